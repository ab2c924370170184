"""Helpers for tests that talk to real peers: nngcat/nanocat subprocesses and pynng sockets.

Generic on purpose (shared by every interop test file):

* :func:`need_tool` skips a test when a command-line tool is missing;
* :func:`run_tool` starts a tool, yields the ``Popen`` and kills it by PID at exit;
* :func:`read_exactly` / :func:`read_until_eof` read a tool's stdout with a deadline;
* :func:`parse_msgpack_bins` splits ``--msgpack`` output into message bodies (it keeps
  empty messages visible, unlike ``--raw``);
* :func:`free_tcp_url` picks a loopback port for a tool that must listen;
* :func:`pynng_socket` opens a pynng socket and always closes it, after ours
  (:func:`close_pynng_last`: NNG's ws pipe close can race a peer's and abort).

Known tool quirks (nanomsg-utils 1.1.5, nng-utils 1.5.2):

* nanocat exits right after its send without lingering, so a body that has not
  left yet is cut off (a 1 MiB body over tcp, even 16 KB over ws): keep it alive
  with :data:`NANOCAT_STAY` (a long resend interval) and kill it once the first
  copy arrived. nngcat sleeps 200 ms before exiting, which is usually enough.
* nanocat asserts (exit 134) on an empty ``--file``: send ``--data ""`` instead.
* pynng's ``Socket.recv()`` fails on an empty message: use ``recv_msg().bytes``.
"""

from __future__ import annotations

import os
import random
import select
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

#: nanomsg's default receive limit (NN_RCVMAXSIZE) and the largest body nanopy
#: accepts by default: 1 MiB - 1 fits both.
MIB = 1 << 20
INTEROP_SIZES = (0, 1, 64 * 1024, MIB - 1)
#: Extra nanocat arguments for a sender that must stay up until its body is out.
NANOCAT_STAY = ("--interval", "30")


def body_of(size: int, seed: int = 0) -> bytes:
    """A deterministic, non-repeating-looking body of ``size`` bytes."""
    if size == 0:
        return b""
    pattern = bytes((i * 31 + seed * 7 + 11) & 0xFF for i in range(251))
    reps = size // len(pattern) + 1
    return (pattern * reps)[:size]


