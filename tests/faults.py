"""Tools for the fault tier (tests/test_fault_*.py): a fault-injecting TCP proxy,
raw SP clients, tagged messages and resource sampling. Loopback only.
"""

from __future__ import annotations

import hashlib
import os
import resource
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import nanopy.testing

SP_MAGIC = b"\x00SP\x00"


# -- messages that prove they were not corrupted, duplicated or reordered --------------------
def tagged(seq: int, size: int = 64) -> bytes:
    """A body carrying its sequence number and a digest of itself."""
    head = struct.pack(">Q", seq)
    filler = (head * (size // 8 + 1))[: max(size - 24, 0)]
    return head + hashlib.blake2b(head + filler, digest_size=16).digest() + filler


def untag(body: bytes) -> int:
    """The sequence number of a :func:`tagged` body; AssertionError if corrupted."""
    head, digest, filler = body[:8], body[8:24], body[24:]
    assert hashlib.blake2b(head + filler, digest_size=16).digest() == digest, f"corrupted body {body[:32]!r}"
    return struct.unpack(">Q", head)[0]


def assert_in_order_no_duplicates(seqs: list[int]) -> None:
    assert all(a < b for a, b in zip(seqs, seqs[1:])), f"duplicated or reordered: {seqs[:50]}"


def serve_replies(rep: object, answer: Callable[[bytes], bytes]) -> threading.Thread:
    """Answer every request on a REP socket with ``answer(body)`` until it closes (a daemon thread)."""
    import nanopy

    def loop() -> None:
        while True:
            try:
                msg = rep.recv_msg(timeout=None)  # type: ignore[attr-defined]
            except nanopy.Closed:
                return
            msg.reply(answer(msg.body))

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


# -- resources --------------------------------------------------------------------------------
def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- raw SP peers -----------------------------------------------------------------------------
def sp_header(protocol_id: int) -> bytes:
    return SP_MAGIC + struct.pack(">H", protocol_id) + b"\x00\x00"


def recv_exactly(sock: socket.socket, n: int, timeout: float = 5.0) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def raw_sp_client(url: str, protocol_id: int, timeout: float = 5.0) -> socket.socket:
    """A plain TCP connection that has done a correct SP handshake as ``protocol_id``."""
    host, _, port = url.removeprefix("tcp://").rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.sendall(sp_header(protocol_id))
    assert recv_exactly(sock, 8, timeout)[:4] == SP_MAGIC
    return sock


def frame(payload: bytes) -> bytes:
    return struct.pack(">Q", len(payload)) + payload


# -- the fault-injecting proxy ----------------------------------------------------------------
@dataclass
class Fault:
    """What the proxy does to one connection.

    kind: "pass", "rst" / "fin" (cut both ways after ``after`` bytes client->server),
    "stall" (hold client->server bytes for ``seconds`` after ``after`` bytes),
    "half-close" (shut the server's read side after ``after`` bytes, keep the rest open),
    "blackhole" (accept, never forward, never answer).
    """

    kind: str = "pass"
    after: int = 0
    seconds: float = 0.0


@dataclass
class FaultProxy:
    """127.0.0.1 TCP proxy in front of ``upstream``; connection i gets ``faults[i]`` (then "pass")."""

    upstream: tuple[str, int]
    faults: list[Fault] = field(default_factory=list)
    connections: int = 0

    def __post_init__(self) -> None:
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self.url = f"tcp://127.0.0.1:{self.port}"
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._accept_loop, daemon=True)]
        self._threads[0].start()

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        with self._lock:
            for s in self._socks:
                try:
                    s.close()
                except OSError:
                    pass
        for t in self._threads:
            t.join(5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                r, _, _ = select.select([self._listener], [], [], 0.05)
                if not r:
                    continue
                client, _ = self._listener.accept()
            except OSError:
                return
            fault = self.faults[self.connections] if self.connections < len(self.faults) else Fault()
            self.connections += 1
            with self._lock:
                self._socks.append(client)
            t = threading.Thread(target=self._serve, args=(client, fault), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, client: socket.socket, fault: Fault) -> None:
        if fault.kind == "blackhole":
            self._stop.wait()  # hold the connection; say nothing
            return
        try:
            server = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            client.close()
            return
        with self._lock:
            self._socks.append(server)
        forwarded = 0  # client -> server bytes
        stalled = False
        pair = {client: server, server: client}
        try:
            while not self._stop.is_set():
                r, _, _ = select.select([client, server], [], [], 0.05)
                for src in r:
                    limit = 65536
                    cuts = fault.kind in ("rst", "fin", "stall", "half-close")
                    if src is client and cuts and forwarded < fault.after:
                        limit = fault.after - forwarded  # stop exactly at the fault point
                    data = src.recv(limit)
                    if not data:
                        return
                    pair[src].sendall(data)
                    if src is client:
                        forwarded += len(data)
                        if forwarded >= fault.after:
                            if fault.kind in ("rst", "fin"):
                                _cut(client, server, rst=fault.kind == "rst")
                                return
                            if fault.kind == "stall" and not stalled:
                                stalled = True
                                time.sleep(fault.seconds)
                            if fault.kind == "half-close":
                                server.shutdown(socket.SHUT_WR)
                                fault = Fault()  # keep relaying the other way
        except OSError:
            return
        finally:
            for s in (client, server):
                try:
                    s.close()
                except OSError:
                    pass


def _cut(a: socket.socket, b: socket.socket, rst: bool) -> None:
    for s in (a, b):
        if rst:  # close with linger 0: the kernel sends RST
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()


wait_for = nanopy.testing.wait_for  # (the shared helper; kept under this name for the fault tests)
