"""PAIR v0: exactly one peer, no header.

Theory of operation: the first pipe is *the* peer; any further pipe is refused by
closing it (as nanomsg's ``excl`` and NNG's pair0 do) while the first one lives.
Sending needs credit on that pipe; received messages queue per pipe.
"""

from __future__ import annotations

from .._core import TRANSMIT, Core, FairQueue, LoadBalancer, PipeInfo, CLOSE_PIPE
from .._errors import WouldBlock
from .._message import Message


class Pair0(Core):
    protocol_id = 0x10
    peer_id = 0x10
    name = "pair"
    peer_name = "pair"

    def __init__(self, options, raw: bool = False) -> None:
        super().__init__(options, raw)
        self.peer: int | None = None
        self._lb = LoadBalancer()
        self._fq = FairQueue(self.actions, options)

    def add_pipe(self, pipe: PipeInfo, credit: int) -> None:
        if self.peer is not None:
            self.actions.append((CLOSE_PIPE, pipe.id, "PAIR already has a peer"))
            return
        super().add_pipe(pipe, credit)
        self.peer = pipe.id
        self._lb.add(pipe.id, pipe.send_priority, credit)
        self._fq.add(pipe.id, pipe.recv_priority)

    def remove_pipe(self, pid: int) -> None:
        if pid != self.peer:
            return
        self.peer = None
        self._lb.remove(pid)
        # Messages already received from the old peer stay readable.
        self.retire_pipe(pid, self._fq)

    def pipe_credit(self, pid: int, n: int) -> None:
        self._lb.give(pid, n)

    def messages_received(self, pid: int, payloads: list[bytes]) -> bool:
        if pid != self.peer:
            return False
        # Queue raw payloads; a Message is built only if the user asks for one.
        return self._fq.push(pid, payloads)

    def send(self, body: bytes, header: bytes = b"") -> None:
        pid = self._lb.take()
        if pid is None:
            raise WouldBlock
        self.actions.append((TRANSMIT, pid, body))

    def recv(self) -> Message:
        body = self._fq.pop()
        return Message(body, self.pipes[self._fq.last_pid].token)

    def recv_body(self) -> bytes:
        return self._fq.pop()

    def can_send(self) -> bool:
        return bool(self._lb)

    def can_recv(self) -> bool:
        return bool(self._fq)
