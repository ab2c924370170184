"""Driving a transport without the engine: listeners, connected pairs, a stalled
peer, and a small pipe that writes control frames (what the checks share).

Everything here uses the plug-in interface only (nanopy.transports), the way
nanopy's pipe driver does, so a check sees what a socket would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio
import trio.testing

from ...core.errors import MessageTooLarge, RemoteProtocolError
from ...transports import ChannelConnection, Connection, Listener, PipeContext
from .proxy import CutProxy, WireAddress, wire_address
from .rules import RULES_BY_ID, ConformanceError
from .target import Check

#: what a connection that went away may raise (docs/transports.md, "Errors"; the
#: engine takes trio's stream errors alike)
GONE = (EOFError, OSError, trio.BrokenResourceError, trio.ClosedResourceError)
#: what ends a pipe at all
ENDED = (*GONE, RemoteProtocolError, MessageTooLarge)
#: the payload size the stalled-peer checks write in
STALL_PAYLOAD = 256 * 1024


async def listen(ck: Check, ctx: PipeContext | None = None, url: str | None = None) -> Listener:
    """A listener on a fresh address (closed when the check ends)."""
    t = ck.target
    with ck.within(ck.timeout, "listen()"):
        listener = await t.transport.listen(url or ck.new_url(), ctx or t.context(dialer=False))
    ck.closing(listener)
    return listener


async def connect(ck: Check, listener: Listener, *, ctx: PipeContext | None = None,
                  url: str | None = None) -> tuple[Connection, Connection]:
    """Dial ``listener`` (or ``url``), accept, and run both handshakes at once (a ws
    listener routes a connection by its upgrade request: accept needs the dialer
    going). Returns ``(dialed, accepted)``; both are closed when the check ends."""
    t = ck.target
    with ck.within(ck.timeout, "dial(), accept() and both handshakes"):
        client = await t.transport.dial(url or listener.url, ctx or t.context(dialer=True))
        ck.closing(client)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.handshake)
            server = await listener.accept()
            ck.closing(server)
            await server.handshake()
    return client, server


async def pair(ck: Check, **contexts: PipeContext) -> tuple[Connection, Connection]:
    """A listener and one connection to it: ``(dialed, accepted)``. Keywords
    ``server`` and ``client`` give the two ends' contexts."""
    listener = await listen(ck, contexts.get("server"))
    return await connect(ck, listener, ctx=contexts.get("client"))


async def cut_listener(ck: Check) -> tuple[Listener, WireAddress]:
    """A listener whose connections a :class:`CutProxy` can cut (the rule is skipped
    for an in-memory transport)."""
    listener = await listen(ck)
    upstream = wire_address(listener.url)
    if upstream is None:
        ck.skip("no wire to cut (an in-memory transport)")
    return listener, upstream


async def through_proxy(ck: Check, nursery: trio.Nursery, listener: Listener,
                        upstream: WireAddress) -> tuple[Connection, Connection, CutProxy]:
    """A connection to ``listener`` through a new proxy (served in ``nursery``):
    ``(dialed, accepted, proxy)``."""
    proxy = CutProxy(upstream)
    await nursery.start(proxy.serve)
    client, server = await connect(ck, listener, url=proxy.url)
    return client, server, proxy


async def write(conn: Connection, payloads: list[bytes]) -> None:
    """Write ``payloads`` the way a pipe does: a channel through ``frame`` and
    ``write_all`` (its own ``send`` may differ), any other connection by ``send``."""
    if isinstance(conn, ChannelConnection):
        await conn.write_all(conn.frame(payloads))
    else:
        await conn.send(payloads)


def not_bytes(batch: object) -> str | None:
    """Why ``batch`` is not a list of exactly-bytes payloads, or None."""
    if not isinstance(batch, list):
        return f"receive() returned a {type(batch).__name__}, not a list"
    for payload in batch:
        if payload.__class__ is not bytes:
            return f"receive() returned a payload of type {type(payload).__name__}, not bytes"
    return None


def describe_mismatch(got: list[bytes], expected: list[bytes]) -> str:
    """Where two payload lists part (for failure messages)."""
    if len(got) != len(expected):
        return f"{len(got)} payloads instead of {len(expected)}"
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        if a != b:
            return f"payload {i} differs ({len(a)} bytes, {len(b)} expected)"
    return "equal"


