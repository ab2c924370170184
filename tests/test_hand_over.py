"""The hand-over: an idle socket's one message goes from a direct read straight to
the receiver waiting for it, as if the core had queued it and the receive taken it.

``FairQueue.hand_over`` must leave the queue exactly as a push and a take would,
or do nothing; only cores whose delivery is that plain push offer it; and a
socket receiving that way counts the message as delivered and received.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import wait_until
from test_driver import _role_taken, ipc_url

import nanopy
from nanopy.core.options import new_options
from nanopy.core.queues import FairQueue
from nanopy.protocols import pair, pair1, pipeline, pubsub
from nanopy.testing import wait_pipes

Factory = Callable[..., nanopy.Socket]


def _state(fq: FairQueue) -> tuple[Any, ...]:
    ready = fq.ready
    return (
        {pid: list(q) for pid, q in fq._queues.items()},
        dict(ready._where),
        [list(s) for s in ready._slots],
        list(ready._cursor),
        ready.best,
        set(fq._paused),
        fq.last_pid,
        fq.run_pid,
        list(fq.run),
        list(fq._actions),
    )


def _queue(recv_buffer: int = 8) -> FairQueue:
    fq = FairQueue([], SimpleNamespace(recv_buffer=recv_buffer))
    fq.add(1, 8)
    fq.add(2, 3)
    return fq


def test_hand_over_is_a_push_and_a_take_on_an_idle_queue() -> None:
    plain, handed = _queue(), _queue()
    for fq in (plain, handed):  # some history first: cursors and last pipe moved
        fq.push(2, [b"a", b"b"])
        fq.take_run(256)
    assert plain.push(1, [b"m"]) is True
    assert plain.take_run(256) == [b"m"]
    assert handed.hand_over(1, [b"m"]) == b"m"
    assert _state(handed) == _state(plain)


@pytest.mark.parametrize(
    "case",
    ["queued", "run", "several", "unknown", "retired", "paused", "multipart", "buffer_of_one"],
)
def test_hand_over_declines_and_changes_nothing(case: str) -> None:
    fq = _queue(recv_buffer=1 if case == "buffer_of_one" else 8)
    msgs: list[Any] = [b"m"]
    pid = 1
    if case == "queued":
        fq.push(2, [b"x"])
    elif case == "run":
        fq.push(2, [b"x", b"y", b"z"])
        fq.run.extend(fq.take_run(256)[1:])
    elif case == "several":
        msgs = [b"m", b"n"]
    elif case == "unknown":
        pid = 9
    elif case == "retired":
        fq.retire(1)
    elif case == "paused":
        fq._paused.add(1)
    elif case == "multipart":
        msgs = [SimpleNamespace(parts=[b"a", b"b"])]
    before = _state(fq)
    assert fq.hand_over(pid, msgs) is None
    assert _state(fq) == before


def test_only_cores_that_queue_plainly_offer_it() -> None:
    cores = {
        name: cls(new_options(protocol))
        for name, cls, protocol in (
            ("pair0", pair.Pair0, "pair"),
            ("pull0", pipeline.Pull0, "pull"),
            ("sub0", pubsub.Sub0, "sub"),
            ("pair1", pair1.Pair1, "pair1"),
        )
    }
    assert cores["pair0"].hand_over is not None
    assert cores["pull0"].hand_over is not None
    assert cores["sub0"].hand_over is None  # (it filters by topic first)
    assert cores["pair1"].hand_over is None  # (it reads the hop count first)


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_a_waiting_receiver_gets_the_message_handed_over_and_counted(make_socket: Factory, transport: str) -> None:
    a = make_socket("pair")
    url = a.bind("tcp://127.0.0.1:0" if transport == "tcp" else ipc_url("hand")).url
    b = make_socket("pair", connect=url)
    wait_pipes(a)
    wait_pipes(b)
    core = a._driver.core
    queued: list[int] = []
    feed = core.messages_received

    def counting(pid: int, payloads: list[bytes]) -> bool:
        queued.append(len(payloads))
        return feed(pid, payloads)

    core.messages_received = counting  # type: ignore[method-assign]
    for n in range(3):
        out: list[Any] = []
        thread = threading.Thread(target=lambda: out.append(a.recv(timeout=5)), daemon=True)
        thread.start()
        wait_until(lambda: _role_taken(a), what="receiver took the read role")
        b.send(b"m%d" % n)
        thread.join(5)
        assert out == [b"m%d" % n]
    assert queued == []  # every one went straight to its receiver
    stats = a.stats()
    assert (stats.messages_received, stats.bytes_received) == (3, 6)
    (pipe,) = a.pipes()
    assert (pipe.messages_received, pipe.bytes_received) == (3, 6)
