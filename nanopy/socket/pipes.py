"""The socket's endpoints and pipes: bind, connect, and each pipe's life (engine side).

Owns: the endpoint list, the pipe callbacks, the per-socket connection counters
(connects, disconnects, reconnects, protocol errors, lost pipes), and
``run_pipe``, which runs one pipe from its handshake's end to its close.

May call: the transport registry, :class:`~nanopy.socket.endpoint.Endpoint`, the
socket's task tree (``_tasks``) and its driver (``add_pipe``/``remove_pipe``/
``feed``); never the core.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from .. import _fork
from ..core.base import PipeInfo
from ..core.drops import TOO_LARGE
from ..core.errors import AddressError, AuthenticationFailed, MessageTooLarge, Timeout
from ..core.message import Pipe
from ..core.options import OPTIONS_BY_NAME, validate_priority
from ..core.stats import PipeLosses
from ..engine import engine as _engine
from ..pipe.driver import PipeDriver
from ..transports._base import Connection, DiscardsMessages, OtherWireProtocol, PipeContext, SubscriptionForwarding
from ..transports._registry import transports as _transports
from .endpoint import Endpoint
from .gate import Gate, make_peer
from .multipart import endpoint_carries_multipart
from .util import check_timeout

if TYPE_CHECKING:
    from ..driver.socket_driver import SocketDriver
    from .lifecycle import SocketTasks
    from .socket import Socket

log = logging.getLogger("nanopy")

_pipe_ids_lock = _fork.process_lock()
_pipe_ids = itertools.count(random.randrange(1, 1 << 30))
#: the bind keywords that make its gate (nanopy/socket/gate.py)
GATE_OPTIONS = ("authorize", "allow", "deny", "zap_domain")


def _new_pipe_id() -> int:
    with _pipe_ids_lock:
        return (next(_pipe_ids) % 0x7FFFFFFF) or next(_pipe_ids)


class PipeHosting:
    """Endpoints and pipes, mixed into :class:`nanopy.Socket`: each call is handed to
    the socket's :class:`PipeHost` part."""

    _host: PipeHost

    def bind(self, url: str, **options: Any) -> Endpoint:
        """Listen on ``url``; returns once listening.

        Args:
            url: ``scheme://address``, e.g. ``tcp://127.0.0.1:0`` (port 0: any free port).
            **options: endpoint options: ``priority``, ``recv_priority`` (1 = highest
                .. 16, default 8), what the transport accepts (``ssl_context``), and
                the gate: ``authorize=fn`` (``fn(peer) -> True | False | reason``,
                run in a worker thread before a peer's pipe joins the socket),
                ``allow=`` / ``deny=`` (lists of IP addresses or CIDR blocks; tcp,
                tls+tcp, ws, wss, zmtp+tcp). A refused peer is closed (a ZMTP one
                first gets an ERROR with the reason), logged once per host and
                interval, and counted in ``stats().auth_failures``. ``zap_domain="..."``
                asks the process's ZAP handler (RFC 27, ``inproc://zeromq.zap.01``;
                :class:`nanopy.ZapAuthenticator`) too, after ``allow``/``deny`` and
                before ``authorize``; ZMTP's ``plain_server=True`` leaves PLAIN
                passwords to it.

        Returns:
            The :class:`Endpoint`; ``ep.url`` has the real port.

        Raises:
            AddressInUse: the address is taken.
            AddressError: unknown scheme or malformed URL; ``allow=``/``deny=`` on
                a transport without IP addresses, or an entry that is no address.
            TypeError: an unknown endpoint option, an ``authorize`` that is not
                callable, or ``plain_server`` without ``zap_domain``.
            Closed: the socket is closed.
        """
        return self._host.bind(url, options)

    def connect(self, url: str, **options: Any) -> Endpoint:
        """Connect to ``url`` in the background, retrying with back-off; returns at once.

        An absent peer is not an error: the dialer retries every
        ``reconnect_interval`` (doubling up to ``reconnect_interval_max``).

        Args:
            url: ``scheme://address`` of the peer.
            **options: endpoint options, as for :meth:`bind`.

        Returns:
            The :class:`Endpoint`; ``ep.close()`` stops this connection only.

        Raises:
            AddressError: unknown scheme or malformed URL.
            TypeError: an unknown endpoint option.
            Closed: the socket is closed.
        """
        return self._host.connect(url, options)

    def wait_for_pipes(self, count: int = 1, timeout: float | None = None) -> None:
        """Block until this socket has at least ``count`` pipes (connected peers).

        Woken by pipe events, no polling. A pipe counts once its handshake is
        done, so a message sent after this returns has a peer to go to (unless the
        pipe closes meanwhile). ``count=0`` returns at once.

        Args:
            count: how many pipes to wait for.
            timeout: seconds to wait at most; ``None`` waits until they are there.

        Raises:
            Timeout: fewer than ``count`` pipes when ``timeout`` ran out; the message
                names the socket's endpoints.
            Closed: the socket is or gets closed.
            RuntimeError: called on the engine thread (from a pipe callback).
            ValueError: a negative ``count`` or ``timeout``.
            TypeError: a ``timeout`` that is not a number.
        """
        self._host.wait_for_pipes(count, timeout)

    def on_pipe_added(self, callback: Callable[[Pipe], Any]) -> None:
        """Call ``callback(pipe)`` on the engine thread for each new pipe.

        Args:
            callback: gets the new :class:`Pipe`; returning ``False`` rejects
                (closes) it before the protocol sees it, and the rejection is
                logged at INFO on the ``nanopy`` logger with the pipe's address.
                It must not block; exceptions are logged.
        """
        self._host.added_callbacks.append(callback)

    def on_pipe_removed(self, callback: Callable[[Pipe], Any]) -> None:
        """Call ``callback(pipe)`` on the engine thread when a pipe goes away.

        Args:
            callback: gets the departed :class:`Pipe`; it must not block.
        """
        self._host.removed_callbacks.append(callback)


