"""PUSH -> PULL throughput, measured at the receiver.

Parent side: :func:`measure` runs one (system, api, transport, size) cell once.
Worker side (``python throughput.py '<json>'``): roles ``recv`` (PULL, binds),
``send`` (PUSH, connects) and ``inproc`` (both, as two threads of one process).

Method: the sender sends as fast as it can until told to stop. The receiver
counts every message; from its first message it waits ``warmup`` seconds, then
marks (time, CPU, count), waits ``duration`` seconds and marks again -- the rate
is the count difference over the time difference. Only then is the sender
stopped; it sends a short end marker, and the receiver drains everything to it,
so the run also proves that every message sent was received exactly once. The
sender samples its own CPU time every 20 ms so the parent can cut the same window
out of it (CLOCK_MONOTONIC is shared by all processes).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (
    END,
    Commands,
    Sampler,
    emit,
    interpolate,
    loadavg,
    make_url,
    open_socket,
    remove_ipc,
    run_workers,
    split_variant_system,
    start_watchdog,
    worker_args,
)

CHUNK = 64  # messages between checks of the clock / stop flag (same for every system)
BATCH = 256  # messages per send_batch / most per recv_batch (the ``batch`` api: nanopy only)
_INF = float("inf")


# -- timed loops (identical for every system) ------------------------------------------


class _Window:
    """Marks (time, CPU, count) at the end of warmup and of the timed window.

    Checked once every 64 messages, so it costs nothing measurable per message.
    """

    def __init__(self, t_first: float, n: int, warmup: float, duration: float, on_window: Callable[[], None]) -> None:
        self.marks: list[tuple[float, float, int]] = []
        self.deadline = t_first + warmup if n else -1.0
        self.duration = duration
        self.on_window = on_window

    def check(self, n: int) -> None:
        t = time.monotonic()
        if t >= self.deadline:
            self.marks.append((t, time.process_time(), n))
            if len(self.marks) == 1:
                self.deadline = t + self.duration
            else:
                self.deadline = _INF
                self.on_window()


def recv_sync(recv: Callable[[], bytes], size: int, warmup: float, duration: float, on_window: Callable[[], None]) -> dict[str, Any]:
    m = recv()
    t_first = time.monotonic()
    n = 1 if len(m) == size else 0
    window = _Window(t_first, n, warmup, duration, on_window)
    while n:
        m = recv()
        if len(m) != size:
            break
        n += 1
        if not n & 63:
            window.check(n)
    return {"received": n, "marks": window.marks, "t_first": t_first, "end_ok": m == END}


async def recv_trio(arecv: Any, size: int, warmup: float, duration: float, on_window: Callable[[], None]) -> dict[str, Any]:
    m = await arecv()
    t_first = time.monotonic()
    n = 1 if len(m) == size else 0
    window = _Window(t_first, n, warmup, duration, on_window)
    while n:
        m = await arecv()
        if len(m) != size:
            break
        n += 1
        if not n & 63:
            window.check(n)
    return {"received": n, "marks": window.marks, "t_first": t_first, "end_ok": m == END}


def send_sync(send: Callable[[bytes], Any], msg: bytes, flags: Any, sampler: Sampler) -> int:
    monotonic = time.monotonic
    chunk = range(CHUNK)
    n = 0
    while not flags.stop:
        for _ in chunk:
            send(msg)
        n += CHUNK
        sampler.maybe(monotonic(), n)
    send(END)
    sampler.force(n)
    return n


async def send_trio(asend: Any, msg: bytes, flags: Any, sampler: Sampler) -> int:
    monotonic = time.monotonic
    chunk = range(CHUNK)
    n = 0
    while not flags.stop:
        for _ in chunk:
            await asend(msg)
        n += CHUNK
        sampler.maybe(monotonic(), n)
    await asend(END)
    sampler.force(n)
    return n


def recv_batches(recv_batch: Callable[[int], list[bytes]], size: int, warmup: float, duration: float,
                 on_window: Callable[[], None]) -> dict[str, Any]:
    """The ``batch`` api (nanopy): ``recv_batch(BATCH)``, the window checked once per batch."""
    got = recv_batch(BATCH)
    t_first = time.monotonic()
    n = 0
    window = _Window(t_first, 1 if len(got[0]) == size else 0, warmup, duration, on_window)
    while True:
        for m in got:
            if len(m) != size:  # the end marker: everything before it is counted
                return {"received": n, "marks": window.marks, "t_first": t_first, "end_ok": m == END}
            n += 1
        window.check(n)
        got = recv_batch(BATCH)


def send_batches(send_batch: Callable[[list[bytes]], Any], msg: bytes, flags: Any, sampler: Sampler) -> int:
    """The ``batch`` api (nanopy): ``send_batch`` of ``BATCH`` messages at a time."""
    monotonic = time.monotonic
    batch = [msg] * BATCH
    n = 0
    while not flags.stop:
        send_batch(batch)
        n += BATCH
        sampler.maybe(monotonic(), n)
    send_batch([END])
    sampler.force(n)
    return n


def _receive(sock: Any, api: str, size: int, warmup: float, duration: float, on_window: Callable[[], None]) -> dict[str, Any]:
    if api == "sync":
        return recv_sync(sock.recv, size, warmup, duration, on_window)
    if api == "batch":
        return recv_batches(sock.recv_batch, size, warmup, duration, on_window)
    import trio

    return trio.run(recv_trio, sock.arecv, size, warmup, duration, on_window)


def _send(sock: Any, api: str, size: int, flags: Any, sampler: Sampler) -> int:
    msg = b"m" * size
    if api == "sync":
        return send_sync(sock.send, msg, flags, sampler)
    if api == "batch":
        return send_batches(sock.send_batch, msg, flags, sampler)
    import trio

    return trio.run(send_trio, sock.asend, msg, flags, sampler)


# -- worker roles -------------------------------------------------------------------------


def worker_main() -> None:
    args = worker_args()
    start_watchdog(args["timeout"])
    role, system, api = args["role"], args["system"], args["api"]
    sender, receiver = split_variant_system(system)
    size, warmup, duration = args["size"], args["warmup"], args["duration"]
    try:
        if role == "recv":
            sock = open_socket(receiver, "pull", args["url"], bind=True)
            emit("ready", url=sock.url)
            res = _receive(sock, api, size, warmup, duration, lambda: emit("window"))
            emit("done", **res)
            sock.close()
        elif role == "send":
            cmds = Commands()
            sock = open_socket(sender, "push", args["url"], bind=False)
            sampler = Sampler()
            n = _send(sock, api, size, cmds, sampler)
            emit("sent", sent=n, samples=sampler.samples)
            cmds.exit.wait(args["timeout"])
            sock.close()
        elif role == "inproc":
            _inproc(args, system, api, size, warmup, duration)
        else:
            raise ValueError(role)
    except BaseException as exc:  # noqa: BLE001 -- reported to the parent, which fails the run
        emit("error", message=f"{type(exc).__name__}: {exc}")
        sys.stdout.flush()
        os._exit(2)
    sys.stdout.flush()
    os._exit(0)  # skip library atexit hooks: everything was already received and closed


def _inproc(args: dict[str, Any], system: str, api: str, size: int, warmup: float, duration: float) -> None:
    flags = SimpleNamespace(stop=False)
    rsock = open_socket(system, "pull", args["url"], bind=True)
    ssock = open_socket(system, "push", rsock.url, bind=False)
    out: dict[str, Any] = {}
    sampler = Sampler()

    def on_window() -> None:
        flags.stop = True

    def receiver() -> None:
        try:
            out["recv"] = _receive(rsock, api, size, warmup, duration, on_window)
        except BaseException as exc:  # noqa: BLE001 -- ends the run with an error event
            out["error"] = f"receiver: {type(exc).__name__}: {exc}"
            flags.stop = True

    def sender() -> None:
        try:
            out["sent"] = _send(ssock, api, size, flags, sampler)
        except BaseException as exc:  # noqa: BLE001 -- ends the run with an error event
            out["error"] = f"sender: {type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=receiver, daemon=True), threading.Thread(target=sender, daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if "error" in out:
        raise RuntimeError(out["error"])
    emit("done", **out["recv"])
    emit("sent", sent=out["sent"], samples=sampler.samples)
    ssock.close()
    rsock.close()


# -- parent side ----------------------------------------------------------------------------


def measure(system: str, api: str, transport: str, size: int, warmup: float, duration: float) -> dict[str, Any]:
    """Run one throughput measurement; returns a result record (raises WorkerError)."""
    url = make_url(transport, f"tp{size}")
    common = {"system": system, "api": api, "size": size, "warmup": warmup, "duration": duration}
    timeout = warmup + duration + 20.0
    common["timeout"] = timeout
    load = loadavg()
    try:
        if transport == "inproc":
            workers = run_workers(("throughput.py", "inproc", {**common, "url": url}), None, {}, timeout)
            recv_w = send_w = workers["inproc"]
        else:
            workers = run_workers(
                ("throughput.py", "recv", {**common, "url": url}),
                ("throughput.py", "send", common),
                {("recv", "window"): ("send", "stop"), ("recv", "done"): ("send", "exit")},
                timeout,
            )
            recv_w, send_w = workers["recv"], workers["send"]
    finally:
        remove_ipc(url)
    done = recv_w.event("done")
    sent = send_w.event("sent")
    if done is None or sent is None:
        raise RuntimeError(f"missing events: recv={recv_w.events} send={send_w.events}")
    marks = done["marks"]
    if len(marks) < 2:
        raise RuntimeError("the receiver never completed its timed window")
    (t0, c0, n0), (t1, c1, n1) = marks[0], marks[1]
    elapsed = t1 - t0
    msgs = n1 - n0
    cpu = cpu_recv = c1 - c0
    samples = sent["samples"]
    cpu_send = None
    if transport != "inproc":  # inproc: the process CPU already covers both threads
        cpu_send = interpolate(samples, t1, 1) - interpolate(samples, t0, 1)
        cpu += cpu_send
    sender_rate = (interpolate(samples, t1, 2) - interpolate(samples, t0, 2)) / elapsed
    complete = done["received"] == sent["sent"] and done["end_ok"]
    return {
        "test": "throughput",
        "system": system,
        "api": api,
        "transport": transport,
        "mode": "thread" if transport == "inproc" else "proc",
        "size": size,
        "msgs_per_s": msgs / elapsed,
        "mb_per_s": msgs * size / elapsed / 1e6,
        "cpu_us_per_msg": cpu / msgs * 1e6,
        # Per process (tcp/ipc): which end is the busier one.
        "cpu_recv_us_per_msg": cpu_recv / msgs * 1e6 if cpu_send is not None else None,
        "cpu_send_us_per_msg": cpu_send / msgs * 1e6 if cpu_send is not None else None,
        "sender_msgs_per_s": sender_rate,
        "window_s": elapsed,
        "window_msgs": msgs,
        "sent": sent["sent"],
        "received": done["received"],
        "complete": complete,
        "loadavg": load,
    }


if __name__ == "__main__":
    worker_main()
