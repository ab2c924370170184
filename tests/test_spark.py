"""nanopy.spark with a real local SparkSession (one for the whole test run).

The session is ``local[2,3]``: two cores like ``local[2]``, plus up to 3 attempts
per task so the coordinator test can kill a task and watch Spark retry it.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

import nanopy
import nanopy.spark
from nanopy.spark import Coordinator, Deduplicator, split_tag
from nanopy.testing import wait_no_pipes, wait_pipes

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    import shutil

    from pyspark import cloudpickle

    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("Spark needs Java (17) on PATH or JAVA_HOME")
    # Functions defined here run in Spark's workers, which cannot import this module.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    session = nanopy.spark.local_session("local[2,3]", "nanopy-tests")
    yield session
    session.stop()


class Collector:
    """A foreachBatch sink (runs in this process): records rows, signals a goal."""

    def __init__(self, goal: int, fail_on: bytes | None = None) -> None:
        self.goal = goal
        self.rows: list[tuple[bytes, int]] = []
        self.batches: list[int] = []
        self.fail_on = fail_on
        self.failed = False
        self.reached = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [(bytes(r.payload), r.seq) for r in df.select("payload", "seq").collect()]
        if self.fail_on is not None and not self.failed and any(p == self.fail_on for p, _ in rows):
            self.failed = True
            raise RuntimeError("injected sink failure")
        with self.lock:
            if rows:
                self.batches.append(batch_id)
            self.rows.extend(rows)
            if len(self.rows) >= self.goal:
                self.reached.set()


def start_query(spark: Any, url: str, sink: Any, workdir: str, **options: str) -> Any:
    reader = spark.readStream.format("nanopy").option("url", url)
    for key, value in options.items():
        reader = reader.option(key, value)
    return (reader.load().writeStream.foreachBatch(sink)
            .option("checkpointLocation", os.path.join(workdir, "checkpoint"))
            .trigger(processingTime="0 seconds").start())


def source_counts(progress: list[Any]) -> list[dict[str, int]]:
    """The source's counters from each progress report (sources[0].latestOffset, JSON)."""
    import json

    out = []
    for p in progress:
        raw = p["sources"][0].get("latestOffset")
        if raw:
            out.append(json.loads(raw) if isinstance(raw, str) else raw)
    return out


def ids(n: int, start: int = 0) -> list[bytes]:
    return [b"m%07d" % i for i in range(start, start + n)]


def test_source_delivers_every_pushed_message(spark: Any, tmp_path: Any) -> None:
    n = 20_000
    sink = Collector(n)
    with nanopy.Socket("push", bind="tcp://127.0.0.1:0", send_buffer=n) as push:
        query = start_query(spark, push.endpoints[0].url, sink, str(tmp_path),
                            maxRecordsPerBatch="4000")
        try:
            wait_pipes(push, 1, 120)
            for payload in ids(n):
                push.send(payload)
            assert sink.reached.wait(120), f"only {len(sink.rows)} of {n} arrived"
        finally:
            query.stop()
    assert sorted(p for p, _ in sink.rows) == ids(n)
    assert sorted(s for _, s in sink.rows) == list(range(1, n + 1))
    assert len(sink.batches) >= 5  # 4000 rows per micro-batch at most


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from s3_server import s3_server

    with s3_server(str(tmp_path_factory.mktemp("moto"))) as endpoint:
        yield endpoint


