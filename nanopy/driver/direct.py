"""The direct read: a receiver reads the socket's only pipe in its own thread.

Owns: the socket's :class:`~nanopy.platform.Waker` (``_waker_box``), the
:class:`~nanopy.platform.ReadyWait` of the read role's holder (``_wait_cache``),
the count of direct receivers, and the loop of a direct receive
(:meth:`DirectRead._direct_steps`), shared by threads (blocking in the wait) and
trio/asyncio tasks (waiting in their own loop on the wait's descriptors). Both
come from nanopy.platform: an eventfd and an epoll descriptor on Linux, a socket
pair and a selector with the portable backend (docs/architecture.md, "The
platform layer").

May call: the round (:class:`~nanopy.driver.round.Round`: ``_direct_round`` is a round
that feeds what was read and tries the attempt), the pipe's read role
(``pipe.reader``, a ``ReadRole`` of nanopy/_seam.py:
``take_role``/``release_role``/``read_lock``/``direct_failed``/``count_delivery``) and
its connection's ``read_nowait``/``fileno``; nanopy.platform's ``new_waker`` and ``ready_wait``.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import trio

from .. import platform
from .._seam import PipeT
from ..core.errors import MessageTooLarge, RemoteProtocolError, WouldBlock
from .round import BLOCKED, _Blocked
from .waiters import WaitQueue

if TYPE_CHECKING:
    from .._seam import ReadConnection, ReadRole
    from ..platform import ReadyWait, Waker
    from .round import Round
    from .runs import ReceiveRuns

T = TypeVar("T")

# What one direct read found besides messages (see DirectRead._direct_read).
_NOTHING = object()
_PARTIAL = object()
_FAILED = object()
_UNREAD = object()  # (no read made yet whose outcome the loop has not taken)
# The end of a direct receive's loop, as ``next(steps, _DONE)`` reports it.
_DONE: Any = object()


class DirectRead(Generic[PipeT]):
    """The direct receive (see the module docstring)."""

    def __init__(self, driver: Round[PipeT], runs: ReceiveRuns) -> None:
        """``runs``: the receive runs part (nanopy/driver/runs.py), whose body pop (an
        attempt) a round may spare when it would raise WouldBlock (nothing ready,
        nothing held, no run: ``ReceiveRuns.nothing_queued``), and the core's
        ``hand_over``: what
        was read goes straight to the caller when the core can tell it is the one
        message (see :meth:`_direct_round`)."""
        self.round = driver  # the lock, the core, the wait queues and the round's calls
        self._pop_attempt = runs.recv_body_attempt
        self._nothing_queued = runs.nothing_queued  # (the pop's exact WouldBlock test)
        self._held = runs.held
        self._hand = driver.core.hand_over  # (None: the core has no such step)
        self._waker_box: list[Waker | None] = [None]  # wakes a thread (or task) that reads a pipe directly
        self.users = 0  # threads and tasks inside a direct receive
        self._wait_cache: tuple[int, ReadyWait] | None = None  # (pid, its wait) of the direct reader
        # The engine's "is this its thread?" (a socket's engine never changes): asked
        # once per receive, looked up once (see _in_engine_first).
        self._in_engine: Callable[[], bool] = self._in_engine_first

    def _in_engine_first(self) -> bool:
        """The first engine-thread check: binds the engine's own for the next ones."""
        check = self._in_engine = self.round._engine().in_engine_thread
        return check()

    # -- direct receive -----------------------------------------------------------------
    def _waker(self) -> Waker:
        """The waker of a thread receiving directly (lock held; made once)."""
        box = self._waker_box
        waker = box[0]
        if waker is None:
            waker = box[0] = _new_waker()
            weakref.finalize(self, _close_waker_box, box)
        return waker

    def recv(self, attempt: Callable[[], T], deadline: float | None) -> T | _Blocked:
        """Receive on the socket's only pipe by reading it from this thread.

        Runs :meth:`_direct_steps`, blocking in the platform's ready wait (the
        connection and the waker) whenever they must wait. Returns BLOCKED when
        the read role is not available or the pipe stops being readable here; the
        caller then waits the ordinary way.
        """
        begun = self._direct_begin(attempt, deadline)
        if begun is None:
            return BLOCKED
        reader, state = begun
        steps = None
        try:
            ready = self._direct_wait(reader.pid, reader.direct_conn, state.waker)
            first: Any = _UNREAD
            if state.peeked and state.waiter is None:
                # _direct_begin's look found bytes (a round trip's reply is often there
                # when its caller receives): the steps' first read, made here, and its
                # result returned without making the loop (one call fewer); anything
                # else goes on in the loop as if it had read it.
                first = self._direct_read(reader, state, attempt)
                if first is _FAILED:
                    return BLOCKED
                if first is not _NOTHING and first is not _PARTIAL and first is not BLOCKED:
                    return first  # type: ignore[no-any-return]
            steps = self._direct_steps(reader, state, attempt, ready, first)
            # (next with a default: the loop's end raises no StopIteration here)
            left = next(steps, _DONE)
            if left is not _DONE:
                if ready is None:
                    return BLOCKED
                wait = ready.wait
                while left is not _DONE:
                    wait(left)
                    left = next(steps, _DONE)
            return state.result  # type: ignore[no-any-return]
        finally:
            if steps is not None:
                steps.close()
            self._direct_end(reader, state)

    async def arecv(
        self,
        attempt: Callable[[], T],
        deadline: float | None,
        wait: Callable[[tuple[int, ...], float | None], Awaitable[None]],
    ) -> tuple[T | _Blocked, bool]:
        """The async twin of :meth:`recv`: this task reads the socket's only pipe.

        A trio task (of a loop other than the engine's) or an asyncio task runs
        :meth:`_direct_steps` in its own thread, so the bytes reach it without the
        engine thread, a GIL hand-over or a cross-thread wake. It waits in its own
        loop (``wait``: trio's ``wait_readable``, asyncio's ``add_reader``) on the
        ready wait's descriptors (Linux: one epoll descriptor), so a wake (close,
        a message handed in by another path, the pipe ending) interrupts it
        exactly as it does a thread.
        Returns ``(result, waited)``; ``waited`` says whether the task yielded
        (then the call already had its schedule point). A cancellation can only
        arrive in that wait, before the attempt succeeded: the call took nothing.
        """
        begun = self._direct_begin(attempt, deadline)
        if begun is None:
            return BLOCKED, False
        reader, state = begun
        steps = None
        waited = False
        try:
            ready = self._direct_wait(reader.pid, reader.direct_conn, state.waker)
            steps = self._direct_steps(reader, state, attempt, ready)
            left = next(steps, _DONE)
            if left is not _DONE:
                if ready is None:
                    return BLOCKED, waited
                while left is not _DONE:
                    waited = True
                    await wait(ready.fds, left)
                    left = next(steps, _DONE)
            return state.result, waited
        finally:
            if steps is not None:
                steps.close()
            self._direct_end(reader, state)

    def _direct_begin(self, attempt: Callable[[], Any], deadline: float | None) -> tuple[ReadRole, _DirectState] | None:
        """Take the read role of the socket's only pipe (see nanopy/pipe/driver.py) for a
        direct receive; None when that is not possible now.

        An idle receive (the body pop, with nothing queued and no action pending
        once the credit due is folded) parks its waiter in this same round: the first round of
        :meth:`_direct_steps` would only have found the attempt blocked, drained
        nothing and parked it (one lock round fewer per idle receive)."""
        r = self.round
        if r.recv_q.waiters or type(r.recv_q) is not WaitQueue or self._in_engine():
            return None  # (other receivers waiting: the engine shares messages out fairly)
        try:
            (pipe,) = r.pipes.values()
        except ValueError:  # the pipe went (or another came) meanwhile
            return None
        reader = pipe.reader
        if not reader.direct:
            return None
        with r.lock:
            if r.closed:
                raise r.closed_error()
            waker = self._waker_box[0]
            if waker is None:
                waker = self._waker()
            self.users += 1
            # (the state's fields set here: _DirectState has no __init__ to call, one
            # call fewer per direct receive; the rest start at the class's defaults)
            state = _DirectState()
            state.pid = pipe.pid
            state.waker = waker
            state.deadline = deadline
            if r._due:
                # The credit of this caller's own send, given back without the lock:
                # folded here, as the next round would, so it does not keep an idle
                # receive from parking now (what it leaves in ``core.actions`` keeps
                # the waiter unparked, and the receive's next round drains it).
                # (Rare in a round trip: a lane send written whole keeps its credit.)
                r._fold_due()
            if (
                attempt is self._pop_attempt
                and not r.core.actions
                and self._nothing_queued()
                and (deadline is None or deadline > time.monotonic())
            ):
                # The steps' look at the kernel, taken here when the pipe's wait is made
                # (open while the socket is: close() closes it under this lock): a reply
                # already there is read at once, no waiter parked and taken back.
                cached = self._wait_cache
                conn = reader.direct_conn
                if cached is not None and cached[0] == pipe.pid and conn is not None and not conn.read_more:
                    state.peeked = True
                    idle = not cached[1].wait(0)
                else:
                    idle = True
                if idle:
                    state.waiter = _FdWaiter(waker)
                    r.recv_q.waiters.append(state.waiter)
        if not reader.take_role(waker):
            if state.waiter is not None:
                r._abandon(r.recv_q, state.waiter)
            self._direct_done()
            return None
        return reader, state

    def _direct_end(self, reader: ReadRole, state: _DirectState) -> None:
        r = self.round
        if state.waiter is not None:
            r._abandon(r.recv_q, state.waiter)
        reader.release_role()
        if not state.counted_out:
            self._direct_done()

    def _direct_steps(
        self,
        reader: ReadRole,
        state: _DirectState,
        attempt: Callable[[], T],
        ready: ReadyWait | None,
        outcome: Any = _UNREAD,
    ) -> Generator[float | None, None, None]:
        """The loop of a direct receive, without its waits (threads and tasks share it).

        Reads first: a busy pipe has bytes waiting, and then no waiter is parked
        and nobody waits. Unless the last read filled its buffer, it first asks (or
        :meth:`_direct_begin` asked, under the lock, before it parked an idle waiter)
        ``ready`` (a poll that does not block) whether there is anything to read:
        an idle round trip's receive finds nothing, and a read that finds nothing
        costs a syscall that raises (BlockingIOError) where the poll returns an
        empty list. What a read completes is taken in the same round that feeds
        it to the core (a busy receiver pays one round per read). Otherwise:
        a round that tries ``attempt`` and parks a waiter that wakes the waker
        if it would block (an idle receive's was parked by :meth:`_direct_begin`),
        then a wait -- the generator yields the seconds left
        (None: no deadline) and its driver waits until the connection or the
        waker is readable, or that time passes. It ends with the result in
        ``state.result``, or BLOCKED there at the deadline or when the pipe stops
        being readable here (a generator that returns None raises no StopIteration
        in ``next(steps, default)``: a receive pays no exception).
        ``outcome``: what the first read found when :meth:`recv` made it (then
        :meth:`_direct_begin` had seen bytes and parked no waiter).
        """
        r = self.round
        result: T | _Blocked = BLOCKED
        tried = state.waiter is not None  # a round has tried the attempt (_direct_begin's, for an idle one)
        conn = reader.direct_conn
        # nothing to read now (an idle pipe): wait before the first read
        if outcome is not _UNREAD:
            read = False  # (the first read was made: its outcome is taken below)
        elif state.peeked:  # (_direct_begin looked: it parked the waiter if nothing was there)
            read = state.waiter is not None
        else:
            read = ready is not None and conn is not None and not conn.read_more and not ready.wait(0)
        while True:
            if outcome is _UNREAD:
                if tried:
                    if not isinstance(result, _Blocked) or state.waiter is None:
                        state.result = result  # a result, or BLOCKED at the deadline (the caller times out)
                        return
                    if reader.paused or reader.owner.closed or reader.pid not in r.pipes or len(r.recv_q.waiters) > 1:
                        return  # BLOCKED (more receivers now: let the engine share messages out)
                if not read:
                    outcome = self._direct_read(reader, state, attempt)
                    continue
            else:  # what the last read found
                if outcome is _FAILED:
                    return  # BLOCKED
                got, outcome = outcome, _UNREAD
                if got is not _NOTHING:
                    if got is not _PARTIAL:
                        result, tried = got, True
                    continue  # read something (maybe a partial frame): look again at once
                read = True
            if state.waiter is None:
                result = self._direct_round(state, None, attempt)  # try, and park a waiter
                tried = True
                continue
            if not state.waiter.woken:
                left = None if state.deadline is None else state.deadline - time.monotonic()
                if left is None or left > 0:
                    yield left
                    state.waker.clear()
                    if not state.waiter.woken:
                        read = False
                        continue  # readable (or a stray wake): read it
            read = False
            result = self._direct_round(state, None, attempt)  # woken or timed out: look again

    def _direct_read(self, reader: ReadRole, state: _DirectState, attempt: Callable[[], T]) -> Any:
        """One read by the read role's holder: what the kernel holds goes to the core,
        and the attempt is tried, in one round taken before anyone else may read.

        Returns the attempt's result (or BLOCKED) when messages were read,
        ``_PARTIAL`` when only part of a frame was, ``_NOTHING`` when the kernel
        held nothing, ``_FAILED`` when the connection ended (the pipe is closed).
        """
        conn = reader.direct_conn
        assert conn is not None  # (_direct_begin took the role of a direct pipe only)
        with reader.read_lock:
            try:
                payloads = None if reader.owner.closed else conn.read_nowait()
            except (EOFError, OSError, RemoteProtocolError, MessageTooLarge) as exc:
                failure: BaseException = exc
            else:
                if payloads is None:
                    return _NOTHING
                if not payloads:
                    return _PARTIAL
                return self._direct_round(state, payloads, attempt)
        reader.direct_failed(failure)  # (Timeout, an OSError, never comes from here)
        return _FAILED

    def _direct_wait(self, pid: int, conn: ReadConnection | None, waker: Waker) -> ReadyWait | None:
        """A wait for pipe ``pid`` or the waker (a thread blocks in it, a task waits
        for its descriptors; made once per pipe: only the read role's holder uses it,
        so a blocked receive pays one call into the backend and no allocation)."""
        cached = self._wait_cache
        if cached is not None and cached[0] == pid:
            return cached[1]
        fd = conn.fileno() if conn is not None else -1
        if fd < 0:
            return None
        try:
            ready = _ready_wait(fd, waker)
        except OSError:  # the pipe's connection was closed since fileno(): wait the usual way
            return None
        # (a wait cached for an earlier pipe is left to the garbage collector: a thread
        # that held that pipe's role may still be about to wait in it)
        self._wait_cache = (pid, ready)
        return ready

    def _direct_done(self) -> None:
        r = self.round
        with r.lock:
            self.users -= 1
            if r.closed and not self.users:
                self.close_fds()  # the last direct receiver of a closed socket

    def close_fds(self) -> None:
        """Close the waker and the reader's wait (lock held, no direct receiver left)."""
        _close_waker_box(self._waker_box)
        cached, self._wait_cache = self._wait_cache, None
        if cached is not None:
            cached[1].close()

    def _direct_round(
        self, state: _DirectState, payloads: list[bytes] | None, attempt: Callable[[], T]
    ) -> T | _Blocked:
        """One round of a direct receive: feed ``payloads``, try, park a fresh waiter."""
        r = self.round
        queue = r.recv_q
        size = sum(map(len, payloads)) if payloads else 0
        with r.lock:
            waiter = state.waiter
            if waiter is not None:
                state.waiter = None
                try:
                    queue.waiters.remove(waiter)
                except ValueError:
                    pass
            if r.closed:
                raise r.closed_error()
            if r._due:
                r._fold_due()
            result: T | _Blocked
            body = None
            pop = attempt is self._pop_attempt
            if payloads:
                hand = self._hand
                if pop and hand is not None and not self._held:
                    # An idle socket's one message goes straight to this caller: the core
                    # says when it may (nothing queued, no run: Core.hand_over), and it is
                    # counted as take_delivery then the pop would count it -- delivered on
                    # the pipe and received.
                    body = hand(state.pid, payloads)
                    if body is not None:
                        pipe = r.pipes.get(state.pid)
                        if pipe is not None:
                            pipe.reader.count_delivery(1, size, False)
                        r.received += 1
                        r.bytes_received += size
                if body is None:
                    r.take_delivery(state.pid, payloads, size)
            if body is not None:
                result = body  # type: ignore[assignment]  # (attempt is the body pop: T is bytes)
            elif pop and self._nothing_queued():
                result = BLOCKED  # (the pop would raise WouldBlock: an idle receive spares it)
            else:
                try:
                    result = attempt()
                except WouldBlock:
                    result = BLOCKED
            # The drain written out as try_recv_body writes it: an idle socket's round
            # emits nothing and finds nobody waiting (a queue that waits for close
            # never wakes from a drain), and then costs no call.
            if r.core.actions or r.send_q.waiters or queue.waiters or r.watchers:
                actions = r._drain()
            else:
                actions = None
            if result is not BLOCKED:
                # The receive ends with this result: counted out of the direct receivers
                # here, not in a lock round of its own (the socket is open: checked above,
                # so close() finds no receiver left and closes the descriptors itself; this
                # one no longer waits on them).
                self.users -= 1
                state.counted_out = True
            elif state.deadline is None or state.deadline > time.monotonic():
                # Parked after the drain: a drain wakes a receiver only if one could take a
                # message, which this attempt just found not (the drain skips an idle
                # socket's receive queue then, instead of asking whether it is ready).
                state.waiter = _FdWaiter(state.waker)
                queue.waiters.append(state.waiter)
        if actions:
            r.execute(actions)
        return result


