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
from nanopy.core.base import TRANSMIT, PipeInfo
from nanopy.core.errors import WouldBlock
from nanopy.core.options import new_options
from nanopy.driver.socket_driver import LANE_MAX, SocketDriver
from nanopy.protocols.pipeline import Pull0, Push0
from nanopy.protocols.pubsub import Pub0
from nanopy.protocols.reqrep import Req0
from nanopy.testing import inproc_url, ipc_url, wait_pipes

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


class _Reader:
    """The read side of a fake pipe (``PipeDriver.reader``, nanopy/pipe/reading.py)."""

    def __init__(self) -> None:
        self.paused = False  # set by the socket's round when the pipe's queue is full
        self.resumed = 0
        self.rx_msgs = self.rx_bytes = 0  # (the pipe view: counted by the socket driver per read)

    def resume(self) -> None:
        self.resumed += 1

    def count_delivery(self, n_msgs: int, n_bytes: int, pause: bool) -> None:
        self.rx_msgs += n_msgs
        self.rx_bytes += n_bytes
        if pause:
            self.paused = True


class _InstantPipe:
    """A pipe driver whose every transmit is written at once (credit comes back)."""

    def __init__(self, pid: int = 1, instant: bool = True) -> None:
        self.written: list[bytes] = []
        self.pid = pid
        self.instant = instant  # False: the payloads stay queued (no credit comes back)
        self.lock = threading.Lock()
        self.lane_credit = self.lane_bytes = self.lane_kept = 0
        self.closed = self.withdrawn = False  # (a pipe found dead: nanopy/driver/endings.py)
        self.reader = _Reader()

    def transmit(self, payload: bytes, idle: bool | None = None, framed: Any = None, lane: bool = False) -> int:
        if lane:
            if self.lane_credit <= 0:
                return -1
            self.lane_credit -= 1
            self.lane_bytes += len(payload)
        self.written.append(payload)
        return 1 if self.instant else 0

    # the socket's calls on a pipe (PipeHandle of nanopy/_seam.py)
    def grant_lane(self, n: int) -> None:
        self.lane_credit += n

    def revoke_lane(self) -> tuple[int, int, int]:
        n, spent = self.lane_credit, self.lane_bytes
        self.lane_credit = self.lane_bytes = 0
        return n, spent, 0

    def fan_out(self, pipes: Any, actions: list[Any], start: int) -> tuple[int, list[bytes], list[tuple[int, int]]]:
        """A fan-out burst's TRANSMITs, each through its pipe's ``transmit`` (as
        ``queue_fan_out`` does for a pipe that is due)."""
        handled, gone, credit = 0, [], []
        for action in actions[start:]:
            if action[0] is not TRANSMIT:
                break
            handled += 1
            pipe = pipes.get(action[1])
            done = -1 if pipe is None else pipe.transmit(action[2], False, {})
            if done > 0:
                credit.append((action[1], done))
            elif done < 0:
                gone.append(action[2])
        return handled, gone, credit

    def take_unwritten(self) -> list[bytes]:
        return []  # (everything given counts as written)

    def withdraw(self, resend: bool) -> tuple[list[bytes], int] | None:
        self.withdrawn = self.closed = True
        return None if getattr(self, "writing", False) else (self.take_unwritten(), 0)

    def refuse_sends(self) -> None:
        self.closed = True


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


def test_idle_pipe_send_takes_one_lock_round_at_most() -> None:
    driver = _driver(Push0)
    pipe = _InstantPipe()
    driver.add_pipe(pipe, PipeInfo(1, "pipe", 8, 8), 2)  # type: ignore[arg-type]
    lock = driver.lock = _CountingLock()  # type: ignore[assignment]
    for i in range(100):
        assert driver.try_send(b"%d" % i, b"")
    # Each round folds in the credit the writes gave back, sends, and hands the
    # sole pipe's other credit to the lane: the next send needs no round.
    assert lock.rounds == 50
    assert pipe.written == [b"%d" % i for i in range(100)]


