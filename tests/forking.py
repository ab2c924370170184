"""Helpers of the fork tests: run a function in a forked child that always exits, and reap
it by its PID within a deadline (a pidfd: no polling)."""

from __future__ import annotations

import faulthandler
import os
import select
import signal
import sys
from collections.abc import Callable

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
