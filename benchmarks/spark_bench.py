"""Throughput of the nanopy Spark source and of the Coordinator (local[N] or a cluster).

    .venv/bin/python benchmarks/spark_bench.py [--messages 1000000] [--size 1024] [--items 20000] \
        [--master spark://127.0.0.1:7077] [--spool]
    .venv/bin/python benchmarks/spark_bench.py --compare --skip-coordinator   # the scaling curve

Source: a producer *process* pushes N messages (``size`` bytes, an 8-digit id
first) as fast as PUSH allows; a streaming query reads them through
``format("nanopy")`` with default options (``--spool``: a spoolPath) and a
foreachBatch sink aggregates each micro-batch in the JVM (count, sum of ids, seq
range). Reported: messages/s from the first to the last message delivered into
micro-batches, with a check that all N arrived exactly once.

``--compare`` runs the source benchmark with local[1], local[2] and a standalone
cluster of two 1-core workers on loopback (started as the cluster tests start it),
one after the other in the same run, and prints the curve.

Coordinator: 20,000 trivial items over the master's default parallelism in tasks, after a warm-up run;
reported in items/s for a few chunk sizes.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import threading
import time

import nanopy
import nanopy.spark
import nanopy.testing

PRODUCER = r"""
import sys, time, nanopy, nanopy.testing
url, size = sys.argv[1], int(sys.argv[2])
pad = b"x" * max(0, size - 8)
with nanopy.Socket("push", bind=url, send_buffer=65536, linger=30) as push:
    nanopy.testing.wait_pipes(push, 1, 120)
    sys.stdout.write("connected\n"); sys.stdout.flush()
    i = 0
    send = push.send
    for line in sys.stdin:
        n = int(line)
        t0 = time.perf_counter()
        for i in range(i, i + n):
            send(b"%08d" % i + pad)
        i += 1
        sys.stdout.write(f"sent {n} in {time.perf_counter() - t0:.3f}s\n"); sys.stdout.flush()
