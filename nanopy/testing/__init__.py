"""Helpers for testing code that uses nanopy (and for nanopy's own tests).

* Addresses and waits for real sockets: :func:`ipc_url`, :func:`inproc_url`,
  :func:`local_url`, :func:`free_port`, :func:`wait_pipes`, :func:`wait_no_pipes`,
  :func:`connect_pair`, :func:`wait_for`.
* The transport conformance kit: :func:`check_transport` runs the checks
  nanopy's own transports pass against any registered scheme (a plug-in's too).
* Virtual time: :func:`engine_in_this_loop` runs nanopy's engine inside the
  current trio run, so ``trio.testing.MockClock`` governs every timer;
  :func:`fake_transport` installs :class:`FakeTransport` (``fake://``), an
  in-memory transport with controls (held writes, refused dials, stalled
  handshakes, cut connections, injected messages). See ``docs/testing.md``.
"""

from __future__ import annotations

import contextvars
import itertools
import math
import os
import tempfile
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import trio

from .. import transports
from ..core.errors import AddressError, AddressInUse, RemoteProtocolError
from ..engine import engine as _engine
from ..socket.socket import Socket
from ..transports import Connection, Listener, PipeContext, Transport
from .conformance import check_transport as check_transport
from .conformance import free_port as free_port
from .conformance import local_url as local_url
from .conformance import wait_for as wait_for

_counter = itertools.count()


def ipc_url(tag: str = "t") -> str:
    """A fresh ``ipc://`` URL in the temporary directory (short enough for sun_path)."""
    return f"ipc://{tempfile.gettempdir()}/np-{os.getpid()}-{tag}-{next(_counter)}.ipc"


def inproc_url(tag: str = "t") -> str:
    """A fresh, process-unique ``inproc://`` URL."""
    return f"inproc://{tag}-{os.getpid()}-{next(_counter)}"


def wait_pipes(sock: Socket, count: int = 1, timeout: float = 5.0) -> None:
    """Block until ``sock`` has at least ``count`` pipes (woken by pipe events, no polling).

    Raises:
        TimeoutError: the pipes did not come up in time.
    """
    _wait_for_pipes(sock, lambda n: n >= count, timeout, f"{count} pipe(s) not connected")


def wait_no_pipes(sock: Socket, timeout: float = 5.0) -> None:
    """Block until ``sock`` has no pipes."""
    _wait_for_pipes(sock, lambda n: n == 0, timeout, "pipes still connected")


def _wait_for_pipes(sock: Socket, done: Callable[[int], bool], timeout: float, what: str) -> None:
    with sock._pipes_changed:
        if not sock._pipes_changed.wait_for(lambda: done(len(sock._pipes)), timeout):
            raise TimeoutError(f"{sock!r}: {what} within {timeout}s")


def connect_pair(a: Socket, b: Socket, url: str, timeout: float = 5.0) -> None:
    """Bind ``a`` on ``url``, connect ``b`` to it and wait until both see the pipe."""
    ep = a.bind(url)
    b.connect(ep.url)
    wait_pipes(a, 1, timeout)
    wait_pipes(b, 1, timeout)


# -- an engine inside the test's own trio run -------------------------------------------
#
# The process engine runs in a thread with the real clock. For tests of timing
# (batching, timers, back-off, close) nanopy can instead run its engine tasks in
# the test's trio run, so that run's clock -- trio.testing.MockClock -- governs
# every timer, and trio.testing.wait_all_tasks_blocked() means "nanopy is idle".

_in_engine_task: contextvars.ContextVar[bool] = contextvars.ContextVar("nanopy_in_engine_task", default=False)


