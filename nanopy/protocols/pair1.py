"""PAIR v1 (NNG's pair1, protocol 0x11): one peer, a hop-count header.

Theory of operation: the first pipe is the peer; later ones are closed while it
lives (monogamous mode only; NNG's deprecated polyamorous mode is not offered).
Every message carries one 32-bit big-endian word: the upper 24 bits must be zero,
the low 8 bits count hops (docs/wire.md section 7.5).

* Sending (cooked): the word on the wire is 1 (NNG: the pipe adds one to a zero
  header). Raw: the application supplies the word it received (hop count h,
  h < 255) and the wire carries h + 1, so each device adds a hop; an empty raw
  header counts as 0.
* Receiving: shorter than 4 bytes or a non-zero upper part closes the pipe (NNG);
  a hop count over ``max_ttl`` drops the message (counted) and keeps the pipe, so a
  ring of devices cannot loop forever. Hop count 0 is accepted because mangos
  sends 0 (the draft RFC says to discard it; NNG accepts it too).
* Cooked receivers strip the word; raw ones expose it in ``Message.header``.

Sending waits for credit on the peer's pipe (like PAIR v0); with no peer it waits.
"""

from __future__ import annotations

from ..core.base import TRANSMIT, FairQueuing, LoadBalancing
from ..core.drops import PROTOCOL_ERROR, TTL_EXCEEDED
from ..core.errors import ProtocolError, WouldBlock
from ..core.message import Message
from ._common import SinglePeer

_ONE = b"\x00\x00\x00\x01"


class Pair1(SinglePeer, LoadBalancing, FairQueuing):
    protocol_id = 0x11
    peer_id = 0x11
    name = "pair1"
    peer_name = "pair1"

    # SinglePeer: one peer, the rest closed. FairQueuing: recv of queued Messages.

    def messages_received(self, pid: int, payloads: list[bytes]) -> bool:
        if pid != self.peer:
            return False
        token = self.pipes[pid].token
        ttl = self.options.max_ttl
        raw = self.raw
        msgs = []
        ok = True
        for i, payload in enumerate(payloads):
            if len(payload) < 4 or payload[0] or payload[1] or payload[2]:
                self.protocol_violation(pid, "pair1: malformed hop-count header")
                self.count_drop(PROTOCOL_ERROR, len(payloads) - i, pid)
                ok = False
                break
            if payload[3] > ttl:
                self.count_drop(TTL_EXCEEDED, 1, pid)  # too many hops: a loop of devices, most likely
                continue
            if raw:
                msgs.append(Message(payload[4:], token, payload[:4]))
            else:
                msgs.append(Message(payload[4:], token))
        if msgs:
            ok = self._fq.push(pid, msgs) and ok
        return ok

    def send(self, body: bytes, header: bytes = b"") -> None:
        if self.raw and header:
            if len(header) != 4 or header[0] or header[1] or header[2] or header[3] >= 0xFF:
                raise ProtocolError(
                    "raw pair1: the header must be the 4-byte hop count word as received (< 255)"
                )
            word = b"\x00\x00\x00" + bytes((header[3] + 1,))
        else:
            word = _ONE
        pid = self._lb.take()
        if pid is None:
            raise WouldBlock
        self.actions.append((TRANSMIT, pid, word + body))