@pytest.mark.parametrize("spool_kind", ["path", "s3", None], ids=["spool", "s3-spool", "no-spool"])
def test_restart_mid_stream(spark: Any, tmp_path: Any, spool_kind: str | None,
                            request: pytest.FixtureRequest) -> None:
    """With a spool nothing is lost across a restart; without one, the replayed batch is."""
    first, second = 3000, 2000
    spooled = spool_kind is not None
    spool = str(tmp_path / "spool")
    if spool_kind == "s3":
        from s3_server import bucket_uri

        spool = bucket_uri(request.getfixturevalue("s3_endpoint"), "restart", "q1/spool")
    options = {"maxRecordsPerBatch": "1000"}
    if spooled:
        options["spoolPath"] = spool
    sink = Collector(first + second, fail_on=ids(1, first - 1)[0])
    with nanopy.Socket("push", bind="tcp://127.0.0.1:0", send_buffer=10_000) as push:
        url = push.endpoints[0].url
        query = start_query(spark, url, sink, str(tmp_path), **options)
        try:
            wait_pipes(push, 1, 120)
            for payload in ids(first):
                push.send(payload)
            # The sink fails on the batch holding the last message: the query dies
            # with that batch planned (offsets logged, spooled) but not committed.
            with pytest.raises(Exception, match="injected sink failure"):
                query.awaitTermination(120)
        finally:
            query.stop()
        assert sink.failed
        before = len(sink.rows)
        if spooled:
            from nanopy.spark._spool import Spool

            assert Spool(spool).segments(), "the failed batch should be in the spool"
        wait_no_pipes(push, 60)  # the old reader process is gone
        if not spooled:
            sink.goal = first + second - (first - before)
        query = start_query(spark, url, sink, str(tmp_path), **options)
        try:
            wait_pipes(push, 1, 120)
            for payload in ids(second, first):
                push.send(payload)
            assert sink.reached.wait(120), f"only {len(sink.rows)} of {sink.goal} arrived"
        finally:
            query.stop()
    got = sorted(p for p, _ in sink.rows)
    if spooled:
        assert got == ids(first + second)  # nothing lost, no repeats
        assert sorted(s for _, s in sink.rows) == list(range(1, first + second + 1))
    else:  # at-most-once: exactly the failed batch is missing, and the progress says so
        assert got == ids(before) + ids(second, first)
        assert before < first
        latest = source_counts(query.recentProgress)
        assert latest and latest[-1]["skippedBatches"] == 1
        assert latest[-1]["skippedMessages"] == first - before


def test_sink_batch_write_delivers_every_row(spark: Any) -> None:
    n = 5000
    with nanopy.Socket("pull", bind="tcp://127.0.0.1:0", recv_timeout=30) as pull:
        df = spark.range(n).selectExpr("cast(concat('r', id) as binary) as payload").repartition(6)
        df.write.format("nanopy").option("url", pull.endpoints[0].url).mode("append").save()
        # write() flushed before returning: everything is already here or on the wire.
        got = [split_tag(pull.recv()) for _ in range(n)]
        pull.recv_timeout = 0.2
        with pytest.raises(nanopy.Timeout):
            pull.recv()
        # One cached socket per reused Python worker, not one per task (6 tasks, 2 slots).
        assert pull.stats().connects <= 3
    assert sorted(p for p, _ in got) == sorted(b"r%d" % i for i in range(n))
    tags = {t for _, t in got}
    assert len(tags) == n
    assert {t.batch_id for t in tags} == {-1}
    assert {t.partition for t in tags} == set(range(6))
    assert len({t.run_id for t in tags}) == 1


def test_streaming_source_to_sink(spark: Any, tmp_path: Any) -> None:
    n = 5000
    with nanopy.Socket("push", bind="tcp://127.0.0.1:0", send_buffer=n) as push, \
            nanopy.Socket("pull", bind="tcp://127.0.0.1:0", recv_timeout=120) as pull:
        query = (spark.readStream.format("nanopy").option("url", push.endpoints[0].url)
                 .option("maxRecordsPerBatch", "1000").load()
                 .selectExpr("cast(concat(cast(payload as string), '!') as binary) as payload")
                 .writeStream.format("nanopy").option("url", pull.endpoints[0].url)
                 .option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(processingTime="0 seconds").start())
        try:
            wait_pipes(push, 1, 120)
            for payload in ids(n):
                push.send(payload)
            dedup = Deduplicator()
            got = []
            while len(got) < n:
                payload = dedup.accept(pull.recv())
                if payload is not None:
                    got.append(payload)
        finally:
            query.stop()
    assert sorted(got) == [p + b"!" for p in ids(n)]
    assert dedup.duplicates == 0