def test_a_sole_pipe_sends_on_lane_credit_until_a_second_pipe_takes_it_back() -> None:
    driver = _driver(Push0)
    a, b = _InstantPipe(1), _InstantPipe(2)
    driver.add_pipe(a, PipeInfo(1, "a", 8, 8), 1000)  # type: ignore[arg-type]
    lock = driver.lock = _CountingLock()  # type: ignore[assignment]
    for _ in range(100):
        assert driver.try_send(b"xy", b"")
    assert lock.rounds == 1  # one round granted LANE_MAX credits; 99 sends spent them
    assert a.lane_credit == LANE_MAX - 99
    assert driver.sent_counts() == (100, 200)  # unspent lane credit is not counted as sent
    assert driver.writable()

    driver.add_pipe(b, PipeInfo(2, "b", 8, 8), 1000)  # type: ignore[arg-type]
    assert driver.lane is None and a.lane_credit == 0  # given back to the core
    for i in range(10):
        assert driver.try_send(b"%d" % i, b"")
    # Two pipes: round robin per message again, and nothing was lost on the way.
    assert a.written[100:] == [b"0", b"2", b"4", b"6", b"8"]
    assert b.written == [b"1", b"3", b"5", b"7", b"9"]
    assert driver.sent_counts() == (110, 210)


def test_a_waiting_sender_takes_lane_credit_back_into_the_core() -> None:
    # Another thread's send granted the lane every credit after this sender's own
    # try failed: its waiting attempt must still find them.
    driver = _driver(Push0)
    pipe = _InstantPipe(instant=False)
    driver.add_pipe(pipe, PipeInfo(1, "a", 8, 8), 5)  # type: ignore[arg-type]
    assert driver.try_send(b"0", b"")
    assert pipe.lane_credit == 4 and not driver.core.can_send()
    assert driver.try_once(driver.send_attempt(b"1")) is None  # sent, not BLOCKED
    assert driver.lane is None and pipe.lane_credit == 0
    assert pipe.written == [b"0", b"1"]
    assert driver.sent_counts() == (2, 2)


def test_lane_credit_of_a_removed_pipe_is_not_counted_as_sent() -> None:
    driver = _driver(Push0)
    a = _InstantPipe(1)
    driver.add_pipe(a, PipeInfo(1, "a", 8, 8), 10)  # type: ignore[arg-type]
    assert driver.try_send(b"x", b"")
    assert a.lane_credit == 9
    driver.remove_pipe(1)
    assert driver.lane is None and driver.sent_counts() == (1, 1)
    assert not driver.try_send(b"x", b"")  # no pipe, no lane: it would block


class _QueuingPipe(_InstantPipe):
    """A pipe that keeps what it is given unwritten (no credit comes back), as a
    stalled peer's pipe does, and can be found dead (nanopy/driver/endings.py)."""

    def __init__(self, pid: int) -> None:
        super().__init__(pid, instant=False)
        self.writing = False

    def transmit(self, payload: bytes, idle: bool | None = None, framed: Any = None, lane: bool = False) -> int:
        return -1 if self.closed else super().transmit(payload, idle, framed, lane)

    def queue_batch(self, batch: list[bytes], kick: bool) -> None:
        self.written += batch

    def take_unwritten(self) -> list[bytes]:
        out, self.written = self.written, []
        return out


