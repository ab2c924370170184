"""nanopy + Spark end to end: a streaming pipeline and a coordinated batch job.

    .venv/bin/pip install -e '.[spark]'        # pyspark, pyarrow; needs Java 17
    .venv/bin/python examples/spark_pipeline.py [--messages 50000] [--items 20000] \
        [--master spark://127.0.0.1:7077]

1. Two producers PUSH ``--messages`` readings ("sensor,value") in total.
2. A Structured Streaming query reads them with ``format("nanopy")`` (PULL, with
   a spool), parses them, keeps a running count and sum per sensor, and writes
   the totals after every micro-batch (complete mode) with ``format("nanopy")`` (PUSH) to a consumer.
3. The consumer drops repeated messages by their tag, keeps the newest total per
   sensor, and checks that the counts add up to every message sent and that the
   sums match what the producers sent.
4. A :class:`nanopy.spark.Coordinator` hands ``--items`` work items to Spark
   tasks in chunks, with a live progress bar on stderr, and checks each result.

The script ends by printing the counts it verified.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import threading
import time

try:
    import pyspark  # noqa: F401  (the spark extra)
except ImportError:
    sys.exit("This demo needs the spark extra (PySpark 4, pyarrow) and Java 17: "
             ".venv/bin/pip install '.[spark]'")

import nanopy
import nanopy.spark
from nanopy.spark import Coordinator, Deduplicator

SENSORS = 8


def produce(push: nanopy.Socket, first: int, count: int) -> None:
    for i in range(first, first + count):
        push.send(b"sensor-%d,%d" % (i % SENSORS, i))


def expected_totals(n: int) -> dict[str, tuple[int, int]]:
    totals = {f"sensor-{s}": [0, 0] for s in range(SENSORS)}
    for i in range(n):
        entry = totals[f"sensor-{i % SENSORS}"]
        entry[0] += 1
        entry[1] += i
    return {k: (c, s) for k, (c, s) in totals.items()}


def consume(pull: nanopy.Socket, n: int, latest: dict[str, tuple[int, int]], done: threading.Event) -> None:
    """Keep the newest (count, sum) per sensor until the counts reach ``n``."""
    dedup = Deduplicator()
    while sum(c for c, _ in latest.values()) < n:
        try:
            payload = dedup.accept(pull.recv(timeout=1.0))
        except nanopy.Timeout:
            continue
        except nanopy.Closed:
            return
        if payload is None:
            continue
        sensor, count, total = payload.decode().split(",")
        if int(count) > latest.get(sensor, (0, 0))[0]:
            latest[sensor] = (int(count), int(total))
    done.set()


def streaming_pipeline(spark, n: int, workdir: str) -> dict[str, tuple[int, int]]:
    latest: dict[str, tuple[int, int]] = {}
    done = threading.Event()
    with nanopy.Socket("push", bind="tcp://127.0.0.1:0", send_buffer=n) as p1, \
            nanopy.Socket("push", bind="tcp://127.0.0.1:0", send_buffer=n) as p2, \
            nanopy.Socket("pull", bind="tcp://127.0.0.1:0") as results:
        sources = ",".join(p.endpoints[0].url for p in (p1, p2))
        readings = (spark.readStream.format("nanopy")
                    .option("urls", sources)                      # connect to both producers
                    .option("spoolPath", os.path.join(workdir, "spool"))
                    .option("maxRecordsPerBatch", "20000")
                    .load())
        totals = (readings
                  .selectExpr("split(cast(payload as string), ',') as f")
                  .selectExpr("f[0] as sensor", "cast(f[1] as long) as value")
                  .groupBy("sensor")
                  .agg({"value": "sum", "*": "count"})
                  .selectExpr("cast(concat_ws(',', sensor, `count(1)`, `sum(value)`) as binary) as payload"))
        query = (totals.writeStream.format("nanopy").outputMode("complete")
                 .option("url", results.endpoints[0].url)
                 .option("checkpointLocation", os.path.join(workdir, "checkpoint"))
                 .trigger(processingTime="0 seconds").start())
        consumer = threading.Thread(target=consume, args=(results, n, latest, done), daemon=True)
        consumer.start()
        try:
            from nanopy.testing import wait_pipes

            wait_pipes(p1, 1, 120)
            wait_pipes(p2, 1, 120)
            half = n // 2
            producers = [threading.Thread(target=produce, args=(p1, 0, half)),
                         threading.Thread(target=produce, args=(p2, half, n - half))]
            t0 = time.monotonic()
            for t in producers:
                t.start()
            for t in producers:
                t.join()
            deadline = time.monotonic() + 300
            while not done.wait(0.5):
                if not query.isActive:  # fail fast with Spark's reason
                    raise SystemExit(f"the streaming query stopped: {query.exception()}")
                if time.monotonic() > deadline:
                    raise SystemExit(f"timed out: counts reached {sum(c for c, _ in latest.values())} of {n}")
            query.processAllAvailable()  # let the last micro-batch commit before stopping
            print(f"stream: {n} messages counted through source -> aggregate -> sink "
                  f"in {time.monotonic() - t0:.1f}s", flush=True)
        finally:
            query.stop()
    return latest


def work(item: int) -> str:
    """A small CPU-bound task: a few rounds of hashing."""
    digest = str(item).encode()
    for _ in range(20):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()[:12]


def coordinated_job(spark, items: int) -> int:
    coord = Coordinator(range(items), chunk_size=64, progress=True, name="hashing")
    t0 = time.monotonic()
    results = coord.map(spark, work)
    elapsed = time.monotonic() - t0
    bad = sum(1 for i, r in enumerate(results) if r != work(i))
    if bad or len(results) != items:
        raise SystemExit(f"coordinator: {bad} wrong results")
    print(f"coordinator: {items} items in {elapsed:.1f}s ({items / elapsed:,.0f}/s), "
          f"per task {coord.per_worker()}", flush=True)
    return items


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--master", default="local[2]",
                    help="Spark master URL, e.g. spark://127.0.0.1:7077 (default local[2])")
    args = ap.parse_args()
    spark = nanopy.spark.local_session(args.master, "nanopy-example")  # also registers "nanopy"
    try:
        with tempfile.TemporaryDirectory(prefix="nanopy-spark-") as workdir:
            latest = streaming_pipeline(spark, args.messages, workdir)
        expected = expected_totals(args.messages)
        if latest != expected:
            raise SystemExit(f"mismatch: got {latest}, expected {expected}")
        done = coordinated_job(spark, args.items)
    finally:
        spark.stop()
    print(f"verified: {sum(c for c, _ in latest.values())}/{args.messages} messages "
          f"(counts and sums of {len(latest)} sensors match), {done}/{args.items} coordinator "
          "results exactly once")


if __name__ == "__main__":
    main()
