"""nanopy.spark.Coordinator without Spark: threads stand in for tasks (fast)."""

from __future__ import annotations

import io
import pickle
import threading
import time

import pytest

import nanopy
from nanopy.spark import Coordinator, CoordinatorLost, TaskClient, split_tag
from nanopy.spark._tags import Deduplicator, make_tag


def run_clients(client: TaskClient, fn, n: int = 2) -> list[int]:
    counts: list[int] = []
    errors: list[BaseException] = []

    def body() -> None:
        try:
            counts.append(client.run(fn))
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=body) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return counts


def test_every_item_once_across_clients() -> None:
    with Coordinator(range(5000), chunk_size=32, progress=False) as coord:
        counts = run_clients(coord.client(), lambda x: x + 1, 3)
        assert coord.wait(5)
    assert sum(counts) == 5000
    assert coord.results() == [x + 1 for x in range(5000)]
    assert coord.duplicates == 0


def test_client_is_picklable_and_holds_no_socket() -> None:
    with Coordinator([1, 2, 3], progress=False) as coord:
        client = pickle.loads(pickle.dumps(coord.client()))
        assert client.run(lambda x: x * 10) == 3
    assert coord.results() == [10, 20, 30]


def test_batch_mode() -> None:
    with Coordinator(range(100), chunk_size=7, progress=False) as coord:
        assert coord.client().run(lambda xs: [x * 2 for x in xs], batch=True) == 100
    assert coord.results() == [x * 2 for x in range(100)]


def test_failed_client_items_are_redone() -> None:
    with Coordinator(range(1000), chunk_size=50, progress=False) as coord:
        client = coord.client()
        seen = {"n": 0}

        def flaky(x: int) -> int:
            seen["n"] += 1
            if seen["n"] == 120:
                raise RuntimeError("injected")
            return -x

        with pytest.raises(RuntimeError, match="injected"):
            client.run(flaky)
        # The failed client closed its socket: its leased chunk went back.
        assert client.run(lambda x: -x) > 0
        assert coord.wait(5)
    assert coord.results() == [-x for x in range(1000)]
    assert coord.requeued >= 1


def test_expired_lease_goes_back() -> None:
    with Coordinator(range(200), chunk_size=10, lease_timeout=0.3, progress=False) as coord:
        # A "hung" task: takes a chunk over a raw PAIR socket and never answers.
        hung = nanopy.Socket("pair", connect=coord.url, recv_timeout=5)
        try:
            hung.send(coord._token.encode() + pickle.dumps((1, "hung", [], 10)))
            _, kind, payload = pickle.loads(hung.recv())
            assert kind == "items" and len(payload) == 10
            assert coord.client().run(lambda x: x) == 200
            assert coord.wait(5)
            assert coord.requeued >= 10
        finally:
            hung.close(linger=0)
    assert coord.results() == list(range(200))


def test_late_result_counts_once() -> None:
    with Coordinator(range(20), chunk_size=20, lease_timeout=0.2, progress=False) as coord:
        slow = nanopy.Socket("pair", connect=coord.url, recv_timeout=5)
        try:
            slow.send(coord._token.encode() + pickle.dumps((1, "slow", [], 20)))
            _, kind, items = pickle.loads(slow.recv())
            assert kind == "items"
            assert coord.client().run(lambda x: ("fast", x)) == 20  # after the lease expired
            slow.send(coord._token.encode() + pickle.dumps((2, None, [(i, ("slow", x)) for i, x in items], 0)))
            _, kind, _ = pickle.loads(slow.recv())
            assert kind == "done"
        finally:
            slow.close(linger=0)
    assert coord.results() == [("fast", x) for x in range(20)]
    assert coord.duplicates == 20


def test_cancel_stops_tasks() -> None:
    with Coordinator(range(100_000), chunk_size=10, progress=False) as coord:
        client = coord.client()

        def work(x: int) -> int:
            if x == 500:
                coord.cancel()
            return x

        processed = client.run(work)
    assert coord.cancelled
    assert 500 <= processed < 100_000
    assert coord.wait(0)


def test_task_times_out_when_coordinator_is_gone() -> None:
    coord = Coordinator(range(10), progress=False).start()
    client = coord.client()
    coord.close()
    client.timeout = 0.5
    t0 = time.monotonic()
    with pytest.raises(CoordinatorLost, match="no answer"):
        client.run(lambda x: x)
    assert time.monotonic() - t0 < 5


def test_stale_token_is_refused() -> None:
    from nanopy.spark import CoordinatorRefused

    with Coordinator(range(3), progress=False) as coord:
        stale = TaskClient(coord.url, "not-the-token", timeout=5)
        with pytest.raises(CoordinatorRefused):
            stale.run(lambda x: x)
        coord.client().run(lambda x: x)


def test_progress_line_shows_counts_and_workers() -> None:
    out = io.StringIO()
    with Coordinator(range(300), chunk_size=10, progress=True, progress_stream=out) as coord:
        run_clients(coord.client(), lambda x: x, 2)
        assert coord.wait(5)
    text = out.getvalue()
    last = text.strip().splitlines()[-1]
    assert "300/300" in last and "items/s" in last


def test_socket_refuses_pickling_with_advice() -> None:
    sock = nanopy.Socket("push")
    try:
        with pytest.raises(TypeError, match="create the socket where it is used"):
            pickle.dumps(sock)
    finally:
        sock.close()


def test_tag_round_trip_and_dedup() -> None:
    msg = b"topic/payload" + make_tag(7, 3, 1, 42)
    payload, tag = split_tag(msg)
    assert payload == b"topic/payload"
    assert tag == (7, 3, 1, 42)
    dedup = Deduplicator()
    assert dedup.accept(msg) == b"topic/payload"
    assert dedup.accept(msg) is None
    assert dedup.duplicates == 1
    with pytest.raises(ValueError):
        split_tag(b"untagged")


def test_requests_without_the_token_are_refused_before_unpickling() -> None:
    with Coordinator(range(3), progress=False) as coord:
        stray = nanopy.Socket("pair", connect=coord.url, recv_timeout=5)
        try:
            stray.send(b"\x00" * 16 + pickle.dumps((1, "x", [], 10)))
            _, kind, _ = pickle.loads(stray.recv())
            assert kind == "refused"
        finally:
            stray.close(linger=0)
        assert coord.client().run(lambda x: x) == 3


def test_default_address_is_loopback_and_port_can_be_fixed() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Coordinator(range(3), port=port, progress=False) as coord:
        assert coord.url == f"tcp://127.0.0.1:{port}"  # never all interfaces unless asked
        assert coord.client().run(lambda x: x) == 3
    with Coordinator(range(3), advertise="driver.example", progress=False) as coord:
        assert coord.url.startswith("tcp://driver.example:")
    with pytest.raises(ValueError, match="either bind"):
        Coordinator(range(3), bind="tcp://127.0.0.1:0", port=port)
    with pytest.raises(ValueError, match="port must be"):
        Coordinator(range(3), port=70000)
