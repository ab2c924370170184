"""Driver programs for the cluster tests (run as subprocesses by test_spark_cluster.py).

    python spark_cluster_driver.py MASTER stream IN_URL OUT_URL SPOOL CHECKPOINT MAX_BATCH
    python spark_cluster_driver.py MASTER basics PULL_URL
    python spark_cluster_driver.py MASTER executor-kill PID_DIR ITEMS
    python spark_cluster_driver.py MASTER defaults WORKDIR URL:SIZE:COUNT [URL:SIZE:COUNT ...]
    python spark_cluster_driver.py MASTER frames WORKDIR ZMTP_URL COUNT

Each prints JSON lines on stdout ("started", then results); the test reads them.
"""

from __future__ import annotations

import json
import os
import sys
import time

import nanopy.spark


def say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def session(master: str):  # type: ignore[no-untyped-def]
    return nanopy.spark.local_session(master, "nanopy-cluster-test", **{
        "spark.executor.memory": "512m",
        "spark.cores.max": "2",
        "spark.task.maxFailures": "4",
        "spark.sql.streaming.noDataProgressEventInterval": "1000",  # idle progress every second
        "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData",
    })


def stream(spark, in_url: str, out_url: str, spool: str, checkpoint: str, max_batch: str) -> None:  # type: ignore[no-untyped-def]
    """Source -> "<first 8 bytes of the payload>:seq" -> sink; runs until killed."""
    query = (spark.readStream.format("nanopy").option("url", in_url)
             .option("spoolPath", spool).option("maxRecordsPerBatch", max_batch).load()
             .selectExpr("cast(concat(cast(substring(payload, 1, 8) as string), ':', cast(seq as string)) "
                        "as binary) as payload")
             .writeStream.format("nanopy").option("url", out_url)
             .option("checkpointLocation", checkpoint)
             .trigger(processingTime="0 seconds").start())
    say(event="started", pid=os.getpid())
    while query.isActive:
        progress = query.lastProgress
        if progress:
            source = progress["sources"][0]
            end, latest = source.get("endOffset"), source.get("latestOffset")
            say(event="progress", batch=progress["batchId"], rows=progress["numInputRows"],
                end=json.loads(end)["seq"] if end else None,
                latest=json.loads(latest) if latest else None)
        query.awaitTermination(0.5)
    say(event="ended", error=str(query.exception()))


def basics(spark, pull_url: str) -> None:  # type: ignore[no-untyped-def]
    from nanopy.spark import Coordinator

    sc = spark.sparkContext
    driver_host = sc.getConf().get("spark.driver.host")
    # The manual pattern: the coordinator finds the driver host by itself.
    with Coordinator(range(3000), chunk_size=32, progress=False) as coord:
        client = coord.client()
        rows = sc.parallelize(range(2), 2).mapPartitions(lambda _: client.process(lambda x: x * 2)).collect()
        coord.wait(30)
    manual = {"url": coord.url, "ok": coord.results() == [x * 2 for x in range(3000)],
              "duplicates": coord.duplicates, "hosts": sorted({w.split(":")[0] for w, _ in rows}),
              "executor_pids": sorted({w.split(":")[1].split("/")[0] for w, _ in rows})}
    # map() with a fixed port.
    port = int(os.environ["NANOPY_TEST_COORD_PORT"])
    fixed = Coordinator(range(1000), chunk_size=16, port=port, progress=False)
    t0 = time.perf_counter()
    ok = fixed.map(spark, lambda x: x + 1) == [x + 1 for x in range(1000)]
    say(event="coordinator", driver_host=driver_host, manual=manual,
        fixed={"url": fixed.url, "ok": ok, "seconds": time.perf_counter() - t0})
    # The sink from executors to the test's PULL socket.
    t0 = time.perf_counter()
    (spark.range(20000).selectExpr("cast(concat('r', id) as binary) as payload").repartition(4)
     .write.format("nanopy").option("url", pull_url).mode("append").save())
    say(event="sink", rows=20000, seconds=time.perf_counter() - t0)


def executor_kill(spark, pid_dir: str, items: str) -> None:  # type: ignore[no-untyped-def]
    from nanopy.spark import Coordinator

    def work(x: int) -> int:
        marker = os.path.join(pid_dir, f"{os.getpid()}.pid")
        if not os.path.exists(marker):  # the executor JVM is the pyspark daemon's parent
            daemon = os.getppid()
            with open(f"/proc/{daemon}/stat") as f:
                jvm = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(marker + ".tmp", "w") as f:
                f.write(str(jvm))
            os.replace(marker + ".tmp", marker)
        time.sleep(0.004)  # simulated work, so the job outlives the kill
        return -x

    n = int(items)
    coord = Coordinator(range(n), chunk_size=8, lease_timeout=30, progress=False)
    say(event="started", pid=os.getpid())
    results = coord.map(spark, work, tasks=2, timeout=240)
    say(event="done", ok=results == [-x for x in range(n)], duplicates=coord.duplicates,
        requeued=coord.requeued, per_worker=coord.per_worker())


def load_errors(spark) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Bad options, each refused at load(): the first line of nanopy's message."""
    cases = {
        "no-port": {"url": "tcp://127.0.0.1"},
        "unresolvable": {"url": "tcp://no-such-host.invalid:5555"},
        "no-url": {"protocol": "pull"},
        "subscribe-on-pull": {"url": "tcp://127.0.0.1:1", "subscribe": "orders"},
        "typo": {"url": "tcp://127.0.0.1:1", "maxBufferedByte": "5"},
    }
    out = {}
    for name, options in cases.items():
        try:
            spark.readStream.format("nanopy").options(**options).load()
            out[name] = "accepted"
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out[name] = next((line.split("SourceOptionError: ", 1)[1] for line in str(exc).splitlines()
                              if "SourceOptionError: " in line), str(exc)[-600:])
    return out


