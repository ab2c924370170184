"""Capability rules (C1-C11 but C3, which runs through sockets): a connection that
declares a capability protocol of nanopy/transports/_base.py behaves as its
docstring says. A capability not declared skips its rule.
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Callable

import trio
import trio.testing

from ...core.errors import AddressError, NanopyError, ProtocolError
from ...protocols._registry import protocols as protocol_registry
from ...socket.socket import Socket
from ...transports._base import (
    ChannelConnection,
    CountsUnwritten,
    DirectReadable,
    DiscardsMessages,
    JudgesSilence,
    KernelSocketBacked,
    OtherWireProtocol,
    PeerWatching,
    ReportsWriteWait,
    SinkAttachable,
    WriteWindow,
)
from .harness import (
    GONE,
    RawPipe,
    connect,
    cut_listener,
    expect_end,
    listen,
    not_bytes,
    pair,
    receive_exactly,
    stall,
    through_proxy,
    write,
)
from .target import PROMPT, Check
from .wire import close_quietly


async def direct_readable(ck: Check) -> None:
    """C1: read_nowait/wait_readable/failed/fileno."""
    t = ck.target
    client, server = await pair(ck)
    if not isinstance(server, DirectReadable):
        ck.skip("DirectReadable not declared")
    with ck.within(PROMPT, "read_nowait() from another thread with nothing sent (it must never block)"):
        first = await trio.to_thread.run_sync(server.read_nowait, abandon_on_cancel=True)
    ck.expect(first is None or first == [], f"read_nowait() with nothing sent returned {first!r}")
    head = [t.payload(i, 1000) for i in range(10)]
    tail = [t.payload(10 + i, 1000) for i in range(10)] + [t.payload(99, 300_000)]
    await client.send(head)
    await receive_exactly(ck, server, head, "payloads read by receive() before read_nowait()")
    with ck.within(ck.timeout, "payloads read by wait_readable() and read_nowait() from another thread"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.send, tail)
            got = await _read_directly(ck, server, len(tail))
    ck.expect(got == tail, f"read_nowait() after receive() returned {[len(p) for p in got]}, not the payloads sent")
    await close_quietly(client)
    with ck.within(ck.timeout, "read_nowait() after the peer's close"):
        while True:
            await server.wait_readable()
            try:
                batch = await trio.to_thread.run_sync(server.read_nowait, abandon_on_cancel=True)
            except GONE:
                break
            ck.expect(not batch, f"read_nowait() after the peer's close returned {len(batch or [])} payload(s)")
    ck.expect(server.failed, "failed is false after read_nowait() raised the end of the connection")
    await close_quietly(server)
    ck.expect(server.fileno() == -1, f"fileno() of a closed connection is {server.fileno()}, not -1")


async def _read_directly(ck: Check, conn: DirectReadable, count: int) -> list[bytes]:
    got: list[bytes] = []
    while len(got) < count:
        await conn.wait_readable()
        batch = await trio.to_thread.run_sync(conn.read_nowait, abandon_on_cancel=True)
        if batch is None:
            continue
        wrong = not_bytes(batch)
        ck.expect(not wrong, f"read_nowait(): {wrong}")
        got += batch
    return got


async def sink_attachable(ck: Check) -> None:
    """C2: attach_sink, paused and drain_to_sink."""
    t = ck.target
    client, server = await pair(ck)
    if not isinstance(server, SinkAttachable):
        ck.skip("SinkAttachable not declared")
    delivered: list[bytes] = []
    paused = False
    reached = trio.Event()
    expected = 0

    def sink(payloads: list[bytes]) -> None:
        wrong = not_bytes(list(payloads))
        ck.expect(not wrong, f"the sink was given {wrong}")
        ck.expect(not paused, "a payload reached the sink while paused() was true")
        delivered.extend(payloads)
        if len(delivered) >= expected:
            reached.set()

    server.attach_sink(sink, lambda: paused)
    first = [t.payload(i, 100) for i in range(5)]
    expected = len(first)
    async with trio.open_nursery() as nursery:
        await client.send(first)  # (not paused, nothing queued: straight into the sink)
        with ck.within(ck.timeout, "payloads reaching an attached sink"):
            await reached.wait()
        ck.expect(delivered == first, f"the sink got {len(delivered)} payloads, not the {len(first)} sent in order")
        paused = True
        state = await stall(ck, nursery, client, size=1000)
        state.stop = True
        held = delivered[len(first):]
        ck.expect(not held, f"{len(held)} payloads reached the sink while paused")
        written = state.written
        expected = len(first) + len(written)
        reached = trio.Event()
        paused = False
        nursery.start_soon(_drain_forever, server)
        with ck.within(ck.timeout, "drain_to_sink() once the sink is not paused"):
            await reached.wait()
            await state.done.wait()
        ck.expect(delivered == first + written, f"the sink got {len(delivered)} payloads, not the "
                  f"{expected} sent, each once and in order")
        nursery.cancel_scope.cancel()


async def _drain_forever(conn: SinkAttachable) -> None:
    while True:
        await conn.drain_to_sink()


async def judges_silence(ck: Check) -> None:
    """C4: silence_blamed() after an ordinary close."""
    client, server = await pair(ck)
    if not isinstance(client, JudgesSilence):
        ck.skip("JudgesSilence not declared")
    before = client.silence_blamed()
    ck.expect(before is None or isinstance(before, str), f"silence_blamed() returned {before!r}")
    await close_quietly(server)
    await expect_end(ck, client, "receive() after the peer's close")
    after = client.silence_blamed()
    ck.expect(after is None, f"silence_blamed() after an ordinary close by the peer is {after!r}, not None")


async def other_wire_protocol(ck: Check) -> None:
    """C5: check_protocol() for every protocol; a refused socket cannot bind."""
    t = ck.target
    transport = t.transport
    if not isinstance(transport, OtherWireProtocol):
        ck.skip("OtherWireProtocol not declared")
    refused = []
    for name in protocol_registry.names():
        try:
            transport.check_protocol(name, False, {})
        except (AddressError, ProtocolError):
            refused.append(name)
        except Exception as exc:  # noqa: BLE001
            ck.fail(f"check_protocol({name!r}) raised {type(exc).__name__}, not AddressError or ProtocolError")
    for name in refused[:2]:
        with Socket(name) as sock:
            try:
                sock.bind(ck.new_url("refused"), **t.bind_options)
            except NanopyError:
                continue
            ck.fail(f"a {name} socket bound {t.scheme}:// although check_protocol refuses it")


async def kernel_socket_backed(ck: Check) -> None:
    """C6: kernel_socket() is the socket used, and aclose() closes it."""
    client, server = await pair(ck)
    if not isinstance(client, KernelSocketBacked) or not isinstance(server, KernelSocketBacked):
        ck.skip("KernelSocketBacked not declared")
    mine, theirs = client.kernel_socket(), server.kernel_socket()
    for ks, side in ((mine, "the dialed end"), (theirs, "the accepted end")):
        ck.expect(callable(getattr(ks, "getsockopt", None)), f"kernel_socket() of {side} has no getsockopt()")
    if hasattr(mine, "getpeername") and hasattr(theirs, "getsockname"):
        try:
            faces = mine.getpeername(), theirs.getsockname()
        except OSError as exc:
            ck.fail(f"kernel_socket() is not a connected socket: getpeername() raised {exc}")
        ck.expect(faces[0] == faces[1], f"kernel_socket()s do not face each other: the dialed end's peer is "
                  f"{faces[0]!r}, the accepted end's address {faces[1]!r}")
    await close_quietly(client)
    if hasattr(mine, "fileno"):
        ck.expect(mine.fileno() == -1, "aclose() left the kernel socket open")


async def reports_write_wait(ck: Check) -> None:
    """C7: waiting_for_room while idle, stalled, and after."""
    client, server = await pair(ck)
    if not isinstance(client, ReportsWriteWait):
        ck.skip("ReportsWriteWait not declared")
    ck.expect(not client.waiting_for_room, "waiting_for_room is true on an idle connection")
    async with trio.open_nursery() as nursery:
        state = await stall(ck, nursery, client)
        ck.expect(client.waiting_for_room, "waiting_for_room is false while a write waits for a peer that reads "
                  "nothing")
        state.stop = True
        await receive_exactly(ck, server, state.written, "payloads written to a stalled reader, once it reads")
        with ck.within(ck.timeout, "the waiting write once the peer read"):
            await state.done.wait()
    ck.expect(not client.waiting_for_room, "waiting_for_room is still true after the write finished")


async def counts_unwritten(ck: Check) -> None:
    """C8: unwritten_bytes() after a write_all() cut by a reset."""
    t = ck.target
    listener, upstream = await cut_listener(ck)
    async with trio.open_nursery() as nursery:
        client, server, proxy = await through_proxy(ck, nursery, listener, upstream)
        if not isinstance(server, CountsUnwritten) or not isinstance(server, ChannelConnection):
            ck.skip("CountsUnwritten not declared (on a ChannelConnection)")
        chunk = server.frame([t.payload(0, 32 << 20)])  # (more than the kernel buffers on the way)
        failed = trio.Event()

        async def write_until_cut() -> None:
            try:
                await server.write_all(chunk)
            except GONE:
                failed.set()

        nursery.start_soon(write_until_cut)
        with ck.within(ck.timeout, "a write of 32 MiB to a peer that reads nothing, until it waits"):
            await trio.testing.wait_all_tasks_blocked(0.02)
        proxy.cut("rst")
        with ck.within(ck.timeout, "write_all() failing after the peer's reset"):
            await failed.wait()
        left = server.unwritten_bytes()
        ck.expect(left is None or (isinstance(left, int) and 0 < left <= len(chunk)),
                  f"unwritten_bytes() after a write cut by a reset is {left!r}, not None or 1..{len(chunk)}")
        nursery.cancel_scope.cancel()
    await close_quietly(client)


async def discards_messages(ck: Check) -> None:
    """C9: count_drops_with() and a clean exchange."""
    client, server = await pair(ck)
    if not isinstance(server, DiscardsMessages):
        ck.skip("DiscardsMessages not declared")
    counted: list[tuple[str, int]] = []
    server.count_drops_with(lambda reason, n: counted.append((reason, n)))
    await client.send([b"one", b"two"])
    await receive_exactly(ck, server, [b"one", b"two"], "a clean exchange")
    ck.expect(not counted, f"a clean exchange counted drops: {counted}")


#: dead_peer_timeout for rule C10 (short: the rule watches it run out)
WATCH = 0.3


async def peer_watching(ck: Check) -> None:
    """C10: keepalive keeps a live peer, spares a busy pipe, ends a silent peer's."""
    t = ck.target
    listener = await listen(ck, t.context(dialer=False, dead_peer_timeout=WATCH))
    client, server = await connect(ck, listener, ctx=t.context(dialer=True, dead_peer_timeout=WATCH))
    if not isinstance(client, PeerWatching):
        ck.skip("PeerWatching not declared")
    keepalive = client.keepalive
    if keepalive is None:
        ck.fail("keepalive is None although dead_peer_timeout is set")
    # (sleeps here are the behaviour under test: time passing with or without a peer)
    async with trio.open_nursery() as nursery:
        for conn in (client, server):
            nursery.start_soon(RawPipe(conn).run)
        await _keepalive_lives(ck, keepalive, lambda: False, "a live peer that answers")
        nursery.cancel_scope.cancel()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(RawPipe(client).run)  # (the server reads and answers nothing from now on)
        await _keepalive_lives(ck, keepalive, lambda: True, "a busy pipe whose peer is silent")
        with ck.within(WATCH * 3 + PROMPT, "keepalive ending a silent peer's pipe"):
            try:
                await keepalive(lambda: False)
            except TimeoutError as exc:
                ck.expect(exc.errno == errno.ETIMEDOUT, f"keepalive raised TimeoutError with errno {exc.errno}, "
                          "not ETIMEDOUT")
            else:
                ck.fail("keepalive returned while its peer was silent")
        nursery.cancel_scope.cancel()