def need_tool(name: str) -> str:
    """The absolute path of ``name``, or skip the test if it is not installed."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed")
    return path


@contextmanager
def run_tool(
    args: Sequence[str],
    *,
    stdin: bytes | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``args`` with piped stdout/stderr; kill it by PID when the block ends.

    ``stdin`` bytes, if given, are written and the pipe closed at once.
    """
    proc = subprocess.Popen(
        list(args),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        if stdin is not None:
            assert proc.stdin is not None
            proc.stdin.write(stdin)
            proc.stdin.close()
        yield proc
    finally:
        if proc.poll() is None:
            try:
                os.kill(proc.pid, 9)
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def wait_exit(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    """Wait for ``proc`` to exit; fail the test (with its stderr) if it does not."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{proc.args!r} did not exit within {timeout}s")


def _read(proc: subprocess.Popen[bytes], want: int | None, timeout: float) -> bytes:
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    have = 0
    while want is None or have < want:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 1 << 20 if want is None else min(1 << 20, want - have))
        if not chunk:
            break  # EOF
        chunks.append(chunk)
        have += len(chunk)
    return b"".join(chunks)


def read_exactly(proc: subprocess.Popen[bytes], n: int, timeout: float = 10.0) -> bytes:
    """Read ``n`` bytes of ``proc``'s stdout; fail the test if they do not come in time."""
    data = _read(proc, n, timeout)
    if len(data) != n:
        err = b""
        if proc.poll() is not None and proc.stderr is not None:
            err = proc.stderr.read()
        pytest.fail(f"{proc.args!r}: read {len(data)} of {n} bytes in {timeout}s; stderr={err!r}")
    return data


def read_until_eof(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> bytes:
    """Everything ``proc`` writes to stdout until it closes it (or ``timeout``)."""
    return _read(proc, None, timeout)


def msgpack_bin_size(body_size: int) -> int:
    """Bytes nanocat/nngcat ``--msgpack`` prints for a body of ``body_size`` bytes."""
    if body_size < 256:
        return 2 + body_size
    if body_size < 65536:
        return 3 + body_size
    return 5 + body_size


def parse_msgpack_bins(data: bytes) -> list[bytes]:
    """Split concatenated msgpack bin8/bin16/bin32 objects into their bodies."""
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        tag = data[pos]
        if tag == 0xC4:
            size, head = data[pos + 1], 2
        elif tag == 0xC5:
            (size,) = struct.unpack_from(">H", data, pos + 1)
            head = 3
        elif tag == 0xC6:
            (size,) = struct.unpack_from(">I", data, pos + 1)
            head = 5
        else:
            raise ValueError(f"not a msgpack bin object at offset {pos}: 0x{tag:02x}")
        start = pos + head
        if start + size > len(data):
            raise ValueError(f"truncated msgpack bin object at offset {pos}")
        out.append(data[start : start + size])
        pos = start + size
    return out


def read_msgpack_messages(
    proc: subprocess.Popen[bytes], sizes: Sequence[int], timeout: float = 10.0
) -> list[bytes]:
    """Read exactly the ``--msgpack`` output of messages with these body sizes."""
    total = sum(msgpack_bin_size(s) for s in sizes)
    return parse_msgpack_bins(read_exactly(proc, total, timeout))


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for tools that cannot bind port 0).

    Picked below the kernel's ephemeral range: a port from that range can be taken
    by any outgoing connection (another test's dialer) before the tool binds it.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    low = _ephemeral_low()
    for _ in range(50):
        port = random.randrange(max(10000, low - 12000), low)
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_tcp_url(host: str = "127.0.0.1") -> str:
    port = free_tcp_port(host)
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


#: how long a pynng socket's close waits for its pipes to go once ours are closed
PYNNG_PIPES_GONE = 3.0


@contextmanager
def pynng_socket(kind: str, **options: Any) -> Iterator[Any]:
    """Open ``pynng.<kind>(**options)`` (e.g. ``"Pull0"``) and close it at exit, ours first.

    NNG 1.5's close of a pipe whose peer closes at the same moment can abort the
    process (SIGABRT inside its ws pipe close). So the exit closes our side first
    (:func:`close_pynng_last`) and the pynng socket last, when it has no pipe of
    ours left to race on.
    """
    pynng = pytest.importorskip("pynng")
    sock = getattr(pynng, kind)(**options)
    try:
        yield sock
    finally:
        close_pynng_last(sock)


def _address(pipe: Any) -> str | None:
    try:
        return str(pipe.local_address)
    except Exception:  # a pipe NNG is tearing down
        return None


def close_pynng_last(sock: Any) -> None:
    """Close the nanopy sockets that have a pipe to ``sock``, wait (bounded) until NNG
    dropped those pipes on its own, then close ``sock``.

    A nanopy pipe and an NNG pipe are the two ends of one connection when our
    remote address is NNG's local one (tcp, ws, wss, tls+tcp: host:port; ipc: path).
    """
    from nanopy import _engine

    try:
        theirs = {addr: pipe for pipe in sock.pipes if (addr := _address(pipe)) is not None}
        shared = set()
        for ours in list(_engine._sockets):
            if ours.closed:
                continue
            mine = {p.remote_address for p in ours.pipes} & theirs.keys()
            if mine:
                shared |= {theirs[addr].id for addr in mine}
                ours.close(linger=0)
        deadline = time.monotonic() + PYNNG_PIPES_GONE
        while shared & {p.id for p in sock.pipes} and time.monotonic() < deadline:
            time.sleep(0.005)  # NNG gives no event for a pipe it dropped: poll its list
    finally:
        sock.close()


def pynng_dial(sock: Any, url: str) -> None:
    """Dial without failing when the listener is not up yet (pynng retries)."""
    sock.dial(url, block=False)


def ipv6_available() -> bool:
    """Whether [::1] can be bound on this machine."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True
