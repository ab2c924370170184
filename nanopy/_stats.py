"""Socket statistics."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SocketStats:
    """A snapshot of one socket's counters (``Socket.stats()``)."""

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
    #: messages refused for exceeding ``recv_max_size`` (each also closed its pipe
    #: and counts in ``protocol_errors``): the sender's loss is silent, this is the trace
    messages_too_large: int = 0
