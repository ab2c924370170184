"""close() racing bind() leaves no listener behind (issue 10, defect 4).

A thread binds while another closes the socket at a random moment: whichever
wins, once close() has returned the address must be free to bind again (tcp,
ipc and ws; inproc names too).
"""

from __future__ import annotations

import random
import threading
import time

import pytest

import nanopy
from nanopy.testing import free_port, inproc_url, ipc_url

ROUNDS = 40


_free_port = free_port  # (nanopy.testing's shared helper)


def _fresh_url(scheme: str) -> str:
    if scheme == "tcp":
        return f"tcp://127.0.0.1:{_free_port()}"
    if scheme == "ws":
        return f"ws://127.0.0.1:{_free_port()}/race"
    if scheme == "ipc":
        return ipc_url("race")
    return inproc_url("race")


def _spin(seconds: float) -> None:
    """Busy-wait (no sleep: the point is a precise, random moment)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.parametrize("scheme", ["tcp", "ipc", "ws", "inproc"])
def test_close_racing_bind_frees_the_address(scheme: str) -> None:
    rng = random.Random(10)
    errors: list[BaseException] = []  # kept alive, as an application's traceback would be
    for _ in range(ROUNDS):
        url = _fresh_url(scheme)
        sock = nanopy.Socket("pull")
        go = threading.Barrier(2)

        def bind() -> None:
            go.wait()
            try:
                sock.bind(url)
            except nanopy.Closed as exc:
                errors.append(exc)

        binder = threading.Thread(target=bind)
        binder.start()
        go.wait()
        _spin(rng.random() * 0.02)
        sock.close(linger=0)
        binder.join(10)
        assert not binder.is_alive()
        # close() returned: the address is free again, at once.
        again = nanopy.Socket("pull")
        try:
            again.bind(url)
        finally:
            again.close(linger=0)