# The backend's functions, bound once (nanopy.platform picked the backend at import).
_new_waker = platform.new_waker
_ready_wait = platform.ready_wait


def _close_waker_box(box: list[Waker | None]) -> None:
    waker, box[0] = box[0], None
    if waker is not None:
        waker.close()


class _DirectState:
    """What one direct receive carries between its rounds (made by
    :meth:`DirectRead._direct_begin`, which sets ``pid``, ``waker`` and ``deadline``)."""

    pid: int
    waker: Waker
    deadline: float | None
    # Defaults read from the class until a round sets them on the instance.
    waiter: _FdWaiter | None = None
    result: Any = BLOCKED  # what the receive returns (see DirectRead._direct_steps)
    counted_out = False  # the round that found the result counted this receiver out
    peeked = False  # _direct_begin asked the pipe's wait whether anything is readable


class _FdWaiter:
    """The waiter of a thread reading a pipe directly: a wake wakes the socket's waker."""

    __slots__ = ("_waker", "woken")

    def __init__(self, waker: Waker) -> None:
        self._waker = waker
        self.woken = False

    def wake(self) -> None:
        if not self.woken:
            self.woken = True
            self._waker.wake()  # (never raises: a closed waker ignores it)


async def _trio_wait_readable(fds: tuple[int, ...], timeout: float | None) -> None:
    """Wait (in this trio loop) until one of ``fds`` is readable or ``timeout`` passes."""
    with trio.move_on_after(float("inf") if timeout is None else timeout) as scope:
        if len(fds) == 1:  # (Linux: the one epoll descriptor)
            await trio.lowlevel.wait_readable(fds[0])
            return
        async with trio.open_nursery() as nursery:
            for fd in fds:
                nursery.start_soon(_trio_readable_then_cancel, fd, scope)


