"""Shared pieces of the benchmark suite: system adapters, worker plumbing, statistics.

A *variant* is one (system, api) pair: ``nanopy/sync``, ``nanopy/trio``,
``pynng/sync``, ``pynng/trio``, ``pyzmq/sync``. Every adapter opens a socket that
offers ``send(bytes)`` / ``recv() -> bytes`` (and ``asend``/``arecv`` for the trio
api), so the timed loops are the same code for every system.

Workers are separate Python processes started by ``run.py``; they talk to the
parent with one JSON object per line on stdout and read commands (``stop``,
``exit``) from stdin. Every worker has its own watchdog that ends the process
if the parent forgets it.
"""

from __future__ import annotations

import importlib
import itertools
import json
import math
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

VARIANTS: list[tuple[str, str]] = [
    ("nanopy", "sync"),
    ("nanopy", "trio"),
    ("nanopy", "batch"),  # send_batch / recv_batch (throughput cells only)
    ("pynng", "sync"),
    ("pynng", "trio"),
    ("pyzmq", "sync"),
]

END = b"E"  # end marker: shorter than any measured payload


def variant_name(system: str, api: str) -> str:
    return f"{system}/{api}"


# -- adapters (imported lazily so a worker loads only its own system) --------------


class _ZmqSocket:
    """pyzmq socket with the send/recv/close shape the loops use."""

    def __init__(self, kind: str, url: str, bind: bool) -> None:
        import zmq

        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket({"push": zmq.PUSH, "pull": zmq.PULL, "pair": zmq.PAIR}[kind])
        zmtp = url.startswith("zmtp+")  # a zmtp cell: URLs between workers keep the prefix
        url = url.removeprefix("zmtp+")
        if bind:
            if url.startswith("tcp://") and url.endswith(":0"):
                url = url[:-1] + "*"
            self._sock.bind(url)
            self.url = self._sock.getsockopt_string(zmq.LAST_ENDPOINT) if not url.startswith("inproc") else url
        else:
            self._sock.connect(url)
            self.url = url
        if zmtp:
            self.url = "zmtp+" + self.url
        # Bound methods: the hot loops call these directly.
        self.send = self._sock.send
        self.recv = self._sock.recv

    def close(self) -> None:
        self._sock.close(linger=0)


class _NngSocket:
    def __init__(self, kind: str, url: str, bind: bool) -> None:
        import pynng

        cls = {"push": pynng.Push0, "pull": pynng.Pull0, "pair": pynng.Pair0}[kind]
        self._sock = cls()
        if bind:
            listener = self._sock.listen(url)
            if url.startswith("tcp://"):
                # str() of the address is right; its .port is byte-swapped in pynng 0.9.
                host, _, port = str(listener.local_address).rpartition(":")
                self.url = f"tcp://{host}:{port}"
            else:
                self.url = url
        else:
            self._sock.dial(url, block=False)
            self.url = url
        self.send = self._sock.send
        self.recv = self._sock.recv
        self.asend = self._sock.asend
        self.arecv = self._sock.arecv

    def close(self) -> None:
        self._sock.close()


class _NanopySocket:
    def __init__(self, kind: str, url: str, bind: bool) -> None:
        import nanopy

        self._sock = nanopy.Socket(kind)
        if bind:
            self.url = self._sock.bind(url).url
        else:
            self._sock.connect(url)
            self.url = url
        self.send = self._sock.send
        self.recv = self._sock.recv
        self.asend = self._sock.asend
        self.arecv = self._sock.arecv
        self.send_batch = self._sock.send_batch  # (the ``batch`` api, throughput only)
        self.recv_batch = self._sock.recv_batch

    def close(self) -> None:
        self._sock.close(linger=0)


def open_socket(system: str, kind: str, url: str, bind: bool) -> Any:
    """Open a ``kind`` ("push", "pull", "pair") socket of ``system``, bound or connected."""
    if system == "nanopy":
        return _NanopySocket(kind, url, bind)
    if system == "pynng":
        return _NngSocket(kind, url, bind)
    if system == "pyzmq":
        return _ZmqSocket(kind, url, bind)
    raise ValueError(f"unknown system {system!r}")


