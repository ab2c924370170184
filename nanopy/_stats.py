"""Socket statistics."""

from __future__ import annotations

from dataclasses import dataclass


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
