"""Helpers for tests that talk to real peers: nngcat/nanocat subprocesses and pynng sockets.

Generic on purpose (shared by every interop test file):

* :func:`need_tool` skips a test when a command-line tool is missing;
* :func:`run_tool` starts a tool, yields the ``Popen`` and kills it by PID at exit;
* :func:`read_exactly` / :func:`read_until_eof` read a tool's stdout with a deadline;
* :func:`parse_msgpack_bins` splits ``--msgpack`` output into message bodies (it keeps
  empty messages visible, unlike ``--raw``);
* :func:`free_tcp_url` picks a loopback port for a tool that must listen;
* :func:`pynng_peer` runs a pynng socket in a child process; :func:`pynng_socket`
  opens one in this process (tcp/ipc only). Both close it after ours
  (:func:`close_pynng_last`: NNG's ws pipe close can race a peer's and abort).

pynng peers and NNG's aborts (issue 22). NNG 1.5 can abort its process (SIGABRT
in its close of a ws pipe) however carefully we order the closes, so every pynng
peer on ws, wss or tls+tcp lives in a child process, ``tests/pynng_child.py``,
started by a multiprocessing forkserver that imported pynng once (a new peer is a
fork: milliseconds) and driven over a Pipe (commands: open, call a method, get/set
an option, list pipes, close). :class:`PynngPeer` stands for the socket: ``send``, ``recv``,
``recv_msg().bytes``, ``dial``, ``listen``, ``subscribe``, options as attributes,
``pipes`` as :class:`PipeInfo`; pynng's exceptions come back as pynng's classes.
Each peer gets a fresh child (a spare is started while the test before runs),
never one that hosted a socket before: NNG's threads can still crash after its
close returned. A closed peer's child exits on its own and is reaped later.
What a test sees when a child dies:

* in the peer's close (``with pynng_peer(...)``'s exit, after the test's own
  work) or in its exit after that: a :class:`PynngCloseCrashed` warning with
  the signal, the child's stderr and the test that owned it -- NNG's bug, not
  ours, and not a failure;
* during a call the test makes (or the child stops answering for
  :data:`CHILD_REPLY_TIMEOUT`): :class:`PynngPeerDied`, an ``AssertionError``
  that fails the test with the same details.

pytest itself never goes down with NNG. :func:`pynng_socket` (in process; it
offers pynng's pipe callbacks and sharing one socket between threads) refuses
ws/wss/tls+tcp URLs and points to :func:`pynng_peer`.

Known tool quirks (nanomsg-utils 1.1.5, nng-utils 1.5.2):

* nanocat exits right after its send without lingering, so a body that has not
  left yet is cut off (a 1 MiB body over tcp, even 16 KB over ws): keep it alive
  with :data:`NANOCAT_STAY` (a long resend interval) and kill it once the first
  copy arrived. nngcat sleeps 200 ms before exiting, which is usually enough.
* nanocat asserts (exit 134) on an empty ``--file``: send ``--data ""`` instead.
* pynng's ``Socket.recv()`` fails on an empty message: use ``recv_msg().bytes``.
"""

from __future__ import annotations

import atexit
import builtins
import inspect
import itertools
import multiprocessing
import os
import random
import select
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

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
    return _read_fd(proc.stdout.fileno(), want, timeout)


def _read_fd(fd: int, want: int | None, timeout: float) -> bytes:
    """Up to ``want`` bytes (None: until EOF) from ``fd``, or fewer when ``timeout`` passes."""
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


def _port_walk() -> Iterator[int]:
    """Every port of the range below the ephemeral one, once each, from a random
    start, then round again."""
    low = _ephemeral_low()
    first = max(10000, low - 12000)
    start = random.randrange(first, low)
    return itertools.cycle(itertools.chain(range(start, low), range(first, start)))


