"""The oracle of the driver's fast paths: lanes and runs change nothing a user sees.

Two socket drivers get the same operations in lockstep (hypothesis state
machines). One is built as usual; the other's core declares no fast path
(``send_lane``, ``fan_lane`` and ``body_queue`` cleared on the instance), so
every send and receive goes through the core message by message -- the
reference. After every step both must agree on what each pipe was given, in
which order, what was received, whether a call would block, the credit state
(``writable``), the statistics and the drops.

Pipes are fakes (the same idea as tests/test_driver.py): a pipe keeps what it
was given and hands credit back only when the machine says its kernel took
some. A burst (and with it the fan-out lane) is judged by the wall clock
(``FANOUT_GAP``): the comparison stays deterministic with that judgement fixed,
never a burst for most machines here, always one for ``FanOutPublisherPair``,
whose fast driver then takes the fan-out lane whenever every pipe has credit
(``FAN_MIN`` lowered to 1: the fakes' credit is small) and whose flush round runs
when the machine says so.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from test_driver import _InstantPipe

from nanopy.core.base import PipeInfo
from nanopy.core.errors import ProtocolError, Timeout
from nanopy.core.message import Message, Multipart
from nanopy.core.options import new_options
from nanopy.driver.socket_driver import SocketDriver
from nanopy.protocols.pipeline import Pull0, Push0
from nanopy.protocols.pubsub import Pub0
from nanopy.socket.messaging import Messaging
from nanopy.socket.multipart import MultipartMixin

ORACLE = settings(max_examples=100, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class _Pipe(_InstantPipe):
    """A pipe driver that keeps what it is given: credit comes back on ``kernel_takes``,
    or at once from ``transmit`` while ``instant`` (a direct write the kernel took)."""

    def __init__(self, pid: int) -> None:
        super().__init__(pid, instant=False)
        self.unwritten = 0  # given, credit not returned yet

    def transmit(self, payload: bytes, idle: bool | None = None, framed: Any = None, lane: bool = False) -> int:
        done = super().transmit(payload, idle, framed, lane)
        if done == 0:
            self.unwritten += 1
        return done

    # the fan-out lane's calls (PipeHandle.queue_batch, flush_queued)
    first_at = 0.0

    def queue_batch(self, batch: list[bytes], kick: bool) -> bool:
        if self.closed:
            return False
        self.written += batch
        self.unwritten += len(batch)  # (never instant: credit comes when the kernel takes it)
        return True

    def flush_queued(self, framed: Any) -> int:
        return 0


class _Engine:
    """The engine as a driver sees it: a clock, and the flush rounds it starts, kept
    until the machine runs them."""

    def __init__(self) -> None:
        self.spawned: list[Any] = []

    def now(self) -> float:
        return time.monotonic()

    def spawn(self, fn: Any) -> None:
        self.spawned.append(fn)


def _driver(core_cls: type, fast: bool, engine: _Engine | None = None, **opts: Any) -> SocketDriver:
    options = new_options(core_cls.name)
    for key, value in opts.items():
        setattr(options, key, value)
    core = core_cls(options)
    if not fast:  # the reference: every operation through the core, one message at a time
        core.send_lane = False
        core.fan_lane = False
        core.body_queue = None
    return SocketDriver(core, lambda: "oracle", lambda: engine)  # type: ignore[arg-type,return-value]


async def _at_once(*args: Any) -> None:
    """``wait_out_burst`` in a flush round the machine runs: the burst is over."""


@pytest.fixture(autouse=True)
def _fixed_burst_judgement(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    import nanopy.driver.lanes
    import nanopy.driver.round

    bursts = getattr(request.cls, "bursts", False)
    gap = float("inf") if bursts else -1.0  # (always a burst, or never)
    monkeypatch.setattr(nanopy.driver.round, "FANOUT_GAP", gap)
    monkeypatch.setattr(nanopy.driver.lanes, "FANOUT_GAP", gap)
    if bursts:
        monkeypatch.setattr(nanopy.driver.lanes, "FAN_MIN", 1)
        monkeypatch.setattr(nanopy.driver.lanes, "wait_out_burst", _at_once)


class _Calls(Messaging, MultipartMixin):
    """The receive calls of a Socket, its refusal of a multipart message included."""


def _socket_calls(driver: SocketDriver) -> Messaging:
    """The user's ``Socket.send``/``recv`` (with their written-out copies of the
    lane send and the run pop, docs/architecture.md) on ``driver``; a send that
    would wait times out at once."""
    calls = _Calls()
    calls._driver = driver
    calls._options = SimpleNamespace(send_timeout=0.0, recv_timeout=0.0)
    return calls


def _sent(send: Any) -> bool:
    """Whether ``send()`` went out (False: it timed out, it would have had to wait)."""
    try:
        send()
    except Timeout:
        return False
    return True


class _Pair(RuleBasedStateMachine):
    """The fast driver and the reference, with the same pipes."""

    #: whether the pipes carry multipart messages (ZMTP)
    multipart = False

    core_cls: type = Push0
    options: dict[str, Any] = {}

    def __init__(self) -> None:
        super().__init__()
        self.engine = _Engine()
        self.fast = _driver(self.core_cls, True, self.engine, **self.options)
        self.fast_socket = _socket_calls(self.fast)
        self.ref = _driver(self.core_cls, False, self.engine, **self.options)
        self.pipes: dict[int, tuple[_Pipe, _Pipe]] = {}
        self.next_pid = 1
        self.bodies = 0

    def body(self, pid: int = 0) -> bytes:
        self.bodies += 1
        return b"p%02d:m%05d" % (pid, self.bodies)  # (one length: byte counts compare too)

    @rule(credit=st.integers(0, 6))
    def add_pipe(self, credit: int) -> None:
        if len(self.pipes) >= 3:
            return
        pid = self.next_pid
        self.next_pid += 1
        pair = (_Pipe(pid), _Pipe(pid))
        for driver, pipe in zip((self.fast, self.ref), pair, strict=True):
            info = PipeInfo(pid, f"p{pid}", 8, 8)
            assert driver.add_pipe(pipe, info, credit, multipart=self.multipart)  # type: ignore[arg-type]
        self.pipes[pid] = pair

    @precondition(lambda self: self.pipes)
    @rule(data=st.data())
    def remove_pipe(self, data: st.DataObject) -> None:
        pid = data.draw(st.sampled_from(sorted(self.pipes)))
        del self.pipes[pid]
        assert self.fast.remove_pipe(pid) == self.ref.remove_pipe(pid)

    @invariant()
    def same_stats(self) -> None:
        assert self.fast.sent_counts() == self.ref.sent_counts()
        assert self.fast.received_counts() == self.ref.received_counts()
        assert self.fast.core.drops == self.ref.core.drops
        assert self.fast.closed == self.ref.closed


class SenderPair(_Pair):
    """PUSH (the send lane of a sole pipe; round robin over several)."""

    @rule(n=st.integers(1, 12))
    def send(self, n: int) -> None:
        for _ in range(n):
            body = self.body()
            assert self.fast.try_send(body, b"") == self.ref.try_send(body, b"")

    @rule(n=st.integers(1, 12))
    def socket_send(self, n: int) -> None:
        # Socket.send's own copy of the lane send against the reference's round.
        for _ in range(n):
            body = self.body()
            assert _sent(lambda body=body: self.fast_socket.send(body)) == self.ref.try_send(body, b"")

    @rule(n=st.integers(1, 3))
    def blocked_send_waits_the_usual_way(self, n: int) -> None:
        # What a caller that has to wait tries (Waiting.call's attempt), once.
        for _ in range(n):
            body = self.body()
            got = [d.try_once(d.send_attempt(body)) for d in (self.fast, self.ref)]
            assert repr(got[0]) == repr(got[1])

    @precondition(lambda self: self.pipes)
    @rule(data=st.data(), instant=st.booleans())
    def kernel_keeps_up(self, data: st.DataObject, instant: bool) -> None:
        # Sends to this pipe are written at once (credit back from transmit), or queue.
        pid = data.draw(st.sampled_from(sorted(self.pipes)))
        for pipe in self.pipes[pid]:
            pipe.instant = instant

    def _held(self, pid: int) -> list[bytes]:
        """Bodies the fast driver took for pipe ``pid`` and holds, not given to it yet."""
        return []

    @precondition(lambda self: self.pipes)
    @rule(data=st.data())
    def kernel_takes(self, data: st.DataObject) -> None:
        pid = data.draw(st.sampled_from(sorted(self.pipes)))
        fast, ref = self.pipes[pid]
        assert fast.unwritten + len(self._held(pid)) == ref.unwritten
        n = data.draw(st.integers(0, fast.unwritten))
        if n:
            for driver, pipe in ((self.fast, fast), (self.ref, ref)):
                pipe.unwritten -= n
                driver.credit(pid, n)

    @invariant()
    def same_deliveries(self) -> None:
        for pid, (fast, ref) in self.pipes.items():
            assert fast.written + self._held(pid) == ref.written
        # (as a poll asks: in a round, which first folds credit that came back lazily)
        assert self.fast.inspect(self.fast.writable) == self.ref.inspect(self.ref.writable)


class PublisherPair(SenderPair):
    """PUB, lossless (waits for credit) and dropping (counts drops)."""

    core_cls = Pub0
    options = {"overflow": "block"}


class DroppingPublisherPair(SenderPair):
    core_cls = Pub0
    options = {"overflow": "drop"}


class FanOutPublisherPair(PublisherPair):
    """PUB in a burst: the fast driver's fan-out lane (every pipe's credit taken at
    once, bodies handed to all the pipes a batch at a time by a full list, the flush
    round, a pipe coming or going, or a send that finds the lane dry) and the
    round's burst execution (``PipeHandle.fan_out``), against the reference's
    message-by-message core. A body the lane holds counts as given to each member."""

    def kernel_keeps_up(self) -> None:
        """Not a rule here: these fakes' kernel never takes a write at once (a batch the
        lane queues for the writer task would give its credit back later than the
        reference's direct write does; tests/test_lanes.py runs real pipes)."""

    def _held(self, pid: int) -> list[bytes]:
        """The bodies the fast driver's fan-out lane holds for pipe ``pid``, not handed out yet."""
        lanes = self.fast.lanes
        return list(lanes._fan_out) if any(p.pid == pid for p in lanes._fan_pipes) else []

    @rule()
    def flush_round(self) -> None:
        spawned, self.engine.spawned = self.engine.spawned, []
        for fn in spawned:
            trio.run(fn)


