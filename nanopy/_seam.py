"""The seam between the socket side (nanopy/driver/) and the pipe side (nanopy/pipe/).

The socket's driver sees each of its pipes only as a :class:`PipeHandle`: what it
may call on a pipe and the few counters it may read. It never assigns a field of a
pipe (tests/test_layers.py scans for that): every change of a pipe's state is one
of the operations below, made by the part of the pipe that owns that state. A pipe
sees its socket only as a :class:`PipeHost`: five calls and one counter. Neither
side imports the other: ``PipeDriver`` (nanopy/pipe/driver.py) and ``SocketDriver``
(nanopy/driver/socket_driver.py) satisfy these protocols structurally, which mypy
checks where a pipe is made (and in nanopy/pipe/driver.py). A side that needs more
of the other is a design change, made here first.

Also here: the batching figures both sides share (a burst's batch size, how long
a queued message may wait) and :func:`wait_out_burst`, the wait of the pipe's
writer task and of the socket's flush round alike.

May call: nothing of nanopy but ``core`` (a typing seam).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import trio

if TYPE_CHECKING:
    import threading

    from typing_extensions import TypeVar

    from .core.actions import Action
else:
    from typing import TypeVar

#: a sending thread writes the outbox itself at this many messages ...
CALLER_BATCH_MAX = 256
#: ... or once the outbox holds this many payload bytes (and ``CALLER_BATCH`` messages)
CALLER_BYTES = 16 * 1024
#: the writer task's first wait before flushing a partial batch left by a burst
FLUSH_DELAY = 200e-6
#: no queued message waits longer than this for a flush
MAX_HOLD = 1e-3

#: the chunk a fan-out framed last, per framing: ``{framing: (batch, (chunk, payload bytes))}``
Framed = dict[Any, tuple[list[bytes], Any]]


class ReadConnection(Protocol):
    """The part of a directly readable connection (``DirectReadable``) a direct
    receive uses: one non-blocking read, and the descriptor to wait on."""

    def read_nowait(self) -> list[bytes] | None:
        """What the kernel holds, parsed (None: nothing; []: part of a frame)."""
        ...

    def fileno(self) -> int:
        """The descriptor that becomes readable (-1: none)."""
        ...

    #: the last read filled its whole buffer: more is probably waiting
    read_more: bool


class PipeState(Protocol):
    """What the read side tells of its pipe."""

    @property
    def closed(self) -> bool:
        """The pipe is closed: read nothing more."""
        ...


class ReadRole(Protocol):
    """A pipe's read side (``PipeReader``) as the socket sees it: the read role a
    receiving thread takes, the pause the socket's full queue sets, the counts of
    what was delivered."""

    @property
    def pid(self) -> int: ...

    @property
    def owner(self) -> PipeState: ...

    @property
    def direct(self) -> bool:
        """A thread may take the read role (the connection reads without blocking)."""
        ...

    @property
    def direct_conn(self) -> ReadConnection | None: ...

    @property
    def paused(self) -> bool:
        """The socket's queue for this pipe is full: nothing is read."""
        ...

    @property
    def read_lock(self) -> threading.Lock:
        """Held across a read and the delivery of what it parsed."""
        ...

    @property
    def rx_msgs(self) -> int:
        """Messages delivered from this pipe (the pipe view, ``Socket.pipes()``)."""
        ...

    @property
    def rx_bytes(self) -> int: ...

    def take_role(self, waker: Any) -> bool:
        """A receiving thread asks for the read role; False if it cannot have it now."""
        ...

    def release_role(self) -> None: ...

    def direct_failed(self, exc: BaseException) -> None:
        """The role holder met the end of the connection: the pipe ends."""
        ...

    def resume(self) -> None:
        """The socket's queue has room again: read on (RESUME_READ)."""
        ...

    def count_delivery(self, n_msgs: int, n_bytes: int, pause: bool) -> None:
        """The socket's core took ``n_msgs`` read from this pipe (socket lock held);
        ``pause``: its queue is full, read nothing until :meth:`resume`."""
        ...


