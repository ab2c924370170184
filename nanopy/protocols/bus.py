"""BUS (bus v0): every message goes to every directly connected peer.

Theory of operation: there is no header on the wire (WIRE.md section 8.7). A send
is queued on every pipe that has send credit; a pipe that cannot take it misses
it (best effort, like nanomsg's ``dist``), so ``send`` never blocks, even with no
peer at all. Received messages are fair-queued per pipe. A cooked BUS never
re-forwards what it receives: a message reaches direct peers only.

Raw mode (devices): a received message's ``Message.header`` is the 4-byte id of
the pipe it came from -- local only, it never reaches the wire (NNG keeps the same
4-byte id; nanomsg an in-process pointer). Sending with such a header skips that
pipe, so ``nanopy.device(bus, bus)`` (one raw socket forwarding to itself) relays
between its peers without echoing anything back to its sender. BUS has no hop
count: a topology with a cycle of devices loops, exactly as in nanomsg and NNG.
"""

from __future__ import annotations

from typing import Any

from .._core import TRANSMIT, Core, FairQueue, LoadBalancer, PipeInfo
from .._message import Message


class Bus0(Core):
    protocol_id = 0x70
    peer_id = 0x70
    name = "bus"
    peer_name = "bus"

    def __init__(self, options: Any, raw: bool = False) -> None:
        super().__init__(options, raw)
        self._lb = LoadBalancer()
        self._fq = FairQueue(self.actions, options)

    def add_pipe(self, pipe: PipeInfo, credit: int) -> None:
        super().add_pipe(pipe, credit)
        self._lb.add(pipe.id, pipe.send_priority, credit)
        self._fq.add(pipe.id, pipe.recv_priority)

    def remove_pipe(self, pid: int) -> None:
        super().remove_pipe(pid)
        self._lb.remove(pid)
        self._fq.remove(pid)

    def pipe_credit(self, pid: int, n: int) -> None:
        self._lb.give(pid, n)

    def messages_received(self, pid: int, payloads: list[bytes]) -> bool:
        pipe = self.pipes.get(pid)
        if pipe is None:
            return False
        token = pipe.token
        if self.raw:
            origin = pid.to_bytes(4, "big")
            return self._fq.push(pid, [Message(p, token, origin) for p in payloads])
        return self._fq.push(pid, [Message(p, token) for p in payloads])

    def send(self, body: bytes, header: bytes = b"") -> None:
        skip = int.from_bytes(header[:4], "big") if self.raw and len(header) >= 4 else None
        take = self._lb.take_pipe
        actions = self.actions
        for pid in self.pipes:
            if pid != skip and take(pid):
                actions.append((TRANSMIT, pid, body))
            elif pid != skip:
                self.dropped += 1  # that peer is not keeping up: it misses this one

    def can_send(self) -> bool:
        return True

    def recv(self) -> Message:
        return self._fq.pop()

    def can_recv(self) -> bool:
        return bool(self._fq)