def test_a_dead_lane_pipe_gives_its_credit_and_queue_back_ahead_of_later_sends() -> None:
    driver = _driver(Push0)
    a, b = _QueuingPipe(1), _QueuingPipe(2)
    driver.add_pipe(a, PipeInfo(1, "a", 1, 8), 8)  # type: ignore[arg-type]
    for body in (b"m1", b"m2", b"m3"):
        assert driver.try_send(body, b"")
    assert driver.lane is a and a.lane_credit == 5
    driver.pipe_ending(a)  # found dead: its lane credit and its queue go back at once
    assert driver.lane is None and a.closed and a.withdrawn and a.written == []
    assert driver.sent_counts() == (3, 6) and driver.requeued == 3
    assert not driver.try_send(b"later", b"")  # no pipe: the requeued ones wait first
    driver.add_pipe(b, PipeInfo(2, "b", 2, 8), 8)  # type: ignore[arg-type]
    assert b.written == [b"m1", b"m2", b"m3"]  # queued on it inside that round
    driver.execute([(TRANSMIT, 1, b"m4")])  # chosen for A by a round before it died
    assert driver.try_send(b"later", b"")
    assert b.written == [b"m1", b"m2", b"m3", b"m4", b"later"]
    driver.remove_pipe(1, [])
    assert driver.requeued == 4 and driver.core.dropped == 0 and "_drain" not in vars(driver)


def test_a_dead_pipe_with_a_write_under_way_holds_sends_until_its_removal() -> None:
    driver = _driver(Push0)
    a, b = _QueuingPipe(1), _QueuingPipe(2)
    driver.add_pipe(a, PipeInfo(1, "a", 1, 8), 8)  # type: ignore[arg-type]
    driver.add_pipe(b, PipeInfo(2, "b", 2, 8), 8)  # type: ignore[arg-type]
    assert driver.try_send(b"m1", b"")
    a.writing = True  # (its writer task is inside a write)
    driver.pipe_ending(a)
    assert a.closed and a.written == [b"m1"]  # not taken: the write may still take some
    assert not driver.try_send(b"later", b"") and not driver.writable()
    driver.remove_pipe(1, [b"m1"])  # what the write never wrote, known once it ended
    assert b.written == [b"m1"] and driver.requeued == 1
    assert driver.try_send(b"later", b"")
    assert b.written == [b"m1", b"later"]


@pytest.mark.parametrize("overflow", ["drop", "block"])
def test_pub_with_one_subscriber_spends_lane_credit_then_drops_or_blocks_as_before(overflow: str) -> None:
    driver = _driver(Pub0, overflow=overflow)
    pipe = _InstantPipe(instant=False)
    driver.add_pipe(pipe, PipeInfo(1, "sub", 8, 8), 3)  # type: ignore[arg-type]
    assert driver.try_send(b"0", b"")
    assert pipe.lane_credit == 2
    assert driver.try_send(b"1", b"") and driver.try_send(b"2", b"")
    if overflow == "drop":
        assert driver.try_send(b"3", b"")  # no credit anywhere: PUB drops, never blocks
        assert driver.core.dropped == 1
    else:
        assert not driver.try_send(b"3", b"")  # lossless PUB waits for room
        assert not driver.writable()
    assert pipe.written == [b"0", b"1", b"2"]


def _pull_with_queued(n: int, pipes: int = 1) -> tuple[SocketDriver, Any]:
    driver = _driver(Pull0)
    for pid in range(1, pipes + 1):
        driver.add_pipe(_InstantPipe(pid), PipeInfo(pid, f"p{pid}", 8, 8), 8)  # type: ignore[arg-type]
        assert driver.deliver(pid, [b"%d:%d" % (pid, i) for i in range(n)])
    return driver, driver.core


def test_a_receive_takes_a_run_of_the_sole_pipe_and_serves_it_first() -> None:
    driver, core = _pull_with_queued(300)
    lock = driver.lock = _CountingLock()  # type: ignore[assignment]
    got = [driver.try_recv_body() for _ in range(300)]
    assert got == [b"1:%d" % i for i in range(300)]
    assert lock.rounds == 2  # RUN_MAX bodies, then the other 44
    assert driver.try_recv_body() is None
    # Every body is counted once, when it reaches the user.
    assert driver.received_counts() == (300, sum(map(len, got)))


