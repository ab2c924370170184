"""A pipe's read side: the reader task, the inproc sink, and the read role.

:class:`PipeReader` is a part of :class:`~nanopy.pipe.driver.PipeDriver`, reached as
``pipe.reader``. It owns ``paused`` (the core's queue for the pipe is full: read
nothing) and its wake-up (``resume``), the read role (``role``, ``lease_until``,
``role_waker``, ``read_lock``; see the docstring of nanopy/pipe/driver.py) and the
three reader loops: a plain ``receive()`` loop, an inproc sink's drain, and the
role reader of a stream connection (tcp, ipc) that stands aside while a
receiving thread holds the role. It sees its pipe only as a :class:`ReadOwner`.

May call: the socket driver's ``deliver`` (the one way read payloads reach the
core), the connection's read side (``receive``, ``read_nowait``,
``wait_readable``, ``attach_sink``/``drain_to_sink``).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

import trio

from ..core.errors import MessageTooLarge, RemoteProtocolError
from ..transports._base import DirectReadable, SinkAttachable

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..platform import Waker
    from ..transports._base import Connection

#: ``(chunk, payload bytes)`` of the in-memory write in progress (set by the writing
#: pipe, nanopy/pipe/driver.py): the receiving pipe's sink, called inside that write,
#: takes the size from here when it gets that very chunk and hands it to ``deliver``,
#: so nobody sums the same payloads again. (One slot replaced whole: another thread's
#: write at the same time only costs a sum. Between pipes only: the socket gets the size.)
handed_over: list[Any] = [None]

# A thread that lets go of the read role usually comes straight back: the reader
# task leaves the role to it for this long after it let go.
READ_LEASE = 5e-3
# The longest sleep of a reader task standing aside while a thread holds the role.
STAND_ASIDE_MAX = 50e-3


class ReadOwner(Protocol):
    """What the read side needs of its pipe (``PipeDriver``)."""

    @property
    def lock(self) -> threading.Lock:
        """The pipe lock: ``paused`` changes under it (the read role has its own)."""
        ...

    @property
    def closed(self) -> bool:
        """The pipe is closed: read nothing more."""
        ...

    def close_soon(self) -> None:
        """End the pipe (its reader and writer stop)."""
        ...


class PipeReader:
    """The read side of a :class:`~nanopy.pipe.driver.PipeDriver` (see the module docstring)."""

    def __init__(
        self,
        owner: ReadOwner,
        conn: Connection,
        pid: int,
        deliver: Callable[[int, list[bytes], int], bool],
        run_soon: Callable[[Callable[[], object]], object],
        note_failure: Callable[[BaseException], None],
    ) -> None:
        self.owner = owner
        self.lock = owner.lock  # (the pipe's lock: one object, not a copy of state)
        self.conn = conn
        self.pid = pid
        self._deliver = deliver  # the socket's (PipeHost.deliver)
        self._run_soon = run_soon  # the engine's
        self._note_failure = note_failure  # the pipe's liveness judges how it ended
        self.paused = False  # the core's queue for this pipe is full: read nothing
        # Counters of the pipe view (Socket.pipes()) of what was delivered: counted by
        # the socket's round under its lock, per read (``count_delivery``).
        self.rx_msgs = self.rx_bytes = 0
        self._event: trio.Event | None = None  # wakes a paused reader task
        # In-memory connections (inproc) deliver from the sender's thread (a sink).
        self.sink_conn = conn if isinstance(conn, SinkAttachable) else None
        # The read role (see the docstring of nanopy/pipe/driver.py).
        self.direct_conn = conn if isinstance(conn, DirectReadable) else None
        self.direct = self.direct_conn is not None
        self.read_lock = threading.Lock()
        # Held by the read role's holder: threads asking at once get it one at a time
        # (taken without waiting, never the pipe lock: see take_role).
        self._role_lock = threading.Lock()
        self.role = False  # a thread holds the read role
        self.lease_until = 0.0
        self.role_waker: Waker | None = None  # the role holder's waker (nanopy.platform)

    def count_delivery(self, n_msgs: int, n_bytes: int, pause: bool) -> None:
        """The socket's core took ``n_msgs`` read from this pipe (the socket's lock
        held); ``pause``: its queue is full, read nothing until :meth:`resume`."""
        self.rx_msgs += n_msgs
        self.rx_bytes += n_bytes
        if pause:
            self.paused = True

    def resume(self) -> None:
        """The core's queue has room again: read on (the round's RESUME_READ)."""
        with self.lock:
            self.paused = False
            event, self._event = self._event, None
        if event is not None:
            self._run_soon(event.set)

    # -- the read role (any thread) --------------------------------------------
    def take_role(self, waker: Waker) -> bool:
        """A thread asks for the read role; False if it cannot have it now.

        Without the pipe lock: the role's own lock, taken without waiting, decides
        between threads, and the waker is set before ``closed`` is read, so either
        this sees the pipe closed or the pipe's end (``_stopped``, which sets
        ``closed`` and then reads ``role_waker``) finds the waker and wakes it. The
        reader task reads ``role`` without a lock anyway."""
        if not self._role_lock.acquire(False):
            return False  # (another thread holds the role)
        self.role_waker = waker
        if self.owner.closed or self.paused or not self.direct:
            self.role_waker = None  # (the pipe's end may have woken it: a stray wake-up)
            self._role_lock.release()
            return False
        self.role = True  # (only now: a refused take never sends the reader task aside)
        return True

    def release_role(self) -> None:
        conn = self.direct_conn
        if conn is not None and conn.failed and not self.owner.closed:
            # What we read ended in an error or EOF after good messages: the
            # reader task may never be woken for it, so end the pipe here.
            try:
                self.read_direct()
            except (EOFError, OSError, RemoteProtocolError, MessageTooLarge) as exc:
                self.direct_failed(exc)
        # (the lease first: the reader task that sees the role free sees the lease)
        self.lease_until = time.monotonic() + READ_LEASE
        self.role_waker = None
        self.role = False
        self._role_lock.release()

    def read_direct(self) -> list[bytes] | None:
        """Read what the kernel holds (role holder only); None if nothing or closed."""
        with self.read_lock:
            conn = self.direct_conn
            if self.owner.closed or conn is None:
                return None
            return conn.read_nowait()

    def direct_failed(self, exc: BaseException) -> None:
        """The role holder met the end of the connection or a bad peer."""
        self._note_failure(exc)
        self.owner.close_soon()

    async def run(self) -> None:
        """The reader task: read until the connection ends (raises how it ended)."""
        if self.direct:
            await self._role_reader()
            return
        if self.sink_conn is not None:
            await self._sink_reader()
            return
        conn = self.conn
        deliver = self._deliver
        pid = self.pid
        while True:
            await self._until_resumed()
            payloads = await conn.receive()
            if payloads and payloads[0].__class__ is not bytes:
                # A plug-in transport broke the payload contract (Connection.receive):
                # cores get bytes, never a buffer that may change or cannot be hashed.
                payloads = [bytes(p) for p in payloads]
            deliver(pid, payloads, -1)  # (a full queue sets paused)

    async def _sink_reader(self) -> None:
        """An in-memory connection delivers from the sender's thread through a sink;
        this task only drains what queued while the core's queue was full."""
        conn = self.sink_conn
        assert conn is not None  # (only for a sink connection: see run)
        deliver = self._deliver
        pid = self.pid

        def sink(payloads: list[bytes]) -> None:
            handed = handed_over[0]  # (called inside the writer's write: it knows the size)
            deliver(pid, payloads, handed[1] if handed is not None and handed[0] is payloads else -1)

        conn.attach_sink(sink, lambda: self.paused)
        while True:
            await self._until_resumed()
            await conn.drain_to_sink()

    async def _until_resumed(self) -> None:
        """Wait while the core's queue for this pipe is full."""
        while True:
            with self.lock:
                if not self.paused:
                    return
                event = self._event = trio.Event()
            await event.wait()

    async def _role_reader(self) -> None:
        """The reader of a connection with a read role: reads only while it holds it."""
        conn = self.direct_conn
        assert conn is not None  # (only for a direct connection: see run)
        deliver = self._deliver
        pid = self.pid
        read_lock = self.read_lock
        more = False
        while True:
            if self.role or time.monotonic() < self.lease_until:
                await self._stand_aside()
                more = False
                continue
            await self._until_resumed()
            if self.role:
                continue
            if more or conn.failed:
                await trio.lowlevel.checkpoint()
            else:
                await conn.wait_readable()
            if self.role:
                continue  # a thread took the role while we waited: it reads
            with read_lock:  # read and deliver as one step: reads reach the core in order
                payloads = conn.read_nowait()
                if payloads:
                    deliver(pid, payloads, -1)  # (a full queue sets paused)
            more = conn.read_more

    async def _stand_aside(self) -> None:
        """Wait until no thread holds the read role and its lease has run out.

        Polled with sleeps that double while the role stays taken (nothing wakes
        this task per message): a receive loop costs the engine a few wake-ups a
        second, and a thread that leaves for good hands reading back within
        ``STAND_ASIDE_MAX``.
        """
        delay = READ_LEASE
        while True:
            if self.role:
                await trio.sleep(delay)
                delay = min(delay * 2, STAND_ASIDE_MAX)
                continue
            left = self.lease_until - time.monotonic()
            if left <= 0:
                return
            await trio.sleep(left)