def test_coordinator_20000_items_exactly_once(spark: Any) -> None:
    n = 20_000
    with Coordinator(range(n), chunk_size=64, progress=True) as coord:
        client = coord.client()
        rows = (spark.sparkContext.parallelize(range(2), 2)
                .mapPartitions(lambda _: client.process(lambda x: x * x)).collect())
        assert coord.wait(10)
    assert coord.results() == [x * x for x in range(n)]
    assert len(rows) == 2 and sum(count for _, count in rows) == n
    assert coord.duplicates == 0


def test_coordinator_redoes_items_of_a_failed_task(spark: Any) -> None:
    n = 20_000
    with Coordinator(range(n), chunk_size=64, progress=True) as coord:
        client = coord.client()

        def task(_: Any) -> Iterator[tuple[str, int]]:
            from pyspark import TaskContext

            attempt = TaskContext.get().attemptNumber()
            state = {"done": 0}

            def work(x: int) -> int:
                state["done"] += 1
                if attempt == 0 and state["done"] == 3000:
                    raise RuntimeError("injected task failure")
                return 3 * x

            yield from client.process(work)

        rows = spark.sparkContext.parallelize(range(2), 2).mapPartitions(task).collect()
        assert coord.wait(10)
    assert coord.results() == [3 * x for x in range(n)]
    assert coord.requeued >= 1  # the failed attempt's leased chunk went back
    retried = [w for w, _ in rows if w.endswith(".1")]
    assert retried, f"no retried task among {rows}"
    assert sum(coord.per_worker().values()) == n


def test_coordinator_map_helper(spark: Any) -> None:
    coord = Coordinator([f"w{i}" for i in range(500)], chunk_size=16, progress=False)
    assert coord.map(spark, str.upper, tasks=2) == [f"W{i}" for i in range(500)]


def test_socket_in_a_closure_fails_clearly(spark: Any) -> None:
    sock = nanopy.Socket("push")
    try:
        with pytest.raises(Exception, match="cannot pickle .*nanopy socket belongs"):
            spark.sparkContext.parallelize([1]).map(lambda x: (x, sock)).collect()
    finally:
        sock.close()


def test_nanopy_in_reused_forked_workers(spark: Any) -> None:
    """Two jobs: each task makes a socket in the worker; reused workers keep working."""
    with nanopy.Socket("pull", bind="tcp://127.0.0.1:0", recv_timeout=60) as pull:
        url = pull.endpoints[0].url

        def task(part: Iterator[int]) -> Iterator[int]:
            with nanopy.Socket("push", connect=url, send_timeout=30) as push:
                for x in part:
                    push.send(b"%d:%d" % (os.getpid(), x))
            yield os.getpid()

        jobs = [set(spark.sparkContext.parallelize(range(100), 4).mapPartitions(task).collect())
                for _ in range(2)]
        got = [pull.recv().split(b":") for _ in range(200)]
    assert sorted(int(x) for _, x in got) == sorted(list(range(100)) * 2)
    assert {int(p) for p, _ in got} == jobs[0] | jobs[1]
    assert jobs[0] & jobs[1], "the second job should run in (some of) the same reused workers"


