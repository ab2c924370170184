"""``inproc://name`` -- in-process pipes that hand message objects over as they are.

Nothing is framed or copied: a payload travels as the same ``bytes`` object.

Each direction of a pipe is an inbox that behaves like a small kernel buffer
(``INBOX_SIZE`` messages). The sending pipe writes into it as into a socket: a
non-blocking write takes what fits and the sender's own pipe driver gives the
credit back for what was taken; a full inbox makes the sender's writer task wait
for room -- that is the receiver's back-pressure.

Delivery is direct, the one documented exception to "a transport never calls into
a socket" (``SinkAttachable`` in nanopy/transports/_base.py): the receiving pipe
driver attaches a *sink* to its inbox (its own function feeding its socket's core),
and while the receiver keeps up (nothing queued, the sink not paused) a write hands
the payloads to that sink from the sender's thread -- no engine hop. Otherwise
payloads queue in the inbox and the receiving pipe's reader task drains them into
the sink, in order, once the core has room, which makes room for the sender again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import trio

from ..core.errors import AddressError, AddressInUse, RemoteProtocolError
from ._base import ChannelConnection, Connection, Listener, PipeContext, Transport, pass_gate
from ._table import ProcessTable

#: messages an inbox holds for a receiver that does not keep up (its "kernel buffer")
INBOX_SIZE = 64


class _Inbox:
    """One direction of an inproc pipe: the sender writes, the receiver drains.

    ``_lock`` orders everything that reaches the receiving core: a direct delivery
    and a drain of the queue both happen under it, so payloads arrive in order.
    """

    __slots__ = ("_lock", "_items", "_readable", "_writable", "_sink", "_paused", "closed")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[bytes] = []
        # (event, its trio token): the reader waiting for items, the writer for room
        self._readable: tuple[trio.Event, trio.lowlevel.TrioToken] | None = None
        self._writable: tuple[trio.Event, trio.lowlevel.TrioToken] | None = None
        self._sink: Callable[[list[bytes]], object] | None = None
        self._paused: Callable[[], bool] = lambda: True
        self.closed = False

    @property
    def writer_waiting(self) -> bool:
        """The writer waits in ``put`` for room (cleared when the reader makes some)."""
        return self._writable is not None

    def attach(self, sink: Callable[[list[bytes]], object], paused: Callable[[], bool]) -> None:
        with self._lock:
            self._sink = sink
            self._paused = paused

    def put_nowait(self, items: list[bytes]) -> int:
        """Deliver or queue what fits of ``items`` (any thread); returns how many."""
        with self._lock:
            if self.closed:
                raise EOFError("inproc peer closed")
            queued = self._items
            sink = self._sink
            if sink is not None and not queued and not self._paused():
                sink(items)  # straight into the receiving core, from this thread
                return len(items)
            room = INBOX_SIZE - len(queued)
            if room <= 0:
                return 0
            taken = items if len(items) <= room else items[:room]
            queued.extend(taken)
            waiter, self._readable = self._readable, None
        if waiter is not None:
            _wake(waiter)
        return len(taken)

    async def put(self, items: list[bytes]) -> None:
        """Deliver or queue all of ``items``, waiting for room (engine thread)."""
        while True:
            n = self.put_nowait(items)
            if n == len(items):
                await trio.lowlevel.cancel_shielded_checkpoint()  # (done: a cancel here would lose or hide it)
                return
            items = items[n:]
            with self._lock:
                if self.closed:
                    raise EOFError("inproc peer closed")
                if len(self._items) < INBOX_SIZE:
                    continue  # room was made meanwhile
                event = trio.Event()
                self._writable = (event, trio.lowlevel.current_trio_token())
            await event.wait()

    async def take(self, into_sink: bool) -> list[bytes]:
        """Wait for queued payloads and take them all (reader task): into the sink,
        under the lock so they stay in order with direct deliveries (``drain``),
        or returned (``receive``, when no sink is attached)."""
        while True:
            with self._lock:
                items = self._items
                sink = self._sink if into_sink else None
                if items and (sink is not None or not into_sink):
                    self._items = []
                    if sink is not None:
                        sink(items)
                    waiter, self._writable = self._writable, None
                    break
                if self.closed:
                    raise EOFError("inproc peer closed")
                event = trio.Event()
                self._readable = (event, trio.lowlevel.current_trio_token())
            await event.wait()
        if waiter is not None:
            _wake(waiter)
        await trio.lowlevel.cancel_shielded_checkpoint()  # (done: a cancel here would lose or hide it)
        return items

    def close(self) -> None:
        with self._lock:
            self.closed = True
            waiters = (self._readable, self._writable)
            self._readable = self._writable = None
        for waiter in waiters:
            if waiter is not None:
                _wake(waiter)


def _wake(waiter: tuple[trio.Event, trio.lowlevel.TrioToken]) -> None:
    """Set a waiting task's event from any thread."""
    event, token = waiter
    try:
        token.run_sync_soon(event.set)
    except trio.RunFinishedError:
        pass