class PipeHost:
    """The endpoints-and-pipes part of a socket: its endpoint list, pipe callbacks,
    the wait for pipes, each pipe's life (engine side) and the connection counters.

    It reaches the rest of the socket through what it is given: the driver, the
    task tree, the options, and a few callables (the socket's name, its engine).
    """

    def __init__(
        self,
        sock: Socket,
        driver: SocketDriver,
        tasks: SocketTasks,
        engine: Callable[[], _engine.Engine],
        running_engine: Callable[[], _engine.Engine | None],
    ) -> None:
        self._sock = sock  # (each Endpoint belongs to it; its repr names it in errors)
        self._driver = driver
        self._tasks = tasks
        self._options = sock._options
        self._engine = engine  # the socket's engine, started on first use
        self.running_engine = running_engine  # ... or None if it never started
        self.endpoints: list[Endpoint] = []
        self.added_callbacks: list[Callable[[Pipe], Any]] = []
        self.removed_callbacks: list[Callable[[Pipe], Any]] = []
        self.pipes_changed = threading.Condition(threading.Lock())  # wait_for_pipes, nanopy.testing
        self.counts = PipeCounts()
        #: called with (socket, url) before an endpoint is made; a running device's guard
        #: refuses one that would lose frames (nanopy/socket/device.py)
        self.endpoint_checks: tuple[Callable[[Any, str], None], ...] = ()

    # -- endpoints ---------------------------------------------------------------
    def make_endpoint(self, url: str, dialer: bool, options: dict[str, Any]) -> Endpoint:
        self._driver.check_open()
        if not isinstance(url, str):
            raise TypeError(f"address must be a str URL, not {type(url).__name__}")
        scheme, sep, _ = url.partition("://")
        if not sep or not scheme:
            raise AddressError(
                f"{url!r} is not a URL; expected scheme://address with a scheme among: {', '.join(_transports.names())}"
            )
        transport = _transports.get(scheme)
        # A connect must fail now, not in its background dialer, on a bind-only address.
        if dialer:
            transport.check_dial_url(url)
        else:
            transport.check_url(url)
        if isinstance(transport, OtherWireProtocol):  # (zmtp+tcp, zmtp+ipc)
            transport.check_protocol(self._driver.core.name, self._sock.raw, options)
        for check in self.endpoint_checks:
            check(self._sock, url)
        priority = validate_priority("priority", options.pop("priority", 8))
        recv_priority = validate_priority("recv_priority", options.pop("recv_priority", 8))
        allowed = set(transport.endpoint_options)
        if dialer:  # every dialing transport honours it (docs/api.md)
            allowed.add("connect_timeout")
            if "connect_timeout" in options:
                options["connect_timeout"] = OPTIONS_BY_NAME["connect_timeout"].check(options["connect_timeout"])
        unknown = set(options) - allowed
        if unknown:
            raise TypeError(
                f"unknown endpoint option(s) {', '.join(sorted(unknown))} for {scheme}://"
                f"{'' if dialer else ' bind'}; "
                f"accepted: priority, recv_priority{''.join(', ' + a for a in sorted(allowed))}"
            )
        return Endpoint(self._sock, url, transport, dialer, priority, recv_priority, options)

    def bind(self, url: str, options: dict[str, Any]) -> Endpoint:
        """:meth:`nanopy.Socket.bind`'s work."""
        gate_options = {key: options.pop(key) for key in GATE_OPTIONS if key in options}
        gate = None
        if isinstance(url, str) and any(value is not None for value in gate_options.values()):
            gate = Gate(str(self._sock.name), url, **gate_options,  # (checked before anything is made)
                        timeout=self._options.handshake_timeout)
        zap = gate is not None and gate.zap_domain is not None
        if options.get("plain_server") and options.get("plain_auth") is None and not zap:
            raise TypeError("plain_server=True leaves the password check to a ZAP handler: give zap_domain= "
                            "too (or plain_auth=check)")
        ep = self.make_endpoint(url, False, options)
        ep.gate = gate
        if not self._tasks.reserve():
            raise self._driver.closed_error()
        self._engine().run(self._bind, ep)
        # A close() since the bind began has closed the listener (or will): say so.
        self._driver.feed(self.endpoints.append, ep)
        return ep

    def connect(self, url: str, options: dict[str, Any]) -> Endpoint:
        """:meth:`nanopy.Socket.connect`'s work."""
        if options.get("plain_server"):
            raise TypeError("plain_server= is for a bind with zap_domain= (a connect has no gate)")
        ep = self.make_endpoint(url, True, options)
        self._driver.feed(self.endpoints.append, ep)
        self._tasks.start_endpoint(ep, ep.run_dialer)
        return ep

    async def _bind(self, ep: Endpoint) -> None:
        """Engine side of :meth:`bind`: open the listener, then run it in the socket's
        task tree. A close meanwhile waits for this bind (``SocketTasks.bind_begins``)
        and the listener is closed here, so no address outlives ``close()``."""
        tasks = self._tasks
        if not tasks.bind_begins():
            raise self._driver.closed_error()
        listener = None
        try:
            listener = await ep.open_listener()
            if not tasks.spawn_endpoint(ep, ep.run_listener, listener):
                raise self._driver.closed_error()
            listener = None  # the listener task owns it now
        finally:
            if listener is not None:
                with trio.CancelScope(shield=True):
                    await listener.aclose()
            tasks.bind_ends()

    def forget_endpoint(self, ep: Endpoint) -> None:
        def forget() -> None:
            if ep in self.endpoints:
                self.endpoints.remove(ep)

        self._driver.feed(forget, check_open=False)

    def pipe_context(self, ep: Endpoint) -> PipeContext:
        core = self._driver.core
        opts = self._options
        return PipeContext(
            protocol_id=core.protocol_id,
            peer_id=core.peer_id,
            protocol_name=core.name,
            peer_name=core.peer_name,
            recv_max_size=opts.recv_max_size,
            handshake_timeout=opts.handshake_timeout,
            options={"tcp_nodelay": opts.tcp_nodelay, "dead_peer_timeout": opts.dead_peer_timeout,
                     "connect_timeout": opts.connect_timeout, "kernel_unsent_max": opts.kernel_unsent_max,
                     "kernel_send_buffer": opts.kernel_send_buffer, "kernel_recv_buffer": opts.kernel_recv_buffer,
                     **ep.options},
        )

    # -- pipes (engine thread) -----------------------------------------------------
    async def run_pipe(self, conn: Connection, ep: Endpoint) -> None:
        """Run one pipe until it ends (a task of the socket's pipes nursery)."""
        pipe = Pipe(_new_pipe_id(), conn.remote_address, ep, make_peer(conn, ep.url.partition("://")[0], ep.gate))
        resends = getattr(self._driver.core, "requeues", False)  # (PUSH, raw REQ: nanopy/pipe/resend.py)
        driver = PipeDriver(
            self._driver, self._sock.name, conn, pipe, self._engine(), self.note_protocol_error, resends
        )
        try:
            if ep.closed:
                return  # its endpoint was closed during the handshake
            if not self._call_pipe_callbacks(self.added_callbacks, pipe, accept=True):
                log.info(
                    "%s: pipe %d from %s rejected: an on_pipe_added callback returned False",
                    self._sock.name,
                    pipe.id,
                    pipe.remote_address or ep.url,
                )
                return
            info = PipeInfo(pipe.id, pipe, ep.priority, ep.recv_priority)
            multipart = endpoint_carries_multipart(ep, self._driver.core.name)  # (per pipe: runs end before one)
            if not self._driver.add_pipe(driver, info, self._options.send_buffer, multipart):
                return
            if ep.closed:
                driver.close_soon()  # Endpoint.close() swept its pipes before this one was added
            if isinstance(conn, SubscriptionForwarding):
                self._sock._tell_subscriptions([conn])  # a ZMTP SUB pipe tells its peer the subscriptions
            if isinstance(conn, DiscardsMessages):
                conn.count_drops_with(self._drop_counter(pipe.id))
            self.counts.connects += 1
            self.notify_pipes_changed()
            try:
                await driver.run()
            finally:
                self.counts.disconnects += 1
                resend = driver.resend
                self._driver.remove_pipe(pipe.id, driver.orphans, resend.resent_late, resend.lost_messages)
                self.counts.losses.pipe_ended(driver)
                self.notify_pipes_changed()
                self._call_pipe_callbacks(self.removed_callbacks, pipe, accept=False)
        finally:
            with trio.CancelScope(shield=True):
                await conn.aclose()

    def wait_for_pipes(self, count: int, timeout: float | None) -> None:
        """:meth:`nanopy.Socket.wait_for_pipes`'s work."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"count must be an int >= 0, got {count!r}")
        timeout = check_timeout(timeout, None)
        self._driver.check_open()
        self.refuse_engine_thread("wait_for_pipes")

        def ready() -> bool:
            return self._driver.closed or len(self._driver.pipes) >= count

        with self.pipes_changed:
            done = self.pipes_changed.wait_for(ready, timeout)
        self._driver.check_open()
        if not done:
            where = ", ".join(ep.url for ep in self.endpoints) or "no endpoint"
            raise Timeout(f"{self._sock!r}: {count} pipe(s) wanted, {len(self._driver.pipes)} connected "
                          f"within {timeout}s ({where})")

    def refuse_engine_thread(self, call: str) -> None:
        """A blocking wait for what only the engine thread does would never end there."""
        engine = self.running_engine()
        if engine is not None and engine.in_engine_thread():
            raise RuntimeError(f"{call}() was called on the nanopy engine thread (from a pipe "
                               "callback?), where it would wait for itself; call it from another thread")

    def notify_pipes_changed(self) -> None:
        with self.pipes_changed:
            self.pipes_changed.notify_all()

    def _call_pipe_callbacks(self, callbacks: list[Callable[[Pipe], Any]], pipe: Pipe, accept: bool) -> bool:
        for cb in list(callbacks):
            try:
                if cb(pipe) is False and accept:
                    return False
            except Exception:
                log.exception("%s: pipe callback %r failed", self._sock.name, cb)
        return True

    def note_protocol_error(self, pipe: Pipe | None, exc: BaseException, endpoint: Any = None) -> None:
        """Count a misbehaving peer; its endpoint logs it (rate-limited: docs/transports.md)."""
        self.counts.protocol_errors += 1
        if isinstance(exc, MessageTooLarge):
            self.counts.too_large += 1
            self._driver.count_drop(TOO_LARGE, 1, pipe.id if pipe is not None else None)
        where = f"pipe {pipe.id} ({pipe.remote_address})" if pipe else "a new connection"
        ep = pipe.endpoint if pipe is not None else endpoint
        if ep is not None:
            ep._log_protocol_error(where, exc)
        else:
            log.warning("%s: closing %s: %s", self._sock.name, where, exc)

    def count_reconnect(self) -> None:
        self.counts.reconnects += 1

    def count_dial_failure(self) -> None:
        self.counts.dial_failures += 1
        self.counts.reconnects += 1  # (reconnect_attempts: failed dials and a dialer's failed handshakes)

    def count_handshake(self, ep: Endpoint, failure: BaseException | None) -> None:
        """A handshake on ``ep`` ended (engine thread): ``failure`` is None if it succeeded."""
        if failure is None:
            if ep.dialer and ep._handshakes:
                self.counts.reconnected += 1
            ep._handshakes += 1
            return
        self.counts.handshake_failures += 1
        if isinstance(failure, AuthenticationFailed):
            self.counts.auth_failures += 1

    def _drop_counter(self, pid: int) -> Callable[[str, int], Any]:
        """What a pipe that discards messages itself counts them with (any thread,
        any lock held: the count is made on the engine thread, soon)."""
        engine, count = self._engine(), self._driver.count_drop

        def counted(reason: str, n: int) -> None:
            engine.call_soon(count, reason, n, pid)

        return counted

    def update_contexts(self) -> None:
        """An option a pipe context carries changed: listeners made theirs at bind time,
        and pipes accepted from now on must see the new value (dialers build one per dial)."""
        for ep in list(self.endpoints):
            listener = ep._listener
            if listener is not None:
                listener.update_context(self.pipe_context(ep))

    def close_endpoints(self) -> None:
        """The socket closed: every endpoint is closed and forgotten, and a
        ``wait_for_pipes`` raises Closed."""
        for ep in list(self.endpoints):
            ep._closed = True
        self.endpoints.clear()
        self.notify_pipes_changed()

    def forked(self) -> None:
        """In a forked child: the endpoints are the parent's, the wait's lock may be held."""
        self.pipes_changed = threading.Condition(threading.Lock())
        for ep in self.endpoints:
            ep._closed = True
        self.endpoints.clear()


@dataclass
class PipeCounts:
    """A socket's connection counters kept outside the core's rounds (``stats()``)."""

    connects: int = 0
    disconnects: int = 0
    reconnects: int = 0  # reconnect attempts: failed dials and a dialer's failed handshakes
    protocol_errors: int = 0
    too_large: int = 0
    dial_failures: int = 0
    handshake_failures: int = 0
    auth_failures: int = 0
    reconnected: int = 0
    losses: PipeLosses = field(default_factory=PipeLosses)
