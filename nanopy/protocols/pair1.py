"""PAIR v1 (NNG's pair1, protocol 0x11): one peer, a hop-count header.

Theory of operation: the first pipe is the peer; later ones are closed while it
lives (monogamous mode only; NNG's deprecated polyamorous mode is not offered).
Every message carries one 32-bit big-endian word: the upper 24 bits must be zero,
the low 8 bits count hops (WIRE.md section 8.4).

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

from typing import Any

from .._core import CLOSE_PIPE, TRANSMIT, Core, FairQueue, LoadBalancer, PipeInfo
from .._errors import ProtocolError, WouldBlock
from .._message import Message

_ONE = b"\x00\x00\x00\x01"


class Pair1(Core):
    protocol_id = 0x11
    peer_id = 0x11
    name = "pair1"
    peer_name = "pair1"

    def __init__(self, options: Any, raw: bool = False) -> None:
        super().__init__(options, raw)
        self.peer: int | None = None
        self._lb = LoadBalancer()
        self._fq = FairQueue(self.actions, options)

    def add_pipe(self, pipe: PipeInfo, credit: int) -> None:
        if self.peer is not None:
            self.actions.append((CLOSE_PIPE, pipe.id, "PAIR1 already has a peer"))
            return
        super().add_pipe(pipe, credit)
        self.peer = pipe.id
        self._lb.add(pipe.id, pipe.send_priority, credit)
        self._fq.add(pipe.id, pipe.recv_priority)

    def remove_pipe(self, pid: int) -> None:
        if pid != self.peer:
            return
        super().remove_pipe(pid)
        self.peer = None
        self._lb.remove(pid)
        self._fq.remove(pid)

    def pipe_credit(self, pid: int, n: int) -> None:
        self._lb.give(pid, n)

    def messages_received(self, pid: int, payloads: list[bytes]) -> bool:
        if pid != self.peer:
            return False
        token = self.pipes[pid].token
        ttl = self.options.max_ttl
        raw = self.raw
        msgs = []
        ok = True
        for payload in payloads:
            if len(payload) < 4 or payload[0] or payload[1] or payload[2]:
                self.protocol_violation(pid, "pair1: malformed hop-count header")
                ok = False
                break
            if payload[3] > ttl:
                self.dropped += 1  # too many hops: a loop of devices, most likely
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

    def recv(self) -> Message:
        return self._fq.pop()

    def can_send(self) -> bool:
        return bool(self._lb)

    def can_recv(self) -> bool:
        return bool(self._fq)
