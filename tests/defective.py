"""Planted defects for the conformance kit's own tests: small broken variants of
real transports, each breaking one rule of nanopy.testing.conformance.RULES.

:class:`Defective` serves a scheme of its own over a real transport (tcp, inproc,
the example plug-in): URLs are translated, and every connection it makes or
accepts goes through ``patch`` (which swaps a method, or the class for a
property). A defect is one such variant; ``DEFECTS`` maps each rule id to one.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

import nanopy.transports
from nanopy import RemoteProtocolError
from nanopy.testing import local_url
from nanopy.transports import Connection, Listener, PipeContext, Transport

EXAMPLE_SRC = Path(__file__).resolve().parent.parent / "examples" / "plugins" / "src"
if str(EXAMPLE_SRC) not in sys.path:
    sys.path.insert(0, str(EXAMPLE_SRC))
import nanopy_zlib  # noqa: E402

Patch = Callable[[Connection], None]


class DefectiveListener(Listener):
    def __init__(self, owner: Defective, inner: Listener, asked: str) -> None:
        self.owner = owner
        self.inner = inner
        self.url = owner.outer(inner.url)
        self.asked = asked
        self.accepted = 0

    async def accept(self) -> Connection:
        conn = await self.inner.accept()
        self.accepted += 1
        self.owner.patch(conn)
        return conn

    def update_context(self, ctx: PipeContext) -> None:
        self.inner.update_context(ctx)

    async def aclose(self) -> None:
        await self.inner.aclose()


class Defective(Transport):
    """``scheme`` served by the registered transport ``base``, with a defect."""

    listener_class: type[DefectiveListener] = DefectiveListener

    def __init__(self, scheme: str, base: str) -> None:
        self.scheme = scheme
        self.base = base
        self.schemes = (scheme,)
        self.inner = nanopy.transports.get(base) if base != "tcp+zlib" else nanopy_zlib.transport
        self.endpoint_options = self.inner.endpoint_options

    def outer(self, url: str) -> str:
        return self.scheme + url[len(self.base):]

    def inner_url(self, url: str) -> str:
        if self.base == "inproc" and url.endswith(":0"):  # (the kit's default address: a host:port)
            return local_url("inproc", self.scheme)
        return self.base + url[len(self.scheme):]

    def patch(self, conn: Connection) -> None:
        """Break ``conn`` (default: leave it alone)."""

    def check_url(self, url: str) -> None:
        self.inner.check_url(self.inner_url(url))

    def check_dial_url(self, url: str) -> None:
        self.inner.check_dial_url(self.inner_url(url))

    async def listen(self, url: str, ctx: PipeContext) -> Listener:
        return self.listener_class(self, await self.inner.listen(self.inner_url(url), ctx), url)

    async def dial(self, url: str, ctx: PipeContext) -> Connection:
        conn = await self.inner.dial(self.inner_url(url), ctx)
        self.patch(conn)
        return conn


def swap_class(conn: Connection, **members: Any) -> None:
    """Give ``conn`` a subclass of its class with ``members`` (properties too)."""
    conn.__class__ = type("Broken" + type(conn).__name__, (type(conn),), members)


def wrap(conn: Connection, name: str, make: Callable[[Any], Any]) -> None:
    """Replace method ``name`` of ``conn`` by ``make(original)``."""
    setattr(conn, name, make(getattr(conn, name)))


# -- one defect per rule --------------------------------------------------------------
class PortZeroKept(Defective):
    """T1: Listener.url keeps the port 0 it was asked for."""

    class listener_class(DefectiveListener):  # noqa: N801
        def __init__(self, owner: Defective, inner: Listener, asked: str) -> None:
            super().__init__(owner, inner, asked)
            self.url = asked


class CloseRaisesTwice(Defective):
    """T2: Listener.aclose() raises the second time."""

    class listener_class(DefectiveListener):  # noqa: N801
        closed = False

        async def aclose(self) -> None:
            if self.closed:
                raise RuntimeError("already closed")
            self.closed = True
            await self.inner.aclose()


class DialNeverRefused(Defective):
    """T3: dial() to nobody returns a connection (that fails later)."""

    async def dial(self, url: str, ctx: PipeContext) -> Connection:
        try:
            return await super().dial(url, ctx)
        except OSError:
            return _Dead()


class _Dead(Connection):
    async def handshake(self) -> None:
        raise ConnectionRefusedError("nobody there")

    async def send(self, payloads: list[bytes]) -> None:
        raise ConnectionRefusedError("nobody there")

    async def receive(self) -> list[bytes]:
        raise ConnectionRefusedError("nobody there")

    async def aclose(self) -> None:
        pass


class Bytearrays(Defective):
    """T4: receive() hands bytearrays."""

    def patch(self, conn: Connection) -> None:
        def make(receive: Any) -> Any:
            async def broken() -> list[Any]:
                return [bytearray(p) for p in await receive()]
            return broken
        wrap(conn, "receive", make)


class AnyPeer(Defective):
    """T5: the handshake accepts a peer of any protocol."""

    def patch(self, conn: Connection) -> None:
        def make(handshake: Any) -> Any:
            async def broken() -> None:
                try:
                    await handshake()
                except RemoteProtocolError:
                    pass
            return broken
        wrap(conn, "handshake", make)


class LosesBigMessages(Defective):
    """T6: payloads of 1 MiB and more are dropped."""

    def patch(self, conn: Connection) -> None:
        wrap(conn, "frame", lambda frame: lambda payloads: frame([p for p in payloads if len(p) < 1 << 20]))


class AcceptCancelCloses(Defective):
    """T7: a cancelled accept() closes the listener."""

    class listener_class(DefectiveListener):  # noqa: N801
        async def accept(self) -> Connection:
            try:
                return await super().accept()
            except trio.Cancelled:
                with trio.CancelScope(shield=True):
                    await self.inner.aclose()
                raise


class CloseForgetsUnshaken(Defective):
    """T8: aclose() of a connection whose handshake did not finish does nothing (it leaks)."""

    def patch(self, conn: Connection) -> None:
        done = [False]
        handshake, aclose = conn.handshake, conn.aclose

        async def shake() -> None:
            await handshake()
            done[0] = True

        async def close() -> None:
            if done[0]:
                await aclose()

        conn.handshake = shake  # type: ignore[method-assign]
        conn.aclose = close  # type: ignore[method-assign]


class ReceiveLosesOnCancel(Defective):
    """T9: a checkpoint after the read: a cancel there loses what was read."""

    def patch(self, conn: Connection) -> None:
        def make(receive: Any) -> Any:
            async def broken() -> list[bytes]:
                got: list[bytes] = await receive()
                await trio.lowlevel.checkpoint()
                return got
            return broken
        wrap(conn, "receive", make)


class SendNeverWaits(Defective):
    """T10 (the issue's first planted defect): send() never waits; what the kernel
    does not take piles up in memory."""

    def patch(self, conn: Connection) -> None:
        backlog: list[bytes] = []
        sock: socket.socket = conn._stream.socket._sock  # type: ignore[attr-defined]  # (the stdlib socket)

        async def send(payloads: list[bytes]) -> None:
            backlog.append(conn._deflate.compress(b"".join(  # type: ignore[attr-defined]
                len(p).to_bytes(8, "big") + p for p in payloads)) + conn._deflate.flush(2))  # type: ignore[attr-defined]
            while backlog:
                try:
                    n = sock.send(backlog[0])
                except BlockingIOError:
                    return  # (left in memory)
                backlog[0] = backlog[0][n:]
                if not backlog[0]:
                    backlog.pop(0)
            await trio.lowlevel.checkpoint()

        conn.send = send  # type: ignore[method-assign]


class WriteAllHoards(Defective):
    """T10 on a channel's own path: send() still waits, but write_all() -- what the
    pipe uses -- never does; what the kernel refuses piles up in memory."""

    def patch(self, conn: Connection) -> None:
        hoard = bytearray()
        write_nowait, waiting_write_all = conn.write_nowait, conn.write_all  # type: ignore[attr-defined]

        async def write_all(chunk: Any) -> None:
            hoard.extend(chunk)
            del hoard[:write_nowait(bytes(hoard[:1 << 20]))]
            await trio.lowlevel.checkpoint()

        async def send(payloads: list[bytes]) -> None:  # (the original, waiting path)
            await waiting_write_all(conn.frame(payloads))  # type: ignore[attr-defined]

        conn.write_all = write_all  # type: ignore[attr-defined]
        conn.send = send  # type: ignore[method-assign]


class SlowSendCancel(Defective):
    """T11: a cancelled write (a channel's write_all: what send and the pipe use)
    lingers for 3 s before it ends."""

    def patch(self, conn: Connection) -> None:
        def make(write_all: Any) -> Any:
            async def broken(chunk: Any) -> None:
                try:
                    await write_all(chunk)
                except trio.Cancelled:
                    with trio.CancelScope(shield=True):
                        await trio.sleep(3)
                    raise
            return broken
        wrap(conn, "write_all", make)


class WriteNowaitLies(Defective):
    """T12: write_nowait() says it took the whole chunk after a partial write."""

    def patch(self, conn: Connection) -> None:
        def make(write_nowait: Any) -> Any:
            def broken(chunk: Any) -> int:
                write_nowait(chunk)
                return len(chunk)
            return broken
        wrap(conn, "write_nowait", make)


class CloseRaisesOnSecondCall(Defective):
    """T13 (the issue's second planted defect): aclose() raises on a second call."""

    def patch(self, conn: Connection) -> None:
        closed = [False]

        def make(aclose: Any) -> Any:
            async def broken() -> None:
                if closed[0]:
                    raise RuntimeError("connection already closed")
                closed[0] = True
                await aclose()
            return broken
        wrap(conn, "aclose", make)


def _translate(conn: Connection, src: type[BaseException], dst: Callable[[str], BaseException]) -> None:
    def make(receive: Any) -> Any:
        async def broken() -> list[bytes]:
            try:
                got: list[bytes] = await receive()
            except src as exc:
                raise dst(str(exc)) from None
            return got
        return broken
    wrap(conn, "receive", make)


class EofIsProtocolError(Defective):
    """T14: a clean end between messages raises RemoteProtocolError."""

    def patch(self, conn: Connection) -> None:
        _translate(conn, EOFError, RemoteProtocolError)


class CutIsEof(Defective):
    """T15: a cut inside a message raises EOFError (the example plug-in's old behaviour)."""

    def patch(self, conn: Connection) -> None:
        _translate(conn, RemoteProtocolError, EOFError)


class NoSizeLimit(Defective):
    """T16: recv_max_size ignored."""

    async def listen(self, url: str, ctx: PipeContext) -> Listener:
        return await super().listen(url, _unlimited(ctx))

    async def dial(self, url: str, ctx: PipeContext) -> Connection:
        return await super().dial(url, _unlimited(ctx))


def _unlimited(ctx: PipeContext) -> PipeContext:
    return PipeContext(ctx.protocol_id, ctx.peer_id, ctx.protocol_name, ctx.peer_name, 0, ctx.options,
                       ctx.handshake_timeout)


class EightPipesAtMost(Defective):
    """T17: the listener drops every connection past its 8th."""

    class listener_class(DefectiveListener):  # noqa: N801
        async def accept(self) -> Connection:
            while True:
                conn = await super().accept()
                if self.accepted <= 8:
                    return conn
                await conn.aclose()


class DialsOnce(Defective):
    """T18: dial() works once; every later dial is refused (no reconnect)."""

    dials = 0

    async def dial(self, url: str, ctx: PipeContext) -> Connection:
        self.dials += 1
        if self.dials > 1:
            raise ConnectionRefusedError("this transport dials once")
        return await super().dial(url, ctx)


class ClosedFilenoKept(Defective):
    """C1: fileno() of a closed connection is not -1."""

    def patch(self, conn: Connection) -> None:
        conn.fileno = lambda: 1000  # type: ignore[attr-defined]


class SinkIgnoresPause(Defective):
    """C2: the sink is fed while paused."""

    def patch(self, conn: Connection) -> None:
        wrap(conn, "attach_sink", lambda attach: lambda sink, paused: attach(sink, lambda: False))


class DeafToSubscriptions(Defective):
    """C3: a filtering peer (ZMTP) never hears a subscription made after the pipe."""

    def patch(self, conn: Connection) -> None:
        if hasattr(conn, "subscriptions"):
            told = conn.subscriptions  # (the first push, when the pipe joins, goes through)
            calls = iter([told])
            conn.subscriptions = lambda topics: next(calls, lambda t: None)(topics)  # type: ignore[attr-defined]


class ForgetsSilence(Defective):
    """C4: silence_blamed() blames every close."""

    def patch(self, conn: Connection) -> None:
        conn.silence_blamed = lambda: "silent for too long"  # type: ignore[attr-defined]


class BadProtocolCheck(Defective):
    """C5: check_protocol() raises ValueError instead of AddressError."""

    def check_protocol(self, name: str, raw: bool, options: dict[str, object]) -> None:
        if name == "bus":
            raise ValueError("no bus here")


class WrongKernelSocket(Defective):
    """C6: kernel_socket() is a socket the connection does not use."""

    def patch(self, conn: Connection) -> None:
        other = socket.socket()
        conn.kernel_socket = lambda: other  # type: ignore[attr-defined]


class NeverWaitingForRoom(Defective):
    """C7: waiting_for_room is always false."""

    def patch(self, conn: Connection) -> None:
        swap_class(conn, waiting_for_room=property(lambda self: False, lambda self, value: None))


class UnwrittenZero(Defective):
    """C8: unwritten_bytes() says 0 after a write cut by a reset."""

    def patch(self, conn: Connection) -> None:
        conn.unwritten_bytes = lambda: 0  # type: ignore[attr-defined]


class DropsCountedAlways(Defective):
    """C9: a clean exchange counts a drop."""

    def patch(self, conn: Connection) -> None:
        conn.count_drops_with = lambda count: count("reply_without_request", 1)  # type: ignore[attr-defined]


class NeverJudgesSilence(Defective):
    """C10: keepalive never ends a silent peer's pipe."""

    def patch(self, conn: Connection) -> None:
        if getattr(conn, "keepalive", None) is not None:
            async def keepalive(busy: Callable[[], bool]) -> None:
                await trio.sleep_forever()
            conn.keepalive = keepalive  # type: ignore[attr-defined]


class WindowUnwatched(Defective):
    """C11: watch_window() says True, but the window moves without calling the hook."""

    def patch(self, conn: Connection) -> None:
        if hasattr(conn, "watch_window"):
            conn.watch_window = lambda moved: True  # type: ignore[attr-defined]


#: rule id -> (the defect, the transport it breaks)
DEFECTS: dict[str, tuple[type[Defective], str]] = {
    "T1": (PortZeroKept, "tcp"), "T2": (CloseRaisesTwice, "tcp"), "T3": (DialNeverRefused, "tcp"),
    "T4": (Bytearrays, "tcp"), "T5": (AnyPeer, "tcp"), "T6": (LosesBigMessages, "tcp"),
    "T7": (AcceptCancelCloses, "tcp"), "T8": (CloseForgetsUnshaken, "tcp"), "T9": (ReceiveLosesOnCancel, "tcp"),
    "T10": (SendNeverWaits, "tcp+zlib"), "T11": (SlowSendCancel, "tcp"), "T12": (WriteNowaitLies, "tcp"),
    "T13": (CloseRaisesOnSecondCall, "tcp+zlib"), "T14": (EofIsProtocolError, "tcp"), "T15": (CutIsEof, "tcp"),
    "T16": (NoSizeLimit, "tcp"), "T17": (EightPipesAtMost, "tcp"), "T18": (DialsOnce, "tcp"),
    "C1": (ClosedFilenoKept, "tcp"), "C2": (SinkIgnoresPause, "inproc"),
    "C3": (DeafToSubscriptions, "zmtp+tcp"), "C4": (ForgetsSilence, "tcp"),
    "C5": (BadProtocolCheck, "tcp"), "C6": (WrongKernelSocket, "tcp"), "C7": (NeverWaitingForRoom, "tcp"),
    "C8": (UnwrittenZero, "tcp"), "C9": (DropsCountedAlways, "tcp"),
    "C10": (NeverJudgesSilence, "zmtp+tcp"), "C11": (WindowUnwatched, "zmtp+tcp"),
}
