"""The source's write-ahead spool and receiver, without a SparkSession (fast).

Spools on a local path, a file:// URI and s3:// against a loopback moto server.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from s3_server import bucket_uri, s3_server

import nanopy
from nanopy.spark import _options as opt
from nanopy.spark._receiver import Limits, Receiver, make_batch
from nanopy.spark._spool import Spool, redact
from nanopy.testing import wait_no_pipes, wait_pipes

SCHEMA = pa.schema([("payload", pa.binary()), ("topic", pa.string()),
                    ("received", pa.timestamp("us", tz="UTC")), ("seq", pa.int64())])


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with s3_server(str(tmp_path_factory.mktemp("moto"))) as endpoint:
        yield endpoint


@pytest.fixture(params=["path", "file-uri", "s3"])
def spool_uri(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "path":
        return str(tmp_path / "spool")
    if request.param == "file-uri":
        return f"file://{tmp_path}/spool"
    endpoint = request.getfixturevalue("s3_endpoint")
    import re

    return bucket_uri(endpoint, "spool-tests", re.sub(r"\W", "-", request.node.name) + "/spool")


def rows(after: int, n: int) -> pa.RecordBatch:
    return make_batch(after, [b"m%d" % i for i in range(after + 1, after + n + 1)], 1.5e9, [], SCHEMA)


def test_spool_log_write_read_trim(spool_uri: str) -> None:
    spool = Spool(spool_uri)
    spool.prepare()
    assert spool.end() == 0
    for after, n in ((0, 5), (5, 3), (8, 10)):
        spool.write(after, after + n, rows(after, n))
    assert [(a, b) for a, b, _, _ in spool.segments()] == [(0, 5), (5, 8), (8, 18)]
    assert spool.end() == 18
    # A range across files, cut inside the first and the last.
    got = pa.Table.from_batches(spool.read(3, 10, SCHEMA))
    assert got.column("seq").to_pylist() == list(range(4, 11))
    assert got.column("payload").to_pylist() == [b"m%d" % i for i in range(4, 11)]
    spool.trim(8)  # files wholly at or below 8 go
    assert [(a, b) for a, b, _, _ in spool.segments()] == [(8, 18)]
    assert spool.end() == 18
    with pytest.raises(RuntimeError, match="storage every executor can read"):
        spool.read(3, 10, SCHEMA)


def test_spool_uri_credentials_are_not_shown() -> None:
    uri = "s3://AKIDEXAMPLE:s3cr3t@bucket/dir?endpoint_override=h:1&scheme=http"
    assert redact(uri) == "s3://***@bucket/dir"
    assert "s3cr3t" not in repr(Spool(uri))
    assert redact("/local/path") == "/local/path"


def test_spool_bad_uri_is_a_clear_error() -> None:
    with pytest.raises(opt.SourceOptionError, match="spoolPath nosuchfs://x"):
        Spool("nosuchfs://x/y").prepare()


def test_receiver_spools_before_counting_and_restarts_after_the_log(spool_uri: str) -> None:
    """Every message received is in the spool (the receiver keeps only an index);
    a new receiver (a restarted runner) numbers on from the end of the log and
    still indexes what the old one received but nobody committed."""
    spool = Spool(spool_uri)
    spool.prepare()
    n = 3000
    with nanopy.Socket("push", bind="tcp://127.0.0.1:0") as push:
        options = {"url": push.endpoints[0].url}
        rx = Receiver(options, 0, spool, SCHEMA, Limits(options))
        try:
            wait_pipes(push, 1, 10)
            for i in range(n):
                push.send(b"a%d" % i)
            assert rx.wait_past(n - 1, 20) == n
            assert spool.end() == n
            files = rx.files(100, 200)
            got = pa.Table.from_batches(spool.read(100, 200, SCHEMA, files))
            assert got.column("seq").to_pylist() == list(range(101, 201))
            on_disk = pa.Table.from_batches(spool.read(0, n, SCHEMA))
            assert on_disk.column("payload").to_pylist() == [b"a%d" % i for i in range(n)]
            spool.trim(1000, rx.commit(1000))
            assert rx.metrics()["backlog"] == n - 1000
        finally:
            rx.close()
        wait_no_pipes(push, 10)  # the old receiver's pipe is gone: nothing is sent into it
        rx2 = Receiver(options, 1000, spool, SCHEMA, Limits(options))
        try:
            assert rx2.files(1000, n) and rx2.files(1000, n)[-1].last == n
            wait_pipes(push, 1, 10)
            push.send(b"after-restart")
            assert rx2.wait_past(n, 20) == n + 1
            (batch,) = spool.read(n, n + 1, SCHEMA, rx2.files(n, n + 1))
            assert batch.column("payload").to_pylist() == [b"after-restart"]
        finally:
            rx2.close()
    # What the first receiver read ahead (1001..3000) is still in the log.
    assert pa.Table.from_batches(spool.read(1000, n + 1, SCHEMA)).num_rows == n + 1 - 1000


def test_receiver_drops_oversized_messages_but_keeps_the_rest(tmp_path: Any) -> None:
    spool = Spool(str(tmp_path / "spool"))
    with nanopy.Socket("push", bind="tcp://127.0.0.1:0") as push:
        options = {"url": push.endpoints[0].url, "recvmaxsize": "100"}
        rx = Receiver(options, 0, spool, SCHEMA, Limits(options))
        try:
            wait_pipes(push, 1, 10)
            push.send(b"small-1")
            push.send(b"x" * 300)  # over recvMaxSize: dropped and counted, connection kept
            for i in range(2, 200):
                push.send(b"small-%d" % i)
            assert rx.wait_past(198, 20) == 199
            got = pa.Table.from_batches(spool.read(0, 199, SCHEMA)).column("payload").to_pylist()
            assert got == [b"small-%d" % i for i in range(1, 200)]
            assert rx.metrics()["oversized"] == 1
            assert len(push.pipes) == 1
            push.send(b"y" * 5000)  # over 4 x recvMaxSize: nanopy closes that connection, counted
            wait_no_pipes(push, 10)
            assert rx.sock.stats().messages_too_large == 1
        finally:
            rx.close()


def test_receiver_bounds_memory_and_backlog_in_bytes(tmp_path: Any) -> None:
    """64 KiB messages: the socket's queue shrinks to recvBufferBytes / size, and the
    receiver stops at maxBufferedBytes of uncommitted spool until a commit."""
    size, n = 64 << 10, 200
    spool = Spool(str(tmp_path / "spool"))
    with nanopy.Socket("push", bind="tcp://127.0.0.1:0", send_buffer=1000) as push:
        options = {"url": push.endpoints[0].url, "recvbufferbytes": str(1 << 20),
                   "maxbufferedbytes": str(2 << 20)}
        rx = Receiver(options, 0, spool, SCHEMA, Limits(options))
        try:
            wait_pipes(push, 1, 10)
            sender = __import__("threading").Thread(
                target=lambda: [push.send(b"%06d" % i + b"z" * (size - 6)) for i in range(n)])
            sender.start()
            end = rx.wait_past(0, 20)
            import time

            deadline = time.monotonic() + 20  # polling another thread's counter
            while rx.metrics()["backpressureWaits"] == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            m = rx.metrics()
            assert m["backpressureWaits"] >= 1
            assert m["socketQueueLimit"] <= (1 << 20) // size + 1
            assert m["backlogBytes"] < (2 << 20) + (8 << 20)  # the bound plus one group
            end = committed = m["seq"]
            while end < n:  # commit as Spark would; the receiver goes on
                spool.trim(end, rx.commit(end))
                committed = end
                end = rx.wait_past(end, 20)
            sender.join(20)
            assert rx.metrics()["received"] == n
        finally:
            rx.close()
    # What was never committed is all there (how far the last commit reached depends
    # on how the receiver's waits fell; committed files are gone by design).
    after = max(committed, n - 3)
    got = pa.Table.from_batches(spool.read(after, n, SCHEMA)).column("payload").to_pylist()
    assert [p[:6] for p in got] == [b"%06d" % i for i in range(after, n)]


def test_partial_spool_files_are_removed_and_default_spools_of_dead_processes_swept(tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    from nanopy.spark._spool import DefaultSpool, sweep_default_spools

    spool = Spool(str(tmp_path / "spool"))
    spool.prepare()
    spool.write(0, 5, rows(0, 5))
    (tmp_path / "spool" / f"{5:020d}-{9:020d}.arrow.tmp").write_bytes(b"partial")
    spool.prepare()  # a new receiver starts
    assert sorted(os.listdir(tmp_path / "spool")) == [f"{0:020d}-{5:020d}.arrow"]
    # A default spool made by a process that then died is swept; a live one is not.
    code = ("import sys; from nanopy.spark._spool import DefaultSpool; "
            "print(DefaultSpool(sys.argv[1]).uri)")
    dead = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()
    assert os.path.isdir(dead)
    live = DefaultSpool(str(tmp_path))
    assert not os.path.exists(dead)  # swept when `live` was made
    assert sweep_default_spools(str(tmp_path)) == 0 and os.path.isdir(live.uri)


def test_option_names_are_checked_with_suggestions() -> None:
    with pytest.raises(opt.SourceOptionError, match='unknown nanopy source option "maxrecordsperbatc"; '
                                                    'did you mean "maxRecordsPerBatch"'):
        opt.check_names(opt.lower({"url": "tcp://h:1", "maxRecordsPerBatc": "5"}), "source")
    with pytest.raises(opt.SourceOptionError, match='option "column" applies to the nanopy sink, not the source'):
        opt.check_names({"column": "x"}, "source")
    opt.check_names(opt.lower({"URL": "tcp://h:1", "SpoolPath": "/x", "checkpointLocation": "/c"}), "source")
    assert opt.lower({"spool": "/x", "subscribe": "a"}) == {"spoolpath": "/x", "subscriptions": "a"}


def test_unresolvable_host_fails_and_nobody_listening_warns(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(opt.SourceOptionError, match="cannot resolve host 'no-such-host.invalid'"):
        opt.check_reachable(["tcp://no-such-host.invalid:5555"], "connect", "source")
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with caplog.at_level("WARNING", logger="nanopy.spark"):
        opt.check_reachable([f"tcp://127.0.0.1:{port}"], "connect", "sink")
    assert f"nothing is listening at tcp://127.0.0.1:{port}" in caplog.text


def test_log_lines_use_sparks_layout() -> None:
    import logging
    import re

    from nanopy.spark._logfmt import SparkFormatter

    record = logging.LogRecord("nanopy.spark", logging.WARNING, __file__, 1, "dropped %d", (3,), None)
    assert re.fullmatch(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d WARN nanopy.spark: dropped 3",
                        SparkFormatter().format(record))


def test_batches_are_cut_into_partitions_of_about_equal_bytes() -> None:
    from nanopy.spark._source import plan_ranges
    from nanopy.spark._spool import Segment

    # Two files: 1,000 small messages (1 MB), then 100 big ones (100 MB).
    files = [Segment(0, 1000, "a", 1_000_000), Segment(1000, 1100, "b", 100_000_000)]
    ranges = plan_ranges(0, 1100, files, 32 << 20, 2, min_rows=10)
    assert ranges[0][0] == 0 and ranges[-1][1] == 1100
    assert all(a < b for a, b in ranges) and all(x[1] == y[0] for x, y in zip(ranges, ranges[1:]))
    assert len(ranges) == 4  # ceil(101 MB / 32 MiB): 25 MB each
    assert ranges[0][1] > 1000  # the first range takes all the small messages and some big ones
    # A small batch is one partition; minPartitions splits a larger one evenly.
    assert plan_ranges(0, 50, files, 32 << 20, 2) == [(0, 50)]
    assert plan_ranges(0, 1000, files, 32 << 20, 2, min_rows=10) == [(0, 500), (500, 1000)]
