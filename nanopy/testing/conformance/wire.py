"""Rules about bytes on the way: a stalled reader, partial writes of a channel, the
peer's end between and inside messages, and the receive limit (T10, T12, T14-T16),
checked on the plug-in interface directly.
"""

from __future__ import annotations

import trio
import trio.testing

from ...core.errors import MessageTooLarge, RemoteProtocolError
from ...transports import ChannelConnection, Connection
from .harness import (
    ENDED,
    GONE,
    connect,
    cut_listener,
    expect_end,
    listen,
    not_bytes,
    pair,
    receive_exactly,
    stall,
    through_proxy,
)
from .proxy import wire_address
from .target import PROMPT, Check


async def stalled_reader(ck: Check) -> None:
    """T10 (interface half): send() waits for a peer that reads nothing, and every
    payload arrives in order once it reads."""
    client, server = await pair(ck)
    async with trio.open_nursery() as nursery:
        state = await stall(ck, nursery, client)
        state.stop = True
        written = state.written
        await receive_exactly(ck, server, written, f"{len(written)} payloads written to a stalled reader, "
                              "once it reads")
        with ck.within(ck.timeout, "the waiting send() once the peer read"):
            await state.done.wait()
    await client.send([b"after the stall"])
    await receive_exactly(ck, server, [b"after the stall"], "a payload after the stall")


async def partial_writes(ck: Check) -> None:
    """T12: a channel's frame/write_nowait/write_all contract."""
    t = ck.target
    client, server = await pair(ck)
    if not isinstance(client, ChannelConnection):
        ck.skip("not a ChannelConnection")
    payloads = [t.payload(i, 256 * 1024) for i in range(32)]  # 8 MiB: more than a kernel buffer takes
    chunk = client.frame(payloads)
    try:
        size = len(chunk)
        chunk[0:1]  # noqa: B018 - slicing is the contract
    except TypeError as exc:
        ck.fail(f"frame() returned a {type(chunk).__name__} without len() or slicing: {exc}")
    overhead = client.frame_overhead
    if overhead is not None and isinstance(chunk, (bytes, bytearray, memoryview)):
        ck.expect(size == sum(len(p) for p in payloads) + overhead * len(payloads),
                  f"frame() of {len(payloads)} payloads is {size} bytes; frame_overhead {overhead} says "
                  f"{sum(len(p) for p in payloads) + overhead * len(payloads)}")
    if client.framing is not None:
        ck.expect(client.frame(payloads) == chunk, "two frame() calls of the same payloads differ although "
                  f"framing is {client.framing!r}")
    with ck.within(PROMPT, "write_nowait() from another thread (it must never block)"):
        taken = await trio.to_thread.run_sync(client.write_nowait, chunk, abandon_on_cancel=True)
    ck.expect(isinstance(taken, int) and 0 <= taken <= size,
              f"write_nowait() of a {size}-unit chunk returned {taken!r}, not 0..{size}")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.write_all, chunk[taken:])
        await receive_exactly(ck, server, payloads, f"8 MiB cut by write_nowait() after {taken} of {size} "
                              "units and finished by write_all(rest)")
    await client.send([b"after"])
    await receive_exactly(ck, server, [b"after"], "a payload after a partial write")


async def peer_eof(ck: Check) -> None:
    """T14: a graceful close, then a FIN and a RST between messages (wire transports)."""
    client, server = await pair(ck)
    await client.send([b"one", b"two"])
    await close_quietly(client)
    await receive_exactly(ck, server, [b"one", b"two"], "payloads sent before the peer's close")
    await _end_not_protocol_error(ck, server, "receive() after the peer's close")
    listener = await listen(ck)
    upstream = wire_address(listener.url)
    if upstream is None:
        return  # (no wire to cut)
    for how in ("fin", "rst"):
        async with trio.open_nursery() as nursery:
            client, server, proxy = await through_proxy(ck, nursery, listener, upstream)
            await client.send([b"before the cut"])
            await receive_exactly(ck, server, [b"before the cut"], f"a payload before a {how.upper()}")
            proxy.cut(how)
            await _end_not_protocol_error(ck, server, f"receive() after a {how.upper()} between messages")
            nursery.cancel_scope.cancel()