async def _keepalive_lives(ck: Check, keepalive: Callable[[Callable[[], bool]], Awaitable[None]],
                           busy: Callable[[], bool], what: str) -> None:
    """``keepalive(busy)`` runs for twice the timeout without ending the pipe."""
    with trio.move_on_after(WATCH * 2):
        try:
            await keepalive(busy)
        except TimeoutError as exc:
            ck.fail(f"keepalive ended the pipe of {what}: {exc}")
        ck.fail(f"keepalive returned on {what}")


#: request ids of rule C11 (a REQ's ids have the top bit set)
_REQUEST_ID = 0x80000000


async def write_window(ck: Check) -> None:
    """C11: window() and the hook given to watch_window(), over a req/rep pair."""
    t = ck.target
    client, server = await pair(ck, server=t.context(dialer=False, protocol="rep"),
                                client=t.context(dialer=True, protocol="req"))
    if not isinstance(client, WriteWindow):
        ck.skip("WriteWindow not declared")
    moves = [0]

    def moved() -> None:
        moves[0] += 1

    if not client.watch_window(moved):
        ck.skip("WriteWindow declared, but watch_window() says this connection never limits its writes")
    for round_ in range(3):
        room = client.window()
        ck.expect(isinstance(room, int) and room > 0,
                  f"window() with nothing outstanding (round {round_}) is {room!r}, not a positive int")
        batch = [t.payload(_REQUEST_ID + 16 * round_ + i, 100) for i in range(min(room, 8))]
        before = moves[0]
        await write(client, batch)
        after = client.window()
        ck.expect(after == room or moves[0] > before,
                  f"window() moved from {room} to {after} with a write, and the hook was not called")
        got: list[bytes] = []
        with ck.within(ck.timeout, "the requests of a window's worth, at the peer"):
            while len(got) < len(batch):
                got += await server.receive()
        before = moves[0]
        await write(server, got)  # (each answered: what a REP received goes back as its reply)
        await receive_exactly(ck, client, batch, "the replies to a window's worth of requests")
        again = client.window()
        ck.expect(again == after or moves[0] > before,
                  f"window() moved from {after} to {again} with the replies, and the hook was not called")
