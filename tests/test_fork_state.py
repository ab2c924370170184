"""Fork safety, piece by piece (nanopy/_fork.py): whatever another thread of the parent was
doing at ``os.fork()`` -- holding a nanopy lock, waking a trio loop, importing a plug-in,
running a test engine -- the child makes new sockets that work, its inherited objects are
closed and say so, and the parent's closes take effect while the child lives.

Each test forces the state a fork could meet by chance (a lock held, a load half done)
and forks in it; tests/test_fork_stress.py forks under real load.
"""

from __future__ import annotations

import ast
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import send_until_full, wait_until
from forking import FORK_WARNING, fork_child, inherited_socket_is_closed, living_child, reap

import nanopy
import nanopy.metrics
from nanopy import _fork
from nanopy.discovery import Discovery
from nanopy.protocols import _registry as protocol_registry
from nanopy.testing import engine_in_this_loop, local_url, wait_no_pipes, wait_pipes
from nanopy.transports import _registry as transport_registry

pytestmark = [pytest.mark.filterwarnings(FORK_WARNING), pytest.mark.timeout(60)]

BOUND = 10.0  # seconds: the longest the parent waits for a child
NANOPY = Path(nanopy.__file__).parent


# -- the inventory: every process-wide piece of state is listed in nanopy/_fork.py ---------------
_STATEFUL_CALLS = {
    "Lock", "RLock", "Condition", "Event", "Semaphore", "BoundedSemaphore", "local", "count", "iter",
    "WeakSet", "WeakValueDictionary", "WeakKeyDictionary", "ProcessTable", "Registry", "SeriesRegistry", "process_lock",
    "loading_lock", "defaultdict", "OrderedDict", "deque", "dict", "set", "list",
}


def _call_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return None


def _is_state(value: ast.expr) -> bool:
    """A registry, cache, counter or lock: a call that makes one, or an empty container (a
    non-empty literal is a constant table)."""
    if _call_name(value) in _STATEFUL_CALLS:
        return True
    if isinstance(value, (ast.Dict, ast.List, ast.Set)):
        items = value.keys if isinstance(value, ast.Dict) else value.elts
        return not items or all(isinstance(i, ast.Constant) and i.value is None for i in items)
    return False


def _module_state() -> dict[str, ast.expr | None]:
    """Module-level registries, caches, counters and locks of nanopy, and every module
    global a function rebinds (``global``), by dotted name."""
    found: dict[str, ast.expr | None] = {}
    for path in sorted(NANOPY.rglob("*.py")):
        parts = path.relative_to(NANOPY).with_suffix("").parts
        module = ".".join(("nanopy", *(parts[:-1] if parts[-1] == "__init__" else parts)))
        if module == "nanopy._fork":
            continue  # (its own bookkeeping: what the hooks work through)
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign):
                targets, value = [node.target], node.value
            else:
                continue
            for target in targets:
                if isinstance(target, ast.Name) and value is not None and _is_state(value) and target.id != "__all__":
                    found[f"{module}.{target.id}"] = value
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                for name in node.names:
                    found.setdefault(f"{module}.{name}", None)
    return found


def test_every_process_wide_state_is_listed_in_the_fork_module() -> None:
    found = _module_state()
    unlisted = sorted(set(found) - set(_fork.PROCESS_STATE))
    assert not unlisted, f"module-level state missing from nanopy/_fork.py PROCESS_STATE: {unlisted}"
    stale = sorted(set(_fork.PROCESS_STATE) - set(found))
    assert not stale, f"PROCESS_STATE names what no longer exists: {stale}"
    plain_locks = [name for name, value in found.items() if _call_name(value) in ("Lock", "RLock")]
    assert not plain_locks, f"module-level locks must come from _fork.process_lock(): {plain_locks}"


def test_fork_hooks_are_registered_in_one_place() -> None:
    users = sorted(p.relative_to(NANOPY).as_posix() for p in NANOPY.rglob("*.py")
                   if "register_at_fork(" in p.read_text() and not p.is_relative_to(NANOPY / "platform"))
    assert users == ["_fork.py"]  # (through nanopy.platform, which registers nothing of its own)


