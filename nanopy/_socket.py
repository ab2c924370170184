"""The public :class:`Socket`: thread-safe and context-free.

Concurrency model: all protocol state lives in the socket's Sans-I/O core, owned
by its :class:`~nanopy._driver.SocketDriver` -- the only code that takes the socket
lock. User threads and tasks (``send``/``recv``) and the engine thread (pipes,
timers) feed the core through the driver. Calls that can complete do so on the
caller's thread without any trio hop; calls that cannot park a waiter (a plain lock
for a thread, an event for a trio or asyncio task) that the driver wakes. Actions
the core emits are carried out after the lock is released, so two sockets never
hold each other's locks.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
from collections.abc import Callable, Iterable
from typing import Any

import trio
from trio.lowlevel import cancel_shielded_checkpoint

from . import _engine
from ._core import Core, PipeInfo
from ._driver import SocketDriver, _Blocked, cancellation_point, checkpoint_after, checkpoint_before, in_trio
from ._drops import TOO_LARGE
from ._endpoint import Endpoint
from ._errors import AddressError, Closed, MessageTooLarge, ProtocolError, WouldBlock
from ._lifecycle import SocketTasks
from ._message import Message, Pipe
from ._multipart import MultipartMixin, receive_multipart
from ._observe import PipeList, socket_stats
from ._options import OptionAttributes, docstring_section, make_descriptors, new_options, validate_priority
from ._pipe import PipeDriver
from ._poller import Pollable
from ._registry import protocols as _protocols
from ._registry import transports as _transports
from ._requests import RequestMethods
from ._stats import PipeLosses, SocketStats
from ._util import DEFAULT as _DEFAULT
from ._util import as_bytes
from ._waiters import WaitQueue
from .transports._base import Connection, PipeContext

log = logging.getLogger("nanopy")


_pipe_ids_lock = threading.Lock()
_pipe_ids = itertools.count(random.randrange(1, 1 << 30))
_socket_serials = itertools.count(1)  # (next() on a count is atomic under the GIL)


def _new_pipe_id() -> int:
    with _pipe_ids_lock:
        return (next(_pipe_ids) % 0x7FFFFFFF) or next(_pipe_ids)


def _as_list(value: str | Iterable[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


class Socket(RequestMethods, MultipartMixin, Pollable, OptionAttributes):
    """A scalability-protocols socket.

    Args:
        protocol: a protocol name (``"req"``, ``nanopy.PUSH``, ...), looked up in the
            protocol registry.
        raw: raw mode (headers exposed, no protocol state machine), for devices.
        bind: a URL or a list of URLs to bind at once (see :meth:`bind`).
        connect: a URL or a list of URLs to connect to at once (see :meth:`connect`).
        **options: any socket option below, validated at once; each is also an
            attribute that may be read and set at any time.

    Raises:
        ValueError: unknown protocol name.
        TypeError: an unknown option, or an option of the wrong type.
        AddressError, AddressInUse: a ``bind``/``connect`` URL was refused.

    Any thread may call any method at any time; ``asend``/``arecv`` and friends
    work from trio and asyncio tasks.
    """


    def __init__(
        self,
        protocol: str,
        *,
        raw: bool = False,
        bind: str | Iterable[str] | None = None,
        connect: str | Iterable[str] | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(protocol, str):
            raise TypeError(f"protocol must be a name such as 'req', not {type(protocol).__name__}")
        core_cls = _protocols.get(protocol)
        self._core_cls = core_cls  # options check protocol-specific values against it (overflow)
        self._options = new_options(protocol)
        self._engine_obj: _engine.Engine | None = None
        self._endpoints: list[Endpoint] = []
        self._added_callbacks: list[Callable[[Pipe], Any]] = []
        self._removed_callbacks: list[Callable[[Pipe], Any]] = []
        self._pipes_changed = threading.Condition(threading.Lock())  # for nanopy.testing
        # counters (stats) kept outside the core's rounds
        self._connects = self._disconnects = 0
        self._losses = PipeLosses()
        self._reconnects = self._protocol_errors = self._too_large = 0
        # Metrics label a socket by its name, or by this stable id while it has none.
        self._serial = next(_socket_serials)
        self._named = False
        for key, value in options.items():
            if key not in _OPTION_NAMES:
                raise TypeError(
                    f"unknown socket option {key!r}; options are: {', '.join(sorted(_OPTION_NAMES))}"
                )
            setattr(self, key, value)
        self._driver = SocketDriver(core_cls(self._options, raw=raw), self._get_name, lambda: self._engine)
        # Every engine task of this socket runs in this tree (nanopy/_lifecycle.py).
        self._tasks = SocketTasks(self._get_name, lambda: self._engine, lambda: list(self._driver.pipe_drivers()))
        self._driver.spawn_task = self._tasks.start_task
        self.raw = raw
        self._closing_q: WaitQueue | None = None  # made by the first _await_closed
        _engine.track_socket(self)
        try:
            for url in _as_list(bind):
                self.bind(url)
            for url in _as_list(connect):
                self.connect(url)
        except BaseException:
            self.close(linger=0)
            raise

    # -- identity --------------------------------------------------------------
    def _get_name(self) -> str:
        return str(self.name)

    @property
    def _core(self) -> Core:
        """The protocol core (for tests and introspection; only the driver feeds it)."""
        return self._driver.core

    @property
    def _pipes(self) -> dict[int, PipeDriver]:
        return self._driver.pipes

    @property
    def protocol(self) -> str:
        """The protocol name (``"req"``, ...)."""
        return self._core.name

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (or the socket was inherited across a fork)."""
        return self._driver.closed

    @property
    def endpoints(self) -> list[Endpoint]:
        """The live endpoints (binds and connects)."""
        return list(self._endpoints)

    @property
    def pipes(self) -> PipeList:
        """The currently connected pipes; ``sock.pipes()`` gives a snapshot of each.

        A list of :class:`Pipe` objects that may also be called: ``sock.pipes()``
        returns one :class:`PipeStats` per pipe (id, remote address, transport,
        priorities, queued messages each way, messages and bytes each way, drops,
        connected since).
        """
        return PipeList(d.pipe for d in list(self._pipes.values()))

    @property
    def _metrics_label(self) -> str:
        """The ``socket`` label of this socket's metrics (nanopy.metrics)."""
        return str(self.name) if self._named else f"{self._core.name}-{self._serial}"

    def __repr__(self) -> str:
        state = "closed" if self._driver.closed else f"{len(self._pipes)} pipes"
        return f"<nanopy.Socket {self.name!r} ({self._core.name}{' raw' if self.raw else ''}), {state}>"

    def __reduce__(self) -> Any:
        # A socket is tied to this process's engine and connections; copying it
        # elsewhere (a Spark closure, multiprocessing) cannot work, so say why.
        raise TypeError(
            f"cannot pickle {self!r}: a nanopy socket belongs to the process that made it. "
            "Pass its URL instead and create the socket where it is used (in Spark, inside "
            "the task function); see docs/spark.md"
        )

    def _option_changed(self, name: str) -> None:
        """Hook for options that must reach running parts."""
        if name == "name":
            self._named = True
        if name in ("recv_max_size", "tcp_nodelay", "handshake_timeout", "dead_peer_timeout"):
            # Listeners made their context at bind time; pipes accepted from now
            # on must see the new value (dialers build a context per dial).
            for ep in list(getattr(self, "_endpoints", ())):
                listener = ep._listener
                if listener is not None:
                    listener.update_context(self._pipe_context(ep))

    # -- endpoints ---------------------------------------------------------------
    @property
    def _engine(self) -> _engine.Engine:
        engine = self._engine_obj
        if engine is None:
            engine = self._engine_obj = _engine.get_engine()
        return engine

    def _make_endpoint(self, url: str, dialer: bool, options: dict[str, Any]) -> Endpoint:
        self._check_open()
        if not isinstance(url, str):
            raise TypeError(f"address must be a str URL, not {type(url).__name__}")
        scheme, sep, _ = url.partition("://")
        if not sep or not scheme:
            raise AddressError(
                f"{url!r} is not a URL; expected scheme://address with a scheme among: "
                f"{', '.join(_transports.names())}"
            )
        transport = _transports.get(scheme)
        # A connect must fail now, not in its background dialer, on a bind-only address.
        if dialer:
            transport.check_dial_url(url)
        else:
            transport.check_url(url)
        check_protocol = getattr(transport, "check_protocol", None)
        if check_protocol is not None:  # a transport of another wire protocol (zmtp+tcp)
            check_protocol(self._core.name, self.raw, options)
            receive_multipart(self)  # from now on recv() looks for multipart messages
        priority = validate_priority("priority", options.pop("priority", 8))
        recv_priority = validate_priority("recv_priority", options.pop("recv_priority", 8))
        allowed = set(getattr(transport, "endpoint_options", ()))
        unknown = set(options) - allowed
        if unknown:
            raise TypeError(
                f"unknown endpoint option(s) {', '.join(sorted(unknown))} for {scheme}://; "
                f"accepted: priority, recv_priority{''.join(', ' + a for a in sorted(allowed))}"
            )
        return Endpoint(self, url, transport, dialer, priority, recv_priority, options)

    def bind(self, url: str, **options: Any) -> Endpoint:
        """Listen on ``url``; returns once listening.

        Args:
            url: ``scheme://address``, e.g. ``tcp://127.0.0.1:0`` (port 0: any free port).
            **options: endpoint options: ``priority``, ``recv_priority`` (1 = highest
                .. 16, default 8) and what the transport accepts (``ssl_context``).

        Returns:
            The :class:`Endpoint`; ``ep.url`` has the real port.

        Raises:
            AddressInUse: the address is taken.
            AddressError: unknown scheme or malformed URL.
            TypeError: an unknown endpoint option.
            Closed: the socket is closed.
        """
        ep = self._make_endpoint(url, False, options)
        if not self._tasks.reserve():
            raise self._driver.closed_error()
        self._engine.run(self._bind, ep)
        # A close() since the bind began has closed the listener (or will): say so.
        self._driver.feed(self._endpoints.append, ep)
        return ep

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
        ep = self._make_endpoint(url, True, options)
        self._driver.feed(self._endpoints.append, ep)
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

    def _forget_endpoint(self, ep: Endpoint) -> None:
        def forget() -> None:
            if ep in self._endpoints:
                self._endpoints.remove(ep)

        self._driver.feed(forget, check_open=False)

    def _pipe_context(self, ep: Endpoint) -> PipeContext:
        core = self._core
        opts = self._options
        return PipeContext(
            protocol_id=core.protocol_id,
            peer_id=core.peer_id,
            protocol_name=core.name,
            peer_name=core.peer_name,
            recv_max_size=opts.recv_max_size,
            handshake_timeout=opts.handshake_timeout,
            options={"tcp_nodelay": opts.tcp_nodelay, "dead_peer_timeout": opts.dead_peer_timeout, **ep.options},
        )

    # -- pipes (engine thread) -----------------------------------------------------
    async def _run_pipe(self, conn: Connection, ep: Endpoint) -> None:
        """Run one pipe until it ends (a task of the socket's pipes nursery)."""
        pipe = Pipe(_new_pipe_id(), conn.remote_address, ep)
        driver = PipeDriver(self._driver, self.name, conn, pipe, self._engine, self._note_protocol_error)
        try:
            if ep.closed:
                return  # its endpoint was closed during the handshake
            if not self._call_pipe_callbacks(self._added_callbacks, pipe, accept=True):
                log.info(
                    "%s: pipe %d from %s rejected: an on_pipe_added callback returned False",
                    self.name, pipe.id, pipe.remote_address or ep.url,
                )
                return
            info = PipeInfo(pipe.id, pipe, ep.priority, ep.recv_priority)
            if not self._driver.add_pipe(driver, info, self._options.send_buffer):
                return
            if ep.closed:
                driver.close_soon()  # Endpoint.close() swept its pipes before this one was added
            started = getattr(conn, "pipe_started", None)
            if started is not None:
                started(self._driver)  # a ZMTP SUB pipe tells its peer the subscriptions
            self._connects += 1
            self._notify_pipes_changed()
            try:
                await driver.run()
            finally:
                self._disconnects += 1
                requeued = self._driver.remove_pipe(pipe.id, driver.orphans)
                self._losses.pipe_ended(driver, requeued)
                self._notify_pipes_changed()
                self._call_pipe_callbacks(self._removed_callbacks, pipe, accept=False)
        finally:
            with trio.CancelScope(shield=True):
                await conn.aclose()

    def _notify_pipes_changed(self) -> None:
        with self._pipes_changed:
            self._pipes_changed.notify_all()

    def _call_pipe_callbacks(self, callbacks: list[Callable[[Pipe], Any]], pipe: Pipe, accept: bool) -> bool:
        for cb in list(callbacks):
            try:
                if cb(pipe) is False and accept:
                    return False
            except Exception:
                log.exception("%s: pipe callback %r failed", self.name, cb)
        return True

    def _note_protocol_error(self, pipe: Pipe | None, exc: BaseException, endpoint: Any = None) -> None:
        """Count a misbehaving peer; its endpoint logs it (rate-limited: docs/transports.md)."""
        self._protocol_errors += 1
        if isinstance(exc, MessageTooLarge):
            self._too_large += 1
            self._driver.count_drop(TOO_LARGE, 1, pipe.id if pipe is not None else None)
        where = f"pipe {pipe.id} ({pipe.remote_address})" if pipe else "a new connection"
        ep = pipe.endpoint if pipe is not None else endpoint
        if ep is not None:
            ep._log_protocol_error(where, exc)
        else:
            log.warning("%s: closing %s: %s", self.name, where, exc)

    def _count_reconnect(self) -> None:
        self._reconnects += 1

    # -- state checks ---------------------------------------------------------------
    def _check_open(self) -> None:
        self._driver.check_open()

    def _forked(self) -> None:
        """Called in a child process: the engine serving this socket is gone."""
        self._driver.forked()
        self._tasks.forked()

    @staticmethod
    def _timeout(timeout: Any, default: float | None) -> float | None:
        if timeout is _DEFAULT:
            return default
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise TypeError(f"timeout must be a number of seconds or None, not {type(timeout).__name__}")
            if timeout < 0:
                raise ValueError(f"timeout must be >= 0, got {timeout}")
        return float(timeout) if timeout is not None else None

    # -- sending and receiving -------------------------------------------------------
    def send(self, data: Any, *, timeout: float | None = _DEFAULT) -> None:
        """Send a message; returns once it is queued on a pipe.

        Args:
            data: bytes-like (``bytes``, ``bytearray``, ``memoryview``); ``str`` is refused.
            timeout: seconds to wait for room; ``None`` waits forever; ``0`` never
                waits. Defaults to the ``send_timeout`` option.

        On REP/RESPONDENT it answers the request the calling thread (or task)
        last received; on REQ each calling thread (or task) has its own request.

        Raises:
            Timeout: no room in time.
            Closed: the socket is closed.
            ProtocolError: the protocol cannot send (SUB, PULL) or not now.
            TypeError: ``data`` is not bytes-like.
        """
        if data.__class__ is not bytes:
            data = self._outgoing(data)
        if timeout is _DEFAULT:
            driver = self._driver
            lane = driver.lane
            if lane is not None and not driver.closed:
                # The send lane (nanopy/_driver.py) written out: its usual outcome
                # costs no further call.
                done = lane.transmit(data, None, None, True)
                if done == 0:
                    return
                if done > 0:
                    driver.credit(lane.pid, done)
                    return
            if driver.try_send(data, b""):
                return  # the fast path: one round, no waiting
        self._send(data, b"", timeout)

    def _send(self, body: bytes, header: bytes, timeout: Any) -> None:
        if timeout is not _DEFAULT:
            self._timeout(timeout, None)  # refuse a bad timeout whichever path runs
        driver = self._driver
        if driver.try_send(body, header):
            return
        timeout = self._timeout(timeout, self._options.send_timeout)
        driver.call(driver.send_attempt(body, header), driver.send_q, timeout, "send")

    def recv(self, *, timeout: float | None = _DEFAULT) -> bytes:
        """Receive the next message body.

        On REQ it returns the reply to the calling thread's (or task's) own request.

        Args:
            timeout: seconds to wait; ``None`` waits forever, ``0`` never waits.
                Defaults to the socket's ``recv_timeout`` option.

        Returns:
            The message body.

        Raises:
            Timeout: nothing arrived in time.
            Closed: the socket is closed.
            ProtocolError: the protocol cannot receive (PUB, PUSH) or not now.
        """
        if timeout is not _DEFAULT:
            self._timeout(timeout, None)  # refuse a bad timeout whichever path runs
        driver = self._driver
        run = driver.run
        if run and not driver.closed:
            try:
                return run.popleft()  # the rest of a run (nanopy/_driver.py): no lock, no call
            except IndexError:
                pass
        body = driver.try_recv_body()
        if body is None:
            timeout = self._timeout(timeout, self._options.recv_timeout)
            body = driver.call(driver.recv_body_attempt, driver.recv_q, timeout, "recv")
        return body

    def recv_msg(self, *, timeout: float | None = _DEFAULT) -> Message:
        """Receive the next message with its pipe (and header, on raw sockets).

        Args:
            timeout: seconds to wait; ``None`` waits forever, ``0`` never waits.
                Defaults to the socket's ``recv_timeout`` option.

        Returns:
            A :class:`Message`: ``body``, ``pipe``, ``header``; REP and RESPONDENT
            messages can be answered with ``msg.reply()``.

        Raises:
            Timeout: nothing arrived in time.
            Closed: the socket is closed.
            ProtocolError: the protocol cannot receive.
        """
        if timeout is not _DEFAULT:
            self._timeout(timeout, None)  # refuse a bad timeout whichever path runs
        driver = self._driver
        msg = driver.try_once(driver.recv_attempt)
        if not isinstance(msg, _Blocked):
            return msg
        timeout = self._timeout(timeout, self._options.recv_timeout)
        return driver.call(driver.recv_attempt, driver.recv_q, timeout, "recv")

    def recv_batch(self, max_messages: int, *, timeout: float | None = _DEFAULT) -> list[bytes]:
        """Receive up to ``max_messages`` message bodies in one call.

        Waits (as :meth:`recv`) for the first message, then takes whatever else is
        already queued, up to ``max_messages`` in all, under one lock round and
        without waiting again. Use it to drain a busy socket cheaply.

        Args:
            max_messages: the most bodies to return (at least 1).
            timeout: seconds to wait for the first message; ``None`` waits forever,
                ``0`` never waits. Defaults to the socket's ``recv_timeout`` option.

        Returns:
            One to ``max_messages`` message bodies, in arrival order.

        Raises:
            ValueError: ``max_messages`` < 1.
            Timeout: nothing arrived in time.
            Closed: the socket is closed.
            ProtocolError: the protocol cannot receive.
        """
        if max_messages < 1:
            raise ValueError(f"recv_batch: max_messages must be >= 1, got {max_messages}")
        out = [self.recv(timeout=timeout)]
        if max_messages > 1:
            self._recv_ready(out, max_messages - 1)
        return out

    async def arecv_batch(self, max_messages: int, *, timeout: float | None = _DEFAULT) -> list[bytes]:
        """Receive up to ``max_messages`` bodies in one call, from trio or asyncio.

        The async form of :meth:`recv_batch`; it is a checkpoint.

        Args:
            max_messages: the most bodies to return (at least 1).
            timeout: seconds to wait for the first message (see :meth:`recv_batch`).

        Returns:
            One to ``max_messages`` message bodies, in arrival order.

        Raises:
            ValueError: ``max_messages`` < 1.
            Timeout: nothing arrived in time.
            Closed: the socket is closed.
            ProtocolError: the protocol cannot receive.
        """
        if max_messages < 1:
            raise ValueError(f"arecv_batch: max_messages must be >= 1, got {max_messages}")
        out = [await self.arecv(timeout=timeout)]
        if max_messages > 1:
            self._recv_ready(out, max_messages - 1)
        return out

    def _recv_ready(self, out: list[bytes], limit: int) -> None:
        """Append up to ``limit`` queued bodies to ``out`` without waiting (one round)."""
        if self._driver.closed:
            return  # the caller keeps what it already has
        try:
            out.extend(self._driver.recv_bodies(limit))
        except Closed:
            pass

    async def asend(self, data: Any, *, timeout: float | None = _DEFAULT) -> None:
        """Async :meth:`send` (trio or asyncio); a checkpoint: if cancelled, it sends nothing.

        Args:
            data: bytes-like.
            timeout: seconds to wait; ``None`` waits forever, ``0`` never waits.
                Defaults to the socket's ``send_timeout`` option.

        Raises:
            Timeout: no room in time.
            Closed: the socket is closed.
            ProtocolError: the protocol cannot send.
        """
        if data.__class__ is not bytes:
            data = self._outgoing(data)
        await self._asend(data, b"", timeout)

    async def _asend(self, body: bytes, header: bytes, timeout: Any) -> None:
        if timeout is not _DEFAULT:
            self._timeout(timeout, None)  # refuse a bad timeout whichever path runs
        driver = self._driver
        # Fast path: the cancellation point, one round, the schedule point.
        trio_task = in_trio()
        await cancellation_point(trio_task)
        if driver.try_send(body, header):
            if trio_task:
                await cancel_shielded_checkpoint()
            return
        timeout = self._timeout(timeout, self._options.send_timeout)
        await driver.acall(driver.send_attempt(body, header), driver.send_q, timeout, "send")

    async def arecv(self, *, timeout: float | None = _DEFAULT) -> bytes:
        """Async :meth:`recv` (trio or asyncio); a checkpoint: if cancelled, it takes nothing.

        Args:
            timeout: seconds to wait; ``None`` waits forever, ``0`` never waits.
                Defaults to the socket's ``recv_timeout`` option.

        Returns:
            The message body.

        Raises:
            Timeout: nothing arrived in time.
            Closed: the socket is closed.
            ProtocolError: the protocol cannot receive.
        """
        if timeout is not _DEFAULT:
            self._timeout(timeout, None)  # refuse a bad timeout whichever path runs
        driver = self._driver
        # Fast path: the cancellation point, one round, the schedule point.
        trio_task = in_trio()
        await cancellation_point(trio_task)
        body = driver.try_recv_body()
        if body is not None:
            if trio_task:
                await cancel_shielded_checkpoint()
            return body
        timeout = self._timeout(timeout, self._options.recv_timeout)
        return await driver.acall(driver.recv_body_attempt, driver.recv_q, timeout, "recv")

    async def arecv_msg(self, *, timeout: float | None = _DEFAULT) -> Message:
        """Async :meth:`recv_msg` (trio or asyncio); a checkpoint: if cancelled, it takes nothing.

        Args:
            timeout: seconds to wait; ``None`` waits forever, ``0`` never waits.
                Defaults to the socket's ``recv_timeout`` option.

        Returns:
            A :class:`Message`.

        Raises:
            Timeout: nothing arrived in time.
            Closed: the socket is closed.
            ProtocolError: the protocol cannot receive.
        """
        timeout = self._timeout(timeout, self._options.recv_timeout)
        driver = self._driver
        return await driver.acall(driver.recv_attempt, driver.recv_q, timeout, "recv")

    # -- protocol conveniences ----------------------------------------------------------
    # Each delegates to an optional core method; a protocol without it raises
    # ProtocolError. REQ/REP and SURVEYOR methods live below (issue: protocols).
    def _core_method(self, name: str, what: str) -> Callable[..., Any]:
        method: Callable[..., Any] | None = getattr(self._core, name, None)
        if method is None:
            raise ProtocolError(f"{self.name}: {what} is not available on {self._core.name} sockets")
        return method

    def subscribe(self, topic: bytes | str) -> None:
        """SUB: receive messages that start with ``topic``.

        Args:
            topic: a prefix; ``b""`` matches everything. A ``str`` is UTF-8 encoded.
                Subscribing twice needs two unsubscribes.

        Raises:
            ProtocolError: not a cooked SUB socket.
            Closed: the socket is closed.
        """
        topic = topic.encode() if isinstance(topic, str) else as_bytes(topic)
        self._driver.feed(self._core_method("subscribe", "subscribe()"), topic)
        self._subscriptions_changed()

    def unsubscribe(self, topic: bytes | str) -> None:
        """SUB: drop one subscription to ``topic``.

        Args:
            topic: a prefix given to :meth:`subscribe` before.

        Raises:
            ValueError: not subscribed to ``topic``.
            ProtocolError: not a cooked SUB socket.
            Closed: the socket is closed.
        """
        topic = topic.encode() if isinstance(topic, str) else as_bytes(topic)
        self._driver.feed(self._core_method("unsubscribe", "unsubscribe()"), topic)
        self._subscriptions_changed()

    def _subscriptions_changed(self) -> None:
        """Pipes that forward subscriptions to the peer (ZMTP) hear of the change."""
        for driver in self._driver.pipe_drivers():
            changed = getattr(driver.conn, "subscriptions_changed", None)
            if changed is not None:
                changed(self._driver)

    def send_msg(self, msg: Message, *, timeout: float | None = _DEFAULT) -> None:
        """Send a :class:`Message`, header included: how devices forward on raw sockets.

        Args:
            msg: the message; on a cooked socket its header is ignored (the
                protocol makes its own).
            timeout: seconds to wait; ``None`` waits forever, ``0`` never waits.
                Defaults to the socket's ``send_timeout`` option.

        Raises:
            Timeout: no room in time.
            Closed: the socket is closed.
            ProtocolError: the protocol cannot send.
        """
        body = msg.body if msg.body.__class__ is bytes else self._outgoing(msg.body)
        self._send(body, msg.header if self.raw else b"", timeout)

    async def asend_msg(self, msg: Message, *, timeout: float | None = _DEFAULT) -> None:
        """Async :meth:`send_msg` (trio or asyncio).

        Args:
            msg: the message (header used on raw sockets only).
            timeout: seconds to wait; ``None`` waits forever, ``0`` never waits.
                Defaults to the socket's ``send_timeout`` option.

        Raises:
            Timeout: no room in time.
            Closed: the socket is closed.
        """
        body = msg.body if msg.body.__class__ is bytes else self._outgoing(msg.body)
        await self._asend(body, msg.header if self.raw else b"", timeout)

    async def _await_closed(self) -> None:
        """Wait (trio or asyncio) until this socket closes; raises :class:`Closed` then.

        Devices watch both of their sockets with it, so a pump blocked on one
        socket ends when the *other* one closes. ``close`` wakes every wait queue.
        """
        driver = self._driver

        def closing_queue() -> WaitQueue:
            queue = self._closing_q
            if queue is None:
                queue = self._closing_q = WaitQueue(_never)
                driver.queues.append(queue)
            return queue

        def attempt() -> None:
            raise WouldBlock

        await driver.acall(attempt, driver.feed(closing_queue), None, "wait for close")

    # -- observability -------------------------------------------------------------------
    def stats(self) -> SocketStats:
        """A snapshot of this socket's counters.

        ``dropped`` counts every message nanopy discarded and ``drops`` the same
        by reason (docs/metrics.md lists them); the counts add up exactly.
        ``stats()["dropped"]`` reads the same field as ``stats().dropped``.

        Returns:
            A frozen :class:`SocketStats`.
        """
        return socket_stats(self)

    def on_pipe_added(self, callback: Callable[[Pipe], Any]) -> None:
        """Call ``callback(pipe)`` on the engine thread for each new pipe.

        Args:
            callback: gets the new :class:`Pipe`; returning ``False`` rejects
                (closes) it before the protocol sees it, and the rejection is
                logged at INFO on the ``nanopy`` logger with the pipe's address.
                It must not block; exceptions are logged.
        """
        self._added_callbacks.append(callback)

    def on_pipe_removed(self, callback: Callable[[Pipe], Any]) -> None:
        """Call ``callback(pipe)`` on the engine thread when a pipe goes away.

        Args:
            callback: gets the departed :class:`Pipe`; it must not block.
        """
        self._removed_callbacks.append(callback)

    # -- closing -------------------------------------------------------------------------
    # Both halves of closing are in _close_start; nanopy/_lifecycle.py has the order.
    def close(self, linger: float | None = None) -> None:
        """Close the socket; idempotent and callable from any thread.

        Every blocked call on this socket raises :class:`Closed` at once. Then
        the listeners stop (their addresses are free), then the dialers; the
        messages queued on pipes get up to ``linger`` seconds to be written; then
        the pipes close. ``close`` returns once all of that is done, waiting at
        most ``linger`` + 2 s.

        Args:
            linger: seconds queued sends get to be written; defaults to the
                ``linger`` option, ``0`` closes at once.
        """
        self._close_start(linger)
        engine = self._engine_obj
        if engine is not None and engine.in_engine_thread():
            return  # from a pipe callback: the engine cannot wait for itself
        self._tasks.wait()

    async def aclose(self, linger: float | None = None) -> None:
        """Async :meth:`close`: waits (at most ``linger`` + 2 s) in the caller's trio or
        asyncio loop, without a worker thread. It is a checkpoint; cancelling it
        stops the wait only: the socket is closed, and its tasks end in the background.

        Args:
            linger: as for :meth:`close`.
        """
        self._close_start(linger)
        engine = self._engine_obj
        if self._tasks.finished or (engine is not None and engine.in_engine_thread()):
            # Nothing to wait for, or a pipe callback (the engine cannot wait for itself).
            await checkpoint_after(await checkpoint_before())
            return
        await self._tasks.await_finished()

    def _close_start(self, linger: float | None) -> None:
        """Closing, without the wait: the synchronous half (mark closed, close the
        core, wake every blocked call) here, then the asynchronous half started in
        the engine (listeners, dialers, flush within ``linger``, pipes). A second
        call changes nothing."""
        if linger is None:
            linger = self._options.linger
        if self._driver.close_core():
            for ep in list(self._endpoints):
                ep._closed = True
            self._endpoints.clear()
        self._tasks.shutdown(linger)

    async def _flush(self, timeout: float) -> None:
        """Engine side: wait up to ``timeout`` until every pipe has written what it queued."""
        with trio.move_on_after(timeout):
            for pipe in self._driver.pipe_drivers():
                await pipe.wait_flushed()

    def __enter__(self) -> Socket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Socket:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _never() -> bool:
    return False


_OPTION_NAMES = set()
for _name, _descriptor in make_descriptors().items():
    _descriptor.__set_name__(Socket, _name)
    setattr(Socket, _name, _descriptor)
    _OPTION_NAMES.add(_name)
# The options part of the docstring comes from the option table (nanopy/_options.py).
Socket.__doc__ = (Socket.__doc__ or "").rstrip() + "\n\n    " + docstring_section().replace("\n", "\n    ") + "\n"
