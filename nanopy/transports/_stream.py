"""Byte-stream connections (tcp, ipc): SP header exchange and u64 framing.

Uses plain non-blocking stdlib sockets with trio's readiness waits: no stream
wrapper on the hot path, many frames per ``recv``, one ``send`` per batch, and a
``write_nowait`` the pipe's driver calls from the sending thread when the socket is idle.

The framing (:class:`FramedConnection`) is written once over two byte operations,
``_send_all`` and ``_recv_some``; :class:`StreamConnection` supplies them from a
socket (:class:`SocketIO`), the TLS transport from a :class:`trio.SSLStream`.
"""

from __future__ import annotations

import errno
import logging
import math
import socket
from typing import Any, Protocol

import trio

from .. import _fork, platform
from ..core.errors import RemoteProtocolError
from ..core.wire import (
    HEADER_SIZE,
    FrameDecoder,
    encode_frames,
    encode_header,
    frame_head,
    other_wire,
    parse_header,
)
from ._base import ChannelConnection, Connection, Listener, PipeContext, pass_gate

RECV_SIZE = 64 * 1024  # below glibc's mmap threshold: a bigger buffer costs an mmap per read
#: how long a listener out of descriptors (or memory) waits before it tries again
ACCEPT_BACKOFF = 0.1
# accept() failed for want of a resource: back off and retry, the listener stays
_STARVED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# accept() failed for that one connection (Linux reports the new socket's pending
# network errors here; accept(2) says to retry as for EAGAIN)
_ONE_CONNECTION = frozenset(
    getattr(errno, name)
    for name in ("ECONNABORTED", "EPROTO", "EPERM", "ENETDOWN", "ENOPROTOOPT", "EHOSTDOWN",
                 "ENONET", "EHOSTUNREACH", "EOPNOTSUPP", "ENETUNREACH", "ETIMEDOUT")
    if hasattr(errno, name)
)

log = logging.getLogger("nanopy")


# The kernel's counters of a connection's socket, as the platform tells them (the pipe
# side reads them through these names: nanopy/pipe/liveness.py, resend.py).
unacked_bytes = platform.unacked_bytes
unread_bytes = platform.unread_bytes
send_window_state = platform.send_window_state


def close_socket(sock: socket.socket) -> None:
    """Wake trio tasks waiting on ``sock``, then close it."""
    try:
        trio.lowlevel.notify_closing(sock)
    except Exception:  # noqa: BLE001 - outside trio or already closed: nobody to wake
        pass
    sock.close()


class StreamDecoder(Protocol):
    """The parser a :class:`FramedConnection` reads through: SP's
    :class:`~nanopy.core.wire.FrameDecoder`, or another wire protocol's (ZMTP's).

    ``feed`` returns the complete payloads a chunk finishes (raising, or keeping
    in ``error`` what it found after them); ``pending`` counts buffered bytes of
    an incomplete message.
    """

    error: Exception | None

    def feed(self, chunk: bytes) -> list[bytes]: ...

    @property
    def pending(self) -> int: ...


class SocketIO:
    """A connected stdlib socket in non-blocking mode, driven by trio readiness waits."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._drained = False
        self._closed = False
        self._unwritten = 0
        #: ``_send_all`` waits for the kernel to take more (ReportsWriteWait)
        self.waiting_for_room = False

    def kernel_socket(self) -> socket.socket:
        """The TCP (or Unix) socket underneath, for the kernel's counters."""
        return self._sock

    def unwritten_bytes(self) -> int | None:
        """How many bytes of the chunk whose write failed never reached the kernel."""
        return self._unwritten

    async def _send_all(self, data: bytes | memoryview) -> None:
        """Write all of ``data``; ``waiting_for_room`` is true while it waits for the
        kernel to take more."""
        sock = self._sock
        view = memoryview(data)
        try:
            while view:
                try:
                    n = sock.send(view)
                except (BlockingIOError, InterruptedError):
                    self.waiting_for_room = True
                    try:
                        await trio.lowlevel.wait_writable(sock)
                    finally:
                        self.waiting_for_room = False
                    continue
                view = view[n:]
        except BaseException:
            self._unwritten = len(view)  # (what a dead pipe's driver may still send elsewhere)
            raise
        await trio.lowlevel.cancel_shielded_checkpoint()  # (done: a cancel here would lose or hide it)

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
                # Data was already there: still give other tasks a turn, but not a
                # cancellation point (a cancel here would lose what recv took).
                await trio.lowlevel.cancel_shielded_checkpoint()
            return data

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        close_socket(self._sock)