def versions() -> dict[str, str]:
    """Versions of everything measured (imported in the parent only)."""
    out = {"python": sys.version.split()[0]}
    probes: list[tuple[str, Callable[[Any], dict[str, str]]]] = [
        ("nanopy", lambda m: {"nanopy": getattr(m, "__version__", "?")}),
        ("pynng", lambda m: {"pynng": m.__version__}),
        ("zmq", lambda m: {"pyzmq": m.__version__, "libzmq": m.zmq_version()}),
        ("trio", lambda m: {"trio": m.__version__}),
    ]
    for module, describe in probes:
        try:
            out.update(describe(importlib.import_module(module)))
        except ImportError:  # pragma: no cover - that system is simply not measured
            pass
    return out


# -- worker side -----------------------------------------------------------------------


def emit(event: str, **data: Any) -> None:
    """Send one event line to the parent."""
    sys.stdout.write(json.dumps({"event": event, **data}) + "\n")
    sys.stdout.flush()


def start_watchdog(seconds: float) -> None:
    """Hard-exit this worker after ``seconds`` whatever it is doing."""

    def fire() -> None:
        sys.stderr.write(f"worker watchdog fired after {seconds}s\n")
        sys.stderr.flush()
        os._exit(3)

    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()


class Commands:
    """Reads ``stop`` / ``exit`` lines from stdin in a daemon thread."""

    def __init__(self) -> None:
        self.stop = False  # polled by hot loops (a plain attribute read)
        self.exit = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "stop":
                self.stop = True
            elif cmd == "exit":
                self.stop = True
                self.exit.set()
        self.stop = True
        self.exit.set()


class Sampler:
    """(monotonic, process CPU, count) samples, so the parent can cut any window."""

    def __init__(self, every: float = 0.02) -> None:
        self.every = every
        self.samples: list[tuple[float, float, int]] = []
        self.last = 0.0
        self.force(0)

    def maybe(self, t: float, n: int) -> None:
        if t - self.last >= self.every:
            self.samples.append((t, time.process_time(), n))
            self.last = t

    def force(self, n: int) -> None:
        t = time.monotonic()
        self.samples.append((t, time.process_time(), n))
        self.last = t


def interpolate(samples: list[list[float]], t: float, column: int = 1) -> float:
    """Linear interpolation of ``column`` of time-ordered samples at time ``t``."""
    if not samples:
        return float("nan")
    if t <= samples[0][0]:
        return samples[0][column]
    for (ta, *ra), (tb, *rb) in itertools.pairwise(samples):
        if ta <= t <= tb:
            va, vb = ra[column - 1], rb[column - 1]
            if tb == ta:
                return vb
            return va + (vb - va) * (t - ta) / (tb - ta)
    return samples[-1][column]


def worker_args() -> dict[str, Any]:
    return json.loads(sys.argv[1])


# -- parent side -------------------------------------------------------------------------


class WorkerError(RuntimeError):
    pass


@dataclass
class Worker:
    """One worker process; events arrive on the shared queue as (role, dict | None)."""

    role: str
    proc: subprocess.Popen
    stderr: Any
    events: list[dict[str, Any]] = field(default_factory=list)
    eof: bool = False

    def command(self, cmd: str) -> None:
        try:
            self.proc.stdin.write(cmd + "\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError, ValueError):
            pass

    def stderr_text(self) -> str:
        try:
            self.stderr.seek(0)
            return self.stderr.read()[-2000:]
        except (OSError, ValueError):
            return ""

    def event(self, name: str) -> dict[str, Any] | None:
        for ev in self.events:
            if ev.get("event") == name:
                return ev
        return None


def spawn(script: str, role: str, args: dict[str, Any], q: queue.Queue) -> Worker:
    """Start ``python script '<json args>'`` and pump its stdout lines into ``q``."""
    err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 -- closed in run_workers' finally
    cmd = [sys.executable, os.path.join(HERE, script), json.dumps({**args, "role": role})]
    profile_dir = os.environ.get("NANOPY_BENCH_PYSPY")
    if profile_dir:
        # Profiling mode (benchmarks/profiling.py): py-spy runs the worker as its child.
        out = os.path.join(profile_dir, f"{args.get('system')}-{args.get('api')}-{role}.txt")
        pyspy = os.path.join(os.path.dirname(sys.executable), "py-spy")
        cmd = [pyspy, "record", "-f", "raw", "-F", "-t", "-r", "500", "--nonblocking", "-o", out, "--", *cmd]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
        bufsize=1,
    )
    worker = Worker(role, proc, err)

    def pump() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            line = line.strip()
            if not line:
                continue
            try:
                q.put((role, json.loads(line)))
            except ValueError:
                q.put((role, {"event": "noise", "text": line}))
        q.put((role, None))

    threading.Thread(target=pump, daemon=True).start()
    return worker


