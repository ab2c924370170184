"""The platform layer (nanopy/platform): both backends offer the same operations and,
on Linux where both run, behave alike wherever their capabilities say they can; no
module outside the linux backend makes a Linux-only call (none is allowed: the
direct read, the pipe's liveness and resend went through nanopy.platform in
issue 35's phase 2).
"""

from __future__ import annotations

import ast
import errno
import importlib.util
import inspect
import os
import re
import select
import socket
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from forking import FORK_WARNING

import nanopy
from nanopy import platform
from nanopy.platform import _common

ROOT = Path(__file__).resolve().parents[1]
NANOPY = ROOT / "nanopy"
LINUX = sys.platform.startswith("linux")

#: the operations and constants of a backend (those of the Backend protocol)
OPERATIONS = sorted(
    name for name in {*vars(_common.Backend), *_common.Backend.__annotations__} if not name.startswith("_")
)


def _backends() -> list[str]:
    return list(platform.BACKENDS) if LINUX else ["portable"]


@pytest.fixture(params=_backends())
def backend(request: pytest.FixtureRequest) -> Any:
    """Each backend this system runs (both on Linux)."""
    return platform.load(request.param)


# -- the same operations ----------------------------------------------------------------------------
def _signature(fn: Any) -> str:
    return str(inspect.signature(fn))


def _protocol_signature(name: str) -> str:
    sig = inspect.signature(getattr(_common.Backend, name))
    return str(sig.replace(parameters=list(sig.parameters.values())[1:]))  # (without self)


def test_the_protocol_names_every_operation() -> None:
    assert {"new_waker", "ready_wait", "set_keepalive", "unacked_bytes", "ipv4_interfaces",
            "register_at_fork", "lock_file", "CAPABILITIES"} <= set(OPERATIONS)


@pytest.mark.skipif(not LINUX, reason="the linux backend runs on Linux only")
def test_both_backends_offer_the_same_operations_with_the_same_signatures() -> None:
    linux, portable = platform.load("linux"), platform.load("portable")
    for name in OPERATIONS:
        a, b = getattr(linux, name), getattr(portable, name)
        if callable(a):
            assert _signature(a) == _signature(b) == _protocol_signature(name), name
        else:
            assert type(a) is type(b), name
    for module in (linux, portable):  # the package's face hands out every one of them
        public = {n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n))}
        assert public & set(platform.__all__) >= {n for n in OPERATIONS if callable(getattr(module, n))}


def test_the_chosen_backend_is_the_face_of_the_package() -> None:
    chosen = platform.backend
    for name in OPERATIONS:
        assert getattr(platform, name) is getattr(chosen, name), name
    assert platform.NAME == chosen.NAME == platform.default_name()


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    child = {k: v for k, v in os.environ.items() if k != "NANOPY_BACKEND"}
    child.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=child,
                          check=False)


def test_nanopy_backend_picks_the_backend() -> None:
    show = "import nanopy.platform as p; print(p.NAME)"
    assert _run_python(show).stdout.strip() == ("linux" if LINUX else "portable")
    assert _run_python(show, NANOPY_BACKEND="portable").stdout.strip() == "portable"
    if LINUX:
        assert _run_python(show, NANOPY_BACKEND="Linux").stdout.strip() == "linux"
    bad = _run_python(show, NANOPY_BACKEND="bsd")
    assert bad.returncode != 0 and "NANOPY_BACKEND='bsd': choose one of linux, portable" in bad.stderr


@pytest.mark.skipif(LINUX, reason="the linux backend runs here")
def test_the_linux_backend_refuses_other_systems() -> None:
    with pytest.raises(platform.BackendError, match="needs Linux"):
        platform.load("linux")


# -- waking a blocked thread ------------------------------------------------------------------------
def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_a_wake_is_readable_until_cleared(backend: Any) -> None:
    waker = backend.new_waker()
    try:
        assert not _readable(waker.fd)
        for _ in range(3):  # several wakes are one
            waker.wake()
        assert _readable(waker.fd)
        waker.clear()
        assert not _readable(waker.fd)
        waker.clear()  # nothing to clear: no error
    finally:
        waker.close()
    waker.wake()  # after close: ignored
    waker.close()