def test_sub_source_topics_and_pub_sink(spark: Any, tmp_path: Any) -> None:
    """PUB producer -> source (SUB, 2 subscriptions) -> sink (PUB, topicColumn) -> SUB."""
    per_topic = 500
    with nanopy.Socket("pub", bind="tcp://127.0.0.1:0", send_buffer=10_000) as pub, \
            nanopy.Socket("sub", bind="tcp://127.0.0.1:0", recv_timeout=120) as sub:
        sub.subscribe(b"a.")
        query = (spark.readStream.format("nanopy").option("url", pub.endpoints[0].url)
                 .option("protocol", "sub").option("subscriptions", "a.,b.").load()
                 .selectExpr("cast(concat(topic, '|') as binary) as t", "payload")
                 .writeStream.format("nanopy").option("protocol", "pub")
                 .option("url", sub.endpoints[0].url).option("topicColumn", "t")
                 .option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(processingTime="0 seconds").start())
        try:
            wait_pipes(pub, 1, 120)
            for i in range(per_topic):
                for topic in (b"a.", b"b.", b"c."):
                    pub.send(topic + b"%05d" % i)
            got = [split_tag(sub.recv())[0] for _ in range(per_topic)]
            sub.recv_timeout = 0.5
            with pytest.raises(nanopy.Timeout):
                sub.recv()
        finally:
            query.stop()
    assert sorted(got) == [b"a.|a.%05d" % i for i in range(per_topic)]


def test_coordinator_map_timeout_cancels_the_job(spark: Any) -> None:
    import time

    def slow(x: int) -> int:
        time.sleep(0.01)  # simulated work: 20,000 items would take minutes
        return x

    coord = Coordinator(range(20_000), chunk_size=8, progress=False)
    t0 = time.monotonic()
    with pytest.raises(nanopy.Timeout):
        coord.map(spark, slow, tasks=2, timeout=3)
    assert coord.cancelled
    assert 0 < coord.done < 20_000
    assert time.monotonic() - t0 < 30
    # The slots are free again: a new job runs normally.
    assert Coordinator(range(10), progress=False).map(spark, lambda x: -x, tasks=2) == [-x for x in range(10)]


# -- errors at definition time ----------------------------------------------------------


def fails_with(action: Any, text: str) -> None:
    """``action()`` raises at once, with ``text`` on one line of the error."""
    with pytest.raises(Exception) as excinfo:
        action()
    one_line_error(excinfo, text)


def one_line_error(excinfo: pytest.ExceptionInfo, text: str) -> None:
    """Spark wraps the error; our message is there, whole, on one line."""
    assert any(text in line for line in str(excinfo.value).splitlines()), str(excinfo.value)[:2000]


def test_bad_source_options_fail_at_load(spark: Any) -> None:
    cases = [
        ({"url": "tcp://127.0.0.1:1", "maxRecordsPerBatc": "5"},
         'did you mean "maxRecordsPerBatch"'),
        ({"url": "tcp://127.0.0.1:1", "maxRecordsPerBatch": "lots"},
         "option maxRecordsPerBatch='lots' must be an integer"),
        ({"url": "tcp://127.0.0.1:1", "mode": "listen"}, "option mode='listen': expected one of connect, bind"),
        ({"url": "nope://x"}, "unknown transport 'nope'"),
        ({"protocol": "pull"}, 'needs .option("url", "tcp://host:port")'),
        ({"url": "tcp://127.0.0.1"}, "has no valid port"),
        ({"url": "tcp://no-such-host.invalid:5555"}, "cannot resolve host 'no-such-host.invalid'"),
        ({"url": "tcp://127.0.0.1:1", "subscribe": "a"},
         'option "subscribe" applies to protocol "sub" only, and this is "pull"; '
         'did you mean .option("protocol", "sub")?'),
        ({"url": "tcp://127.0.0.1:1", "schema": "avro"}, "option schema='avro': expected one of nanopy, kafka"),
    ]
    for options, message in cases:
        for reader in (spark.readStream, spark.read):
            fails_with(reader.format("nanopy").options(**options).load, message)