"""


def bench_source(spark, n: int, size: int, max_batch: int, spool: bool, extra: dict[str, str]) -> dict:
    from pyspark.sql import functions as F

    url = f"tcp://127.0.0.1:{_free_port()}"
    producer = subprocess.Popen([sys.executable, "-c", PRODUCER, url, str(size)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    work = tempfile.mkdtemp(prefix="nanopy-bench-")
    stats = {"count": 0, "idsum": 0, "last": None, "ranges": [], "batches": 0}
    lock = threading.Lock()
    goal = {"n": 0}
    done = threading.Event()

    def on_batch(df, batch_id):
        ident = F.substring("payload", 1, 8).cast("string").cast("long")
        row = df.agg(F.count("*").alias("n"), F.sum(ident).alias("d"),
                     F.min("seq").alias("lo"), F.max("seq").alias("hi")).collect()[0]
        now = time.perf_counter()
        with lock:
            if row.n:
                stats["batches"] += 1
                stats["count"] += row.n
                stats["idsum"] += row.d
                stats["ranges"].append((row.lo, row.hi))
                stats["last"] = now
            if stats["count"] >= goal["n"]:
                done.set()

    def send(k: int) -> None:
        done.clear()
        goal["n"] += k
        producer.stdin.write(f"{k}\n")
        producer.stdin.flush()

    try:
        reader = spark.readStream.format("nanopy").option("url", url)
        if max_batch:
            reader = reader.option("maxRecordsPerBatch", str(max_batch))
        if spool:
            reader = reader.option("spoolPath", os.path.join(work, "spool"))
        for key, value in extra.items():
            reader = reader.option(key, value)
        query = (reader.load()
                 .writeStream.foreachBatch(on_batch)
                 .option("checkpointLocation", os.path.join(work, "ck"))
                 .trigger(processingTime="0 seconds").start())
        assert producer.stdout.readline().strip() == "connected"
        warm = 20_000  # batches through the whole path (every executor) before timing
        send(warm)
        producer.stdout.readline()
        assert done.wait(120), "warm-up messages did not arrive"
        with lock:
            stats.update(count=0, idsum=0, batches=0)
            goal["n"] = 0
        t0 = time.perf_counter()
        send(n)
        sent = producer.stdout.readline().strip()
        done.wait(300)
        elapsed = stats["last"] - t0 if stats["last"] else float("nan")
        phases: dict[str, list[int]] = {}
        for progress in query.recentProgress:
            if progress.get("numInputRows"):
                for key, ms in progress.get("durationMs", {}).items():
                    phases.setdefault(key, []).append(ms)
        timed = stats["batches"]
        query.stop()
        ranges = sorted(stats["ranges"])
        contiguous = all(b[0] == a[1] + 1 for a, b in itertools.pairwise(ranges))
        return {
            "messages": n, "size": size, "delivered": stats["count"],
            # producer ids are 0..warm+n-1: their sum proves none lost or repeated given the count
            "ids_sum_ok": stats["idsum"] == (warm + n) * (warm + n - 1) // 2 - warm * (warm - 1) // 2,
            "contiguous_seq": contiguous and ranges[0][0] == 1 and ranges[-1][1] == n + warm,
            "batches": stats["batches"], "seconds": round(elapsed, 3),
            "msgs_per_s": round(stats["count"] / elapsed) if stats["last"] else 0,
            "producer": sent,
            "median_ms": {k: sorted(v)[len(v) // 2] for k, v in sorted(phases.items())},
            "batch_ms": phases.get("triggerExecution", [])[-timed:],
        }
    finally:
        producer.kill()
        producer.wait()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_coordinator(spark, items: int, chunk: int) -> dict:
    coord = nanopy.spark.Coordinator(range(items), chunk_size=chunk, progress=False)
    t0 = time.perf_counter()
    results = coord.map(spark, _square, tasks=2)
    elapsed = time.perf_counter() - t0
    assert results == [i * i for i in range(items)]
    return {"items": items, "chunk": chunk, "seconds": round(elapsed, 3),
            "items_per_s": round(items / elapsed), "per_worker": coord.per_worker()}


def _square(x: int) -> int:
    return x * x


def compare(args: argparse.Namespace) -> None:
    """One subprocess per master, the cluster started here and stopped by PID."""
    import ast

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from spark_cluster import standalone_cluster

    base = [sys.executable, os.path.abspath(__file__), "--skip-coordinator", "--messages", str(args.messages),
            "--size", str(args.size), "--max-batch", str(args.max_batch)] + (["--spool"] if args.spool else [])
    for o in args.option:
        base += ["--option", o]
    for c in args.conf:
        base += ["--conf", c]
    curve = {}

    def run(master: str) -> None:
        out = subprocess.run([*base, "--master", master], capture_output=True, text=True, timeout=1800)
        line = next((x for x in out.stdout.splitlines() if x.startswith("source ")), None)
        if line is None:
            print(f"{master}: failed\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}", flush=True)
            return
        result = ast.literal_eval(line[len("source "):])
        curve[master] = result
        print(f"{master}: {result}", flush=True)

    print(f"load average before: {os.getloadavg()}", flush=True)
    for master in args.masters.split(","):
        if master != "cluster":
            run(master)
            continue
        with tempfile.TemporaryDirectory(prefix="nanopy-bench-cluster-") as work, \
                standalone_cluster(work) as cluster:
            run(cluster.master_url)
    print(f"load average after: {os.getloadavg()}", flush=True)
    print(f"\n{args.messages} x {args.size} B, default source options"
          f"{' + spoolPath' if args.spool else ''}{' + ' + ', '.join(args.option) if args.option else ''}:")
    for master, r in curve.items():
        ok = r["delivered"] == args.messages and r["ids_sum_ok"] and r["contiguous_seq"]
        name = "cluster (2 workers x 1 core)" if master.startswith("spark://") else master
        print(f"  {name:30s} {r['msgs_per_s']:>9,} msgs/s  {r['batches']:>3} batches  "
              f"{'all arrived' if ok else 'CHECK FAILED'}  addBatch median {r['median_ms'].get('addBatch')} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--max-batch", type=int, default=0, help="maxRecordsPerBatch (default: the source's)")
    ap.add_argument("--spool", action="store_true", help="give the source a spoolPath")
    ap.add_argument("--compare", action="store_true",
                    help="the source with local[1], local[2] and a 2-worker cluster, same run")
    ap.add_argument("--masters", default="local[1],local[2],cluster",
                    help="with --compare: which of local[N] and cluster to run, in order")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark setting, e.g. spark.locality.wait=0")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="another source option, e.g. maxPartitionBytes=8388608")
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--skip-source", action="store_true")
    ap.add_argument("--skip-coordinator", action="store_true")
    ap.add_argument("--master", default="local[2]",
                    help="Spark master URL, e.g. spark://127.0.0.1:7077 (default local[2])")
    args = ap.parse_args()
    if args.compare:
        compare(args)
        return
    conf = dict(c.split("=", 1) for c in args.conf)
    if args.master.startswith("spark://"):
        conf.setdefault("spark.cores.max", "2")
    spark = nanopy.spark.local_session(args.master, **conf)
    try:
        print(f"load average before: {os.getloadavg()}", flush=True)
        if not args.skip_coordinator:
            bench_coordinator(spark, 2000, 64)  # warm the Python workers
            for chunk in (16, 64, 256):
                print("coordinator", bench_coordinator(spark, args.items, chunk), flush=True)
        if not args.skip_source:
            extra = dict(o.split("=", 1) for o in args.option)
            print("source", bench_source(spark, args.messages, args.size, args.max_batch, args.spool, extra),
                  flush=True)
        print(f"load average after: {os.getloadavg()}", flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