class ReceiverPair(_Pair):
    """PULL: runs of a sole ready pipe against one message per round."""

    core_cls = Pull0
    options = {"recv_buffer": 16}

    def __init__(self) -> None:
        super().__init__()
        self.received: tuple[dict[bytes, list[bytes]], dict[bytes, list[bytes]]] = ({}, {})

    @precondition(lambda self: self.pipes)
    @rule(data=st.data(), n=st.integers(1, 12))
    def deliver(self, data: st.DataObject, n: int) -> None:
        pid = data.draw(st.sampled_from(sorted(self.pipes)))
        payloads = [self.body(pid) for _ in range(n)]
        same_before = self.fast.core.queued(pid) == self.ref.core.queued(pid)
        keeps = [d.deliver(pid, list(payloads)) for d in (self.fast, self.ref)]
        if same_before:
            assert keeps[0] == keeps[1]
        # Each stops reading exactly when this pipe's queue, a run included, is full.
        # (The two queues may differ: a retired pipe's run is served whole before
        # newer messages of another pipe, where the reference interleaves them.)
        for d, keep in zip((self.fast, self.ref), keeps, strict=True):
            assert keep == (d.core.queued(pid) < self.options["recv_buffer"])

    def _took(self, got: list[Any]) -> None:
        """Both drivers received something, or both nothing; note what, per pipe."""
        bodies = [getattr(m, "body", m) for m in got]
        assert isinstance(bodies[0], bytes) == isinstance(bodies[1], bytes)
        for log, body in zip(self.received, bodies, strict=True):
            if isinstance(body, bytes):
                log.setdefault(body[:3], []).append(body)

    @rule(n=st.integers(1, 20))
    def recv(self, n: int) -> None:
        for _ in range(n):
            self._took([self.fast.try_recv_body(), self.ref.try_recv_body()])

    @rule(n=st.integers(1, 20))
    def socket_recv(self, n: int) -> None:
        # Socket.recv's own copy of the run pop against the reference's round.
        # (Only while something is queued: waiting is Waiting.call's, not the copy's.)
        for _ in range(n):
            if not self.fast.readable():
                assert self.ref.try_recv_body() is None
                return
            self._took([self.fast_socket.recv(), self.ref.try_recv_body()])

    @rule(limit=st.integers(1, 20))
    def recv_batch(self, limit: int) -> None:
        got = [self.fast.recv_bodies(limit), self.ref.recv_bodies(limit)]
        assert len(got[0]) == len(got[1])
        for a, b in zip(*got, strict=True):
            self._took([a, b])

    @rule()
    def recv_msg(self) -> None:
        got = [d.try_once(d.recv_attempt) for d in (self.fast, self.ref)]
        self._took(got)
        for msg in got:  # a run keeps its pipe for recv_msg
            if not isinstance(msg, Message):
                continue
            assert msg.pipe == f"p{int(msg.body[1:3])}"  # (the fake pipes' tokens)

    @invariant()
    def same_order_per_pipe(self) -> None:
        # Order holds per pipe and nothing is lost or doubled. Across pipes the two
        # may interleave differently: a run is served before another pipe's newer
        # messages (a retired pipe's run is never given back; see FairQueue).
        fast, ref = self.received
        for key in set(fast) | set(ref):
            a, b = fast.get(key, []), ref.get(key, [])
            short = min(len(a), len(b))
            assert a[:short] == b[:short]
        if not self.fast.readable():
            assert fast == ref  # all taken: the same messages, each once

    @invariant()
    def same_readiness(self) -> None:
        assert self.fast.inspect(self.fast.readable) == self.ref.inspect(self.ref.readable)