def test_a_run_is_counted_readable_and_kept_for_recv_msg_in_order() -> None:
    driver, core = _pull_with_queued(5)
    assert driver.try_recv_body() == b"1:0"
    assert len(driver.run) == 4 and not core.can_recv()
    assert driver.readable()
    assert driver.received_counts() == (1, 3)  # the run's bodies are not received yet
    msg = driver.try_once(driver.recv_attempt)
    assert isinstance(msg, nanopy.Message)
    assert msg.body == b"1:1" and msg.pipe is core.pipes[1].token
    assert driver.recv_bodies(10) == [b"1:2", b"1:3", b"1:4"]
    assert not driver.readable()


def test_several_pipes_are_still_served_one_message_each_in_turn() -> None:
    driver, _ = _pull_with_queued(3, pipes=2)
    got = [driver.try_recv_body() for _ in range(6)]
    assert got == [b"1:0", b"2:0", b"1:1", b"2:1", b"1:2", b"2:2"]
    assert not driver.run


def test_a_run_goes_back_when_a_better_pipe_has_a_message() -> None:
    # Pipe 1 (priority 8) alone: a receive takes a run. Pipe 2 (priority 1)
    # then delivers: the rest of the run goes back to pipe 1's queue and the
    # preferred pipe is served first, as if no run had been taken.
    driver = _driver(Pull0)
    driver.add_pipe(_InstantPipe(1), PipeInfo(1, "low", 8, 8), 8)  # type: ignore[arg-type]
    driver.add_pipe(_InstantPipe(2), PipeInfo(2, "high", 8, 1), 8)  # type: ignore[arg-type]
    assert driver.deliver(1, [b"low%d" % i for i in range(5)])
    assert driver.try_recv_body() == b"low0"
    assert len(driver.run) == 4
    assert driver.deliver(2, [b"high0", b"high1"])
    assert not driver.run
    got = [driver.try_recv_body() for _ in range(6)]
    assert got == [b"high0", b"high1", b"low1", b"low2", b"low3", b"low4"]
    assert driver.received_counts() == (7, sum(map(len, got)) + 4)


def test_a_run_goes_back_when_an_equal_pipe_has_a_message() -> None:
    driver, _ = _pull_with_queued(4)  # pipe 1 alone
    assert driver.try_recv_body() == b"1:0"
    driver.add_pipe(_InstantPipe(2), PipeInfo(2, "p2", 8, 8), 8)  # type: ignore[arg-type]
    assert driver.deliver(2, [b"2:0", b"2:1", b"2:2"])
    got = sorted(driver.try_recv_body() for _ in range(6))  # type: ignore[type-var]
    assert got == [b"1:1", b"1:2", b"1:3", b"2:0", b"2:1", b"2:2"]
    assert driver.received_counts()[0] == 7


def test_nothing_queued_says_exactly_when_the_body_pop_would_block() -> None:
    # A direct receive's parking round skips the pop when this says True, so it
    # must never say True while a body is queued, in a run or held.
    driver, _ = _pull_with_queued(3)
    runs = driver.runs
    assert not runs.nothing_queued()
    assert driver.try_recv_body() == b"1:0"
    assert driver.run and not runs.nothing_queued()  # (the rest waits in the run)
    assert driver.recv_bodies(10) == [b"1:1", b"1:2"]
    with driver.lock:
        assert runs.nothing_queued()
        with pytest.raises(WouldBlock):
            driver.recv_body_attempt()
    assert driver.deliver(1, [b"1:3"])
    assert not runs.nothing_queued()
    assert not _driver(Req0).runs.nothing_queued()  # no runs: it cannot tell


def test_close_drops_an_unserved_run() -> None:
    driver, _ = _pull_with_queued(5)
    assert driver.try_recv_body() == b"1:0"
    assert driver.close_core()
    assert not driver.run
    with pytest.raises(nanopy.Closed):
        driver.try_recv_body()


