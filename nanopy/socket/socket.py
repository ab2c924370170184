"""The public :class:`Socket`: thread-safe and context-free.

Concurrency model: all protocol state lives in the socket's Sans-I/O core, owned
by its :class:`~nanopy.driver.socket_driver.SocketDriver` -- the only code that takes the socket
lock. User threads and tasks (``send``/``recv``) and the engine thread (pipes,
timers) feed the core through the driver. Calls that can complete do so on the
caller's thread without any trio hop; calls that cannot park a waiter (a plain lock
for a thread, an event for a trio or asyncio task) that the driver wakes. Actions
the core emits are carried out after the lock is released, so two sockets never
hold each other's locks.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable
from typing import Any

from ..core.base import Core
from ..core.operations import Operations
from ..core.options import OptionAttributes, Options, docstring_section, make_descriptors, new_options
from ..core.stats import SocketStats
from ..driver.socket_driver import SocketDriver
from ..engine import engine as _engine
from ..pipe.driver import PipeDriver
from ..protocols._registry import protocols as _protocols
from . import series as _series
from .batch import Batches, BatchSending
from .closing import Closing
from .endpoint import Endpoint
from .lifecycle import SocketTasks
from .messaging import Messaging
from .multipart import MultipartMixin
from .observe import PipeList, socket_stats
from .pipes import PipeHost, PipeHosting
from .poller import Pollable
from .requests import RequestMethods, Requests
from .util import ClosingContext, async_twin_of

_socket_serials = itertools.count(1)  # (next() on a count is atomic under the GIL)


def _as_list(value: str | Iterable[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


def _assemble(sock: Socket, protocol: str, raw: bool, options: dict[str, Any]) -> None:
    """Make ``sock``'s state and parts, in the order they need each other."""
    if not isinstance(protocol, str):
        raise TypeError(f"protocol must be a name such as 'req', not {type(protocol).__name__}")
    core_cls = _protocols.get(protocol)
    # Options check protocol-specific values against it (overflow): the raw form
    # of REQ, REP, SURVEYOR and RESPONDENT is a core of its own.
    sock._core_cls = vars(core_cls).get("raw_class", core_cls) if raw else core_cls
    sock._options = new_options(protocol)
    sock._engine_obj = None
    # Metrics: a socket's series is its name (nanopy/socket/series.py); the serial keys it there.
    sock._serial = next(_socket_serials)
    sock._named = False
    for key, value in options.items():
        if key not in _OPTION_NAMES:
            raise TypeError(f"unknown socket option {key!r}; options are: {', '.join(sorted(_OPTION_NAMES))}")
        setattr(sock, key, value)

    def engine() -> _engine.Engine:
        return sock._engine  # (started on first use)

    def running_engine() -> _engine.Engine | None:
        return sock._engine_obj  # (None: never started)

    driver = sock._driver = SocketDriver(core_cls(sock._options, raw=raw), sock._get_name, engine)
    sock._ops = Operations(driver.core, raw, driver.core.name, sock._get_name)
    # Every engine task of this socket runs in this tree (nanopy/socket/lifecycle.py).
    tasks = sock._tasks = SocketTasks(sock._get_name, engine, lambda: list(driver.pipe_drivers()))
    driver.spawn_task = tasks.start_task
    tasks.on_finished = lambda: _series.leave(sock)  # (its counts stay in its series)
    sock.raw = raw
    host = sock._host = PipeHost(sock, driver, tasks, engine, running_engine)
    sock._closing = Closing(sock, driver, tasks, host, sock._options, engine, running_engine)
    sock._batches = Batches(driver, sock._options, raw, sock._outgoing)
    sock._requests = Requests(driver, sock._ops, sock._options, sock._outgoing)
    _engine.track_socket(sock)
    _series.join(sock)


def _open_endpoints(sock: Socket, bind: str | Iterable[str] | None, connect: str | Iterable[str] | None) -> None:
    """The binds and connects given to the constructor; a failure closes ``sock``."""
    try:
        for url in _as_list(bind):
            sock.bind(url)
        for url in _as_list(connect):
            sock.connect(url)
    except BaseException:
        sock.close(linger=0)
        raise


#: the options a listener's pipe context carries (a change reaches the listeners)
_CONTEXT_OPTIONS = ("recv_max_size", "tcp_nodelay", "handshake_timeout", "dead_peer_timeout",
                    "kernel_unsent_max", "kernel_send_buffer", "kernel_recv_buffer")