async def _end_not_protocol_error(ck: Check, conn: Connection, what: str) -> None:
    exc = await expect_end(ck, conn, what)
    ck.expect(isinstance(exc, GONE), f"{what} raised {type(exc).__name__} ({exc}), not EOFError or OSError "
              "(RemoteProtocolError is for a cut inside a message)")


async def cut_mid_message(ck: Check) -> None:
    """T15: a FIN or a RST inside a message: RemoteProtocolError, nothing delivered."""
    t = ck.target
    listener, upstream = await cut_listener(ck)
    body = t.payload(7, 100_000)
    for how in ("fin", "rst"):
        async with trio.open_nursery() as nursery:
            client, server, proxy = await through_proxy(ck, nursery, listener, upstream)
            proxy.hold()
            await client.send([body])
            with ck.within(ck.timeout, "the proxy holding the dialer's message"):
                await proxy.wait_held(len(body) // 2)
            outcome: list[BaseException | list[bytes]] = []
            ended = trio.Event()
            nursery.start_soon(_receive_once, server, outcome, ended)
            with ck.within(ck.timeout, "the listener's end taking a quarter of a message"):
                await proxy.release(len(body) // 4)
            # (the receiver reads the part before the cut: a RST would make the kernel drop it)
            await trio.testing.wait_all_tasks_blocked(0.01)
            proxy.cut(how)
            with ck.within(ck.timeout, f"receive() after a {how.upper()} inside a message"):
                await ended.wait()
            got = outcome[0]
            if isinstance(got, list):
                ck.fail(f"a {how.upper()} inside a message: receive() returned {[len(p) for p in got]}-byte "
                        "payload(s)")
            ck.expect(isinstance(got, RemoteProtocolError), f"a {how.upper()} inside a message raised "
                      f"{type(got).__name__} ({got}), not RemoteProtocolError")
            nursery.cancel_scope.cancel()


async def _receive_once(conn: Connection, outcome: list[BaseException | list[bytes]], ended: trio.Event) -> None:
    try:
        outcome.append(await conn.receive())
    except ENDED as exc:
        outcome.append(exc)
    ended.set()


async def recv_max_size(ck: Check) -> None:
    """T16 (interface half): the limit passes, one byte more fails, on both ends."""
    t = ck.target
    listener = await listen(ck, t.context(dialer=False, recv_max_size=1000))
    if wire_address(listener.url) is None:
        ck.skip("an in-memory transport hands payloads over: no wire limit (as in NNG)")
    for receiving in ("accepting", "dialing"):
        client, server = await connect(ck, listener, ctx=t.context(dialer=True, recv_max_size=1000))
        sender, receiver = (client, server) if receiving == "accepting" else (server, client)
        await sender.send([b"x" * 1000])
        await receive_exactly(ck, receiver, [b"x" * 1000], f"a payload of exactly recv_max_size at the "
                              f"{receiving} end")
        await sender.send([b"y" * 1001])
        with ck.within(ck.timeout, f"receive() of a payload over recv_max_size at the {receiving} end"):
            try:
                batch = await receiver.receive()
            except (MessageTooLarge, RemoteProtocolError):
                pass
            except ENDED as exc:
                ck.fail(f"a payload over recv_max_size raised {type(exc).__name__} ({exc}), not MessageTooLarge")
            else:
                wrong = not_bytes(batch)
                ck.fail(wrong or f"a payload over recv_max_size was delivered at the {receiving} end "
                        f"({[len(p) for p in batch]} bytes)")


async def close_quietly(conn: Connection) -> None:
    """aclose() within the prompt bound, errors ignored (T13 judges them)."""
    with trio.move_on_after(PROMPT):
        try:
            await conn.aclose()
        except Exception:  # noqa: BLE001, S110 - judged by T13
            pass