class _Answer:
    """The listener's answer to one dial: admitted, or refused/closed (any thread).

    The dialer's handshake waits for it, so a dialer a bind's gate refuses never
    has a pipe (nor writes into one that is about to close)."""

    __slots__ = ("_lock", "admitted", "_waiter")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.admitted: bool | None = None  # (None: not answered yet)
        self._waiter: tuple[trio.Event, trio.lowlevel.TrioToken] | None = None

    def give(self, admitted: bool) -> None:
        with self._lock:
            if self.admitted is not None:
                return
            self.admitted = admitted
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            _wake(waiter)

    async def wait(self) -> bool:
        with self._lock:
            if self.admitted is None:
                event = trio.Event()
                self._waiter = (event, trio.lowlevel.current_trio_token())
            else:
                event = None
        if event is not None:
            await event.wait()
        else:
            await trio.lowlevel.checkpoint()
        return bool(self.admitted)


class InprocConnection(ChannelConnection):
    """One end of an inproc pipe: a channel whose chunks are lists of payloads."""

    #: the listener's end asks a bind's gate before it answers the dialer
    gates_itself = True

    def __init__(self, inbox: _Inbox, outbox: _Inbox, remote_address: str, answer: _Answer,
                 dialer: bool) -> None:
        self._inbox = inbox
        self._outbox = outbox
        self.remote_address = remote_address
        self._answer = answer
        self._dialer = dialer

    async def handshake(self) -> None:
        answer = self._answer
        if self._dialer:
            if not await answer.wait():
                raise ConnectionRefusedError(f"{self.remote_address}: the inproc listener refused or closed")
            return
        await pass_gate(self)
        answer.give(True)

    def frame(self, payloads: list[bytes]) -> list[bytes]:
        return payloads

    def write_nowait(self, chunk: list[bytes]) -> int:
        return self._outbox.put_nowait(chunk)

    @property
    def waiting_for_room(self) -> bool:
        return self._outbox.writer_waiting

    async def write_all(self, chunk: list[bytes]) -> None:
        await self._outbox.put(chunk)

    def attach_sink(self, sink: Callable[[list[bytes]], object], paused: Callable[[], bool]) -> None:
        """Deliver what the peer sends through ``sink`` (payloads -> the core) while
        ``paused()`` is false; the receiving pipe driver calls this before reading."""
        self._inbox.attach(sink, paused)

    async def drain_to_sink(self) -> None:
        """Hand payloads queued while the sink was paused to it (reader task)."""
        await self._inbox.take(into_sink=True)

    async def receive(self) -> list[bytes]:
        return await self._inbox.take(into_sink=False)

    async def aclose(self) -> None:
        self._answer.give(False)
        self._inbox.close()
        self._outbox.close()


class _InprocListener(Listener):
    def __init__(self, name: str, url: str, ctx: PipeContext) -> None:
        self.name = name
        self.url = url
        self.ctx = ctx
        self._send, self._recv = trio.open_memory_channel[InprocConnection](256)

    def offer(self, conn: InprocConnection) -> None:
        try:
            self._send.send_nowait(conn)
        except (trio.WouldBlock, trio.ClosedResourceError):
            raise ConnectionRefusedError(f"{self.url}: listener busy or closed") from None

    async def accept(self) -> Connection:
        try:
            return await self._recv.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise OSError("inproc listener closed") from None

    async def aclose(self) -> None:
        _registry.remove(self.name, self)
        self._send.close()
        async with self._recv:
            while True:  # dials never accepted: their dialers hear the refusal now
                try:
                    conn = self._recv.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                    break
                await conn.aclose()


#: the process's inproc listeners by name
_registry: ProcessTable[str, _InprocListener] = ProcessTable()


def listening(name: str) -> bool:
    """True if a socket of this process binds ``inproc://name`` now."""
    return _registry.get(name) is not None


def _name(url: str) -> str:
    name = url[len("inproc://") :]
    if not name:
        raise AddressError(f"{url!r}: inproc needs a name, e.g. inproc://jobs")
    return name


class InprocTransport(Transport):
    schemes = ("inproc",)

    def check_url(self, url: str) -> None:
        _name(url)

    async def listen(self, url: str, ctx: PipeContext) -> Listener:
        listener = _InprocListener(_name(url), url, ctx)
        if not _registry.add(listener.name, listener):
            raise AddressInUse(98, f"{listener.url}: address already in use")
        return listener

    async def dial(self, url: str, ctx: PipeContext) -> Connection:
        await trio.lowlevel.checkpoint()  # (before the offer: a cancel after it would strand the listener's end)
        listener = _registry.get(_name(url))
        if listener is None:
            raise ConnectionRefusedError(f"{url}: no inproc listener")
        if listener.ctx.protocol_id != ctx.peer_id or listener.ctx.peer_id != ctx.protocol_id:
            raise RemoteProtocolError(
                f"{url}: listener speaks {listener.ctx.protocol_name}, "
                f"which is not a peer of {ctx.protocol_name}"
            )
        to_listener, to_dialer = _Inbox(), _Inbox()
        answer = _Answer()
        mine = InprocConnection(to_dialer, to_listener, url, answer, dialer=True)
        theirs = InprocConnection(to_listener, to_dialer, url, answer, dialer=False)
        listener.offer(theirs)
        return mine


transport = InprocTransport()
