"""Rules checked on the plug-in interface directly: addresses, the handshake,
cancellation, and ``aclose`` (T1-T5, T7-T9, T11, T13).

Each check is an ``async def check(ck)`` run by :meth:`Check.run` in a trio run of
its own, with every step bounded.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
import trio.testing

from ...core.errors import AddressError, AddressInUse, RemoteProtocolError
from ...transports import Connection
from .harness import ENDED, connect, expect_end, listen, not_bytes, pair, receive_exactly, stall
from .proxy import wire_address
from .target import PROMPT, Check


async def addresses(ck: Check) -> None:
    """T1: the bound URL, check_url and check_dial_url."""
    t = ck.target
    url = ck.new_url("t1")
    listener = await listen(ck, url=url)
    bound = listener.url
    ck.expect(isinstance(bound, str) and bound.startswith(t.scheme + "://"),
              f"Listener.url is {bound!r}, not a {t.scheme}:// URL")
    asked, got = wire_address(url), wire_address(bound)
    if asked is not None and isinstance(asked.address, tuple) and asked.address[1] == 0:
        ck.expect(got is None or not isinstance(got.address, tuple) or got.address[1] != 0,
                  f"listen({url!r}) left port 0 in Listener.url {bound!r}")
    for check, what in ((t.transport.check_url, "check_url"), (t.transport.check_dial_url, "check_dial_url")):
        try:
            check(bound)
        except Exception as exc:  # noqa: BLE001 - any error is the finding
            ck.fail(f"{what}({bound!r}) refused the bound URL: {type(exc).__name__}: {exc}")
    bare = f"{t.scheme}://"
    try:
        t.transport.check_dial_url(bare)
    except AddressError:
        pass
    except Exception as exc:  # noqa: BLE001
        ck.fail(f"check_dial_url({bare!r}) raised {type(exc).__name__}, not AddressError: {exc}")
    else:
        ck.fail(f"check_dial_url({bare!r}) accepted a URL without an address")


async def bind(ck: Check) -> None:
    """T2: a taken address, and Listener.aclose."""
    t = ck.target
    listener = await listen(ck)
    with ck.within(ck.timeout, "a second listen() on a bound address"):
        try:
            other = await t.transport.listen(listener.url, t.context(dialer=False))
        except AddressInUse:
            pass
        except Exception as exc:  # noqa: BLE001
            ck.fail(f"a second listen({listener.url!r}) raised {type(exc).__name__}, not AddressInUse: {exc}")
        else:
            ck.closing(other)
            ck.fail(f"a second listen({listener.url!r}) succeeded while the first listener is open")
    await close_twice(ck, listener.aclose, "Listener.aclose()")
    again = await listen(ck, url=listener.url)  # the address is free again
    ck.expect(again.url == listener.url, f"listening on {listener.url!r} again gave {again.url!r}")


async def refused_dial(ck: Check) -> None:
    """T3: a dial nobody answers."""
    t = ck.target
    listener = await listen(ck)
    url = listener.url
    await listener.aclose()
    with ck.within(ck.timeout, f"dial({url!r}) with nobody listening"):
        try:
            conn = await t.transport.dial(url, t.context(dialer=True))
        except OSError:
            return
        except Exception as exc:  # noqa: BLE001
            ck.fail(f"dial() with nobody listening raised {type(exc).__name__}, not OSError: {exc}")
    ck.closing(conn)
    ck.fail(f"dial({url!r}) with nobody listening returned a connection")


async def round_trip(ck: Check) -> None:
    """T4: batches both ways."""
    t = ck.target
    client, server = await pair(ck)
    for conn, side in ((client, "the dialed end"), (server, "the accepted end")):
        ck.expect(isinstance(conn.remote_address, str), f"{side}'s remote_address is {conn.remote_address!r}")
    batches = [[b"one", b"", b"x" * 100_000, b"last"], [b""], [t.payload(i, 1000) for i in range(50)]]
    flat = [p for batch in batches for p in batch]
    for sender, receiver, way in ((client, server, "dialer -> listener"), (server, client, "listener -> dialer")):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_send_each, sender, batches)
            await receive_exactly(ck, receiver, flat, f"three batches {way}")


async def _send_each(conn: Connection, batches: list[list[bytes]]) -> None:
    for batch in batches:
        await conn.send(batch)


async def wrong_peer(ck: Check) -> None:
    """T5: a pair listener, a push dialer (push's peer is pull)."""
    t = ck.target
    listener = await listen(ck, t.context(dialer=False, protocol="pair"))
    accepted: list[Connection] = []
    outcome: dict[str, object] = {}
    listener_done = trio.Event()

    async def listener_side() -> None:
        conn = await listener.accept()
        ck.closing(conn)
        accepted.append(conn)
        try:
            await conn.handshake()
            outcome["listener"] = "completed"
        except Exception as exc:  # noqa: BLE001 - judged below
            outcome["listener"] = exc
        listener_done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(listener_side)
        with ck.within(ck.timeout, "the dialer's handshake with a peer of another protocol"):
            try:
                conn = await t.transport.dial(listener.url, t.context(dialer=True, protocol="push"))
            except RemoteProtocolError as exc:
                outcome["dialer"] = exc
            else:
                ck.closing(conn)
                try:
                    await conn.handshake()
                    outcome["dialer"] = "completed"
                except Exception as exc:  # noqa: BLE001
                    outcome["dialer"] = exc
                else:
                    ck.fail("a push dialer completed its handshake with a pair listener")
                await conn.aclose()  # (the listener's end then ends too, if it waits for more)
        got = outcome["dialer"]
        ck.expect(isinstance(got, RemoteProtocolError),
                  f"the dialer's handshake with a peer of another protocol raised {type(got).__name__} "
                  f"({got}), not RemoteProtocolError")
        await trio.testing.wait_all_tasks_blocked()
        if not accepted:
            nursery.cancel_scope.cancel()  # (the connection was refused before the listener saw it)
            return
        with ck.within(ck.timeout, "the listener's handshake with a peer of another protocol"):
            await listener_done.wait()
    ck.expect(outcome["listener"] != "completed", "a pair listener completed its handshake with a push dialer")


async def accept_cancellation(ck: Check) -> None:
    """T7: a cancelled accept, then the next connection."""
    listener = await listen(ck)
    got: list[Connection] = []
    await cancel_when_blocked(ck, lambda: _append(got, listener.accept()), "accept()")
    ck.expect(not got, "accept() returned a connection nobody dialed")
    try:
        client, server = await connect(ck, listener)
    except OSError as exc:
        ck.fail(f"the next connection after a cancelled accept() failed: {type(exc).__name__}: {exc}")
    await client.send([b"after a cancelled accept"])
    await receive_exactly(ck, server, [b"after a cancelled accept"], "a message after a cancelled accept()")


async def _append(into: list[Connection], call: Awaitable[Connection]) -> None:
    into.append(await call)


async def cancel_when_blocked(ck: Check, call: Callable[[], Awaitable[object]], what: str) -> None:
    """Start ``call()``, cancel it once it waits; it must end promptly."""
    with ck.within(PROMPT, f"{what} after its cancellation"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()


async def dial_cancellation(ck: Check) -> None:
    """T8: a dial cancelled at its first wait, a handshake cancelled while it waits
    for the peer; the listener's ends of both must not stay open."""
    t = ck.target
    listener = await listen(ck)
    accepted: list[Connection] = []

    async def acceptor() -> None:
        while True:
            conn = await listener.accept()
            ck.closing(conn)
            accepted.append(conn)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(acceptor)
        with ck.within(PROMPT, "a dial() cancelled at its first wait"):
            with trio.CancelScope() as scope:
                scope.cancel()
                conn = await t.transport.dial(listener.url, t.context(dialer=True))
                ck.closing(conn)  # (it finished without waiting: allowed)
                await conn.aclose()
        with ck.within(ck.timeout, "dial()"):
            client = await t.transport.dial(listener.url, t.context(dialer=True))
        ck.closing(client)
        await cancel_when_blocked(ck, client.handshake, "a handshake() waiting for its peer")
        await close_once(ck, client, "aclose() after a cancelled handshake()")
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    for conn in accepted:
        await _must_end(ck, conn, "the listener's end of a connection whose dialer was cancelled")


async def _must_end(ck: Check, conn: Connection, what: str) -> None:
    """``conn``'s peer is gone: its handshake fails, or its first receive ends."""
    with ck.within(ck.timeout, f"{what} (its handshake)"):
        try:
            await conn.handshake()
        except Exception:  # noqa: BLE001 - any failure ends it, as it should
            return
    await expect_end(ck, conn, f"{what} (its receive)")


async def receive_cancellation(ck: Check) -> None:
    """T9: a cancelled wait, then receives cancelled again and again mid-message."""
    t = ck.target
    client, server = await pair(ck)
    got: list[bytes] = []

    async def take() -> None:
        got.extend(await server.receive())

    await cancel_when_blocked(ck, take, "receive()")
    ck.expect(not got, "a cancelled receive() returned payloads nobody sent")
    await client.send([b"after a cancelled receive"])
    await receive_exactly(ck, server, [b"after a cancelled receive"], "a message after a cancelled receive()")
    big = [t.payload(i, 1 << 20) for i in range(3)]
    cancelled = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.send, big)
        with ck.within(ck.timeout, "3 MiB read by receive() calls cut short again and again"):
            deadline = 0.0005
            while len(got) < len(big):
                with trio.move_on_after(deadline) as scope:
                    batch = await server.receive()
                    wrong = not_bytes(batch)
                    ck.expect(not wrong, f"receive(): {wrong}")
                    got += batch
                if scope.cancelled_caught:  # (longer each time: every receive must get somewhere)
                    cancelled += 1
                    deadline = min(deadline * 1.5, 0.1)
    ck.expect(got == big, f"after {cancelled} cancelled receive() calls, 3 MiB arrived as "
              f"{len(got)} payloads of {[len(p) for p in got]} bytes, not the 3 sent")


async def send_cancellation(ck: Check) -> None:
    """T11: cancel a send that waits for a stalled peer; then close."""
    client, server = await pair(ck)
    async with trio.open_nursery() as nursery:
        state = await stall(ck, nursery, client)
        with ck.within(PROMPT, "a send() waiting for a peer that reads nothing, after its cancellation"):
            state.scope.cancel()
            await state.done.wait()
    await close_once(ck, client, "aclose() after a cancelled send()")
    with ck.within(ck.timeout, "the peer's receive after the writer's close"):
        try:
            while await server.receive():
                pass
        except ENDED:
            pass


async def aclose_rules(ck: Check) -> None:
    """T13: aclose on a connection never handshaken, an idle one, and one whose
    peer sent what it never read."""
    t = ck.target
    listener = await listen(ck)
    with ck.within(ck.timeout, "dial()"):
        fresh = await t.transport.dial(listener.url, t.context(dialer=True))
    ck.closing(fresh)
    await close_twice(ck, fresh.aclose, "aclose() of a connection never handshaken")
    listener = await listen(ck)  # (the first one may hold the fresh connection's other end)
    client, server = await connect(ck, listener)
    await close_twice(ck, client.aclose, "aclose() of an idle connection")
    await expect_end(ck, server, "the peer's receive after an idle connection closed", bound=PROMPT + 1)
    await close_twice(ck, server.aclose, "aclose() of a connection whose peer closed")
    client, server = await connect(ck, listener)
    async with trio.open_nursery() as nursery:
        state = await stall(ck, nursery, server)  # (unread by the client: its close must not wait for it)
        state.stop = True
        await close_twice(ck, client.aclose, "aclose() of a connection with unread data")
        with ck.within(ck.timeout, "the peer's waiting send() after the connection closed"):
            await state.done.wait()
    await expect_end(ck, server, "the peer's receive after a close with unread data")


async def close_once(ck: Check, conn: Connection, what: str) -> None:
    """``conn.aclose()``: prompt, without an error."""
    with ck.within(PROMPT, what):
        try:
            await conn.aclose()
        except Exception as exc:  # noqa: BLE001
            ck.fail(f"{what} raised {type(exc).__name__}: {exc} (aclose must never raise)")


async def close_twice(ck: Check, aclose: Callable[[], Awaitable[None]], what: str) -> None:
    """Call ``aclose`` twice: both prompt, neither raising (idempotent)."""
    for attempt in (what, f"a second {what}"):
        with ck.within(PROMPT, attempt):
            try:
                await aclose()
            except Exception as exc:  # noqa: BLE001
                ck.fail(f"{attempt} raised {type(exc).__name__}: {exc} (aclose must be idempotent and never raise)")