def test_a_wake_after_a_clear_stays_readable(backend: Any) -> None:
    # clear skips its read when no wake came since the last one: every wake must
    # still make the descriptor readable until the next clear, however they alternate
    waker = backend.new_waker()
    try:
        for _ in range(3):
            waker.clear()
            assert not _readable(waker.fd)
            waker.wake()
            assert _readable(waker.fd)
            waker.clear()
            assert not _readable(waker.fd)
            waker.wake()
            waker.wake()
            assert _readable(waker.fd)
        waker.clear()
        assert not _readable(waker.fd)
    finally:
        waker.close()


@pytest.fixture
def waiting(backend: Any, pair: Any) -> Iterator[tuple[Any, Any, socket.socket, socket.socket]]:
    """``(waker, wait, a, b)``: a wait on ``b`` (a socket pair's end ``a`` writes to) and the waker."""
    a, b = pair
    waker = backend.new_waker()
    wait = backend.ready_wait(b.fileno(), waker)
    yield waker, wait, a, b
    wait.close()
    waker.close()


def test_ready_wait_returns_for_a_wake_from_another_thread(waiting: Any) -> None:
    waker, wait, _, _ = waiting
    woken = threading.Event()

    def blocked() -> None:
        wait.wait(None)
        woken.set()

    thread = threading.Thread(target=blocked, daemon=True)
    thread.start()
    waker.wake()
    thread.join(10)
    assert woken.is_set()
    assert any(_readable(fd) for fd in wait.fds)  # an event loop sees it too
    waker.clear()
    wait.wait(0)  # nothing ready: returns at once
    assert not any(_readable(fd) for fd in wait.fds)


def test_ready_wait_returns_for_the_pipe_and_loops_see_it(waiting: Any) -> None:
    _, wait, a, b = waiting
    a.send(b"x")
    wait.wait(10)  # returns at once: b is readable
    assert any(_readable(fd) for fd in wait.fds)
    assert b.recv(10) == b"x"
    assert not any(_readable(fd) for fd in wait.fds)


def test_ready_wait_on_a_closed_descriptor_is_an_oserror(backend: Any) -> None:
    waker = backend.new_waker()
    a, b = socket.socketpair()
    fd = b.fileno()
    a.close()
    b.close()
    try:
        with pytest.raises(OSError):
            backend.ready_wait(fd, waker)
    finally:
        waker.close()


# -- TCP ------------------------------------------------------------------------------------------------
@pytest.fixture
def tcp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    yield client, accepted
    client.close()
    accepted.close()


def _tcp_option(sock: socket.socket, name: str) -> int | None:
    option = getattr(socket, name, None)
    return None if option is None else sock.getsockopt(socket.IPPROTO_TCP, option)


def test_a_listening_port_stays_exclusive(backend: Any) -> None:
    with socket.socket() as first, socket.socket() as second:
        for sock in (first, second):
            backend.reuse_listen_address(sock)
        first.bind(("127.0.0.1", 0))
        first.listen()
        with pytest.raises(OSError) as refused:
            second.bind(first.getsockname())
        assert refused.value.errno == errno.EADDRINUSE


def test_a_datagram_port_is_shared(backend: Any) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as first, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as second:
        for sock in (first, second):
            backend.share_datagram_port(sock)
        first.bind(("127.0.0.1", 0))
        second.bind(first.getsockname())  # (a second process listening for beacons)


def test_keepalive_is_set_with_the_options_the_system_has(backend: Any, tcp_pair: Any) -> None:
    sock, _ = tcp_pair
    backend.set_keepalive(sock, 6, 1, 3)
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
    idle = _tcp_option(sock, "TCP_KEEPIDLE") or _tcp_option(sock, "TCP_KEEPALIVE")
    assert (idle, _tcp_option(sock, "TCP_KEEPINTVL"), _tcp_option(sock, "TCP_KEEPCNT")) == (6, 1, 3)


def test_user_timeout_where_the_backend_has_one(backend: Any, tcp_pair: Any) -> None:
    sock, _ = tcp_pair
    has = backend.CAPABILITIES.user_timeout
    assert backend.set_user_timeout(sock, 9000) is has
    assert backend.user_timeout(sock) == (9000 if has else None)
    if has:
        assert backend.set_user_timeout(sock, 0) and backend.user_timeout(sock) == 0