async def _trio_readable_then_cancel(fd: int, scope: trio.CancelScope) -> None:
    try:
        await trio.lowlevel.wait_readable(fd)
    except OSError:  # the pipe's descriptor was closed under the wait: look again
        pass
    scope.cancel()  # (the first readable descriptor ends the wait for the others)


def _asyncio_wait_for_fds() -> Callable[[tuple[int, ...], float | None], Awaitable[None]] | None:
    """How a task of the running asyncio loop waits for descriptors: None where the
    loop cannot watch them (no ``add_reader``: Windows' default proactor loop), and
    then its tasks wait the ordinary way, woken by the engine."""
    import asyncio

    add_reader = getattr(type(asyncio.get_running_loop()), "add_reader", None)
    if add_reader is None or add_reader is asyncio.BaseEventLoop.add_reader:  # (it raises NotImplementedError)
        return None
    return _asyncio_wait_readable


async def _asyncio_wait_readable(fds: tuple[int, ...], timeout: float | None) -> None:
    """Wait (in this asyncio loop) until one of ``fds`` is readable or ``timeout`` passes."""
    import asyncio

    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not future.done():
            future.set_result(None)

    watched = []
    try:
        for fd in fds:
            try:
                loop.add_reader(fd, ready)
            except (OSError, ValueError):  # the pipe's descriptor was closed meanwhile: look again
                ready()
                break
            watched.append(fd)
        timer = None if timeout is None else loop.call_later(timeout, ready)
        try:
            await future
        finally:
            if timer is not None:
                timer.cancel()
    finally:
        for fd in watched:
            loop.remove_reader(fd)