def run_workers(
    first: tuple[str, str, dict[str, Any]],
    second: tuple[str, str, dict[str, Any]] | None,
    relays: dict[tuple[str, str], tuple[str, str]],
    timeout: float,
) -> dict[str, Worker]:
    """Run one measurement: start ``first`` (the binding side), wait for its ``ready``
    event (which carries the real ``url``), start ``second`` with that url, relay
    events to commands (``(role, event) -> (role, command)``) until both exit.

    Every process is killed by PID when the run ends, whatever happened.

    Raises:
        WorkerError: a worker failed, reported an error, or the run timed out.
    """
    q: queue.Queue = queue.Queue()
    workers: dict[str, Worker] = {}
    deadline = time.monotonic() + timeout
    try:
        script, role, args = first
        workers[role] = spawn(script, role, args, q)
        started_second = second is None
        while not all(w.eof for w in workers.values()) or not started_second:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError(f"timed out after {timeout:.0f}s; events so far: {_brief(workers)}")
            try:
                role, ev = q.get(timeout=left)
            except queue.Empty:
                continue
            w = workers[role]
            if ev is None:
                w.eof = True
                if not started_second:
                    raise WorkerError(f"{role} exited before it was ready: {w.stderr_text()}")
                continue
            w.events.append(ev)
            name = ev.get("event")
            if name == "error":
                raise WorkerError(f"{role}: {ev.get('message')}")
            if name == "ready" and not started_second:
                assert second is not None
                s_script, s_role, s_args = second
                workers[s_role] = spawn(s_script, s_role, {**s_args, "url": ev["url"]}, q)
                started_second = True
            target = relays.get((role, str(name)))
            if target is not None and target[0] in workers:
                workers[target[0]].command(target[1])
        for w in workers.values():
            try:
                w.proc.wait(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                pass
        for w in workers.values():
            if w.proc.returncode not in (0, None):
                raise WorkerError(f"{w.role} exited with {w.proc.returncode}: {w.stderr_text()}")
        return workers
    finally:
        for w in workers.values():
            if w.proc.poll() is None:
                w.proc.kill()  # by PID: only the process we started
                try:
                    w.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            for stream in (w.proc.stdin, w.proc.stdout):
                try:
                    stream.close()  # type: ignore[union-attr]
                except OSError:
                    pass  # a broken pipe to a killed worker
            w.stderr.close()


def _brief(workers: dict[str, Worker]) -> str:
    return "; ".join(
        f"{r}: {[e.get('event') for e in w.events]} {w.stderr_text()[-300:]!r}" for r, w in workers.items()
    )


_ipc_counter = iter(range(1 << 30))


def make_url(transport: str, tag: str) -> str:
    """A bind URL for ``transport`` (tcp binds port 0; the worker reports the real one)."""
    if transport == "tcp":
        return "tcp://127.0.0.1:0"
    if transport == "ipc":
        return f"ipc://{tempfile.gettempdir()}/npbench-{os.getpid()}-{tag}-{next(_ipc_counter)}.ipc"
    if transport == "inproc":
        return f"inproc://npbench-{tag}-{next(_ipc_counter)}"
    if transport == "zmtp":
        # ZeroMQ's wire: nanopy speaks it on zmtp+tcp://; libzmq reads the URL without the prefix.
        return "zmtp+tcp://127.0.0.1:0"
    raise ValueError(transport)


def split_variant_system(system: str) -> tuple[str, str]:
    """(sender, receiver) of a system name: ``"nanopy"`` is both ends, ``"nanopy>pyzmq"``
    a nanopy sender and a pyzmq receiver (zmtp cells only: the two speak ZMTP)."""
    sender, _, receiver = system.partition(">")
    return sender, receiver or sender


def remove_ipc(url: str) -> None:
    if url.startswith("ipc://"):
        try:
            os.unlink(url[len("ipc://") :])
        except OSError:
            pass


# -- statistics ---------------------------------------------------------------------------


def median(values: list[float]) -> float:
    vals = sorted(v for v in values if not math.isnan(v))
    if not vals:
        return float("nan")
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, round(p / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[k]


def loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # pragma: no cover
        return float("nan")


def now_utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


Callback = Callable[[], None]
