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
import logging
import math
import threading
from collections.abc import Callable, Iterable
from typing import Any

import trio

from ..core.base import Core
from ..core.errors import Timeout
from ..core.message import Pipe
from ..core.operations import Operations
from ..core.options import OptionAttributes, docstring_section, make_descriptors, new_options
from ..core.stats import PipeLosses, SocketStats
from ..driver.socket_driver import SocketDriver, checkpoint_after, checkpoint_before
from ..driver.waiters import WaitQueue
from ..engine import engine as _engine
from ..pipe.driver import PipeDriver
from ..protocols._registry import protocols as _protocols
from . import series as _series
from .batch import Batches, BatchSending
from .endpoint import Endpoint
from .lifecycle import SocketTasks
from .messaging import Messaging
from .multipart import MultipartMixin
from .observe import PipeList, socket_stats
from .pipes import PipeHosting
from .poller import Pollable
from .requests import RequestMethods, Requests
from .util import ClosingContext, async_twin_of, run_in_worker_thread

log = logging.getLogger("nanopy")


_socket_serials = itertools.count(1)  # (next() on a count is atomic under the GIL)


def _as_list(value: str | Iterable[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


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
        # Options check protocol-specific values against it (overflow): the raw form
        # of REQ, REP, SURVEYOR and RESPONDENT is a core of its own.
        self._core_cls = vars(core_cls).get("raw_class", core_cls) if raw else core_cls
        self._options = new_options(protocol)
        self._engine_obj: _engine.Engine | None = None
        self._endpoints: list[Endpoint] = []
        self._added_callbacks: list[Callable[[Pipe], Any]] = []
        self._removed_callbacks: list[Callable[[Pipe], Any]] = []
        self._pipes_changed = threading.Condition(threading.Lock())  # wait_for_pipes, nanopy.testing
        # counters (stats) kept outside the core's rounds
        self._connects = self._disconnects = 0
        self._losses = PipeLosses()
        self._reconnects = self._protocol_errors = self._too_large = 0
        self._dial_failures = self._handshake_failures = self._auth_failures = self._reconnected = 0
        # Metrics: a socket's series is its name (nanopy/socket/series.py); the serial keys it there.
        self._serial = next(_socket_serials)
        self._named = False
        for key, value in options.items():
            if key not in _OPTION_NAMES:
                raise TypeError(f"unknown socket option {key!r}; options are: {', '.join(sorted(_OPTION_NAMES))}")
            setattr(self, key, value)
        self._driver = SocketDriver(core_cls(self._options, raw=raw), self._get_name, lambda: self._engine)
        # What the core offers beyond send/recv, looked up once (nanopy/core/operations.py).
        self._ops = Operations(self._driver.core, raw, self._driver.core.name, self._get_name)
        self._batches = Batches(self._driver, self._options, raw, self._outgoing)
        self._requests = Requests(self._driver, self._ops, self._options, self._outgoing)
        # Every engine task of this socket runs in this tree (nanopy/socket/lifecycle.py).
        self._tasks = SocketTasks(self._get_name, lambda: self._engine, lambda: list(self._driver.pipe_drivers()))
        self._driver.spawn_task = self._tasks.start_task
        self._tasks.on_finished = lambda: _series.leave(self)  # (its counts stay in its series)
        self.raw = raw
        self._closing_q: WaitQueue | None = None  # made by the first _await_closed
        _engine.track_socket(self)
        _series.join(self)
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
        if name in ("recv_max_size", "tcp_nodelay", "handshake_timeout", "dead_peer_timeout"):
            # Listeners made their context at bind time; pipes accepted from now
            # on must see the new value (dialers build a context per dial).
            for ep in list(getattr(self, "_endpoints", ())):
                listener = ep._listener
                if listener is not None:
                    listener.update_context(self._pipe_context(ep))

    # -- state checks ---------------------------------------------------------------
    def _check_open(self) -> None:
        self._driver.check_open()

    def _forked(self) -> None:
        """Called in a forked child (nanopy/_fork.py): the engine serving this socket is
        gone. Closed at once, nobody woken (every waiter is a parent's thread or loop):
        calls raise ``Closed`` naming the fork."""
        self._driver.forked()
        self._tasks.forked()
        self._pipes_changed = threading.Condition(threading.Lock())
        if self._closing_q is not None:
            self._closing_q.forget_all()
        for ep in self._endpoints:
            ep._closed = True
        self._endpoints.clear()

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
    # Both halves of closing are in _close_start; nanopy/socket/lifecycle.py has the order.
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
            self._notify_pipes_changed()  # (wait_for_pipes raises Closed)
        self._tasks.shutdown(linger)

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
        timeout = self._timeout(timeout, None)
        self._check_open()
        self._refuse_engine_thread("flush")
        if self._written():
            return
        if timeout == 0 or not self._engine.run(self._await_written, timeout):
            raise Timeout(self._still_queued(timeout))

    @async_twin_of(flush)
    async def aflush(self, timeout: float | None = None) -> None:
        """Async :meth:`flush` for trio and asyncio tasks: the wait runs in a worker
        thread of the caller's loop. Cancelling it stops the wait, not the writes."""
        timeout = self._timeout(timeout, None)
        self._check_open()
        if self._written():
            await checkpoint_after(await checkpoint_before())
            return
        if timeout == 0 or not await run_in_worker_thread(self._engine.run, self._await_written, timeout):
            raise Timeout(self._still_queued(timeout))

    def _written(self) -> bool:
        return all(pipe.flushed() for pipe in self._driver.pipe_drivers())

    def _still_queued(self, timeout: float | None) -> str:
        return (f"{self!r}: {self._driver.queued_out()} message(s) still queued after {timeout}s; "
                "a peer is not reading (see stats().queued_out and pipes())")

    async def _await_written(self, timeout: float | None) -> bool:
        """Engine side of :meth:`flush`: True once the pipes of the call's time wrote all."""
        with trio.move_on_after(math.inf if timeout is None else timeout):
            for pipe in self._driver.pipe_drivers():
                await pipe.wait_flushed()
            return True
        return False

_OPTION_NAMES = set()
for _name, _descriptor in make_descriptors().items():
    _descriptor.__set_name__(Socket, _name)
    setattr(Socket, _name, _descriptor)
    _OPTION_NAMES.add(_name)
# The options part of the docstring comes from the option table (nanopy/core/options.py).
Socket.__doc__ = (Socket.__doc__ or "").rstrip() + "\n\n    " + docstring_section().replace("\n", "\n    ") + "\n"