class LoopEngine(_engine.Engine):
    """An engine whose tasks run in the current trio run (see :func:`engine_in_this_loop`).

    "The engine thread" means the engine's own tasks here: the test's tasks are
    callers, as a user's thread or task would be. Blocking calls from the test's
    tasks cannot wait (the loop would stop); see :meth:`run`.
    """

    def __init__(self, nursery: trio.Nursery) -> None:  # no super().__init__: no thread
        self._token = self._loop_token = trio.lowlevel.current_trio_token()
        self._nursery = self._loop_nursery = nursery
        self.now = trio.lowlevel.current_clock().current_time
        self._stopped = False
        self.thread_id = threading.get_ident()

    def in_engine_thread(self) -> bool:
        return _in_engine_task.get()

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> bool:
        try:
            self._loop_token.run_sync_soon(_as_engine, fn, *args)
        except trio.RunFinishedError:
            return False
        return True

    def spawn(self, afn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        if threading.get_ident() == self.thread_id:
            self._loop_nursery.start_soon(_engine_task, afn, *args)
        else:
            self.call_soon(self._loop_nursery.start_soon, _engine_task, afn, *args)

    def run(self, afn: Callable[..., Awaitable[Any]], *args: Any, timeout: float | None = None) -> Any:
        """From another thread: as the real engine. From the loop's own thread (a
        blocking call such as ``bind`` made by the test): run ``afn`` at once, which
        works when it completes without waiting (binding ``fake://`` or ``inproc://``);
        if it would wait, unwind it and raise RuntimeError."""
        if threading.get_ident() != self.thread_id:
            return super().run(afn, *args, timeout=timeout)
        token = _in_engine_task.set(True)
        try:
            coro: Any = afn(*args)
            try:
                trap = coro.send(None)
            except StopIteration as done:
                return done.value
            _unwind(coro, trap)
        finally:
            _in_engine_task.reset(token)
        raise RuntimeError(
            f"{getattr(afn, '__name__', afn)}: this blocking nanopy call has to wait for the engine, "
            "which runs in the test's own trio loop (engine_in_this_loop): use the async form "
            "(aclose, asend, arecv...) or call it from a worker thread"
        )

    def forked(self) -> None:
        super().forked()
        self._loop_token = _engine._GONE

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._loop_nursery.cancel_scope.cancel()


def _as_engine(fn: Callable[..., Any], *args: Any) -> None:
    token = _in_engine_task.set(True)
    try:
        fn(*args)
    finally:
        _in_engine_task.reset(token)


async def _engine_task(afn: Callable[..., Awaitable[Any]], *args: Any) -> None:
    _in_engine_task.set(True)  # this task's own context (copied when it was spawned)
    await afn(*args)


def _unwind(coro: Any, trap: Any) -> None:
    """Abandon a coroutine that suspended outside a task, as trio unwinds a cancelled wait."""
    error = RuntimeError("abandoned: it would wait")
    while True:
        abort = getattr(trap, "abort_func", None)
        if abort is not None:
            abort(lambda: None)  # take it off whatever it waits on
        try:
            trap = coro.throw(error)
        except BaseException:  # noqa: BLE001 - the coroutine is gone, as intended
            return


@asynccontextmanager
async def engine_in_this_loop(close_timeout: float = 10.0) -> AsyncIterator[LoopEngine]:
    """Run nanopy's engine inside the current trio run, for deterministic tests.

    Sockets first used inside the block get a :class:`LoopEngine` whose dialers,
    listeners, pipes and timers are tasks of this run: under
    ``trio.testing.MockClock(autojump_threshold=0)`` every reconnect back-off,
    resend, survey deadline, linger and timeout happens in virtual time, and
    ``await trio.testing.wait_all_tasks_blocked()`` returns once nanopy is idle.
    Use the async API (``asend``, ``arecv``, ``aclose``...) from the test's tasks; a
    blocking call that has to wait for the engine raises RuntimeError there
    (``bind`` on ``fake://`` and ``connect`` never wait). On exit, sockets still
    open are closed (``aclose(linger=0)``) and the engine's tasks cancelled.
    See ``docs/testing.md``.
    """
    if _engine._test_engine is not None:
        raise RuntimeError("engine_in_this_loop() is already active")
    async with trio.open_nursery() as nursery:
        engine = LoopEngine(nursery)
        _engine._test_engine = engine
        try:
            yield engine
        finally:
            _engine._test_engine = None
            with trio.CancelScope(shield=True), trio.move_on_after(close_timeout):
                for sock in list(_engine._sockets):
                    if getattr(sock, "_engine_obj", None) is engine and not sock.closed:
                        await sock.aclose(linger=0)
            engine.stop()


# -- an in-memory transport with controls ------------------------------------------------


@dataclass(frozen=True)
class FakeEvent:
    """One thing that happened on a :class:`FakeTransport` (see ``FakeTransport.events``).

    Attributes:
        time: ``trio.current_time()`` when it happened.
        kind: ``"listen"``, ``"listener-closed"``, ``"dial"``, ``"refused"``,
            ``"accept"``, ``"handshake"``, ``"send"``, ``"close"`` or ``"cut"``.
        url: the address concerned.
        side: ``"dialer"`` or ``"listener"`` for connection events, else ``""``.
    """

    time: float
    kind: str
    url: str
    side: str = ""


class FakeConnection(Connection):
    """One end of an in-memory connection made by :class:`FakeTransport`.

    It implements the plug-in contract (``handshake``, ``send``, ``receive``,
    ``aclose``) and records what the engine does with it.

    Attributes:
        side: ``"dialer"`` or ``"listener"``.
        url: the address it was made for.
        peer: the other end.
        batches: every ``send`` call as ``(time, payloads)``: how the engine batched writes.
        closed: True once the engine (or a cut) closed it.
    """

    def __init__(self, transport: FakeTransport, url: str, ctx: PipeContext, side: str) -> None:
        self.transport = transport
        self.url = url
        self.ctx = ctx
        self.side = side
        self.remote_address = f"fake:{side}-peer"
        self.peer: FakeConnection = self
        self.batches: list[tuple[float, list[bytes]]] = []
        self.closed = False
        self._error: BaseException | None = None
        self._inbox: deque[bytes] = deque()
        self._changed = trio.Event()
        self._held = False
        self._when_drained: list[Callable[[], Any]] = []

    def __repr__(self) -> str:
        return f"<FakeConnection {self.side} {self.url}{' closed' if self.closed else ''}>"

    @property
    def payloads(self) -> list[bytes]:
        """Every payload written through this end, in order (SP header included)."""
        return [p for _, batch in self.batches for p in batch]

    # -- controls for the test ---------------------------------------------------------------
    def hold(self) -> None:
        """Make ``send`` wait (a full socket buffer) until :meth:`release`."""
        self._held = True

    def release(self) -> None:
        """Let held and later writes through."""
        self._held = False
        self._wake()

    def inject(self, *payloads: bytes) -> None:
        """Make this end receive ``payloads`` as if the peer had written them."""
        self._inbox.extend(payloads)
        self._wake()

    def call_when_drained(self, fn: Callable[[], Any]) -> None:
        """Call ``fn()`` once, the next time the engine has taken everything this end
        received and asks for more: the moment after a delivery, before the tasks it
        woke have run (to cancel a woken waiter, for example)."""
        self._when_drained.append(fn)

    def cut(self, error: BaseException | None = None) -> None:
        """Break the connection: both ends' ``send`` and ``receive`` raise ``error``
        (a ConnectionResetError by default), as a network failure would."""
        failure = error or ConnectionResetError(f"fake: connection to {self.url} cut")
        self.transport._record("cut", self.url, self.side)
        for end in (self, self.peer):
            end._error = failure
            end._wake()

    # -- the plug-in contract ------------------------------------------------------------------
    async def handshake(self) -> None:
        if self.url in self.transport._stalled:
            await trio.sleep_forever()  # a peer that never answers: the engine's timeout ends it
        peer_ctx = self.peer.ctx
        if peer_ctx.protocol_id != self.ctx.peer_id:
            raise RemoteProtocolError(f"fake: peer speaks protocol {peer_ctx.protocol_id}, expected {self.ctx.peer_id}")
        self.transport._record("handshake", self.url, self.side)
        await trio.lowlevel.checkpoint()

    async def send(self, payloads: list[bytes]) -> None:
        while self._held and self._error is None and not self.closed:
            await self._wait()
        self._check()
        if payloads:
            batch = list(payloads)
            self.batches.append((trio.current_time(), batch))
            self.transport._record("send", self.url, self.side)
            self.peer._inbox.extend(batch)
            self.peer._wake()
        await trio.lowlevel.checkpoint()

    async def receive(self) -> list[bytes]:
        while True:
            if self._inbox:
                out = list(self._inbox)
                self._inbox.clear()
                await trio.lowlevel.checkpoint()
                return out
            self._check()
            if self.peer.closed:
                raise EOFError(f"fake: peer closed {self.url}")
            callbacks, self._when_drained = self._when_drained, []
            for fn in callbacks:
                fn()
            await self._wait()

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport._record("close", self.url, self.side)
            self._wake()
            self.peer._wake()

    # -- internals -------------------------------------------------------------------------------
    def _check(self) -> None:
        if self._error is not None:
            raise self._error
        if self.closed:
            raise trio.ClosedResourceError(f"fake: {self.url} closed")

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _wait(self) -> None:
        await self._changed.wait()


class FakeListener(Listener):
    """A bound ``fake://`` address (made by ``Socket.bind``)."""

    def __init__(self, transport: FakeTransport, url: str, ctx: PipeContext) -> None:
        self.transport = transport
        self.url = url
        self.ctx = ctx
        self.closed = False
        self._send, self._recv = trio.open_memory_channel[FakeConnection](math.inf)

    def update_context(self, ctx: PipeContext) -> None:
        self.ctx = ctx

    async def accept(self) -> Connection:
        try:
            conn = await self._recv.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise OSError(f"fake: listener {self.url} closed") from None
        self.transport._record("accept", self.url, "listener")
        return conn

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.transport._unlisten(self)
        self._send.close()
        while True:  # connections never accepted: their dialers see the end
            try:
                conn = self._recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            await conn.aclose()
        self._recv.close()


class FakeTransport(Transport):
    """An in-memory transport for engine tests: ``fake://NAME`` addresses.

    Connections carry whole payloads between sockets of this process, in the
    current trio run (use it inside :func:`engine_in_this_loop`). Install it with
    :func:`fake_transport`. Controls: :meth:`refuse` / :meth:`accept_dials` (drive
    reconnect back-off), :meth:`stall_handshakes` (a peer that never answers),
    ``FakeConnection.hold`` / ``release`` (a peer that does not read), ``cut`` (a
    network failure) and ``inject`` (crafted wire messages).

    Attributes:
        events: every :class:`FakeEvent`, in order.
        connections: every connection end made (dialer end, then listener end).
    """

    schemes = ("fake",)

    def __init__(self, scheme: str = "fake") -> None:
        self.scheme = scheme
        self.schemes = (scheme,)
        self.events: list[FakeEvent] = []
        self.connections: list[FakeConnection] = []
        self._listeners: dict[str, FakeListener] = {}
        self._refused: set[str] = set()
        self._stalled: set[str] = set()

    # -- controls and observations --------------------------------------------------------------
    def refuse(self, url: str) -> None:
        """Refuse every dial to ``url`` (even while it is bound) until :meth:`accept_dials`."""
        self._refused.add(url)

    def accept_dials(self, url: str) -> None:
        """Undo :meth:`refuse`."""
        self._refused.discard(url)

    def stall_handshakes(self, url: str, stall: bool = True) -> None:
        """Connections to ``url`` made from now on never finish their handshake
        (both ends wait until the engine's ``handshake_timeout``); ``stall=False`` undoes it."""
        if stall:
            self._stalled.add(url)
        else:
            self._stalled.discard(url)

    def times(self, kind: str, url: str | None = None, side: str | None = None) -> list[float]:
        """When each event of ``kind`` (for ``url``, on ``side``) happened."""
        return [
            e.time
            for e in self.events
            if e.kind == kind and (url is None or e.url == url) and (side is None or e.side == side)
        ]

    def ends(self, url: str | None = None, side: str | None = None) -> list[FakeConnection]:
        """The connection ends made for ``url`` on ``side`` (``"dialer"``/``"listener"``)."""
        return [c for c in self.connections if (url is None or c.url == url) and (side is None or c.side == side)]

    # -- the plug-in contract -------------------------------------------------------------------
    def check_url(self, url: str) -> None:
        if not url.startswith(f"{self.scheme}://") or len(url) == len(self.scheme) + 3:
            raise AddressError(f"{url!r}: expected {self.scheme}://NAME")

    async def listen(self, url: str, ctx: PipeContext) -> Listener:
        if url in self._listeners:
            raise AddressInUse(f"fake: {url} is bound already")
        listener = self._listeners[url] = FakeListener(self, url, ctx)
        self._record("listen", url)
        return listener

    async def dial(self, url: str, ctx: PipeContext) -> Connection:
        self._record("dial", url, "dialer")
        listener = self._listeners.get(url)
        if listener is None or url in self._refused:
            self._record("refused", url, "dialer")
            raise ConnectionRefusedError(f"fake: {url} refused the connection")
        mine = FakeConnection(self, url, ctx, "dialer")
        theirs = FakeConnection(self, url, listener.ctx, "listener")
        mine.peer, theirs.peer = theirs, mine
        self.connections += [mine, theirs]
        listener._send.send_nowait(theirs)
        await trio.lowlevel.checkpoint()
        return mine

    # -- internals -------------------------------------------------------------------------------
    def _record(self, kind: str, url: str, side: str = "") -> None:
        self.events.append(FakeEvent(trio.current_time(), kind, url, side))

    def _unlisten(self, listener: FakeListener) -> None:
        if self._listeners.get(listener.url) is listener:
            del self._listeners[listener.url]
        self._record("listener-closed", listener.url)


@contextmanager
def fake_transport(scheme: str = "fake") -> Iterator[FakeTransport]:
    """Register a fresh :class:`FakeTransport` for ``scheme://`` URLs for the block
    (through the public registry, ``nanopy.transports.register``)."""
    transport = FakeTransport(scheme)
    transports.register(scheme, transport, override=True)
    try:
        yield transport
    finally:
        transports.unregister(scheme)