_PORTS = _port_walk()


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for tools that cannot bind port 0).

    Picked below the kernel's ephemeral range: a port from that range can be taken
    by any outgoing connection (another test's dialer) before the tool binds it.
    The ports are walked in turn, not drawn at random: a test that picks many before
    its tools bind them (test_cli's jobs) never gets the same port twice.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(50):
        port = next(_PORTS)
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


#: URL schemes whose NNG close can abort the process: only :func:`pynng_peer` may use them
CRASH_PRONE_SCHEMES = ("ws://", "wss://", "tls+tcp://")


@contextmanager
def pynng_socket(kind: str, **options: Any) -> Iterator[Any]:
    """Open ``pynng.<kind>(**options)`` (e.g. ``"Pull0"``) in this process; close it at exit, ours first.

    For tcp and ipc: ws, wss and tls+tcp peers must be :func:`pynng_peer` (NNG's
    close of those pipes can abort the process). The exit closes our side first
    (:func:`close_pynng_last`) and the pynng socket last.
    """
    pynng = pytest.importorskip("pynng")
    for url in (options.get("listen"), options.get("dial")):
        _refuse_crash_prone(url)
    sock = getattr(pynng, kind)(**options)
    for method in ("listen", "dial"):
        setattr(sock, method, _guarded(getattr(sock, method)))
    try:
        yield sock
    finally:
        close_pynng_last(sock)


def _refuse_crash_prone(url: object) -> None:
    if isinstance(url, str) and url.startswith(CRASH_PRONE_SCHEMES):
        raise ValueError(f"{url}: NNG can abort the process closing this transport; use peers.pynng_peer()")


def _guarded(method: Any) -> Any:
    def call(url: str, *args: Any, **kwargs: Any) -> Any:
        _refuse_crash_prone(url)
        return method(url, *args, **kwargs)

    return call


def _address(pipe: Any) -> str | None:
    try:
        addr = pipe.local_address
    except Exception:  # a pipe NNG is tearing down
        return None
    return None if addr is None else str(addr)


def close_pynng_last(sock: Any) -> None:
    """Close the nanopy sockets that have a pipe to ``sock``, wait (bounded) until NNG
    dropped those pipes on its own, then close ``sock``.

    A nanopy pipe and an NNG pipe are the two ends of one connection when our
    remote address is NNG's local one (tcp, ws, wss, tls+tcp: host:port; ipc: path).
    """
    from nanopy.engine import engine as _engine

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


# -- pynng peers in a child process -------------------------------------------------------
class PynngPeerDied(AssertionError):
    """The child process hosting a :func:`pynng_peer` died (or stopped answering) mid-test."""


class PynngCloseCrashed(UserWarning):
    """NNG took its child process down while the peer was being closed (the test had passed)."""


#: seconds the parent waits for one command's reply (pynng's own timeouts are shorter)
CHILD_REPLY_TIMEOUT = 30.0
#: children started ahead of need, so a peer's process is up (pynng imported) when a test asks
CHILD_SPARES = 1


def _context() -> Any:
    """A forkserver that imported pynng once: a new peer process is a fork of it (ms, not
    the 100+ ms of starting Python and importing pynng). The server never opens a socket,
    so it has no NNG threads to lose in the fork."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["pynng", "pynng_child"])
    return ctx


class _Child:
    """One peer process (:func:`pynng_child.serve`) and its command pipe (one command at a time)."""

    def __init__(self) -> None:
        import pynng_child

        ctx = _context()
        self.stderr = tempfile.NamedTemporaryFile(prefix="pynng-peer-", suffix=".log")
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=pynng_child.serve, args=(theirs, self.stderr.name), daemon=True)
        self.proc.start()
        theirs.close()
        self.lock = threading.Lock()

    def alive(self) -> bool:
        return bool(self.proc.is_alive())

    def ask(self, what: str, cmd: tuple[Any, ...]) -> Any:
        """Send ``cmd``; its reply, or :class:`PynngPeerDied` naming ``what`` and how the child ended."""
        with self.lock:
            try:
                reply = self._exchange(what, cmd)
            except BaseException:
                self.kill()  # e.g. pytest-timeout mid-call: a late reply would answer the next command
                raise
        if reply[0] == "ok":
            return reply[1]
        raise _pynng_error(*reply[1:])

    def _exchange(self, what: str, cmd: tuple[Any, ...]) -> Any:
        try:
            self.conn.send(cmd)
            if not self.conn.poll(CHILD_REPLY_TIMEOUT):
                raise self.died(what)
            return self.conn.recv()
        except (EOFError, OSError):
            raise self.died(what) from None

    def died(self, what: str) -> PynngPeerDied:
        """Kill the child if it still runs (it did not answer in time) and describe its end."""
        self.proc.join(2)
        code = self.proc.exitcode
        if code is None:
            self.kill()
            how = f"no reply within {CHILD_REPLY_TIMEOUT:.0f} s (killed)"
        elif code < 0:
            how = signal.Signals(-code).name
        else:
            how = f"exit status {code}"
        self.stderr.seek(0)
        tail = self.stderr.read()[-2000:].decode(errors="replace").strip()
        return PynngPeerDied(f"pynng peer process {self.proc.pid} ended with {how} during {what}; stderr: {tail!r}")

    def end_commands(self) -> None:
        """Close our end of the pipe: the child's loop sees EOF and the process exits."""
        self.conn.close()

    def kill(self) -> None:
        if self.proc.exitcode is None:
            self.proc.kill()
        self.proc.join(10)
        self.conn.close()
        self.stderr.close()


def _pynng_error(name: str, text: str, errno: int | None) -> Exception:
    """pynng's exception class of that name (tests catch ``pynng.Timeout``), else RuntimeError."""
    import pynng

    cls = getattr(pynng, name, None) or getattr(pynng.exceptions, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(text) if errno is None else cls(text, errno)
        except TypeError:
            pass
    return RuntimeError(f"{name} in the pynng peer: {text}")


_spares: list[_Child] = []  # started, never used
_retired: list[tuple[_Child, str]] = []  # closed peers' children on their way out, and whose they were
_pool_lock = threading.Lock()


def _take_child() -> _Child:
    """A fresh child started while an earlier test ran, and a spare started for the next one.

    Never one that hosted a socket before: NNG's threads can still crash after its
    close returned (seen: an abort while the next socket was listening).
    """
    _reap_retired()
    with _pool_lock:
        while _spares:
            child = _spares.pop()
            if child.alive():
                break
            child.kill()
        else:
            child = _Child()
        while len(_spares) < CHILD_SPARES:
            _spares.append(_Child())  # starts now, imports pynng while this test runs
    return child


def _retire(child: _Child, owner: str) -> None:
    """Let a closed peer's child exit on its own (EOF on its commands); reaped later."""
    if not child.alive():
        child.kill()
        return
    child.end_commands()
    with _pool_lock:
        _retired.append((child, owner))


def _reap_retired() -> None:
    """Collect retired children that exited; one NNG killed after its close is a warning."""
    with _pool_lock:
        done = [(c, o) for c, o in _retired if not c.alive()]
        _retired[:] = [(c, o) for c, o in _retired if c.alive()]
    for child, owner in done:
        if (child.proc.exitcode or 0) < 0:
            exc = child.died("its exit after close")
            warnings.warn(PynngCloseCrashed(f"NNG crashed after closing {owner}: {exc}"), stacklevel=3)
        child.kill()


@atexit.register
def _kill_children() -> None:
    with _pool_lock:
        children = _spares + [c for c, _ in _retired]
        _spares.clear()
        _retired.clear()
    for child in children:
        child.kill()


class PipeInfo(NamedTuple):
    """What the tests read of a pynng pipe in the child: its id and local address."""

    id: int
    local_address: str | None


@dataclass(frozen=True)
class ReceivedMessage:
    """A ``pynng.Message`` as the parent sees it (``recv_msg().bytes``)."""

    bytes: builtins.bytes


class PynngPeer:
    """Stands for ``pynng.<kind>`` living in a child process: the calls the tests make.

    Any method (``send``, ``recv``, ``recv_msg``, ``dial``, ``listen``, ``subscribe``...)
    runs in the child; options are read and set as attributes (``peer.recv_timeout = 10``);
    ``pipes`` lists :class:`PipeInfo`. pynng's errors come back as pynng's classes.
    """

    _child: _Child
    _kind: str

    def __init__(self, child: _Child, kind: str) -> None:
        object.__setattr__(self, "_child", child)
        object.__setattr__(self, "_kind", kind)

    @property
    def pipes(self) -> list[PipeInfo]:
        return [PipeInfo(*p) for p in self._child.ask(f"{self._kind}.pipes", ("pipes",))]

    @property
    def pid(self) -> int:
        return int(self._child.proc.pid)

    def close(self) -> None:
        self._child.ask(f"{self._kind}.close()", ("close",))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if inspect.isfunction(inspect.getattr_static(_pynng_class(self._kind), name, None)):

            def call(*args: Any, **kwargs: Any) -> Any:
                value = self._child.ask(f"{self._kind}.{name}()", ("call", name, args, kwargs))
                if isinstance(value, tuple) and len(value) == 2 and value[0] == "message":
                    return ReceivedMessage(value[1])
                return value

            return call
        return self._child.ask(f"reading {self._kind}.{name}", ("get", name))

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_") or hasattr(type(self), name):
            object.__setattr__(self, name, value)  # e.g. a test wrapping close()
        else:
            self._child.ask(f"setting {self._kind}.{name}", ("set", name, value))

    def _abort_now(self) -> None:
        """Containment test: the child aborts at once (as NNG does when its close races)."""
        self._child.ask(f"{self._kind}: abort", ("abort",))

    def _abort_on_close(self) -> None:
        """Containment test: the child's next close aborts instead of closing."""
        self._child.ask(f"{self._kind}: arm abort", ("abort_on_close",))


def _pynng_class(kind: str) -> Any:
    import pynng

    return getattr(pynng, kind)


@contextmanager
def pynng_peer(kind: str, **options: Any) -> Iterator[PynngPeer]:
    """Like :func:`pynng_socket`, but the pynng socket lives in a child process.

    ``options`` are pynng's constructor keywords; ``tls_config`` is a dict for
    ``pynng.TLSConfig`` whose ``"mode"`` (and ``"auth_mode"``) name the class's constants.
    The exit closes ours first (:func:`close_pynng_last`), then the peer; a child that
    dies in that close gives a :class:`PynngCloseCrashed` warning, not a failure.
    """
    pytest.importorskip("pynng")
    child = _take_child()
    peer = PynngPeer(child, kind)
    try:
        child.ask(f"pynng.{kind}(...)", ("open", kind, options))
    except BaseException:
        child.kill()
        raise
    died_in_test = False
    try:
        yield peer
    except PynngPeerDied:
        died_in_test = True  # the test fails with the child's end in its message
        raise
    finally:
        try:
            if not died_in_test:
                close_pynng_last(peer)
        except PynngPeerDied as exc:  # NNG's close race (issue 22): contained, reported
            warnings.warn(PynngCloseCrashed(f"NNG crashed closing its {kind}, after the test: {exc}"), stacklevel=3)
        finally:
            _retire(child, f"{kind} of {os.environ.get('PYTEST_CURRENT_TEST', '?')}")