def rss_peaks(root: int) -> dict[str, int]:
    """Peak resident memory (VmHWM, KiB) of the driver JVM and the source runners under ``root``."""
    peaks: dict[str, int] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/status") as f:
                hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo += [int(k) for k in f.read().split()]
        except (OSError, StopIteration):
            continue
        role = ("jvm" if b"java" in cmd.split(b"\0")[0] else
                "runner" if b"python_streaming_source_runner" in cmd else None)
        if role:
            peaks[role] = max(peaks.get(role, 0), hwm)
    return peaks


def defaults(spark, workdir: str, *streams: str) -> None:  # type: ignore[no-untyped-def]
    """Load-time checks, two queries on one PULL source, then one query per
    URL:SIZE:COUNT with default options (no spool, no caps) until COUNT arrive."""
    from pyspark.sql import functions as F

    say(event="load-errors", errors=load_errors(spark))
    for i, spec in enumerate(streams):
        url, size, count = spec.rsplit(":", 2)
        goal = int(count)
        totals = {"n": 0, "bytes": 0, "ids": 0, "lo": None, "hi": 0, "batches": 0}

        def on_batch(df, batch_id: int, totals=totals) -> None:  # type: ignore[no-untyped-def]
            row = df.agg(F.count("*").alias("n"), F.sum(F.length("payload")).alias("b"),
                         F.sum(F.substring("payload", 1, 8).cast("string").cast("long")).alias("d"),
                         F.min("seq").alias("lo"), F.max("seq").alias("hi")).collect()[0]
            if row.n:
                totals["n"] += row.n
                totals["bytes"] += row.b
                totals["ids"] += row.d
                totals["lo"] = row.lo if totals["lo"] is None else min(totals["lo"], row.lo)
                totals["hi"] = max(totals["hi"], row.hi)
                totals["batches"] += 1

        df = spark.readStream.format("nanopy").option("url", url).load()
        query = (df.writeStream.foreachBatch(on_batch)
                 .option("checkpointLocation", os.path.join(workdir, f"ck{i}"))
                 .trigger(processingTime="0 seconds").start())
        second_error = None
        if i == 0:  # a second query on the same PULL source is refused
            # ... once the first holds it (its first trigger, which reports progress,
            # made its receiver): started together, either could be the one refused
            waited = time.monotonic() + 180
            while query.isActive and query.lastProgress is None and time.monotonic() < waited:
                query.awaitTermination(0.2)
            second = (df.writeStream.format("noop").option("checkpointLocation", os.path.join(workdir, "ck-2nd"))
                      .trigger(processingTime="0 seconds").start())
            try:
                second.awaitTermination(180)
                second_error = str(second.exception())
            except Exception as exc:  # noqa: BLE001 - the refusal, reported to the test
                second_error = str(exc)
            finally:
                second.stop()
            second_error = next((line for line in second_error.splitlines() if "already reads" in line),
                                second_error[:300])
        t0 = time.perf_counter()
        say(event="started", url=url, size=int(size), count=goal, second_query=second_error)
        while query.isActive and totals["n"] < goal:
            query.awaitTermination(0.5)
        seconds = time.perf_counter() - t0
        latest = None
        waited = time.monotonic() + 60
        while query.isActive and time.monotonic() < waited:
            # The last batch's rows are counted inside it; its progress is posted after
            # it ends (a run of one batch has none before): wait for it.
            progress = query.lastProgress
            latest = progress["sources"][0].get("latestOffset") if progress else None
            if latest and json.loads(latest).get("seq", 0) >= goal:
                break
            query.awaitTermination(0.2)
        error = str(query.exception()) if not query.isActive else None
        peaks = rss_peaks(os.getpid())  # while this query's source runner lives
        query.stop()
        say(event="stream", url=url, size=int(size), totals=totals, seconds=seconds, error=error,
            latest=json.loads(latest) if latest else None, peaks_kib=peaks)


def frames(spark, workdir: str, url: str, count: str) -> None:  # type: ignore[no-untyped-def]
    """The source on a libzmq PUSH (zmtp+tcp): every row's payload and frames, in one line."""
    goal = int(count)
    rows: list[list[object]] = []

    def on_batch(df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        for r in df.select("payload", "parts", "seq").collect():
            parts = None if r.parts is None else [bytes(p).hex() for p in r.parts]
            rows.append([bytes(r.payload).hex(), parts, r.seq])

    query = (spark.readStream.format("nanopy").option("url", url).load().writeStream.foreachBatch(on_batch)
             .option("checkpointLocation", os.path.join(workdir, "ck")).trigger(processingTime="0 seconds")
             .start())
    say(event="started")
    while query.isActive and len(rows) < goal:
        query.awaitTermination(0.5)
    error = str(query.exception()) if not query.isActive else None
    query.stop()
    say(event="frames", rows=rows, error=error)


def main() -> None:
    master, scenario, *args = sys.argv[1:]
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark = session(master)
    try:
        scenarios = {"stream": stream, "basics": basics, "executor-kill": executor_kill, "defaults": defaults,
                     "frames": frames}
        scenarios[scenario](spark, *args)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
