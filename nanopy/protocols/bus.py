"""BUS (bus v0): every message goes to every directly connected peer.

Theory of operation: there is no header on the wire (docs/wire.md section 7.7). A send
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

from ..core.base import Distributing, FairQueuing
from ..core.message import Message


class Bus0(Distributing, FairQueuing):
    protocol_id = 0x70
    peer_id = 0x70
    name = "bus"
    peer_name = "bus"

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
        # A peer that is not keeping up misses this one (counted as a drop).
        self.distribute(body, skip)