class FramedConnection(ChannelConnection):
    """SP over a byte stream: the 8-byte header exchange and u64-length frames.

    Subclasses supply ``_send_all(data)`` and ``_recv_some(size)`` (``_recv_some``
    returns ``b""`` at end of stream), and ``write_nowait`` where the stream can be
    written from any thread (a plain socket can; a TLS stream cannot).
    """

    def __init__(self, ctx: PipeContext, ipc: bool, remote_address: str) -> None:
        self._ctx = ctx
        self._ipc = ipc
        self._head = frame_head(ipc)  # (one payload's header: a C call, see ``frame``)
        self.frame_overhead = 9 if ipc else 8  # (the ipc mapping adds a type byte)
        self.framing = ("sp-stream", ipc)  # the same bytes for every stream pipe (TLS encrypts later)
        self._decoder: StreamDecoder = FrameDecoder(ipc, ctx.recv_max_size)
        self.remote_address = remote_address

    def frame(self, payloads: list[bytes]) -> bytes:
        if len(payloads) == 1:  # an idle pipe's send: skip the join (and any Python call)
            payload = payloads[0]
            return self._head(len(payload)) + payload
        return encode_frames(payloads, self._ipc)

    async def write_all(self, chunk: bytes | memoryview) -> None:
        await self._send_all(chunk)

    async def _send_all(self, data: bytes | memoryview) -> None:
        raise NotImplementedError

    async def _recv_some(self, size: int) -> bytes:
        raise NotImplementedError

    #: a gated listener answers only once its gate admits (see ``handshake``)
    gates_itself = True

    async def handshake(self) -> None:
        # With a bind's gate: hear the peer's header out, ask the gate, and send ours
        # only when it admits. A refused dialer never completes its handshake, so it
        # never has a pipe to write into (what it sent there would be lost with it).
        gate = self.gate
        ours = encode_header(self._ctx.protocol_id)
        if gate is None:
            await self._send_all(ours)
        header = b""
        while len(header) < HEADER_SIZE:
            try:
                chunk = await self._recv_some(HEADER_SIZE - len(header))
            except ConnectionResetError as exc:
                if header:  # a reset cuts the header as an EOF does
                    raise other_wire(header, "SP", self._ipc) or RemoteProtocolError(
                        f"connection reset during the SP handshake: {exc}") from None
                raise
            if not chunk:
                if not header:  # connected and left (a port probe): not a protocol error
                    raise EOFError("peer closed before the SP handshake")
                raise other_wire(header, "SP", self._ipc) or RemoteProtocolError("peer closed during the SP handshake")
            header += chunk
        parse_header(header, self._ctx.peer_id, self._ipc)
        if gate is not None:
            await pass_gate(self)
            await self._send_all(ours)

    async def receive(self) -> list[bytes]:
        if self._decoder.error is not None:  # found after the frames we returned last
            raise self._decoder.error
        while True:
            try:
                chunk = await self._recv_some(RECV_SIZE)
            except ConnectionResetError as exc:
                if self._decoder.pending:  # a reset cuts a message as an EOF does
                    raise RemoteProtocolError(f"connection reset in the middle of a message: {exc}") from None
                raise
            if not chunk:
                if self._decoder.pending:
                    raise RemoteProtocolError("peer closed in the middle of a message")
                raise EOFError("peer closed the connection")
            msgs = self._decoder.feed(chunk)
            if msgs:
                return msgs


class StreamConnection(SocketIO, FramedConnection):
    """SP framing on a plain socket, with the thread-safe non-blocking fast path."""

    def __init__(self, sock: socket.socket, ctx: PipeContext, ipc: bool, remote_address: str) -> None:
        SocketIO.__init__(self, sock)
        FramedConnection.__init__(self, ctx, ipc, remote_address)
        self._eof = False
        #: the last read_nowait filled its buffer: more is probably waiting
        self.read_more = False

    # -- direct reads: whoever holds the pipe's read role calls these (nanopy/pipe/driver.py) --
    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def failed(self) -> bool:
        """An error or the end was already found: the next read_nowait raises it."""
        return self._eof or self._decoder.error is not None

    async def wait_readable(self) -> None:
        await trio.lowlevel.wait_readable(self._sock)

    def read_nowait(self) -> list[bytes] | None:
        """Read and parse what the kernel holds now, from any thread, never blocking.

        Returns the complete payloads (possibly none: a partial frame), or None if
        nothing was there. Raises EOFError / RemoteProtocolError / MessageTooLarge
        as ``receive`` does.
        """
        decoder = self._decoder
        if decoder.error is not None:  # found after the frames returned last time
            raise decoder.error
        if self._eof:
            raise EOFError("peer closed the connection")
        try:
            chunk = self._sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            self.read_more = False
            return None
        except ConnectionResetError as exc:
            self._eof = True
            if decoder.pending:  # a reset cuts a message as an EOF does
                raise RemoteProtocolError(f"connection reset in the middle of a message: {exc}") from None
            raise
        if not chunk:
            self._eof = True
            if decoder.pending:
                raise RemoteProtocolError("peer closed in the middle of a message")
            raise EOFError("peer closed the connection")
        self.read_more = len(chunk) == RECV_SIZE
        return decoder.feed(chunk)

    def write_nowait(self, chunk: bytes | memoryview) -> int:
        """Write what the kernel takes now (any thread); an error is left for
        ``write_all`` to meet (and report)."""
        try:
            return self._sock.send(chunk)
        except OSError:  # full (BlockingIOError), closed, reset...
            return 0


