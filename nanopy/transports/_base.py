"""The transport plug-in interface.

A transport turns a URL into connections that carry whole SP messages. It owns
its wire details: the SP connection header (or WebSocket subprotocol), framing,
and the receive size limit. The engine owns everything else: reconnecting,
timeouts, flow control, the protocol.

To add a scheme, subclass :class:`Transport` and expose an instance through the
``nanopy.transports`` entry-point group (or call :func:`nanopy.transports.register`).
See ``docs/transports.md`` for a worked example.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..core.errors import Refused


@dataclass(frozen=True)
class PipeContext:
    """What a transport needs to know about the socket it serves.

    Attributes:
        protocol_id, peer_id: SP protocol numbers for the connection header.
        protocol_name, peer_name: protocol names (WebSocket subprotocols).
        recv_max_size: largest payload to accept (0 = unlimited); larger ->
            raise :class:`nanopy.MessageTooLarge` from ``receive``.
        options: socket and endpoint options (``tcp_nodelay``, ``ssl_context``, ...).
        handshake_timeout: seconds the engine allows ``handshake``; a transport
            that does part of the handshake before ``accept`` returns (the ws port
            server reads TLS and the upgrade request to route by path) keeps the
            whole within it.
    """

    protocol_id: int
    peer_id: int
    protocol_name: str
    peer_name: str
    recv_max_size: int = 1 << 20
    options: Mapping[str, Any] = field(default_factory=dict)
    handshake_timeout: float = 10.0


class Connection(abc.ABC):
    """One transport connection carrying SP messages (a pipe's I/O half).

    The engine calls ``handshake`` once (under ``handshake_timeout``), then runs
    one task in ``receive`` and one in ``send``; it never calls either of them
    from two tasks at once.

    Errors: raise :class:`nanopy.RemoteProtocolError` or
    :class:`nanopy.MessageTooLarge` for a misbehaving peer (the pipe is closed and
    counted in ``stats().protocol_errors``); ``EOFError`` or ``OSError`` for a
    connection that went away.
    """

    #: text form of the peer's address, for Pipe.remote_address
    remote_address: str = ""

    #: a bound socket's gate (``authorize=``, ``allow=``/``deny=``), set by the endpoint
    #: before ``handshake`` on a connection that ``gates_itself``: the handshake awaits
    #: ``gate(self)`` once the peer's credentials are known and before it admits the
    #: peer; a string back refuses it (the reason), None admits
    gate: Gate | None = None
    #: the handshake calls ``gate`` itself and raises ``nanopy.Refused`` on a refusal
    #: (ZMTP: so a refusal is an ERROR command; the SP byte streams: so a refused
    #: dialer never receives our header, hence never has a pipe); for other
    #: connections the endpoint calls it after the handshake and closes
    gates_itself: bool = False
    #: the endpoint checks ``allow=``/``deny=`` before ``handshake`` (no TLS or HTTP
    #: upgrade for a denied address); False: the handshake's gate does it (ZMTP)
    refuses_early: bool = True

    def peer_details(self) -> dict[str, Any]:
        """What the handshake learnt of the peer, for its :class:`nanopy.Peer`:
        any of ``mechanism``, ``user``, ``curve_key``, ``certificate``, ``routing_id``
        (an absent key: ``"null"`` / None)."""
        return {}

    async def handshake(self) -> None:
        """Complete the SP handshake (header exchange, HTTP upgrade, TLS...)."""

    @abc.abstractmethod
    async def send(self, payloads: list[bytes]) -> None:
        """Write every payload, in order (the engine's writer task calls it with a batch)."""

    @abc.abstractmethod
    async def receive(self) -> list[bytes]:
        """Return one or more complete payloads (parse as many as are buffered).

        Payloads are ``bytes`` -- exactly ``bytes``, never a ``bytearray`` or
        ``memoryview`` (the payload-type contract between transports and protocol
        cores: cores hash, slice and keep payloads). The engine converts a batch
        that breaks the contract, at a cost; built-in transports never do.
        """

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close the connection; idempotent; must not raise."""

    async def aclose_refused(self, reason: str) -> None:
        """Close a connection a bind's gate refused, telling the peer in its own
        wire protocol where it has a word for it: a TLS ``access_denied`` alert
        before the TLS handshake (a close_notify after it), HTTP 403 before a
        WebSocket upgrade, CLOSE 1008 after it. ``reason`` is the gate's text (a
        transport may pass it on). The default just closes (tcp, ipc: the dialer
        sees its connection end). Bounded in time; must not raise."""
        await self.aclose()


#: see :attr:`Connection.gate`
Gate = Callable[[Connection], Awaitable["str | None"]]


async def pass_gate(conn: Connection) -> None:
    """For a connection that ``gates_itself``: ask its bind's gate (if it has one)
    and raise ``nanopy.Refused`` with the reason if the gate refuses."""
    if conn.gate is not None:
        reason = await conn.gate(conn)
        if reason is not None:
            raise Refused(reason)


class ChannelConnection(Connection):
    """A connection the engine writes as a channel (every built-in transport).

    The pipe's driver is the connection's only writer. It keeps what is not
    written yet (one outbox per pipe) and writes through three operations:

    * ``frame(payloads)`` turns a batch of payloads into one chunk of wire data
      (bytes for a byte stream; in-memory transports may hand the list itself);
    * ``write_nowait(chunk)`` (any thread, never blocks) writes what the channel
      takes at once and returns how much of ``chunk`` that was (bytes, or items of
      a list) -- 0 when it is full or cannot write from this thread;
    * ``await write_all(chunk)`` writes all of it, waiting for room (engine thread).

    The driver never runs two writes at once, and writes a chunk's rest (what
    ``write_nowait`` left) before anything else. A payload's credit goes back to the
    socket once its whole chunk is taken, so a channel that takes nothing while its
    peer reads nothing (a full kernel buffer, a full inproc inbox) is back-pressure.

    A connection whose reader produces frames of its own (WebSocket PONGs) writes
    them through the function given to ``attach_control``: it goes out before any
    queued payload, on a chunk boundary.
    """

    #: bytes ``frame`` adds to every payload when that is a constant (SP over a
    #: stream: the 8-byte length), else None; lets the pipe count payload bytes
    #: from a chunk's length without summing (and without calling ``frame``)
    frame_overhead: int | None = None

    #: Connections whose ``framing`` is equal and not None turn the same payloads
    #: into equal chunks, and only read them: a socket writing one batch to many
    #: such pipes (a PUB's fan-out) frames it once for all of them.
    framing: Hashable | None = None

    #: bytes a write may have in flight that the kernel socket's unacknowledged
    #: count does not show as the channel's own (TLS: a record the peer got only
    #: part of is lost whole, so up to one record's plaintext); nanopy/pipe/sent_log.py
    unacked_slack: int = 0

    def frame(self, payloads: list[bytes]) -> Any:
        """The wire data for ``payloads`` (a ``bytes``-like chunk or a list)."""
        return payloads

    def write_nowait(self, chunk: Any) -> int:
        """Write what can go at once, from any thread; return how much of ``chunk`` went."""
        return 0

    @abc.abstractmethod
    async def write_all(self, chunk: Any) -> None:
        """Write all of ``chunk`` (engine thread; waits for room)."""

    def attach_control(self, send_control: Callable[[bytes], bool]) -> None:
        """Receive the pipe's control-frame writer (see the class docstring).

        ``send_control(frame)`` queues ``frame`` ahead of every payload, replacing a
        control frame not written yet; it returns True if it replaced one.
        ``send_control(frame, append=True)`` writes it after that one instead
        (frames that must all go out, such as ZMTP commands).
        """

    def control_chunk(self, frame: bytes) -> Any:
        """The wire data of a control frame, made when it is written (after the
        chunks before it were framed): a ZMTP CURVE connection seals it then."""
        return frame

    async def send(self, payloads: list[bytes]) -> None:
        await self.write_all(self.frame(payloads))


@runtime_checkable
class DirectReadable(Protocol):
    """A capability: a connection any thread may read without blocking (tcp, ipc).

    The pipe gives such a connection a *read role* (nanopy/pipe/reading.py): a
    receiving thread or task on the socket's only pipe reads it itself
    (nanopy/driver/direct.py) while the engine's reader task stands aside.
    """

    #: the last read filled the whole buffer: read again before waiting
    read_more: bool

    @property
    def failed(self) -> bool:
        """A read met the end of the connection or an error, to be raised by the next read."""

    def read_nowait(self) -> list[bytes] | None:
        """The complete payloads the kernel holds now: None if it held nothing, [] if only
        part of a frame; raises EOFError, OSError or RemoteProtocolError at the end."""

    async def wait_readable(self) -> None:
        """Wait (engine thread) until a read may find something."""

    def fileno(self) -> int:
        """The descriptor a reader polls (-1 once closed)."""


@runtime_checkable
class SinkAttachable(Protocol):
    """A capability: an in-memory connection that delivers from the sender's thread (inproc).

    The one documented exception to "a transport never calls into a socket": the
    receiving pipe attaches a sink (its socket driver's ``deliver``), and the
    sender's write hands payloads to it while the receiver keeps up.
    """

    def attach_sink(self, sink: Callable[[list[bytes]], object], paused: Callable[[], bool]) -> None:
        """Deliver through ``sink`` from now on, while ``paused()`` is false."""

    async def drain_to_sink(self) -> None:
        """Deliver what queued while the sink was paused (engine thread)."""


@runtime_checkable
class SubscriptionForwarding(Protocol):
    """A capability: a connection whose peer filters for the socket (a ZMTP pipe: a
    ZeroMQ publisher filters), so the socket tells it its subscriptions.

    The socket pushes them: it calls ``subscriptions`` inside one of its rounds
    when the pipe joins and after every subscribe or unsubscribe, so the calls
    come in the order the changes were made. The connection only records what
    changed and queues what its peer must hear; it never calls into the socket.
    """

    def subscriptions(self, topics: frozenset[bytes]) -> None:
        """The socket's subscriptions now (``{b""}``: everything); any thread."""


@runtime_checkable
class PeerWatching(Protocol):
    """A capability: a connection that checks a silent peer itself (ws and ZMTP PINGs).

    ``keepalive`` is the pipe's extra task (it gets a ``busy()`` test: the pipe has
    unwritten data), or None when dead-peer detection is off.
    """

    keepalive: Callable[[Callable[[], bool]], Awaitable[None]] | None


@runtime_checkable
class JudgesSilence(Protocol):
    """A capability: a connection that can tell when its peer ended it for our own
    silence (ZMTP: we announced a PING TTL, then wrote nothing for longer).

    The pipe asks when the connection ended by EOF or reset; a reason makes the
    pipe a dead one (``stats().dead_pipes``, one INFO line), None an ordinary
    disconnect.
    """

    def silence_blamed(self) -> str | None:
        """Why the peer took us for dead, or None."""


@runtime_checkable
class OtherWireProtocol(Protocol):
    """A capability: a transport that speaks another wire protocol than SP (ZMTP).

    It checks, when an endpoint is made, that the socket's protocol has a
    counterpart there; its messages may have several parts (``recv_multipart``).
    """

    def check_protocol(self, name: str, raw: bool, options: dict[str, object]) -> None:
        """Raise :class:`nanopy.ProtocolError` if a ``name`` socket cannot use it."""


@runtime_checkable
class KernelSocketBacked(Protocol):
    """A capability: a connection over a kernel TCP or Unix socket (tcp, ipc, tls, ws).

    Dead-peer handling reads the socket's state (unacknowledged bytes, the send
    window) and sets its user timeout; a connection without one is judged by its
    own PINGs or not at all.
    """

    def kernel_socket(self) -> Any:
        """The connection's kernel socket (or an object with its ``getsockopt``)."""


@runtime_checkable
class ReportsWriteWait(Protocol):
    """A capability: a channel that says when its ``write_all`` waits for room (a peer
    reading nothing) rather than writing.

    The pipe counts the messages of its current write in ``queued_out`` only while
    it waits: inside the call that hands them to the kernel (or an inproc inbox) a
    peer may already have them, so counting them then would say a message the peer
    holds is still queued. Without this capability a write counts until it returns.
    """

    @property
    def waiting_for_room(self) -> bool:
        """``write_all`` is waiting for the channel to take more."""


@runtime_checkable
class CountsUnwritten(Protocol):
    """A capability: a channel that knows how much of a failed ``write_all`` never
    reached the kernel, so those messages can go to another pipe."""

    def unwritten_bytes(self) -> int | None:
        """Bytes of the failed chunk not written (None: unknown)."""


@runtime_checkable
class WriteWindow(Protocol):
    """A capability: a channel that takes only so many messages at a time (a ZMTP
    REQ pipe: one request until its reply, as the wire carries no request id).

    A batch the pipe takes from its outbox holds at most ``window()`` messages; the
    rest wait in the outbox like any queued message (in ``queued_out``, their send
    credit held until written, handed back to the socket if the pipe dies). While
    the window is shut nothing is written directly either. The channel tells the
    pipe through the hook given to ``watch_window`` whenever the window may have
    moved (a write shut it, a reply opened it); the pipe then asks ``window()``.
    """

    def window(self) -> int:
        """How many more messages the channel takes now (0: none until it opens)."""

    def watch_window(self, moved: Callable[[], None]) -> bool:
        """Call ``moved()`` from now on after the window moved (from any thread,
        holding none of the pipe's locks: the hook takes the pipe's lock), and
        return True; False if this channel never limits its writes (the pipe then
        ignores the capability)."""


@runtime_checkable
class DiscardsMessages(Protocol):
    """A capability: a connection that may discard a message itself, as its wire
    protocol's peers would (a ZMTP REQ pipe drops a reply without its delimiter).
    The socket hands it a counter, so every such drop counts in ``stats().drops``."""

    def count_drops_with(self, count: Callable[[str, int], Any]) -> None:
        """From now on, count ``n`` messages discarded for ``reason`` (a name of
        nanopy.core.drops: ``DROP_MALFORMED``, ...) with ``count(reason, n)`` (callable from any thread)."""


#: the reasons a connection counts its own discards with (``DiscardsMessages``):
#: the names of nanopy.core.drops, which a transport does not import
DROP_MALFORMED = "malformed"
DROP_CANCELLED = "cancelled"
DROP_UNROUTABLE = "unroutable"


class Listener(abc.ABC):
    """A bound listening endpoint."""

    #: the bound URL with wildcards resolved (e.g. the real port for port 0)
    url: str

    @abc.abstractmethod
    async def accept(self) -> Connection:
        """Wait for the next incoming connection (before its handshake)."""

    def update_context(self, ctx: PipeContext) -> None:
        """Socket options changed (e.g. ``recv_max_size``): use ``ctx`` for
        connections accepted from now on. The default keeps the bind-time context."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop listening and release the address; idempotent."""


class Transport(abc.ABC):
    """A URL scheme's factory of listeners and connections."""

    #: URL schemes this transport serves (e.g. ``("tcp",)``)
    schemes: tuple[str, ...] = ()
    #: endpoint options it accepts beside ``priority``/``recv_priority`` (e.g. ``("ssl_context",)``)
    endpoint_options: tuple[str, ...] = ()
    #: its messages may have several frames (ZeroMQ multipart, :class:`nanopy.zmtp.Multipart`):
    #: the socket then lets ``send_multipart`` use it and looks at what its pipes deliver
    carries_multipart: bool = False

    def check_url(self, url: str) -> None:
        """Raise :class:`nanopy.AddressError` if ``url`` is malformed (called at once by bind/connect)."""

    def check_dial_url(self, url: str) -> None:
        """As :meth:`check_url`, for ``connect`` (e.g. a wildcard host or port 0 is bind-only)."""
        self.check_url(url)

    @abc.abstractmethod
    async def listen(self, url: str, ctx: PipeContext) -> Listener:
        """Bind ``url``; raise :class:`nanopy.AddressInUse` if it is taken."""

    @abc.abstractmethod
    async def dial(self, url: str, ctx: PipeContext) -> Connection:
        """Connect to ``url`` (before the handshake); raise ``OSError`` on failure."""
