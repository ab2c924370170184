"""Divide and conquer with a kill signal (the Guide's ventilator, workers and sink).

The ventilator PUSHes tasks (a number of milliseconds of "work") to workers,
which PUSH results to the sink. When the sink has every result it PUBlishes
"KILL" on a control socket; each worker waits on its task and control sockets
at once with a :class:`nanopy.Poller` and stops when the signal arrives.

    python examples/guide/tasks.py [--tasks N] [--workers N]
"""

from __future__ import annotations

import argparse
import random
import threading
import time

import nanopy
from nanopy.testing import wait_pipes


def worker(vent_url: str, sink_url: str, control_url: str, ready: threading.Barrier, done: list[int]) -> None:
    with nanopy.Socket("pull", connect=vent_url) as receiver, nanopy.Socket(
        "push", connect=sink_url
    ) as sender, nanopy.Socket("sub", connect=control_url) as controller:
        controller.subscribe(b"")
        wait_pipes(controller)  # the kill signal must not find us still connecting
        ready.wait()
        poller = nanopy.Poller()
        poller.register(receiver, nanopy.POLLIN)
        poller.register(controller, nanopy.POLLIN)
        handled = 0
        while True:
            events = dict(poller.poll())
            if events.get(receiver, 0) & nanopy.POLLIN:
                workload = int(receiver.recv(timeout=0))
                time.sleep(workload / 1000)  # the "work"
                sender.send(b"%d" % workload)
                handled += 1
            if events.get(controller, 0) & nanopy.POLLIN:
                assert controller.recv(timeout=0) == b"KILL"
                break
        done.append(handled)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--workers", type=int, default=3)
    args = parser.parse_args()

    with nanopy.Socket("push", bind="tcp://127.0.0.1:0") as ventilator, nanopy.Socket(
        "pull", bind="tcp://127.0.0.1:0", recv_timeout=30.0
    ) as sink, nanopy.Socket("pub", bind="tcp://127.0.0.1:0") as control:
        urls = [s.endpoints[0].url for s in (ventilator, sink, control)]
        ready = threading.Barrier(args.workers + 1)
        done: list[int] = []
        workers = [
            threading.Thread(target=worker, args=(*urls, ready, done)) for _ in range(args.workers)
        ]
        for t in workers:
            t.start()
        # Wait until every worker is connected, or the first one gets all the tasks.
        wait_pipes(ventilator, args.workers)
        ready.wait()

        rng = random.Random(7)
        workloads = [rng.randint(1, 10) for _ in range(args.tasks)]
        start = time.monotonic()
        for ms in workloads:
            ventilator.send(b"%d" % ms)
        print(f"Ventilator: sent {args.tasks} tasks, {sum(workloads)} ms of work in total")

        results = 0
        for _ in range(args.tasks):
            results += int(sink.recv())
        elapsed = time.monotonic() - start
        print(f"Sink: {args.tasks} results ({results} ms of work) in {elapsed * 1000:.0f} ms")

        control.send(b"KILL")
        for t in workers:
            t.join()
        print(f"Workers stopped: {len(done)}, tasks handled: {sum(done)} ({sorted(done)})")


if __name__ == "__main__":
    main()