class MultipartReceiverPair(ReceiverPair):
    """PULL on pipes that carry multipart messages (ZMTP): runs end before one, a
    plain recv() refuses one and keeps it first, every other receive returns it."""

    multipart = True

    def __init__(self) -> None:
        super().__init__()
        self.multipart_bodies: set[bytes] = set()  # delivered as multipart messages

    @precondition(lambda self: self.pipes)
    @rule(data=st.data(), n=st.integers(1, 12))
    def deliver(self, data: st.DataObject, n: int) -> None:
        pid = data.draw(st.sampled_from(sorted(self.pipes)))
        frames = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
        payloads = [self.body(pid) for _ in range(n)]
        # (a multipart message's joined bytes are the plain body: the logs compare them alike)
        payloads = [Multipart([p[:4], p[4:]]) if f else p for p, f in zip(payloads, frames, strict=True)]
        self.multipart_bodies.update(bytes(p) for p in payloads if p.__class__ is Multipart)
        for d in (self.fast, self.ref):
            d.deliver(pid, list(payloads))

    @rule(n=st.integers(1, 20))
    def socket_recv(self, n: int) -> None:
        for _ in range(n):
            if not self.fast.readable():
                assert self.ref.try_recv_body() is None
                return
            try:
                got = self.fast_socket.recv()
            except ProtocolError:
                got = self.fast.try_recv_body()  # the refused message, still first in line
                assert got.__class__ is Multipart
            ref = self.ref.try_recv_body()
            # Each is what its pipe delivered, multipart or not. (Not the same message
            # each time: a retired pipe's run is served before another pipe's newer one.)
            for body in (got, ref):
                if body is not None:
                    assert (body.__class__ is Multipart) == (bytes(body) in self.multipart_bodies)
            self._took([got, ref])

    @invariant()
    def runs_hold_plain_bodies(self) -> None:
        assert all(body.__class__ is bytes for body in self.fast.run)