def test_a_run_counts_against_its_pipes_receive_buffer() -> None:
    driver, core = _pull_with_queued(0)
    core.options.recv_buffer = 8
    assert driver.deliver(1, [b"a", b"b", b"c", b"d", b"e", b"f"])
    assert driver.try_recv_body() == b"a"  # a run of 4 (half the buffer); 3 left in it, 2 queued
    assert len(driver.run) == 3
    # 3 in the run + 2 queued + 3 new = the buffer: the pipe is paused.
    assert not driver.deliver(1, [b"g", b"h", b"i"])


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


# The default timeout and explicit ones: the trio fast path in Socket serves them all.
TIMEOUTS = [
    pytest.param({}, id="default-timeout"),
    pytest.param({"timeout": 1}, id="timeout-1"),
    pytest.param({"timeout": None}, id="timeout-None"),
]


@pytest.mark.parametrize("kwargs", TIMEOUTS)
def test_trio_arecv_in_cancelled_scope_raises_and_takes_nothing(inproc_pair: Any, kwargs: dict[str, Any]) -> None:
    push, pull = inproc_pair
    _ready(pull, push, b"kept")

    async def main() -> None:
        with trio.CancelScope() as scope:
            scope.cancel()
            with pytest.raises(trio.Cancelled):
                await pull.arecv(**kwargs)
        assert await pull.arecv(**kwargs) == b"kept"

    trio.run(main)


@pytest.mark.parametrize("kwargs", TIMEOUTS)
@pytest.mark.parametrize("earlier", [0, 40], ids=["first-send", "after-a-burst"])
def test_trio_asend_in_cancelled_scope_sends_nothing(
    inproc_pair: Any, kwargs: dict[str, Any], earlier: int
) -> None:
    push, pull = inproc_pair  # after a burst, the send lane holds credit

    async def main() -> None:
        for i in range(earlier):
            await push.asend(b"%d" % i, **kwargs)
        with trio.CancelScope() as scope:
            scope.cancel()
            with pytest.raises(trio.Cancelled):
                await push.asend(b"lost", **kwargs)
        await push.asend(b"sentinel", **kwargs)

    trio.run(main)
    got = [pull.recv(timeout=2) for _ in range(earlier + 1)]
    assert got == [b"%d" % i for i in range(earlier)] + [b"sentinel"]  # "lost" was never sent


@pytest.mark.parametrize("kwargs", TIMEOUTS)
@pytest.mark.parametrize("op", ["arecv", "asend", "arecv_msg"])
def test_trio_async_calls_checkpoint_even_when_ready(inproc_pair: Any, op: str, kwargs: dict[str, Any]) -> None:
    push, pull = inproc_pair
    if op != "asend":
        _ready(pull, push, b"x")

    async def main() -> None:
        with trio.testing.assert_checkpoints():
            if op == "asend":
                await push.asend(b"y", **kwargs)
            else:
                await getattr(pull, op)(**kwargs)

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


# -- direct receive: a thread blocked in recv reads its only pipe itself ---------------------------


def _single_pipe_pair(make_socket: Factory, transport: str, **pull_opts: Any) -> tuple[nanopy.Socket, nanopy.Socket]:
    pull = make_socket("pull", **pull_opts)
    url = pull.bind("tcp://127.0.0.1:0" if transport == "tcp" else ipc_url("direct")).url
    push = make_socket("push", connect=url)
    wait_pipes(pull)
    wait_pipes(push)
    return push, pull


def _role_taken(sock: nanopy.Socket) -> bool:
    return any(p.reader.role for p in list(sock._pipes.values()))


