"""A many-peer PAIR v0 core for the coordinator ("polyamorous" pair).

Spark tasks connect ordinary nanopy PAIR sockets; the coordinator's socket speaks
PAIR v0 on the wire but accepts any number of peers. Every received message keeps
its :class:`nanopy.Pipe`, and a send is routed to one pipe named by a 4-byte
big-endian pipe id in front of the body (stripped before transmission). A send to
a pipe that is gone or out of credit is dropped: the coordinator answers each
request once and the task waits for that answer, so credit never runs out in
practice, and a vanished task needs no answer.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from .. import protocols
from ..core.drops import QUEUE_FULL, UNROUTABLE
from ..core.errors import WouldBlock
from ..core.message import Message
from ..protocols import RESUME_READ, TRANSMIT, Core, PipeInfo

PROTOCOL_NAME = "nanopy-spark-hub"


class Hub(Core):
    protocol_id = 0x10
    peer_id = 0x10
    name = "pair"
    peer_name = "pair"

    def __init__(self, options: Any, raw: bool = False) -> None:
        super().__init__(options, raw)
        self._credit: dict[int, int] = {}
        self._queued: dict[int, int] = {}
        self._paused: set[int] = set()
        self._inbox: deque[Message] = deque()

    def add_pipe(self, pipe: PipeInfo, credit: int) -> None:
        super().add_pipe(pipe, credit)
        self._credit[pipe.id] = credit
        self._queued[pipe.id] = 0

    def remove_pipe(self, pid: int) -> None:
        super().remove_pipe(pid)
        self._credit.pop(pid, None)
        self._queued.pop(pid, None)
        self._paused.discard(pid)

    def pipe_credit(self, pid: int, n: int) -> None:
        if pid in self._credit:
            self._credit[pid] += n

    def messages_received(self, pid: int, payloads: list[bytes]) -> bool:
        info = self.pipes.get(pid)
        if info is None:
            return False
        token = info.token
        self._inbox.extend(Message(p, token) for p in payloads)
        queued = self._queued[pid] + len(payloads)
        self._queued[pid] = queued
        if queued >= self.options.recv_buffer:
            self._paused.add(pid)
            return False
        return True

    def recv(self) -> Message:
        if not self._inbox:
            raise WouldBlock
        msg = self._inbox.popleft()
        pid = msg.pipe.id  # type: ignore[union-attr]
        queued = self._queued.get(pid)
        if queued is not None:
            queued -= 1
            self._queued[pid] = queued
            if pid in self._paused and queued <= self.options.recv_buffer // 2:
                self._paused.discard(pid)
                self.actions.append((RESUME_READ, pid))
        return msg

    def can_recv(self) -> bool:
        return bool(self._inbox)

    def send(self, body: bytes, header: bytes = b"") -> None:
        pid = int.from_bytes(body[:4], "big")
        credit = self._credit.get(pid)
        if credit is None or credit <= 0:
            self.count_drop(UNROUTABLE if credit is None else QUEUE_FULL, 1, pid)
            return
        self._credit[pid] = credit - 1
        self.actions.append((TRANSMIT, pid, body[4:]))

    def can_send(self) -> bool:
        return True


def ensure_registered() -> str:
    """Register the hub core (idempotent) and return its protocol name."""
    try:
        protocols.get(PROTOCOL_NAME)
    except ValueError:
        try:
            protocols.register(PROTOCOL_NAME, Hub)
        except ValueError:  # another thread registered it first
            pass
    return PROTOCOL_NAME
