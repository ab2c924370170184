"""PUSH/PULL (pipeline v0): no header; PUSH load-balances, PULL fair-queues.

Theory of operation: PUSH hands each message to the most preferred pipe that has
send credit, round robin among equals (nanomsg ``lb``); with no credit anywhere
``send`` raises WouldBlock and the caller waits -- PUSH never drops. PULL keeps a
queue per pipe and serves them by receive priority, one message each in turn
(nanomsg ``fq``). Raw mode is identical (there is no header to expose).
"""

from __future__ import annotations

from ..core.base import BodyQueuing, LoadBalancing
from ..core.drops import PROTOCOL_ERROR
from ..core.errors import ProtocolError
from ..core.message import Message


class Push0(LoadBalancing):
    protocol_id = 0x50
    peer_id = 0x51
    name = "push"
    peer_name = "pull"
    receives = False
    requeues = True  # a dead pipe's unwritten messages go to the other PULLs

    # send: LoadBalancing.send (one pipe, WouldBlock without credit)

    def messages_received(self, pid: int, payloads: list[bytes]) -> bool:
        self.protocol_violation(pid, "a PULL peer sent data to PUSH")
        self.count_drop(PROTOCOL_ERROR, len(payloads), pid)
        return False

    def recv(self) -> Message:
        raise ProtocolError("PUSH sockets cannot receive; use a PULL socket")


class Pull0(BodyQueuing):
    protocol_id = 0x51
    peer_id = 0x50
    name = "pull"
    peer_name = "push"
    sends = False

    # messages_received / recv / recv_body: BodyQueuing (payloads queued as they
    # came; a gone pipe's messages stay readable)

    def send(self, body: bytes, header: bytes = b"") -> None:
        raise ProtocolError("PULL sockets cannot send; use a PUSH socket")
