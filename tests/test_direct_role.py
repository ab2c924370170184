"""The read role and the count of direct receivers, without the locks they used to take.

``PipeReader.take_role`` decides between threads with the role's own lock (taken
without waiting), not the pipe lock; a direct receive is counted out in the round
that finds its result. Either way one thread at a time holds the role, a refused
take leaves nothing behind, and after any number of receives no receiver is left
counted, so ``close()`` closes the waker and the wait itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from test_driver import ipc_url

import nanopy
from nanopy import platform
from nanopy.testing import wait_pipes

Factory = Callable[..., nanopy.Socket]


def _pair(make_socket: Factory, transport: str) -> tuple[nanopy.Socket, nanopy.Socket]:
    a = make_socket("pair")
    url = a.bind("tcp://127.0.0.1:0" if transport == "tcp" else ipc_url("role")).url
    b = make_socket("pair", connect=url)
    wait_pipes(a)
    wait_pipes(b)
    return a, b


def _reader(sock: nanopy.Socket) -> Any:
    (pipe,) = list(sock._pipes.values())
    return pipe.reader


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_the_read_role_goes_to_one_thread_at_a_time(make_socket: Factory, transport: str) -> None:
    a, _b = _pair(make_socket, transport)
    reader = _reader(a)
    wakers = [platform.new_waker() for _ in range(8)]
    got: list[int] = []
    start = threading.Barrier(len(wakers))

    def ask(i: int) -> None:
        start.wait()
        if reader.take_role(wakers[i]):
            got.append(i)

    threads = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(len(wakers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    try:
        assert len(got) == 1  # (nobody released it: the others were refused)
        assert reader.role and reader.role_waker is wakers[got[0]]
        reader.release_role()
        assert not reader.role and reader.role_waker is None
        assert reader.take_role(wakers[0])  # free again
        reader.release_role()
    finally:
        for w in wakers:
            w.close()


def test_a_refused_take_leaves_the_role_free(make_socket: Factory) -> None:
    a, _b = _pair(make_socket, "tcp")
    reader = _reader(a)
    waker = platform.new_waker()
    try:
        reader.paused = True  # (the core's queue is full: no thread may read)
        assert not reader.take_role(waker)
        assert not reader.role and reader.role_waker is None
        reader.paused = False
        assert reader.take_role(waker)  # (the refused take did not keep the role's lock)
        reader.release_role()
    finally:
        waker.close()


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_direct_receives_leave_no_receiver_counted_and_close_closes_their_descriptors(
    make_socket: Factory, transport: str
) -> None:
    a, b = _pair(make_socket, transport)

    def echo() -> None:
        for _ in range(200):
            b.send(b.recv(timeout=5))

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    for n in range(200):  # (some receives wait, some find the reply already read)
        a.send(b"%d" % n)
        assert a.recv(timeout=5) == b"%d" % n
    thread.join(5)
    direct = a._driver.direct
    assert direct.users == 0
    assert not _reader(a).role
    assert direct._waker_box[0] is not None and direct._wait_cache is not None
    a.close()
    assert direct._waker_box == [None] and direct._wait_cache is None  # closed by close()