def test_unacked_bytes_counted_or_unknown(backend: Any, tcp_pair: Any) -> None:
    sock, _ = tcp_pair  # the peer reads nothing: what its window refuses stays ours
    assert backend.unacked_bytes(None) is None
    if not backend.CAPABILITIES.unacked_bytes:
        assert backend.unacked_bytes(sock) is None and backend.send_window_state(sock) is None
        return
    assert backend.unacked_bytes(sock) == 0
    sock.setblocking(False)
    try:
        while True:
            sock.send(bytes(1 << 16))
    except BlockingIOError:
        pass
    assert backend.unacked_bytes(sock) > 0
    state = backend.send_window_state(sock)
    assert state is not None and state[0] in (True, False)


def test_unread_bytes(backend: Any, tcp_pair: Any) -> None:
    sock, peer = tcp_pair
    sock.setblocking(False)
    assert backend.unread_bytes(sock) == 0 and backend.unread_bytes(None) == 0
    peer.sendall(b"x" * 1000)
    select.select([sock], [], [], 10)
    assert backend.unread_bytes(sock) == 1000
    assert sock.recv(2000) == b"x" * 1000  # (a count, not a read: the bytes are still there)
    assert backend.unread_bytes(sock) == 0


def test_send_buffer_ceiling(backend: Any) -> None:
    ceiling = backend.send_buffer_ceiling()
    assert ceiling is None if backend.NAME == "portable" else ceiling > 0


# -- interfaces -------------------------------------------------------------------------------------
def test_broadcast_from_address_and_netmask() -> None:
    assert platform.broadcast_of("192.0.2.7", 24) == "192.0.2.255"
    assert platform.broadcast_of("10.1.2.3", 8) == "10.255.255.255"
    assert platform.broadcast_of("172.16.5.9", 20) == "172.16.15.255"
    assert _common.prefix_of("255.255.240.0") == 20


@pytest.mark.skipif(not LINUX, reason="compares the two backends (Linux runs both)")
def test_both_backends_find_the_same_interfaces() -> None:
    pytest.importorskip("ifaddr")
    linux, portable = platform.load("linux"), platform.load("portable")
    found = {(i.name, i.broadcast) for i in linux.ipv4_interfaces()}
    assert found == {(i.name, i.broadcast) for i in portable.ipv4_interfaces()}
    for interface in linux.ipv4_interfaces():
        assert not interface.address.startswith("127.") and interface.prefix_len < 31
    assert linux.ipv6_link_interfaces() == portable.ipv6_link_interfaces()