class PipeHandle(Protocol):
    """One pipe as its socket's driver sees it (implemented by ``PipeDriver``)."""

    @property
    def pid(self) -> int: ...

    @property
    def closed(self) -> bool:
        """Refuses sends (``transmit`` returns -1, ``queue_batch`` False)."""
        ...

    @property
    def withdrawn(self) -> bool:
        """The socket took this pipe out of its load balancing (:meth:`withdraw`)."""
        ...

    @property
    def lane_credit(self) -> int:
        """Send-lane credit granted and not spent yet."""
        ...

    @property
    def lane_bytes(self) -> int:
        """The payload bytes the spent lane credit carried."""
        ...

    @property
    def first_at(self) -> float:
        """When the outbox's oldest payload was queued (engine clock)."""
        ...

    @property
    def reader(self) -> ReadRole: ...

    # -- sending
    def transmit(
        self, payload: bytes, idle: bool | None = None, framed: Framed | None = None, lane: bool = False
    ) -> int:
        """Send or queue ``payload`` (a TRANSMIT); the credit to give back now, -1 if
        refused (closed, or ``lane`` and no lane credit left)."""
        ...

    def queue_batch(self, batch: list[bytes], kick: bool) -> bool:
        """Queue ``batch`` in order (False: closed, nothing queued); ``kick``: the
        writer task writes it, else the caller does (:meth:`flush_queued`)."""
        ...

    def flush_queued(self, framed: Framed) -> int:
        """Write the outbox now unless somebody else is writing; the credit to give back."""
        ...

    def fan_out(
        self, pipes: Mapping[int, PipeHandle], actions: list[Action], start: int
    ) -> tuple[int, list[bytes], list[tuple[int, int]]]:
        """Carry out the TRANSMITs of a fan-out burst from ``actions[start]`` on
        ``pipes`` (all of this pipe's kind) in one loop: ``(actions handled,
        payloads refused, [(pid, credit to give back)])``."""
        ...

    def queued_out(self) -> int:
        """Messages queued on this pipe and not written yet."""
        ...

    # -- the send lane
    def grant_lane(self, n: int) -> None: ...

    def revoke_lane(self) -> tuple[int, int]:
        """``(unspent lane credit, bytes the spent credit carried)``, both reset."""
        ...

    # -- ending
    def withdraw(self, resend: bool) -> tuple[list[bytes], int] | None:
        """The socket withdraws this pipe (socket lock held): it refuses sends from
        now on. Returns what it will never write, in order -- with ``resend``, first
        the messages its kernel holds unacknowledged, their count second -- or None
        while a write is under way (the rest comes when the pipe is removed)."""
        ...

    def refuse_sends(self) -> None:
        """Refuse every later send, nothing else (a socket closing, a pipe not added yet)."""
        ...

    def close_soon(self) -> None:
        """End the pipe (CLOSE_PIPE): its reader and writer stop."""
        ...


class PipeHost(Protocol):
    """The socket as one of its pipes sees it (implemented by ``SocketDriver``)."""

    #: Messages the socket has received: a pipe that sees it move since its last
    #: send treats the next send as an answer (written at once), not a burst.
    received: int

    def deliver(self, pid: int, payloads: list[bytes], size: int = -1) -> bool:
        """Hand payloads read from pipe ``pid`` to the core (``size``: their bytes,
        if the reader knows them; -1: the socket sums them); False: stop reading."""
        ...

    def credit(self, pid: int, n: int) -> None:
        """``n`` of pipe ``pid``'s payloads were written: the core may send more."""
        ...

    def pipe_ending(self, pipe: PipeHandle) -> None:
        """``pipe`` was found dead or is closing: the socket stops sending on it and
        takes back what it never wrote, ahead of later sends (nanopy/driver/endings.py)."""
        ...

    def flush_later(self, pipe: PipeHandle | None) -> None:
        """``pipe`` queued a fan-out burst's first payload: the socket's flush round writes it."""
        ...

    def pipe_view(self, pipe: PipeHandle) -> tuple[int, int, int, int]:
        """``(dropped, queued_in, rx_msgs, rx_bytes)`` of ``pipe``, in one consistent look."""
        ...


if TYPE_CHECKING:
    #: The class of a socket driver's pipes: the driver's code sees a ``PipeHandle``
    #: and nothing more; the socket layer, which made them, reads them as its own
    #: (the default: a bare ``SocketDriver`` holds pipes of any class).
    PipeT = TypeVar("PipeT", bound=PipeHandle, default=Any)
else:
    PipeT = TypeVar("PipeT")


async def wait_out_burst(
    progress: Callable[[], int],
    due: Callable[[], float | None],
    now: Callable[[], float],
    write_now: Callable[[], bool] = lambda: False,
) -> None:
    """Wait while a burst of sends goes on, so what it leaves is written in one go.

    Sleeps ``FLUSH_DELAY``, doubling up to ``MAX_HOLD`` (a long burst costs few
    wake-ups), as long as ``progress()`` (a send count) moved during each sleep.
    Returns once it did not, once ``due()`` has come -- when the oldest waiting
    payload has waited ``MAX_HOLD``, on the ``now`` clock (None: nothing waits) --
    or when ``write_now()`` says so after a sleep.
    """
    delay = FLUSH_DELAY
    while True:
        seen = progress()
        wait = delay
        deadline = due()
        if deadline is not None:
            wait = min(delay, deadline - now())
            if wait <= 0:
                return
        await trio.sleep(wait)
        if progress() == seen or write_now():
            return
        delay = min(delay * 2, MAX_HOLD)
