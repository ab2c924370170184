"""Receive runs: receives that skip the core while one pipe alone has messages.

Owns: ``run`` (bodies taken out of the core, not yet received), ``run_token``
and the receive fast path ``try_recv_body`` with its locked twin ``_pop_body``.

A receive takes a *run* when it can: several bodies of the one pipe with any
queued, in order, counted as received in that round (``FairQueue.take_run``).
The rest wait in ``run``, which receivers pop without the lock (a deque's
``popleft`` is atomic) until it is empty; every locked receive serves it first,
so order holds, and readiness, ``recv_msg`` and close see it too. When another
pipe delivers while a run is held, the core takes the rest back from the run's
right end (``FairQueue.give_back_run``, under the socket lock).

A run never holds a multipart message (``FairQueue.stops``): one comes out of
the locked path alone, so the plain ``recv()`` looks at a body's class there
only, and the run's lock-free pop stays as cheap as on a socket without ZMTP
pipes. A multipart message a plain ``recv()`` refused waits in ``held``, which
every locked receive serves before the run.

May call: the round (:class:`~nanopy.driver.round.Round`), the core's body queue.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.errors import WouldBlock
from ..core.message import Message

if TYPE_CHECKING:
    from .round import Round

# The most bodies one receive takes out of the core at once (see the docstring):
# the lock round is paid once per run, not per message.
RUN_MAX = 256


class ReceiveRuns:
    """Runs and the receive fast path (see the module docstring)."""

    def __init__(self, driver: Round[Any]) -> None:
        self.round = driver  # the lock, the core, the counters and the round's calls
        # Runs: cores whose receive is a plain ordered pop of bodies (body_queue).
        body_queue = self._body_queue = driver.core.body_queue
        self.run: deque[bytes] = body_queue.run if body_queue is not None else deque()
        # The body queue's ready pipes (never replaced): ``not ready.best`` is the queue's
        # "nothing queued" as a field test, where ``not body_queue`` costs two calls.
        self.body_ready = body_queue.ready if body_queue is not None else None
        self.run_token: Any = None  # the pipe token of the bodies in ``run`` (recv_msg)
        self.held: deque[bytes] = deque()  # a refused multipart message, first in line (see the docstring)
        # The body pop as an attempt, bound once: the direct read and Socket.recv hand
        # this one object around, and a round knows it by identity (DirectRead).
        self.recv_body_attempt: Callable[[], bytes] = self._pop_body
        # The condition of the receive wait queue: a core without runs is asked alone.
        self.recv_ready: Callable[[], bool] = self.readable if body_queue is not None else driver.core.can_recv

    def stop_at_multipart(self, pid: int) -> None:
        """Pipe ``pid`` carries multipart messages: its runs end before one (lock held)."""
        if self._body_queue is not None:
            self._body_queue.stops.add(pid)

    def forget(self) -> None:
        """Drop what the runs hold (lock held: close, or a forked child)."""
        self.run.clear()
        self.held.clear()

    def received_counts(self) -> tuple[int, int]:
        """(messages, bytes) the user has received: a run's bodies are counted when
        it is taken, so what it still holds is not received yet."""
        r = self.round
        with r.lock:
            queue = self._body_queue
            if queue is None:  # (no runs)
                return r.received, r.bytes_received
            held = [*self.held, *self.run]
            # (a run's bodies given back to their queue are counted again when taken)
            return (
                r.received - len(held) - queue.given_back,
                r.bytes_received - sum(map(len, held)) - queue.given_back_bytes,
            )

    def readable(self) -> bool:
        """Whether a receive would take a body now (lock held)."""
        return bool(self.run) or bool(self.held) or self.round.core.can_recv()

    def try_recv_body(self) -> bytes | None:
        """The next body if one is queued now, else None (an idle socket is seen
        without the lock: every caller then waits with ``call``/``acall``, whose
        first try, under the lock, finds a body queued at that instant)."""
        r = self.round
        run = self.run
        if run and not r.closed:
            try:
                return run.popleft()  # the rest of a run: no lock (see the docstring)
            except IndexError:
                pass
        if not r.closed and self.nothing_queued():
            # Nothing queued at a look without the lock (an idle receive): None, and
            # the caller's wait tries again under the lock before it parks, so a
            # body queued meanwhile is found there (a closed socket raises below).
            return None
        lock = r.lock
        lock.acquire()
        try:
            if r.closed:
                raise r.closed_error()
            if self.nothing_queued():
                return None  # (an idle receive: spare _pop_body's WouldBlock)
            try:
                body = self._pop_body()
            except WouldBlock:
                return None
            # The drain written out: most receives emit nothing and find nobody
            # waiting, and then cost no call at all.
            if r.core.actions or r.send_q.waiters or r.recv_q.waiters or r.watchers:
                actions = r._drain()
            else:
                actions = None
        finally:
            lock.release()
        if actions:
            r.execute(actions)
        return body

    def nothing_queued(self) -> bool:
        """Whether ``_pop_body`` would raise WouldBlock now, for certain (lock held;
        False when it cannot tell: a core without runs)."""
        ready = self.body_ready
        return ready is not None and not ready.best and not self.held and not self.run

    def _pop_body(self) -> bytes:
        """The next body (lock held): the run's next, else the first of a new run
        (counted as received here, all of it); WouldBlock if nothing is queued."""
        if self.held:
            return self.held.popleft()
        run = self.run
        if run:
            try:
                return run.popleft()
            except IndexError:  # (emptied by a receiver without the lock)
                pass
        r = self.round
        queue = self._body_queue
        if queue is None:
            body: bytes = r.core.recv_body()
            r.received += 1
            r.bytes_received += len(body)
            return body
        bodies: list[bytes] = queue.take_run(RUN_MAX)
        body = bodies[0]
        if len(bodies) == 1:  # (several pipes have messages: one each in turn)
            r.received += 1
            r.bytes_received += len(body)
            return body
        r.received += len(bodies)
        r.bytes_received += sum(map(len, bodies))
        info = r.core.pipes.get(queue.run_pid)
        self.run_token = info.token if info is not None else None
        run.extend(itertools.islice(bodies, 1, None))
        return body

    def recv_bodies(self, limit: int) -> list[bytes]:
        """Up to ``limit`` queued bodies in one round (never waits)."""
        return self.round.feed(self._take_bodies, limit)

    def bodies_attempt(self, limit: int) -> Callable[[], list[bytes]]:
        """The attempt of a batch receive that waits for its first message: up to
        ``limit`` bodies taken whole in the round that finds any (a direct read's
        included); WouldBlock while none is queued."""

        def attempt() -> list[bytes]:
            out = self._take_bodies(limit)
            if not out:
                raise WouldBlock
            return out

        return attempt

    def _take_bodies(self, limit: int) -> list[bytes]:
        """``recv_bodies``' work (lock held): what ``limit`` calls of ``_pop_body``
        would return, taken whole -- ``held``, the run, then the core's runs straight
        into the batch (counted per run, never parked in ``run``)."""
        held = self.held
        out: list[bytes] = [held.popleft() for _ in range(min(limit, len(held)))]
        run = self.run
        if run and len(out) < limit:
            append = out.append
            popleft = run.popleft
            try:  # (one by one: a receiver without the lock may pop it meanwhile)
                for _ in range(min(limit - len(out), len(run))):
                    append(popleft())
            except IndexError:
                pass
        left = limit - len(out)
        queue = self._body_queue
        if not left or (queue is not None and not queue):
            return out
        r = self.round
        try:
            if queue is None:  # (a core without runs: one body per call)
                recv_body = r.core.recv_body
                while left:
                    body = recv_body()
                    out.append(body)
                    r.received += 1
                    r.bytes_received += len(body)
                    left -= 1
            else:
                take_run = queue.take_run
                while left:
                    bodies = take_run(left)
                    out += bodies
                    r.received += len(bodies)
                    r.bytes_received += sum(map(len, bodies))
                    left -= len(bodies)
        except WouldBlock:
            pass
        return out

    def recv_attempt(self) -> Message:
        r = self.round
        if self.held:
            return Message(self.held.popleft(), None)  # (counted when it was first taken)
        run = self.run
        if run:
            try:
                return Message(run.popleft(), self.run_token)  # (counted when the run was taken)
            except IndexError:
                pass
        msg = r.core.recv()
        r.received += 1
        r.bytes_received += len(msg.body)
        return msg
