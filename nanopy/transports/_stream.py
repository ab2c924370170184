"""Byte-stream connections (tcp, ipc): SP header exchange and u64 framing.

Uses plain non-blocking stdlib sockets with trio's readiness waits: no stream
wrapper on the hot path, many frames per ``recv``, one ``send`` per batch, and a
``try_send`` that writes straight from the caller's thread when the socket is idle.
"""

from __future__ import annotations

import errno
import socket

import trio

from .._errors import RemoteProtocolError
from .._wire import HEADER_SIZE, FrameDecoder, encode_frame, encode_frames, encode_header, parse_header
from ._base import Connection, Listener, PipeContext

RECV_SIZE = 256 * 1024


class StreamConnection(Connection):
    def __init__(self, sock: socket.socket, ctx: PipeContext, ipc: bool, remote_address: str) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._ctx = ctx
        self._ipc = ipc
        self._decoder = FrameDecoder(ipc, ctx.recv_max_size)
        self._pending: memoryview | None = None
        self._drained = False
        self._closed = False
        self.remote_address = remote_address

    async def handshake(self) -> None:
        await self._send_all(memoryview(encode_header(self._ctx.protocol_id)))
        header = b""
        while len(header) < HEADER_SIZE:
            chunk = await self._recv_some(HEADER_SIZE - len(header))
            if not chunk:
                if not header:  # connected and left (a port probe): not a protocol error
                    raise EOFError("peer closed before the SP handshake")
                raise RemoteProtocolError("peer closed during the SP handshake")
            header += chunk
        parse_header(header, self._ctx.peer_id)

    # -- sending ---------------------------------------------------------------
    def try_send(self, payload: bytes) -> bool:
        if self._pending is not None or self._closed:
            return False
        return self._write_now(encode_frame(payload, self._ipc))

    def try_send_batch(self, payloads: list[bytes]) -> bool:
        if self._pending is not None or self._closed:
            return False
        return self._write_now(encode_frames(payloads, self._ipc))

    def _write_now(self, data: bytes) -> bool:
        """Write without blocking; keep an unwritten tail as pending."""
        try:
            n = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            return False  # the socket is full: the writer task will wait for it
        except OSError:
            return False  # let the writer task meet (and report) the error
        if n < len(data):
            self._pending = memoryview(data)[n:]
            self.has_pending = True
        return True

    async def send(self, payloads: list[bytes]) -> None:
        pending = self._pending
        if pending is not None:
            self._pending = None
            self.has_pending = False
            await self._send_all(pending)
        if payloads:
            await self._send_all(memoryview(encode_frames(payloads, self._ipc)))
        else:
            await trio.lowlevel.checkpoint()

    async def _send_all(self, data: memoryview) -> None:
        sock = self._sock
        while data:
            try:
                n = sock.send(data)
            except (BlockingIOError, InterruptedError):
                await trio.lowlevel.wait_writable(sock)
                continue
            data = data[n:]
        await trio.lowlevel.checkpoint()

    # -- receiving -------------------------------------------------------------
    async def receive(self) -> list[bytes]:
        if self._decoder.error is not None:  # found after the frames we returned last
            raise self._decoder.error
        while True:
            chunk = await self._recv_some(RECV_SIZE)
            if not chunk:
                if self._decoder.pending:
                    raise RemoteProtocolError("peer closed in the middle of a message")
                raise EOFError("peer closed the connection")
            msgs = self._decoder.feed(chunk)
            if msgs:
                return msgs

    async def _recv_some(self, size: int) -> bytes:
        """Read up to ``size`` bytes, waiting for readability as needed.

        After a short read the socket is most likely drained, so we wait for
        readability first instead of paying for a recv that fails with EAGAIN;
        after a full read more is probably buffered, so we read at once.
        """
        sock = self._sock
        waited = False
        if self._drained:
            await trio.lowlevel.wait_readable(sock)
            waited = True
        while True:
            try:
                data = sock.recv(size)
            except (BlockingIOError, InterruptedError):
                await trio.lowlevel.wait_readable(sock)
                waited = True
                continue
            self._drained = len(data) < size
            if not waited:
                # Data was already there: still give other tasks a turn.
                await trio.lowlevel.checkpoint()
            return data

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            trio.lowlevel.notify_closing(self._sock)
        except Exception:
            pass
        self._sock.close()


class StreamListener(Listener):
    """Accepts on a bound, listening, non-blocking stdlib socket."""

    def __init__(self, sock: socket.socket, url: str, ctx: PipeContext, ipc: bool) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._ctx = ctx
        self._ipc = ipc
        self.url = url
        self._closed = False

    def update_context(self, ctx: PipeContext) -> None:
        self._ctx = ctx

    def configure(self, conn_sock: socket.socket) -> None:
        """Per-connection socket options (tcp sets TCP_NODELAY)."""

    def describe_peer(self, addr: object) -> str:
        return str(addr)

    async def accept(self) -> Connection:
        while True:
            try:
                conn, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                await trio.lowlevel.wait_readable(self._sock)
                continue
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    await trio.sleep(0.1)  # out of descriptors: back off, keep listening
                    continue
                raise
            self.configure(conn)
            return StreamConnection(conn, self._ctx, self._ipc, self.describe_peer(addr))

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            trio.lowlevel.notify_closing(self._sock)
        except Exception:
            pass
        self._sock.close()


async def connect_socket(sock: socket.socket, address: object) -> None:
    """Non-blocking connect on a stdlib socket; raises OSError on failure."""
    sock.setblocking(False)
    try:
        sock.connect(address)
    except (BlockingIOError, InterruptedError):
        await trio.lowlevel.wait_writable(sock)
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise OSError(err, f"connect to {address}: {errno.errorcode.get(err, err)}")
