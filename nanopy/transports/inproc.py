"""``inproc://name`` -- in-process pipes that hand message objects over as they are.

Nothing is framed or copied: a payload travels as the same ``bytes`` object.

Delivery is direct: the receiving pipe attaches a *sink* to its inbox (a function
feeding its socket's core), and a sender hands each payload to that sink from its
own thread -- no engine hop -- and gets its credit back at once. Only while the
receiver's queue is full (the sink reports it paused) or older payloads still wait
do payloads queue in the inbox; the receiving pipe's reader task drains them into
the sink, in order, once the queue has room, and only then returns their credit,
so the receiver's back-pressure reaches the sender as on a real wire.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import trio

from .._errors import AddressError, AddressInUse, RemoteProtocolError
from ._base import Connection, Listener, PipeContext, Transport
from ._table import ProcessTable


class _Inbox:
    """One direction of an inproc pipe: senders deliver (or queue), the receiver drains.

    ``_lock`` orders everything that reaches the receiving core: a direct delivery
    and a drain of the queue both happen under it, so payloads arrive in order.
    """

    __slots__ = ("_lock", "_items", "_event", "_token", "_sink", "_paused", "closed")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[bytes] = []
        self._event: trio.Event | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._sink: Callable[[list[bytes]], object] | None = None
        self._paused: Callable[[], bool] = lambda: True
        self.closed = False

    def attach(self, sink: Callable[[list[bytes]], object], paused: Callable[[], bool]) -> None:
        with self._lock:
            self._sink = sink
            self._paused = paused

    def put(self, items: list[bytes]) -> int:
        """Deliver or queue ``items``; returns how many were delivered (-1: closed)."""
        with self._lock:
            if self.closed:
                return -1
            sink = self._sink
            if sink is not None and not self._items and not self._paused():
                sink(items)  # straight into the receiving core, from this thread
                return len(items)
            self._items.extend(items)
            event, self._event = self._event, None
        if event is not None:
            self._wake(event)
        return 0

    async def drain(self) -> int:
        """Wait for queued payloads and hand them all to the sink; returns how many."""
        while True:
            with self._lock:
                items = self._items
                if items and self._sink is not None:
                    self._items = []
                    self._sink(items)
                    break
                if self.closed:
                    raise EOFError("inproc peer closed")
                event = self._event = trio.Event()
                self._token = trio.lowlevel.current_trio_token()
            await event.wait()
        await trio.lowlevel.checkpoint()
        return len(items)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            event, self._event = self._event, None
        if event is not None:
            self._wake(event)

    def _wake(self, event: trio.Event) -> None:
        try:
            self._token.run_sync_soon(event.set)  # type: ignore[union-attr]
        except trio.RunFinishedError:
            pass

    async def take_all(self) -> list[bytes]:
        while True:
            with self._lock:
                if self._items:
                    items, self._items = self._items, []
                    break
                if self.closed:
                    raise EOFError("inproc peer closed")
                event = self._event = trio.Event()
                self._token = trio.lowlevel.current_trio_token()
            await event.wait()
        await trio.lowlevel.checkpoint()
        return items


class InprocConnection(Connection):
    manages_credit = True

    def __init__(self, inbox: _Inbox, outbox: _Inbox, remote_address: str) -> None:
        self._inbox = inbox
        self._outbox = outbox
        self.remote_address = remote_address
        self.peer: InprocConnection | None = None
        self.release_credit: Callable[[int], None] = lambda n: None

    def try_send(self, payload: bytes) -> bool:
        delivered = self._outbox.put([payload])
        if delivered > 0:
            self.release_credit(delivered)  # it is in the peer's core already
        return delivered >= 0

    async def send(self, payloads: list[bytes]) -> None:
        if payloads:
            delivered = self._outbox.put(payloads)
            if delivered < 0:
                raise EOFError("inproc peer closed")
            if delivered:
                self.release_credit(delivered)
        await trio.lowlevel.checkpoint()

    def attach_sink(self, sink: Callable[[list[bytes]], object], paused: Callable[[], bool]) -> None:
        """Deliver what the peer sends through ``sink`` (payloads -> the core) while
        ``paused()`` is false; the receiving pipe calls this before reading."""
        self._inbox.attach(sink, paused)

    async def drain_to_sink(self) -> None:
        """Hand payloads queued while the sink was paused to it; then their credit goes back."""
        n = await self._inbox.drain()
        if self.peer is not None:
            self.peer.release_credit(n)

    async def receive(self) -> list[bytes]:
        items = await self._inbox.take_all()
        if self.peer is not None:
            self.peer.release_credit(len(items))
        return items

    async def aclose(self) -> None:
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
            pass


#: the process's inproc listeners by name
_registry: ProcessTable[str, _InprocListener] = ProcessTable()


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
        listener = _registry.get(_name(url))
        if listener is None:
            raise ConnectionRefusedError(f"{url}: no inproc listener")
        if listener.ctx.protocol_id != ctx.peer_id or listener.ctx.peer_id != ctx.protocol_id:
            raise RemoteProtocolError(
                f"{url}: listener speaks {listener.ctx.protocol_name}, "
                f"which is not a peer of {ctx.protocol_name}"
            )
        to_listener, to_dialer = _Inbox(), _Inbox()
        mine = InprocConnection(to_dialer, to_listener, url)
        theirs = InprocConnection(to_listener, to_dialer, url)
        mine.peer, theirs.peer = theirs, mine
        listener.offer(theirs)
        await trio.lowlevel.checkpoint()
        return mine


transport = InprocTransport()
