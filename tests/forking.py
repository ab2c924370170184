"""Helpers of the fork tests: run a function in a forked child that always exits, and reap
it by its PID within a deadline (a pidfd: no polling)."""

from __future__ import annotations

import faulthandler
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import trio

import nanopy
from nanopy.testing import local_url

#: filterwarnings mark text: Python 3.12+ warns when a process with threads forks (docs/api.md)
FORK_WARNING = "ignore:This process .* is multi-threaded:DeprecationWarning"

#: exit code of a child whose body raised
CHILD_RAISED = 99


def fork_child(body: Callable[[], int], watchdog: float = 20.0) -> int:
    """Fork; the child runs ``body`` and exits with what it returns (``CHILD_RAISED`` if
    it raises). A child stuck longer than ``watchdog`` dumps its stack and exits."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = CHILD_RAISED
    try:
        faulthandler.dump_traceback_later(watchdog, exit=True)
        code = body()
    except BaseException as exc:  # noqa: BLE001 - reported through the exit code
        print(f"forked child {os.getpid()}: {exc!r}", file=sys.stderr, flush=True)
    finally:
        os._exit(code)


def reap(pid: int, timeout: float) -> int | None:
    """Wait for child ``pid`` at most ``timeout`` seconds and return its exit code; a child
    still running then is killed (by its PID), reaped, and None returned."""
    fd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if not poller.poll(timeout * 1000):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
    finally:
        os.close(fd)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@contextmanager
def living_child() -> Iterator[int]:
    """A forked child that does nothing until the block ends (then it exits 0 and is
    reaped): for what must hold while a child lives."""
    read_end, write_end = os.pipe()
    pid = fork_child(lambda: 0 if os.read(read_end, 1) else 1, watchdog=60)
    try:
        yield pid
    finally:
        os.write(write_end, b"x")
        code = reap(pid, 10)
        os.close(read_end)
        os.close(write_end)
    assert code == 0, f"child exit code {code}"


def inherited_socket_is_closed(sock: nanopy.Socket, url: str) -> int:
    """In a child: ``sock`` (the parent's) is closed there. 0 when every call raises
    Closed naming the fork, it shows no pipes nor endpoints, and closing it (and its
    endpoints) returns at once; else the number of the step that failed."""
    t0 = time.monotonic()
    calls: list[Callable[[], Any]] = [
        lambda: sock.send(b"x", timeout=1), lambda: sock.recv(timeout=1), lambda: sock.recv_msg(timeout=0),
        lambda: sock.bind(local_url("tcp")), lambda: sock.connect(url),
    ]
    for step, call in enumerate(calls, 1):
        try:
            call()
            return step
        except nanopy.Closed as exc:
            if "fork" not in str(exc):
                return 10 + step
        except nanopy.NanopyError:
            return 20 + step
    if sock.stats().pipes or not sock.closed or sock.endpoints:
        return 30
    sock.close()
    trio.run(sock.aclose)
    return 0 if time.monotonic() - t0 < 1.0 else 40