def test_bad_sink_options_fail_at_save(spark: Any, tmp_path: Any) -> None:
    df = spark.range(3).selectExpr("cast(id as string) as payload", "id")
    with nanopy.Socket("pull", bind="tcp://127.0.0.1:0") as pull:
        url = pull.endpoints[0].url
        cases = [
            ({"url": url}, "overwrite", "the nanopy sink cannot overwrite"),
            ({"url": url, "column": "nope"}, "append", "column 'nope' is not a column of the DataFrame"),
            ({"url": url, "column": "id"}, "append", "column 'id' is bigint"),
            ({"url": url, "mode": "bind"}, "append", "the nanopy sink cannot bind"),
            ({"url": url, "sendTimeot": "1"}, "append", 'did you mean "sendTimeout"'),
            ({"url": url, "maxRecordsPerBatch": "1"}, "append",
             'option "maxRecordsPerBatch" applies to the nanopy source, not the sink'),
            ({"url": "tcp://no-such-host.invalid:5555"}, "append", "cannot resolve host 'no-such-host.invalid'"),
        ]
        for options, mode, message in cases:
            fails_with(df.write.format("nanopy").mode(mode).options(**options).save, message)


def query_fails_with(df: Any, checkpoint: str, text: str) -> None:
    """A noop query on ``df`` fails, with ``text`` on one line of the error."""
    query = (df.writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(processingTime="0 seconds").start())
    try:
        with pytest.raises(Exception) as excinfo:
            query.awaitTermination(120)
    finally:
        query.stop()
    one_line_error(excinfo, text)


def test_custom_schema_is_refused_before_any_message(spark: Any, tmp_path: Any) -> None:
    df = spark.readStream.format("nanopy").schema("payload binary").option("url", "tcp://127.0.0.1:1").load()
    query_fails_with(df, str(tmp_path / "c"), "the nanopy source has a fixed schema")


def test_sink_without_a_peer_fails_naming_the_url(spark: Any) -> None:
    with nanopy.Socket("pull", bind="tcp://127.0.0.1:0") as pull:
        url = pull.endpoints[0].url
    # The port is free again: nobody listens.
    df = spark.range(3).selectExpr("cast(id as string) as payload").coalesce(1)
    with pytest.raises(Exception) as excinfo:
        df.write.format("nanopy").option("url", url).option("peerTimeout", "0.5").mode("append").save()
    one_line_error(excinfo, f"nanopy sink: no peer at {url} within peerTimeout=0.5s")


# -- batch read, caps, metrics --------------------------------------------------------------


def test_batch_read_with_count_and_with_duration(spark: Any) -> None:
    with nanopy.Socket("push", bind="tcp://127.0.0.1:0", send_buffer=10_000) as push:
        url = push.endpoints[0].url
        sender = threading.Thread(target=lambda: [push.send(p) for p in ids(3000)])
        sender.start()
        rows = (spark.read.format("nanopy").option("url", url).option("count", "3000").load()
                .select("payload", "seq").collect())
        sender.join(30)
        assert sorted(bytes(r.payload) for r in rows) == ids(3000)
        assert sorted(r.seq for r in rows) == list(range(1, 3001))
        # A time bound with nothing to read returns an empty DataFrame on time.
        import time

        t0 = time.monotonic()
        assert spark.read.format("nanopy").option("url", url).option("duration", "1").load().count() == 0
        assert time.monotonic() - t0 < 60
    with pytest.raises(Exception) as excinfo:
        spark.read.format("nanopy").option("url", url).load().collect()
    one_line_error(excinfo, "a batch read needs a bound")


def test_max_offsets_per_trigger_caps_batches_and_progress_has_counts(spark: Any, tmp_path: Any) -> None:
    n = 3000
    sink = Collector(n)
    with nanopy.Socket("push", bind="tcp://127.0.0.1:0", send_buffer=n) as push:
        query = start_query(spark, push.endpoints[0].url, sink, str(tmp_path),
                            maxOffsetsPerTrigger="500", spoolPath=str(tmp_path / "spool"))
        try:
            wait_pipes(push, 1, 120)
            for payload in ids(n):
                push.send(payload)
            assert sink.reached.wait(120), f"only {len(sink.rows)} of {n} arrived"
            progress = [p for p in query.recentProgress if p["numInputRows"]]
        finally:
            query.stop()
    assert sorted(p for p, _ in sink.rows) == ids(n)
    assert max(p["numInputRows"] for p in progress) <= 500
    latest = source_counts(progress)[-1]
    assert latest["received"] == n and latest["oversized"] == 0 and latest["skippedBatches"] == 0