def _recv_in_thread(sock: nanopy.Socket, out: list[Any], **kwargs: Any) -> threading.Thread:
    def run() -> None:
        try:
            out.append(sock.recv(**kwargs))
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_blocked_recv_reads_its_only_pipe_itself(make_socket: Factory, transport: str) -> None:
    push, pull = _single_pipe_pair(make_socket, transport)
    out: list[Any] = []
    thread = _recv_in_thread(pull, out, timeout=5)
    wait_until(lambda: _role_taken(pull), what="receiver took the read role")
    push.send(b"direct")
    thread.join(5)
    assert out == [b"direct"]
    # Then a burst: the rest of what one read parsed is served from the queue.
    for i in range(2000):
        push.send(b"%d" % i)
    assert [pull.recv(timeout=5) for _ in range(2000)] == [b"%d" % i for i in range(2000)]


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_direct_recv_times_out_and_close_wakes_it(make_socket: Factory, transport: str) -> None:
    push, pull = _single_pipe_pair(make_socket, transport)
    with pytest.raises(nanopy.Timeout):
        pull.recv(timeout=0.05)
    out: list[Any] = []
    thread = _recv_in_thread(pull, out, timeout=30)
    wait_until(lambda: _role_taken(pull), what="receiver took the read role")
    pull.close(linger=0)
    thread.join(5)
    assert len(out) == 1 and isinstance(out[0], nanopy.Closed)


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_direct_recv_with_a_small_queue_pauses_and_loses_nothing(make_socket: Factory, transport: str) -> None:
    push, pull = _single_pipe_pair(make_socket, transport, recv_buffer=4)
    out: list[Any] = []
    thread = _recv_in_thread(pull, out, timeout=5)
    wait_until(lambda: _role_taken(pull), what="receiver took the read role")
    for i in range(500):
        push.send(b"%d" % i)
    thread.join(5)
    got = out + [pull.recv(timeout=5) for _ in range(499)]
    assert got == [b"%d" % i for i in range(500)]


def test_peer_leaving_during_direct_recv_closes_the_pipe(make_socket: Factory) -> None:
    from nanopy.testing import wait_no_pipes

    push, pull = _single_pipe_pair(make_socket, "tcp")
    out: list[Any] = []
    thread = _recv_in_thread(pull, out, timeout=30)
    wait_until(lambda: _role_taken(pull), what="receiver took the read role")
    push.close(linger=0)
    wait_no_pipes(pull)
    # The blocked receiver keeps waiting (no pipe now) and gets the next peer's message.
    url = pull.endpoints[0].url
    again = make_socket("push", connect=url)
    wait_pipes(again)
    again.send(b"after")
    thread.join(5)
    assert out == [b"after"]


def test_bad_frame_read_directly_closes_only_that_pipe(make_socket: Factory) -> None:
    import socket
    import struct

    from nanopy.core.wire import encode_header

    pull = make_socket("pull")
    url = pull.bind("tcp://127.0.0.1:0").url
    host, port = url[len("tcp://") :].rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=5)
    try:
        raw.sendall(encode_header(0x50))
        assert raw.recv(8) == encode_header(0x51)
        wait_pipes(pull)
        out: list[Any] = []
        thread = _recv_in_thread(pull, out, timeout=5)
        wait_until(lambda: _role_taken(pull), what="receiver took the read role")
        raw.sendall(struct.pack(">Q", 3) + b"abc" + struct.pack(">Q", 2**63))
        thread.join(5)
        assert out == [b"abc"]  # the good message before the bad frame is delivered
        wait_until(lambda: pull.stats().protocol_errors >= 1, what="protocol error counted")
        assert pull.stats().protocol_errors == 1, pull.stats()
        assert raw.recv(1) == b""  # and the hostile connection is closed
    finally:
        raw.close()


# -- aclose: both halves of closing in the caller's loop ------------------------------------------


