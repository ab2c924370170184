"""Socket statistics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SocketStats:
    """A snapshot of one socket's counters (``Socket.stats()``).

    Attributes:
        messages_sent: messages the user sent (or replied).
        messages_received: messages the user received.
        bytes_sent: body bytes the user sent.
        bytes_received: body bytes the user received.
        messages_dropped: messages a protocol discarded on purpose (PUB to a full
            pipe, SUB's oldest on overflow, too many hops, late replies).
        pipes: pipes connected now.
        connects: pipes made since the socket was created.
        disconnects: pipes lost since the socket was created.
        reconnect_attempts: failed dials and handshakes.
        protocol_errors: peers that broke the wire protocol (their pipe was closed).
        messages_too_large: messages refused for exceeding ``recv_max_size``
            (each also counts in ``protocol_errors``).
        dead_pipes: pipes closed because their peer stopped answering for
            ``dead_peer_timeout`` (each also counts in ``disconnects``).
        lost_pipes_unacked: pipes that ended while their kernel still held bytes
            the peer had not acknowledged: messages that may be lost.
        lost_unacked_bytes: those bytes, summed (wire bytes: frames and headers;
            Linux's count, so 0 where the kernel does not tell).
        messages_requeued: messages a dying pipe had not written yet that went back
            to the socket and on to its other pipes (load-balancing senders).
    """

    messages_sent: int = 0
    messages_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    messages_dropped: int = 0
    pipes: int = 0
    connects: int = 0
    disconnects: int = 0
    reconnect_attempts: int = 0
    protocol_errors: int = 0
    #: the sender's loss is silent (nanomsg and NNG cannot tell it): this is the trace
    messages_too_large: int = 0
    dead_pipes: int = 0
    lost_pipes_unacked: int = 0
    lost_unacked_bytes: int = 0
    messages_requeued: int = 0


class PipeLosses:
    """What a socket lost with its pipes -- the one place these counts are kept
    (docs/partitions.md). Updated on the engine thread as each pipe ends."""

    __slots__ = ("dead_pipes", "lost_pipes_unacked", "lost_unacked_bytes", "messages_requeued")

    def __init__(self) -> None:
        self.dead_pipes = self.lost_pipes_unacked = self.lost_unacked_bytes = self.messages_requeued = 0

    def pipe_ended(self, pipe: Any, requeued: int) -> None:
        """Count how ``pipe`` (a PipeDriver that stopped) ended."""
        if pipe.dead:
            self.dead_pipes += 1
        if pipe.unacked:
            self.lost_pipes_unacked += 1
            self.lost_unacked_bytes += pipe.unacked
        self.messages_requeued += requeued

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}