class Socket(
    Messaging, BatchSending, PipeHosting, RequestMethods, MultipartMixin, Pollable, OptionAttributes, ClosingContext
):
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

    # The parts a socket is made of (nanopy/socket/: each owns its own state).
    _driver: SocketDriver  # the protocol core and every wait on it (the only lock taker)
    _ops: Operations  # what the core offers beyond send/recv, looked up once
    _tasks: SocketTasks  # its engine task tree (nanopy/socket/lifecycle.py)
    _host: PipeHost  # endpoints, pipes and connection counters (pipes.py)
    _closing: Closing  # close, flush, the fork and exit hooks (closing.py)
    _batches: Batches  # send_batch (batch.py)
    _requests: Requests  # request, survey, replies (requests.py)
    _options: Options
    _core_cls: type[Core]
    _engine_obj: _engine.Engine | None
    _serial: int
    _named: bool
    raw: bool

    def __init__(
        self,
        protocol: str,
        *,
        raw: bool = False,
        bind: str | Iterable[str] | None = None,
        connect: str | Iterable[str] | None = None,
        **options: Any,
    ) -> None:
        _assemble(self, protocol, raw, options)
        _open_endpoints(self, bind, connect)

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
        return list(self._host.endpoints)

    @property
    def pipes(self) -> PipeList:
        """The currently connected pipes; ``sock.pipes()`` gives a snapshot of each.

        A list of :class:`Pipe` objects that may also be called: ``sock.pipes()``
        returns one :class:`PipeStats` per pipe (id, remote address, transport,
        priorities, queued messages each way, messages and bytes each way, drops,
        connected since).
        """
        return PipeList(d.pipe for d in list(self._pipes.values()))

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
            _series.renamed(self)
        if name in _CONTEXT_OPTIONS and hasattr(self, "_host"):  # (not while __init__ sets options)
            self._host.update_contexts()

    # -- state checks ---------------------------------------------------------------
    def _check_open(self) -> None:
        self._driver.check_open()

    def _forked(self) -> None:
        """Called in a forked child (nanopy/_fork.py): the engine serving this socket is
        gone. Closed at once, nobody woken (every waiter is a parent's thread or loop):
        calls raise ``Closed`` naming the fork."""
        self._closing.forked()

    @property
    def _engine(self) -> _engine.Engine:
        """The engine serving this socket, started on first use."""
        engine = self._engine_obj
        if engine is None:
            engine = self._engine_obj = _engine.get_engine()
        return engine

    @property
    def _pipes_changed(self) -> threading.Condition:
        """Notified when a pipe comes or goes, and at close (nanopy.testing waits on it)."""
        return self._host.pipes_changed

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

    # -- closing -------------------------------------------------------------------------
    # Both halves of closing start in Closing.start (closing.py); lifecycle.py has the order.
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
        self._closing.close(linger)

    async def aclose(self, linger: float | None = None) -> None:
        """Async :meth:`close`: waits (at most ``linger`` + 2 s) in the caller's trio or
        asyncio loop, without a worker thread. It is a checkpoint; cancelling it
        stops the wait only: the socket is closed, and its tasks end in the background.

        Args:
            linger: as for :meth:`close`.
        """
        await self._closing.aclose(linger)

    def _close_start(self, linger: float | None) -> None:
        """Closing without the wait (the engine's exit hook closes every socket so)."""
        self._closing.start(linger)

    # -- flushing ------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> None:
        """Block until every message queued on this socket's pipes is written to its connection.

        The same wait ``close()`` gives queued messages within ``linger``, without
        closing: what it covers and what it does not is in docs/api.md, "Flushing".
        A message is written once the transport took it (tcp, ipc, ws, wss, tls,
        zmtp: the kernel's send buffer; inproc: the peer's receive queue); this says
        nothing about the peer having read it. Messages the protocol holds for lack
        of a peer, and pipes that connect meanwhile, are not waited for; a pipe that
        closes counts as flushed (its unwritten messages went back to the socket or
        were dropped, as ``stats()`` counts).

        Args:
            timeout: seconds to wait at most; ``None`` waits until written, ``0``
                only checks.

        Raises:
            Timeout: messages were still queued when ``timeout`` ran out.
            Closed: the socket is closed.
            RuntimeError: called on the engine thread (from a pipe callback).
            ValueError: a negative ``timeout``.
            TypeError: a ``timeout`` that is not a number.
        """
        self._closing.flush(timeout)

    @async_twin_of(flush)
    async def aflush(self, timeout: float | None = None) -> None:
        """Async :meth:`flush` for trio and asyncio tasks: the wait runs in a worker
        thread of the caller's loop. Cancelling it stops the wait, not the writes."""
        await self._closing.aflush(timeout)

    async def _await_closed(self) -> None:
        """Wait (trio or asyncio) until this socket closes; raises Closed then (devices)."""
        await self._closing.await_closed()


_OPTION_NAMES = set()
for _name, _descriptor in make_descriptors().items():
    _descriptor.__set_name__(Socket, _name)
    setattr(Socket, _name, _descriptor)
    _OPTION_NAMES.add(_name)
# The options part of the docstring comes from the option table (nanopy/core/options.py).
Socket.__doc__ = (Socket.__doc__ or "").rstrip() + "\n\n    " + docstring_section().replace("\n", "\n    ") + "\n"