@pytest.mark.parametrize("transport", ["tcp", "inproc"])
def test_trio_aclose_lingers_without_a_worker_thread(
    make_socket: Factory, transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_threads(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("aclose used a worker thread")

    monkeypatch.setattr(trio.to_thread, "run_sync", no_threads)
    pull = make_socket("pull")
    url = pull.bind("tcp://127.0.0.1:0" if transport == "tcp" else inproc_url("aclose")).url
    push = make_socket("push", connect=url)
    wait_pipes(push)

    got: list[bytes] = []
    threads: list[threading.Thread] = []

    async def main() -> None:
        token = trio.lowlevel.current_trio_token()
        received = trio.Event()

        def receive() -> None:
            try:
                got.extend(pull.recv(timeout=5) for _ in range(200))
            finally:
                token.run_sync_soon(received.set)

        # Receive in the meantime so the linger flush has somewhere to go.
        threads.append(threading.Thread(target=receive))
        threads[0].start()
        for i in range(200):
            await push.asend(b"%d" % i)
        await push.aclose(linger=5)
        assert push.closed
        # (inproc: aclose returns once the messages are in pull's queue, which
        # the receiving thread may not have emptied yet)
        with trio.fail_after(10):
            await received.wait()
        await pull.aclose(linger=0)  # nothing queued: closes at once

    trio.run(main)
    threads[0].join(10)
    assert got == [b"%d" % i for i in range(200)]
    assert pull.closed


def test_asyncio_aclose_and_cancelled_aclose_still_closes(make_socket: Factory) -> None:
    url = inproc_url("aclose")
    pull = make_socket("pull", bind=url)
    push = make_socket("push", connect=url)
    wait_pipes(push)

    async def main() -> None:
        task = asyncio.ensure_future(push.aclose(linger=5))
        await asyncio.sleep(0)  # it starts (and may be waiting for the flush)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        assert push.closed  # cancelled in its wait or not, the socket is closed
        await pull.aclose()
        assert pull.closed

    asyncio.run(main())


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_reads_by_a_thread_and_by_the_reader_task_stay_in_order(make_socket: Factory, transport: str) -> None:
    # The receiver alternates: reading directly, and pausing past the read lease so
    # the engine's reader task reads; every message must still come in order.
    push, pull = _single_pipe_pair(make_socket, transport)
    n = 20000

    def send() -> None:
        for i in range(n):
            push.send(b"%d" % i)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    pause = threading.Event()
    for i in range(n):
        assert pull.recv(timeout=10) == b"%d" % i
        if i % 997 == 0:
            pause.wait(0.004)  # not synchronisation: lets the lease run out mid-stream
    sender.join(10)


def _protocol_members(proto: type) -> set[str]:
    """The names a typing Protocol declares (methods, properties, attributes)."""
    return {name for name in vars(proto) if not name.startswith("_")} | set(getattr(proto, "__annotations__", {}))


@pytest.mark.parametrize("make_url", [inproc_url, ipc_url])
def test_a_real_pipe_has_everything_the_seam_names(make_url: Callable[[str], str], make_socket: Factory) -> None:
    # The socket's driver reaches a pipe only through PipeHandle (nanopy/_seam.py);
    # mypy checks PipeDriver against it (nanopy/pipe/driver.py), this checks a live one
    # -- and the fakes of these tests, which stand in for it.
    from nanopy._seam import PipeHandle, ReadRole

    url = make_url("seam")
    make_socket("pull", bind=url)
    push = make_socket("push", connect=url)
    wait_pipes(push)
    (pipe,) = push._pipes.values()
    for name in sorted(_protocol_members(PipeHandle)):
        assert hasattr(pipe, name), f"PipeDriver lacks PipeHandle.{name}"
    for name in sorted(_protocol_members(ReadRole)):
        assert hasattr(pipe.reader, name), f"PipeReader lacks ReadRole.{name}"
    fake = _InstantPipe()
    assert not [n for n in _protocol_members(PipeHandle) if not hasattr(fake, n)
                and n not in ("first_at", "queue_batch", "flush_queued", "queued_out", "close_soon")]
