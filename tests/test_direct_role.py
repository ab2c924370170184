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
from conftest import wait_until
from test_driver import _role_taken, _single_pipe_pair

import nanopy
from nanopy import platform

Factory = Callable[..., nanopy.Socket]


def _reader(sock: nanopy.Socket) -> Any:
    (pipe,) = list(sock._pipes.values())
    return pipe.reader


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_the_read_role_goes_to_one_thread_at_a_time(make_socket: Factory, transport: str) -> None:
    _push, pull = _single_pipe_pair(make_socket, transport)
    reader = _reader(pull)
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
    _push, pull = _single_pipe_pair(make_socket, "tcp")
    reader = _reader(pull)
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
    push, pull = _single_pipe_pair(make_socket, transport)
    first: list[Any] = []
    waiting = threading.Thread(target=lambda: first.append(pull.recv(timeout=5)), daemon=True)
    waiting.start()
    wait_until(lambda: _role_taken(pull), what="a receiver took the read role")
    push.send(b"first")  # (read by the waiting receiver itself)
    waiting.join(5)
    assert first == [b"first"]

    def send() -> None:
        for n in range(200):
            push.send(b"%d" % n)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    for n in range(200):  # (some receives wait and read, some find messages queued)
        assert pull.recv(timeout=5) == b"%d" % n
    thread.join(5)
    direct = pull._driver.direct
    assert direct.users == 0
    assert not _reader(pull).role
    assert direct._waker_box[0] is not None and direct._wait_cache is not None
    pull.close()
    assert direct._waker_box == [None] and direct._wait_cache is None  # closed by close()