def test_interfaces_unknown_without_ifaddr(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    portable = platform.load("portable")
    monkeypatch.setitem(sys.modules, "ifaddr", None)  # (import ifaddr raises ImportError)
    monkeypatch.setattr(portable, "_warned_no_ifaddr", [])
    assert portable.ipv4_interfaces() == [] and portable.ipv6_link_interfaces() == []
    assert [r.message for r in caplog.records].count(
        "nanopy: the interfaces of this host are unknown without the ifaddr package (pip install ifaddr); "
        "beacons go to 255.255.255.255 only") == 1


# -- processes and files ------------------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "fork"), reason="this system does not fork")
@pytest.mark.filterwarnings(FORK_WARNING)
def test_fork_hooks_run_around_a_fork(backend: Any) -> None:
    seen: list[str] = []
    read_end, write_end = os.pipe()
    live = [write_end]  # (the hooks stay registered: they act only while this test runs)

    def in_child() -> None:
        if live:
            os.write(live[0], backend.NAME.encode())

    assert backend.register_at_fork(before=lambda: live and seen.append("before"),
                                    after_in_parent=lambda: live and seen.append("parent"),
                                    after_in_child=in_child)
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.close(write_end)
        got = b""
        while chunk := os.read(read_end, 100):  # (until the child exits)
            got += chunk
        os.waitpid(pid, 0)
    finally:
        live.clear()
        os.close(read_end)
    assert got == backend.NAME.encode() and seen == ["before", "parent"]


def test_a_file_lock_is_exclusive_while_its_file_is_open(backend: Any, tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    with open(path, "a+") as first, open(path, "a+") as second:
        backend.lock_file(first, wait=False)
        with pytest.raises(OSError):
            backend.lock_file(second, wait=False)
        first.close()
        backend.lock_file(second, wait=False)


def test_directory_fsync_user_tag_and_unix_sockets(backend: Any, tmp_path: Path) -> None:
    backend.fsync_directory(str(tmp_path))
    tag = backend.user_tag()
    assert tag and os.sep not in tag
    if hasattr(os, "getuid"):
        assert tag == str(os.getuid())
    with socket.socket() as tcp:
        assert not backend.is_unix_socket(tcp)
    if hasattr(socket, "AF_UNIX"):
        assert backend.CAPABILITIES.unix_sockets
        with socket.socket(socket.AF_UNIX) as unix:
            assert backend.is_unix_socket(unix)
    assert backend.UNIX_PATH_MAX in (103, 107)


def test_ipc_without_unix_sockets_is_a_clear_address_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python on Windows has no socket.AF_UNIX: ipc and zmtp+ipc say so at bind and connect."""
    monkeypatch.delattr(socket, "AF_UNIX", raising=False)
    for scheme in ("ipc", "zmtp+ipc"):
        protocol = "pair" if scheme == "ipc" else "push"
        with nanopy.Socket(protocol) as sock:
            for call in (sock.bind, sock.connect):
                with pytest.raises(nanopy.AddressError, match=re.escape(
                        f"{scheme}:// needs Unix domain sockets, which Python on {sys.platform} does not offer")):
                    call(f"{scheme}:///tmp/nanopy-no-unix.ipc")


# -- no Linux-only call outside the linux backend -------------------------------------------------------
#: attributes of these modules that only Linux (or only POSIX) has
OS_SPECIFIC_ATTRIBUTES = {
    "os": {"eventfd", "eventfd_read", "eventfd_write", "EFD_CLOEXEC", "EFD_NONBLOCK", "EFD_SEMAPHORE",
           "register_at_fork", "fork", "forkpty", "getuid", "geteuid", "getgid", "getegid", "pidfd_open",
           "memfd_create", "splice", "sched_getaffinity", "sched_setaffinity", "O_DIRECT"},
    "select": {"epoll", "EPOLLIN", "EPOLLOUT", "EPOLLET", "EPOLLERR", "EPOLLHUP", "poll", "kqueue", "devpoll"},
    "socket": {"TCP_USER_TIMEOUT", "TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT", "TCP_KEEPALIVE", "TCP_INFO",
               "AF_UNIX", "AF_PACKET", "AF_NETLINK", "SO_BINDTODEVICE", "SO_REUSEPORT", "SO_PEERCRED",
               "MSG_NOSIGNAL", "MSG_DONTWAIT", "SIO_KEEPALIVE_VALS"},
}
#: modules that exist on some systems only
OS_SPECIFIC_MODULES = {"fcntl", "termios", "resource", "pwd", "grp", "msvcrt", "winreg", "_winapi", "posix"}
#: Linux-only even for the portable backend
LINUX_ONLY = {"eventfd", "eventfd_read", "eventfd_write", "EFD_CLOEXEC", "EFD_NONBLOCK", "epoll", "EPOLLIN",
              "TCP_USER_TIMEOUT", "TCP_INFO", "TIOCOUTQ", "SIOCOUTQ", "/proc/", "/sys/"}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def os_specific_uses(path: Path) -> set[str]:
    """The OS-specific calls, imports and paths in one module (docstrings and comments aside)."""
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = node.value.id
            if node.attr in OS_SPECIFIC_ATTRIBUTES.get(module, ()) or module in OS_SPECIFIC_MODULES:
                found.add(f"{module}.{node.attr}")
        elif isinstance(node, ast.Import):
            found |= {f"import {a.name}" for a in node.names if a.name.split(".")[0] in OS_SPECIFIC_MODULES}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in OS_SPECIFIC_MODULES:
            found.add(f"import {node.module}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            found |= {p for p in ("/proc/", "/sys/") if node.value.startswith(p)}
    return found


def test_no_os_specific_call_outside_the_platform_layer() -> None:
    found = {}
    for path in sorted(NANOPY.rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if name.startswith("nanopy/platform/"):
            continue
        uses = os_specific_uses(path)
        if uses:
            found[name] = uses
    assert not found, f"OS-specific calls outside nanopy/platform (add an operation there): {found}"


def test_the_portable_backend_makes_no_linux_only_call() -> None:
    source = (NANOPY / "platform" / "portable.py").read_text()
    tree = ast.parse(source)
    docs = _docstrings(tree)
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
               and id(n) not in docs}
    used = {x for x in LINUX_ONLY if x in names or any(x in s for s in strings if "/" in x)}
    assert not used, f"the portable backend uses what only Linux has: {used}"


def test_the_scanner_finds_what_it_looks_for(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('"""About /proc/ and os.eventfd."""\nimport fcntl\nimport os, select, socket\n'
                      'fd = os.eventfd(0)\nep = select.epoll()\nopt = socket.TCP_USER_TIMEOUT\n'
                      'text = open("/proc/net/if_inet6")\n')
    assert os_specific_uses(sample) == {"import fcntl", "os.eventfd", "select.epoll", "socket.TCP_USER_TIMEOUT",
                                        "/proc/"}


# -- the other systems' view: mypy as it would check nanopy on macOS and on Windows ------------------
@pytest.mark.timeout(300)
@pytest.mark.parametrize("system", ["darwin", "win32"])
def test_mypy_finds_no_missing_os_call_on_other_systems(system: str) -> None:
    """mypy with another system's standard library stubs: an attribute that system's
    Python lacks (os.eventfd on macOS, fcntl on Windows) is an error anywhere (the
    linux backend asserts it runs on Linux: mypy skips it)."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--platform", system,
                           "nanopy"], cwd=ROOT, capture_output=True, text=True, timeout=290, check=False)
    bad = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert not bad, "\n".join(bad)