TestSenderOracle = SenderPair.TestCase
TestPublisherOracle = PublisherPair.TestCase
TestDroppingPublisherOracle = DroppingPublisherPair.TestCase
TestFanOutPublisherOracle = FanOutPublisherPair.TestCase
TestFanOutPublisherOracle.bursts = True  # (read by _fixed_burst_judgement)
TestReceiverOracle = ReceiverPair.TestCase
TestMultipartReceiverOracle = MultipartReceiverPair.TestCase
for _case in (TestSenderOracle, TestPublisherOracle, TestDroppingPublisherOracle, TestFanOutPublisherOracle,
              TestReceiverOracle, TestMultipartReceiverOracle):
    _case.settings = ORACLE
del _case  # (not a test of its own)


def test_a_run_given_back_while_a_receiver_pops_it_loses_and_doubles_nothing() -> None:
    """FairQueue.run's two owners: receivers pop the left without the lock while the
    core, under the lock, gives the rest back from the right (give_back_run)."""
    from nanopy.core.base import FairQueue

    for _ in range(20):
        options = new_options("pull")
        options.recv_buffer = 1 << 16
        fq = FairQueue([], options)
        fq.add(1, 8)
        fq.add(2, 8)
        bodies = [b"%05d" % i for i in range(5000)]
        fq.push(1, list(bodies))
        fq.run.extend(fq.take_run(len(bodies)))
        taken: list[bytes] = []
        start = threading.Event()

        def receiver() -> None:
            start.wait()
            popleft = fq.run.popleft
            while True:
                try:
                    taken.append(popleft())
                except IndexError:
                    return

        thread = threading.Thread(target=receiver)
        thread.start()
        start.set()
        fq.push(2, [b"other"])  # another pipe has a message: the run goes back
        thread.join(10)
        rest = []
        while fq:
            rest.append(fq.pop())
        back = [b for b in rest if b != b"other"]
        assert sorted(taken + back) == bodies  # each body exactly once
        assert taken == bodies[: len(taken)]  # the receiver got a prefix, in order
        assert back == bodies[len(taken) :]  # the rest went back in order