async def accept_socket(sock: socket.socket, describe: str = "listener") -> tuple[socket.socket, object]:
    """Accept one connection on a listening non-blocking socket.

    Out of descriptors (or memory), it backs off and retries: one INFO line per
    episode, nothing per retry. Errors of a single incoming connection are skipped.
    """
    starved = False
    while True:
        try:
            conn, addr = sock.accept()
            return _fork.own(conn), addr
        except (BlockingIOError, InterruptedError):
            await trio.lowlevel.wait_readable(sock)
        except OSError as exc:
            if exc.errno in _STARVED:
                if not starved:
                    starved = True
                    log.info("%s: accept paused (%s); retrying every %.1f s", describe, exc, ACCEPT_BACKOFF)
                await trio.sleep(ACCEPT_BACKOFF)
                continue
            if exc.errno in _ONE_CONNECTION:
                await trio.lowlevel.checkpoint()
                continue
            raise


class StreamListener(Listener):
    """Accepts on a bound, listening, non-blocking stdlib socket."""

    def __init__(self, sock: socket.socket, url: str, ctx: PipeContext, ipc: bool) -> None:
        sock.setblocking(False)
        self._sock = _fork.own(sock)
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

    def connection(self, conn_sock: socket.socket, peer: str) -> Connection:
        """The connection for an accepted socket (tls wraps it in TLS)."""
        return StreamConnection(conn_sock, self._ctx, self._ipc, peer)

    async def accept(self) -> Connection:
        conn, addr = await accept_socket(self._sock, self.url)
        self.configure(conn)
        return self.connection(conn, self.describe_peer(addr))

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        close_socket(self._sock)


#: the longest pause between tries of a Unix-socket connect to a listener whose
#: backlog is full (the kernel gives no readiness event for room in it)
BACKLOG_RETRY_MAX = 0.1


async def connect_socket(sock: socket.socket, address: Any, timeout: float | None = None,
                         describe: str | None = None) -> None:
    """Non-blocking connect on a stdlib socket, waiting at most ``timeout`` seconds
    for the peer to accept (the ``connect_timeout`` option; None: as long as the
    kernel tries). Raises OSError on failure, TimeoutError (ETIMEDOUT) when the
    time is up. ``describe`` names the peer in errors."""
    _fork.own(sock)
    sock.setblocking(False)
    with trio.move_on_after(math.inf if timeout is None else timeout) as scope:
        await _connect(sock, address)
    if scope.cancelled_caught:
        raise TimeoutError(errno.ETIMEDOUT, f"connect to {describe or address}: no answer in {timeout:g} s "
                           "(connect_timeout)")


async def _connect(sock: socket.socket, address: Any) -> None:
    pause = 0.005
    while True:
        try:
            sock.connect(address)
            return
        except BlockingIOError as exc:
            if exc.errno != errno.EAGAIN or not platform.is_unix_socket(sock):
                break  # in progress (EINPROGRESS)
            # A Unix listener's backlog is full (its accept is behind): a blocking
            # connect would wait for room, and so do we, trying again.
            await trio.sleep(pause)
            pause = min(pause * 2, BACKLOG_RETRY_MAX)
        except InterruptedError:
            break
    await trio.lowlevel.wait_writable(sock)
    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err:
        raise OSError(err, f"connect to {address}: {errno.errorcode.get(err, err)}") from None


class SocketChannel(SocketIO):
    """A plain socket as a byte channel (what ``ws://`` runs on; ``wss://`` uses
    :class:`nanopy.transports.tls.StreamChannel`), with a thread-safe non-blocking write."""

    secure = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def start(self) -> None:
        """Nothing to negotiate on a plain socket."""

    send_all = SocketIO._send_all
    _buffer: bytearray | None = None

    async def recv(self, size: int) -> memoryview:
        """Read up to ``size`` bytes into a buffer reused by every read (valid until
        the next ``recv``): the parser copies what it keeps, and a busy connection
        does not allocate (and fragment the heap with) a fresh 64 KiB per read."""
        buf = self._buffer
        if buf is None or len(buf) < size:
            buf = self._buffer = bytearray(size)
        sock = self._sock
        while True:
            try:
                n = sock.recv_into(buf, size)
            except (BlockingIOError, InterruptedError):
                await trio.lowlevel.wait_readable(sock)
                continue
            await trio.lowlevel.cancel_shielded_checkpoint()  # (a cancel here would lose the bytes read)
            return memoryview(buf)[:n]

    def send_nowait(self, data: bytes | memoryview) -> int:
        """Write what the kernel takes now (any thread); returns the byte count."""
        try:
            return self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            return 0

    async def send_eof(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        await trio.lowlevel.checkpoint()