async def receive_exactly(ck: Check, conn: Connection, expected: list[bytes], what: str) -> None:
    """Receive until ``len(expected)`` payloads came; they must be ``expected``."""
    got: list[bytes] = []
    with ck.within(ck.timeout, what):
        while len(got) < len(expected):
            batch = await conn.receive()
            wrong = not_bytes(batch)
            if wrong:
                ck.fail(f"{what}: {wrong}")
            got += batch
    if got != expected:
        ck.fail(f"{what}: {describe_mismatch(got, expected)}")


async def expect_end(ck: Check, conn: Connection, what: str, allowed: tuple[type[BaseException], ...] = ENDED,
                     bound: float | None = None) -> BaseException:
    """Receive until the connection ends; nothing more may arrive. Returns the error."""
    with ck.within(ck.timeout if bound is None else bound, what):
        try:
            batch = await conn.receive()
        except allowed as exc:
            return exc
        except BaseException as exc:
            if isinstance(exc, (trio.Cancelled, ConformanceError)):
                raise
            ck.fail(f"{what}: receive() raised {type(exc).__name__}: {exc}")
    ck.fail(f"{what}: receive() returned {len(batch)} payload(s) instead of ending")


@dataclass
class Stalled:
    """Payloads written one per ``send`` to a peer that reads nothing, until a send waits."""

    sent: list[bytes] = field(default_factory=list)  # sends that returned
    pending: list[bytes] = field(default_factory=list)  # the send that waits
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    finished: bool = False  # the waiting send returned after all (the peer drained)
    error: BaseException | None = None
    done: trio.Event = field(default_factory=trio.Event)  # the sender task ended
    stop: bool = False  # end once the waiting send returns (the peer is about to read)

    @property
    def written(self) -> list[bytes]:
        """Every payload handed to ``send``, in order."""
        return self.sent + self.pending


async def stall(ck: Check, nursery: trio.Nursery, conn: Connection, size: int = STALL_PAYLOAD) -> Stalled:
    """Send to a peer that reads nothing until a ``send`` waits; it keeps waiting in
    ``nursery`` (cancel ``Stalled.scope`` or let the peer drain). A transport that
    takes ``buffer_limit`` bytes without waiting fails rule T10."""
    t = ck.target
    state = Stalled()

    async def sender() -> None:
        try:
            with state.scope:
                await send_until_stopped()
        finally:
            state.done.set()

    async def send_until_stopped() -> None:
        index = 0
        try:
            while len(state.sent) * size <= t.buffer_limit:
                state.pending = [t.payload(index, size)]
                await write(conn, state.pending)
                state.sent += state.pending
                state.pending = []
                index += 1
                if state.stop:
                    return
        except ENDED as exc:
            state.error = exc
            return
        state.finished = True

    nursery.start_soon(sender)
    with ck.within(ck.timeout, "sending to a peer that reads nothing until a send() waits"):
        await trio.testing.wait_all_tasks_blocked(0.02)
    if state.error is not None:
        ck.fail(f"send() to a peer that reads nothing raised {type(state.error).__name__}: {state.error}")
    if state.finished:
        raise ConformanceError(
            RULES_BY_ID["T10"], t.scheme,
            f"send() took {len(state.sent) * size >> 20} MiB for a peer that reads nothing without waiting "
            "(unbounded memory behind a stalled reader)",
        )
    return state


class RawPipe:
    """What the pipe driver does for a connection, in small: a reader task that
    collects payloads and a writer task for control frames (``attach_control``:
    WebSocket PONGs, ZMTP commands), so PINGs get answered."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.received: list[bytes] = []
        self.error: BaseException | None = None
        self._control: bytes | None = None
        self._wake = trio.Event()
        if isinstance(conn, ChannelConnection):
            conn.attach_control(self.send_control)

    def send_control(self, frame: bytes, append: bool = False) -> bool:
        """As the pipe driver's: queue ``frame`` ahead of payloads, replacing (or,
        with ``append``, followed by) one not yet written; b"" only asks."""
        control = self._control
        if not frame:
            return control is not None
        self._control = control + frame if append and control is not None else frame
        self._wake.set()
        return control is not None

    async def run(self, read: bool = True) -> None:
        """Run the reader (unless ``read`` is false: a peer that reads nothing) and the writer."""
        async with trio.open_nursery() as nursery:
            if read:
                nursery.start_soon(self._reader)
            nursery.start_soon(self._writer)

    async def _reader(self) -> None:
        try:
            while True:
                self.received += await self.conn.receive()
        except ENDED as exc:
            self.error = exc

    async def _writer(self) -> None:
        conn = self.conn
        if not isinstance(conn, ChannelConnection):
            return
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                control, self._control = self._control, None
                if control:
                    await conn.write_all(conn.control_chunk(control))
        except ENDED as exc:
            self.error = exc
