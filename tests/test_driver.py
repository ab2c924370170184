"""The socket driver: one round per input, credit without recursion, async checkpoints.

The first tests drive a :class:`SocketDriver` with a fake pipe that "writes" every
payload at once (so every TRANSMIT gives its credit straight back); the rest use
real sockets over inproc to check trio's and asyncio's cancellation rules.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing
from conftest import wait_until

import nanopy
from nanopy._core import PipeInfo
from nanopy._driver import SocketDriver
from nanopy._options import new_options
from nanopy.protocols.pipeline import Push0
from nanopy.protocols.reqrep import Req0
from nanopy.testing import inproc_url, wait_pipes

Factory = Callable[..., nanopy.Socket]


class _CountingLock:
    """A lock that counts acquisitions (the driver's rounds)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rounds = 0

    def acquire(self, *args: Any) -> bool:
        self.rounds += 1
        return self._lock.acquire(*args)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class _InstantPipe:
    """A pipe driver whose every transmit is written at once (credit comes back)."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def transmit(self, payload: bytes) -> int:
        self.written.append(payload)
        return 1


def _driver(core_cls: type, **opts: Any) -> SocketDriver:
    options = new_options(core_cls.name)
    for key, value in opts.items():
        setattr(options, key, value)
    return SocketDriver(core_cls(options), lambda: "test", lambda: None)  # type: ignore[arg-type,return-value]


def test_credit_returned_by_many_queued_requests_never_recurses() -> None:
    # REQ sends its queued requests when credit comes back; with a pipe that
    # writes at once, each credit releases the next request. 5000 requests would
    # overflow the stack if credit and transmit called each other.
    driver = _driver(Req0, resend_interval=None)
    core: Any = driver.core
    for i in range(5000):
        driver.feed(core.start_request, b"%d" % i)
    pipe = _InstantPipe()
    assert driver.add_pipe(pipe, PipeInfo(1, "pipe", 8, 8), 1)  # type: ignore[arg-type]
    assert len(pipe.written) == 5000
    assert pipe.written[-1].endswith(b"4999")


def test_idle_pipe_send_takes_one_lock_round() -> None:
    driver = _driver(Push0)
    pipe = _InstantPipe()
    driver.add_pipe(pipe, PipeInfo(1, "pipe", 8, 8), 2)  # type: ignore[arg-type]
    lock = driver.lock = _CountingLock()  # type: ignore[assignment]
    for i in range(100):
        assert driver.try_send(b"%d" % i, b"")
    # The credit each write returns is folded into the next send's round.
    assert lock.rounds == 100
    assert len(pipe.written) == 100


def test_credit_reaches_a_parked_sender_at_once() -> None:
    # With a sender parked for credit, the credit is handed over in a round of
    # its own instead of waiting for the next send.
    driver = _driver(Push0)
    pipe = _InstantPipe()
    driver.add_pipe(pipe, PipeInfo(1, "pipe", 8, 8), 0)  # type: ignore[arg-type]
    assert not driver.try_send(b"x", b"")
    waiter = threading.Event()

    class _Wake:
        woken = False

        def wake(self) -> None:
            self.woken = True
            waiter.set()

    driver.send_q.waiters.append(_Wake())
    driver.credit(1, 1)
    assert waiter.is_set()
    assert driver.try_send(b"x", b"")


# -- trio: every async call is a checkpoint ----------------------------------------------------


@pytest.fixture
def inproc_pair(make_socket: Factory) -> tuple[nanopy.Socket, nanopy.Socket]:
    url = inproc_url("drv")
    pull = make_socket("pull", bind=url)
    push = make_socket("push", connect=url)
    wait_pipes(push)
    return push, pull


def _ready(pull: nanopy.Socket, push: nanopy.Socket, data: bytes) -> None:
    push.send(data)
    wait_until(pull._core.can_recv, what="message queued")


def test_trio_arecv_in_cancelled_scope_raises_and_takes_nothing(inproc_pair: Any) -> None:
    push, pull = inproc_pair
    _ready(pull, push, b"kept")

    async def main() -> None:
        with trio.CancelScope() as scope:
            scope.cancel()
            with pytest.raises(trio.Cancelled):
                await pull.arecv(timeout=1)
        assert await pull.arecv(timeout=1) == b"kept"

    trio.run(main)


def test_trio_asend_in_cancelled_scope_sends_nothing(inproc_pair: Any) -> None:
    push, pull = inproc_pair

    async def main() -> None:
        with trio.CancelScope() as scope:
            scope.cancel()
            with pytest.raises(trio.Cancelled):
                await push.asend(b"lost")
        await push.asend(b"sentinel")

    trio.run(main)
    assert pull.recv(timeout=2) == b"sentinel"  # "lost" was never sent


@pytest.mark.parametrize("op", ["arecv", "asend", "arecv_msg"])
def test_trio_async_calls_checkpoint_even_when_ready(inproc_pair: Any, op: str) -> None:
    push, pull = inproc_pair
    if op != "asend":
        _ready(pull, push, b"x")

    async def main() -> None:
        with trio.testing.assert_checkpoints():
            if op == "asend":
                await push.asend(b"y")
            else:
                await getattr(pull, op)(timeout=1)

    trio.run(main)


def test_trio_arequest_cancelled_sends_nothing(make_socket: Factory) -> None:
    url = inproc_url("drv")
    rep = make_socket("rep", bind=url)
    req = make_socket("req", connect=url)
    wait_pipes(req)

    async def main() -> None:
        with trio.CancelScope() as scope:
            scope.cancel()
            with pytest.raises(trio.Cancelled):
                await req.arequest(b"lost")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, lambda: (rep.recv_msg(timeout=2).reply(b"ok")))
            assert await req.arequest(b"sentinel", timeout=2) == b"ok"

    trio.run(main)
    assert rep.stats().messages_received == 1  # only the sentinel arrived


# -- asyncio: the same rules with CancelledError -------------------------------------------------


def test_asyncio_cancelled_arecv_takes_nothing(inproc_pair: Any) -> None:
    push, pull = inproc_pair
    _ready(pull, push, b"kept")

    async def main() -> None:
        task = asyncio.ensure_future(pull.arecv(timeout=1))
        task.cancel()  # before it ever ran
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await pull.arecv(timeout=1) == b"kept"

    asyncio.run(main())


def test_asyncio_cancelled_asend_sends_nothing(inproc_pair: Any) -> None:
    push, pull = inproc_pair

    async def main() -> None:
        task = asyncio.ensure_future(push.asend(b"lost"))
        await asyncio.sleep(0)  # the task starts and reaches its checkpoint
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await push.asend(b"sentinel")

    asyncio.run(main())
    assert pull.recv(timeout=2) == b"sentinel"