def test_coordinator_advertises_the_driver_host(spark: Any) -> None:
    from spark_cluster import free_port

    host = spark.sparkContext.getConf().get("spark.driver.host")
    port = free_port()
    with Coordinator(range(10), port=port, progress=False) as coord:
        assert coord.url == f"tcp://{host}:{port}"
        coord.client().run(lambda x: x)
    with Coordinator(range(10), progress=False) as coord:
        assert coord.url.startswith(f"tcp://{host}:")


# -- what a Kafka user expects ----------------------------------------------------------------


def run_to_end(spark: Any, url: str, workdir: str, trigger: dict[str, bool], **options: str) -> list[Any]:
    """An availableNow or once query into a memory table; returns its rows once it ended."""
    name = f"nanopy_now_{abs(hash(workdir))}"
    reader = spark.readStream.format("nanopy").option("url", url)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream.format("memory").queryName(name)
             .option("checkpointLocation", os.path.join(workdir, "checkpoint"))
             .trigger(**trigger).start())
    try:
        assert query.awaitTermination(180), f"a {trigger} query must end by itself"
        assert query.exception() is None
    finally:
        query.stop()
    return spark.sql(f"select * from {name}").collect()


@pytest.mark.parametrize("trigger", [{"availableNow": True}, {"once": True}], ids=["availableNow", "once"])
def test_available_now_and_once_take_what_was_sent_and_end_kafka_schema(
        spark: Any, tmp_path: Any, trigger: dict[str, bool]) -> None:
    """availableNow and once on a fresh start read what the producer had sent, then
    end; schema=kafka gives Kafka's columns (value, offset, timestamp, ...)."""
    n = 3000
    with nanopy.Socket("push", bind="tcp://127.0.0.1:0", send_buffer=n) as push:
        url = push.endpoints[0].url
        sender = threading.Thread(target=lambda: [push.send(p) for p in ids(n)])
        sender.start()  # blocks until the query's socket connects
        rows = run_to_end(spark, url, str(tmp_path), trigger, schema="kafka")
        sender.join(30)
    assert list(rows[0].asDict()) == ["key", "value", "topic", "partition", "offset", "timestamp",
                                      "timestampType"]
    assert sorted(bytes(r.value) for r in rows) == ids(n)
    assert sorted(r.offset for r in rows) == list(range(1, n + 1))
    assert {(r.key, r.partition, r.timestampType) for r in rows} == {(None, 0, 1)}
    assert all(r.timestamp is not None for r in rows)


def test_second_query_on_one_pull_source_is_refused(spark: Any, tmp_path: Any) -> None:
    """PUSH would split the stream between two queries: the second is refused with
    the reason, the first keeps every message."""
    n = 2000
    sink = Collector(n)
    with nanopy.Socket("push", bind="tcp://127.0.0.1:0", send_buffer=n) as push:
        url = push.endpoints[0].url
        df = spark.readStream.format("nanopy").option("url", url).option("connectTimeout", "2").load()
        first = (df.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "c1"))
                 .trigger(processingTime="0 seconds").start())
        try:
            wait_pipes(push, 1, 120)
            query_fails_with(df, str(tmp_path / "c2"), "already reads the PULL source")
            for payload in ids(n):
                push.send(payload)
            assert sink.reached.wait(120), f"only {len(sink.rows)} of {n} arrived"
            assert len(push.pipes) == 1
            latest = source_counts(first.recentProgress)[-1]
        finally:
            first.stop()
    assert sorted(p for p, _ in sink.rows) == ids(n)
    assert latest["source"] == f"nanopy pull {url}"
    for key in ("backlog", "backlogBytes", "receivedBytes", "dropped", "oversized", "spoolFiles"):
        assert key in latest