DEGRADED = """
import nanopy
from nanopy import platform
from nanopy.testing import wait_pipes
with nanopy.Socket("push", resend_unacked=True) as push, nanopy.Socket("pull") as pull:
    push.connect(pull.bind("tcp://127.0.0.1:0").url)
    wait_pipes(push)
    push.send(b"m")
    assert pull.recv(timeout=10) == b"m"
    logs = [d.sent_log for d in push._driver.pipe_drivers()]
    pull.close()
    stats = push.stats()
    print(platform.NAME, logs, stats.lost_unacked_bytes, stats.lost_unacked_messages, stats.messages_resent)
"""


@pytest.mark.skipif(not LINUX, reason="forces the portable backend on Linux")
def test_without_the_kernel_count_resend_unacked_keeps_no_log() -> None:
    """The portable backend cannot count unacknowledged bytes: a TCP pipe of PUSH with
    ``resend_unacked`` keeps no sent log, and the loss counters stay 0 (docs/partitions.md)."""
    done = _run_python(DEGRADED, NANOPY_BACKEND="portable")
    assert done.stdout.split() == ["portable", "[None]", "0", "0", "0"], done.stderr
    done = _run_python(DEGRADED)
    assert done.stdout.split()[0] == "linux" and done.stdout.split()[1] != "[None]", done.stderr


def test_the_workflow_runs_the_quick_tier_on_macos_and_windows() -> None:
    """.github/workflows/ci.yml (it cannot run here): macOS and Windows x the Pythons the
    classifiers name, the quick tier exactly as .ci/other-pythons-then selects it."""
    workflow = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    quick = re.search(r'^QUICK="([^"]+)"$', (ROOT / ".ci" / "other-pythons-then").read_text(), re.M)
    assert quick and f'-m "{quick.group(1)}"' in workflow
    assert "os: [macos-latest, windows-latest]" in workflow
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    versions = [c.rsplit(" ", 1)[1] for c in project["classifiers"] if re.fullmatch(r"Programming .*: 3\.\d+", c)]
    assert f"python: [{', '.join(repr(v).replace(chr(39), chr(34)) for v in versions)}]" in workflow
    assert {"Operating System :: POSIX :: Linux", "Operating System :: MacOS",
            "Operating System :: Microsoft :: Windows"} <= set(project["classifiers"])
    assert 'pip install -e ".[test]"' in workflow
