"""Socket and pipe statistics: frozen snapshots, read by attribute or by key."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .drops import new_drop_counts


class _Snapshot:
    """Key access for the snapshot dataclasses: ``stats["dropped"]`` is
    ``stats.dropped``, and ``dict(stats)`` has every field."""

    __slots__ = ()

    def keys(self) -> list[str]:
        """The field names, in order.

        Returns:
            The names ``snapshot[name]`` accepts.
        """
        return [f.name for f in dataclasses.fields(self)]  # type: ignore[arg-type]

    def __getitem__(self, key: str) -> Any:
        if key.__class__ is not str or key not in self.keys():
            raise KeyError(f"{key!r}: not a {type(self).__name__} field; fields are {', '.join(self.keys())}")
        return getattr(self, key)


@dataclass(frozen=True)
class SocketStats(_Snapshot):
    """A snapshot of one socket's counters (``Socket.stats()``).

    Read a field as an attribute (``s.dropped``) or by key (``s["dropped"]``);
    ``dict(s)`` gives them all.

    Attributes:
        messages_sent: messages the user sent (or replied).
        messages_received: messages the user received.
        bytes_sent: body bytes the user sent.
        bytes_received: body bytes the user received.
        messages_dropped: the same number as ``dropped`` (its older name).
        pipes: pipes connected now.
        connects: pipes made since the socket was created.
        disconnects: pipes lost since the socket was created.
        reconnect_attempts: failed dials and a dialer's failed handshakes (the sum of
            ``dial_failures`` and the dialer's part of ``handshake_failures``).
        protocol_errors: peers that broke the wire protocol (their pipe was closed).
        messages_too_large: messages refused for exceeding ``recv_max_size``
            (each also counts in ``protocol_errors`` and in ``drops["too_large"]``).
        dead_pipes: pipes ended for silence: their peer stopped answering for
            ``dead_peer_timeout``, or a ZeroMQ peer closed one after hearing
            nothing from us for longer than the PING TTL we announce (each also
            counts in ``disconnects``; docs/partitions.md).
        lost_pipes_unacked: pipes that ended while their kernel still held bytes
            the peer had not acknowledged: messages that may be lost.
        lost_unacked_bytes: the bytes those pipes' kernels held unacknowledged, summed
            (wire bytes: frames and headers; Linux's count, so 0 where the kernel does not tell).
        messages_requeued: messages a dying pipe had not written yet that went back
            to the socket and on to its other pipes (load-balancing senders).
        dropped: messages discarded, for any reason: ``sum(drops.values())``.
        drops: messages discarded by reason: every name of docs/metrics.md
            ("queue_full", "no_peer", "too_large", ...), zeros included.
        queued_in: messages received and not yet taken by the user.
        queued_out: messages sent and not yet written to a connection.
        dial_failures: dials that made no connection (refused, unreachable, timed out).
        handshake_failures: connections, dialed or accepted, that ended before their
            handshake completed (a wrong protocol, a refused upgrade, a timeout, a
            peer that left, ``auth_failures`` included).
        auth_failures: peers this socket refused in the handshake for their
            credentials: a CURVE key not in ``curve_clients`` or a box that does not
            open, PLAIN credentials refused, a TLS certificate that failed verification;
            and peers a bind's gate (``authorize=``, ``allow=``, ``deny=``) refused.
        reconnects: connections a dialer made again after its first (a pipe lost
            or refused, then made anew).
        messages_resent: messages a dying pipe had handed to its kernel whose bytes
            the peer had not all acknowledged, sent again on the other pipes
            (``resend_unacked``; PUSH, raw REQ): each may arrive twice -- the peer
            may have had it and only its acknowledgement was lost.
        lost_unacked_messages: the same messages when ``resend_unacked`` is off:
            lost with their pipe, unless only the acknowledgement was (also
            counted as ``dead_pipe`` drops; PUSH, raw REQ over tcp, tls+tcp, ws,
            wss, zmtp+tcp on Linux).
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
    dropped: int = 0
    drops: Mapping[str, int] = field(default_factory=new_drop_counts)
    queued_in: int = 0
    queued_out: int = 0
    dial_failures: int = 0
    handshake_failures: int = 0
    auth_failures: int = 0
    reconnects: int = 0
    messages_resent: int = 0
    lost_unacked_messages: int = 0


#: the SocketStats fields that say how things are now (they go up and down); every
#: other number counts since the socket was created, and a Mapping counts by reason:
#: nanopy.metrics exports a new field by this rule (docs/metrics.md, "A new counter")
GAUGE_FIELDS = frozenset({"pipes", "queued_in", "queued_out"})


class PipeLosses:
    """What a socket lost with its pipes -- the one place these counts are kept
    (docs/partitions.md). Updated on the engine thread as each pipe ends. (What
    went back to the socket instead, ``messages_requeued`` and ``messages_resent``,
    is counted where it goes back: ``SocketDriver.requeued``/``resent``,
    nanopy/driver/endings.py.)"""

    __slots__ = ("dead_pipes", "lost_pipes_unacked", "lost_unacked_bytes", "lost_unacked_messages")

    def __init__(self) -> None:
        self.dead_pipes = self.lost_pipes_unacked = self.lost_unacked_bytes = self.lost_unacked_messages = 0

    def pipe_ended(self, pipe: Any) -> None:
        """Count how ``pipe`` (a PipeDriver that stopped) ended. Bytes sent again
        (``resend_unacked``) are no loss."""
        if pipe.liveness.dead:
            self.dead_pipes += 1
        resend = pipe.resend  # (nanopy/pipe/resend.py)
        if resend.unacked and not resend.unacked_resent:
            self.lost_pipes_unacked += 1
            self.lost_unacked_bytes += resend.unacked
        self.lost_unacked_messages += resend.lost_messages

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True)
class PipeStats(_Snapshot):
    """A snapshot of one pipe (``Socket.pipes()``, ``Pipe.stats()``).

    Messages and bytes are counted as the pipe writes and reads them: payloads
    with their protocol header (a REQ's request id, ...), without the
    transport's framing. Read a field as an attribute or by key, as
    :class:`SocketStats`.

    Attributes:
        id: the pipe id (as ``Pipe.id``).
        remote_address: the peer's address as text.
        transport: the URL scheme (``"tcp"``, ``"ipc"``, ``"inproc"``, ...).
        url: the URL of the endpoint that made the pipe.
        dialed: True for a pipe of a ``connect``, False for one a ``bind`` accepted.
        priority: the endpoint's send priority (1 = highest .. 16).
        recv_priority: the endpoint's receive priority.
        queued_out: messages queued on this pipe, not yet written (a write
            waiting for a peer that reads nothing included).
        queued_in: messages it delivered that the user has not taken yet.
        messages_sent: messages written to the connection, counted as the write
            hands them over (a peer holding a message finds it counted).
        messages_received: messages read from the connection.
        bytes_sent: their bytes (protocol header included).
        bytes_received: their bytes (protocol header included).
        dropped: messages of this pipe the socket dropped (any reason).
        connected_since: when the pipe came up (seconds since the epoch).
    """

    id: int
    remote_address: str
    transport: str
    url: str
    dialed: bool
    priority: int
    recv_priority: int
    queued_out: int
    queued_in: int
    messages_sent: int
    messages_received: int
    bytes_sent: int
    bytes_received: int
    dropped: int
    connected_since: float