# -- helpers -------------------------------------------------------------------------------------
@contextmanager
def held(lock: Any) -> Iterator[None]:
    """``lock`` held by another thread (as by a thread in the middle of its critical
    section) until the block ends."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            release.wait(BOUND * 3)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert taken.wait(BOUND)
    try:
        yield
    finally:
        release.set()
        holder.join(BOUND)


def _child_sends(url: str, body: bytes) -> int:
    with nanopy.Socket("push", connect=url, send_timeout=BOUND) as push:
        push.send(body)
    return 0


def fork_talker(url: str, child: Callable[[], int] | None = None) -> int:
    """Fork a child that (after ``child``, which must return 0) sends ``child PID`` to
    ``url`` through a new socket; returns its PID."""

    def body() -> int:
        code = child() if child is not None else 0
        return code or _child_sends(url, b"child %d" % os.getpid())

    return fork_child(body, watchdog=BOUND)


def hear(home: nanopy.Socket, pid: int) -> None:
    """The parent hears from child ``pid`` within BOUND, and the child exits 0."""
    try:
        assert home.recv(timeout=BOUND) == b"child %d" % pid
    finally:
        code = reap(pid, BOUND)
    assert code == 0, f"child exit code {code} (None: it hung and was killed)"


@pytest.fixture
def home() -> Iterator[tuple[nanopy.Socket, str]]:
    with nanopy.Socket("pull") as pull:
        yield pull, pull.bind("tcp://127.0.0.1:0").url


# -- what another thread was doing at the fork ---------------------------------------------------
def test_a_trio_task_in_aclose_at_fork_is_not_woken_in_the_child(home: tuple[nanopy.Socket, str]) -> None:
    """The reported hang: the child's reset woke the parent's trio task waiting in
    ``aclose()``, which takes that trio run's lock -- held at the fork by the parent's
    engine thread waking the run -- and the child never came out of ``os.fork()``."""
    pull, url = home
    with ExitStack() as stack:
        stalled = stack.enter_context(nanopy.Socket("pull", recv_buffer=1))  # never receives
        push = stack.enter_context(nanopy.Socket("push", connect=stalled.bind(local_url("tcp")).url))
        wait_pipes(push)
        send_until_full(lambda b: push.send(b, timeout=0.2), nanopy.Timeout, b"x" * 65536)
        token: list[Any] = []
        closing = threading.Event()

        async def close_slowly() -> None:
            token.append(trio.lowlevel.current_trio_token())
            closing.set()
            await push.aclose(linger=BOUND * 3)  # waits: its queue cannot be written

        closer = threading.Thread(target=trio.run, args=(close_slowly,), daemon=True)
        closer.start()
        assert closing.wait(BOUND)
        wait_until(lambda: push._tasks._finish_waiters, what="aclose() waiting")
        run_lock = getattr(getattr(token[0], "_reentry_queue", None), "lock", None)
        if run_lock is None:
            pytest.skip("this trio keeps its run's lock elsewhere")
        with held(run_lock):  # as while a parent thread wakes that run
            pid = fork_talker(url)
        hear(pull, pid)
        stalled.close(linger=0)  # the push's pipe ends: its aclose returns
        closer.join(BOUND)
        assert not closer.is_alive()


def test_nanopy_locks_held_at_fork_are_free_in_the_child(home: tuple[nanopy.Socket, str]) -> None:
    """Every process lock (pipe ids, the engine's, multipart, metrics...) held by another
    thread at the fork: the child's new socket works (it needs the pipe-id lock)."""
    pull, url = home
    locks = [lock for lock in _fork._locks if lock not in _fork._loading]
    assert transport_registry.transports._lock in _fork._loading
    with ExitStack() as stack:
        for lock in locks:
            stack.enter_context(held(lock))
        pid = fork_talker(url)
    hear(pull, pid)  # (the parent's engine needs the pipe-id lock back to hear it)


def test_a_plugin_loading_in_another_thread_at_fork_is_whole_in_the_child(
    home: tuple[nanopy.Socket, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A protocol being imported (first use) by another thread when the parent forks: the
    fork waits for the import, so the child does not block on a half-imported module."""
    pull, url = home
    gate = sys.modules.setdefault("fork_gate", type(sys)("fork_gate"))
    gate.importing, gate.go = threading.Event(), threading.Event()  # type: ignore[attr-defined]
    name = f"slow_protocol_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(
        "import fork_gate\n"
        "fork_gate.importing.set()\n"
        "fork_gate.go.wait(10)  # the import is under way until the test says\n"
        "from nanopy.protocols.pipeline import Push0 as SlowPush\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(protocol_registry.BUILTIN_PROTOCOLS, "slowpush", f"{name}:SlowPush")
    monkeypatch.delitem(protocol_registry.protocols._loaded, "slowpush", raising=False)
    first_use = threading.Thread(target=lambda: nanopy.Socket("slowpush").close(), daemon=True)
    first_use.start()
    assert gate.importing.wait(BOUND)  # type: ignore[attr-defined]

    def child() -> int:
        with nanopy.Socket("slowpush", connect=url) as push:
            push.send(b"child %d" % os.getpid(), timeout=BOUND)
        return 0

    _release_at_fork.append(gate.go)  # type: ignore[attr-defined]
    try:
        pid = fork_child(child, watchdog=BOUND)  # (the import is under way as fork begins)
    finally:
        _release_at_fork.clear()
    try:
        hear(pull, pid)
    finally:
        first_use.join(BOUND)
        protocol_registry.protocols._loaded.pop("slowpush", None)


# Events set as a fork begins (before nanopy's own before-fork hook, registered earlier:
# CPython runs the later ones first): the import above goes on from inside os.fork().
_release_at_fork: list[threading.Event] = []
os.register_at_fork(before=lambda: [event.set() for event in _release_at_fork])


def test_a_test_engine_running_in_a_parent_thread_is_not_the_childs(home: tuple[nanopy.Socket, str]) -> None:
    """nanopy.testing.engine_in_this_loop active in another thread at the fork: the
    child's sockets get an engine of their own, not the parent's loop (gone there)."""
    pull, url = home
    running, done = threading.Event(), threading.Event()

    async def loop_engine_test() -> None:
        async with engine_in_this_loop():
            running.set()
            await trio.to_thread.run_sync(done.wait, BOUND * 3)

    thread = threading.Thread(target=trio.run, args=(loop_engine_test,), daemon=True)
    thread.start()
    assert running.wait(BOUND)
    try:
        hear(pull, fork_talker(url))
    finally:
        done.set()
        thread.join(BOUND)


# -- what the child inherits ---------------------------------------------------------------------
def test_an_inherited_socket_is_closed_in_the_child_even_mid_call(home: tuple[nanopy.Socket, str]) -> None:
    """A parent's socket whose lock another thread held at the fork (a call in progress):
    in the child every call raises Closed naming the fork, or returns at once."""
    pull, url = home
    push = nanopy.Socket("push", connect=url)
    wait_pipes(pull)

    try:
        with held(push._driver.lock):
            pid = fork_talker(url, lambda: inherited_socket_is_closed(push, url))
        hear(pull, pid)
        push.send(b"parent", timeout=BOUND)  # the parent's socket is untouched
        assert pull.recv(timeout=BOUND) == b"parent"
    finally:
        push.close(linger=0)


@pytest.mark.parametrize("transport", ["tcp", "ipc", "ws", "zmtp+tcp"])
def test_the_parents_close_takes_effect_while_a_child_lives(transport: str) -> None:
    """The child closes its copies of the parent's kernel sockets (not the parent's):
    when the parent closes a socket, its peer sees the end and the address is free at
    once, however long the child lives."""
    with nanopy.Socket("push") as push:
        pull = nanopy.Socket("pull")
        bound = pull.bind(local_url(transport, "close")).url
        push.connect(bound)
        wait_pipes(push)
        with living_child():
            pull.close(linger=0)
            wait_no_pipes(push, timeout=BOUND)  # the peer saw the end
            with nanopy.Socket("pull") as again:
                assert again.bind(bound).url == bound  # the address is free again


def test_a_metrics_port_closed_by_the_parent_is_free_while_a_child_lives() -> None:
    server = nanopy.metrics.serve("127.0.0.1:0")
    with living_child(), server:
        server.close()
        with nanopy.metrics.serve(("127.0.0.1", server.port)) as again:
            assert again.port == server.port


def test_an_inherited_discovery_is_closed_in_the_child() -> None:
    with Discovery("tcp://127.0.0.1:0", interval=0.2) as discovery:
        discovery_lock: Any = discovery._live._lock  # (the live-provider table's lock)

        def child() -> int:
            t0 = time.monotonic()
            try:
                discovery.resolve("anything", timeout=1)
                return 1
            except nanopy.Closed:
                pass
            discovery.close()
            return 0 if time.monotonic() - t0 < 1.0 else 2

        with held(discovery_lock):
            pid = fork_child(child, watchdog=BOUND)
        code = reap(pid, BOUND)
        assert code == 0, f"child exit code {code}"
        assert discovery.services() == {}  # the parent's goes on
