"""Helpers for testing code that uses nanopy (and for nanopy's own tests)."""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Callable

from ._socket import Socket

_counter = itertools.count()


def ipc_url(tag: str = "t") -> str:
    """A fresh ``ipc://`` URL in the temporary directory (short enough for sun_path)."""
    return f"ipc://{tempfile.gettempdir()}/np-{os.getpid()}-{tag}-{next(_counter)}.ipc"


def inproc_url(tag: str = "t") -> str:
    """A fresh, process-unique ``inproc://`` URL."""
    return f"inproc://{tag}-{os.getpid()}-{next(_counter)}"


def wait_pipes(sock: Socket, count: int = 1, timeout: float = 5.0) -> None:
    """Block until ``sock`` has at least ``count`` pipes (woken by pipe events, no polling).

    Raises:
        TimeoutError: the pipes did not come up in time.
    """
    _wait_for_pipes(sock, lambda n: n >= count, timeout, f"{count} pipe(s) not connected")


def wait_no_pipes(sock: Socket, timeout: float = 5.0) -> None:
    """Block until ``sock`` has no pipes."""
    _wait_for_pipes(sock, lambda n: n == 0, timeout, "pipes still connected")


def _wait_for_pipes(sock: Socket, done: Callable[[int], bool], timeout: float, what: str) -> None:
    with sock._pipes_changed:
        if not sock._pipes_changed.wait_for(lambda: done(len(sock._pipes)), timeout):
            raise TimeoutError(f"{sock!r}: {what} within {timeout}s")


def connect_pair(a: Socket, b: Socket, url: str, timeout: float = 5.0) -> None:
    """Bind ``a`` on ``url``, connect ``b`` to it and wait until both see the pipe."""
    ep = a.bind(url)
    b.connect(ep.url)
    wait_pipes(a, 1, timeout)
    wait_pipes(b, 1, timeout)
