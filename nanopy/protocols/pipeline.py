"""PUSH/PULL (pipeline v0): no header; PUSH load-balances, PULL fair-queues.

Theory of operation: PUSH hands each message to the most preferred pipe that has
send credit, round robin among equals (nanomsg ``lb``); with no credit anywhere
``send`` raises WouldBlock and the caller waits -- PUSH never drops. PULL keeps a
queue per pipe and serves them by receive priority, one message each in turn
(nanomsg ``fq``). Raw mode is identical (there is no header to expose).
"""

from __future__ import annotations

from .._core import TRANSMIT, Core, FairQueue, LoadBalancer, PipeInfo
from .._errors import ProtocolError, WouldBlock
from .._message import Message


class Push0(Core):
    protocol_id = 0x50
    peer_id = 0x51
    name = "push"
    peer_name = "pull"
    receives = False

    def __init__(self, options, raw: bool = False) -> None:
        super().__init__(options, raw)
        self._lb = LoadBalancer()

    def add_pipe(self, pipe: PipeInfo, credit: int) -> None:
        super().add_pipe(pipe, credit)
        self._lb.add(pipe.id, pipe.send_priority, credit)

    def remove_pipe(self, pid: int) -> None:
        super().remove_pipe(pid)
        self._lb.remove(pid)

    def pipe_credit(self, pid: int, n: int) -> None:
        self._lb.give(pid, n)

    def messages_received(self, pid: int, payloads: list[bytes]) -> bool:
        self.protocol_violation(pid, "a PULL peer sent data to PUSH")
        return False

    def send(self, body: bytes, header: bytes = b"") -> None:
        pid = self._lb.take()
        if pid is None:
            raise WouldBlock
        self.actions.append((TRANSMIT, pid, body))

    def can_send(self) -> bool:
        return bool(self._lb)

    def recv(self) -> Message:
        raise ProtocolError("PUSH sockets cannot receive; use a PULL socket")


class Pull0(Core):
    protocol_id = 0x51
    peer_id = 0x50
    name = "pull"
    peer_name = "push"
    sends = False

    def __init__(self, options, raw: bool = False) -> None:
        super().__init__(options, raw)
        self._fq = FairQueue(self.actions, options)

    def add_pipe(self, pipe: PipeInfo, credit: int) -> None:
        super().add_pipe(pipe, credit)
        self._fq.add(pipe.id, pipe.recv_priority)

    def remove_pipe(self, pid: int) -> None:
        # Messages already received from the pipe stay readable.
        self.retire_pipe(pid, self._fq)

    def messages_received(self, pid: int, payloads: list[bytes]) -> bool:
        # Queue raw payloads; a Message is built only if the user asks for one.
        return self._fq.push(pid, payloads)

    def recv(self) -> Message:
        body = self._fq.pop()
        return Message(body, self.pipes[self._fq.last_pid].token)

    def recv_body(self) -> bytes:
        return self._fq.pop()

    def can_recv(self) -> bool:
        return bool(self._fq)

    def send(self, body: bytes, header: bytes = b"") -> None:
        raise ProtocolError("PULL sockets cannot send; use a PUSH socket")
