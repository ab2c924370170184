"""The driver-side job coordinator: hands work items to Spark tasks over nanopy.

Wire protocol (private to nanopy.spark; pickled tuples over PAIR v0):

* task -> coordinator: the run's 16-byte token, then a pickled
  ``(rid, hello, results, want)`` where ``hello`` is a
  worker label on the first request of a connection (else ``None``), ``results``
  a list of ``(item_id, value)`` and ``want`` how many new items it can take.
* coordinator -> task: ``(rid, kind, payload)`` with kind ``"items"`` (a list of
  ``(item_id, item)``), ``"wait"`` (seconds to wait before asking again: nothing
  is free now but leased items may come back), ``"done"``, ``"cancelled"`` or
  ``"refused"`` (a wrong token: the task belongs to another coordinator run).
  The token is checked *before* anything is unpickled, so a stray peer on the
  port cannot make the driver unpickle its bytes.

Leases: every item handed out is leased to that connection with a deadline of
``lease_timeout`` seconds, renewed by each request of the connection. When the
connection drops (the task failed, was killed, or closed its socket) its leased
items go straight back to the queue; when a deadline passes (a hung task) they do
too. Results are keyed by item id and the first one wins, so a redone item counts
once.
"""

from __future__ import annotations

import hmac
import logging
import pickle
import secrets
import socket as _stdsocket
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any, TextIO

from ..core.errors import AddressError, Closed, Timeout
from ..socket.socket import Socket
from ..transports._registry import carries_multipart
from ._client import TaskClient
from ._hub import ensure_registered
from ._progress import ProgressBar

log = logging.getLogger("nanopy.spark")

_PID = "!I"


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _spark_driver_address() -> tuple[str | None, str | None]:
    """``(spark.driver.host, spark.driver.bindAddress)`` of the running SparkContext.

    Looks only if pyspark is already imported (a coordinator without Spark, or
    before the session exists, binds loopback).
    """
    if "pyspark" not in sys.modules:
        return None, None
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        return None, None
    conf = sc.getConf()
    return conf.get("spark.driver.host"), conf.get("spark.driver.bindAddress")


class Coordinator:
    """Serve work items to Spark tasks from the driver, with leases and progress.

    Args:
        items: the work items (any picklable objects); consumed at once.
        chunk_size: items handed out per request (bigger = less overhead, more
            work redone when a task dies).
        lease_timeout: seconds a task may hold items without contacting the
            coordinator before they are handed to someone else.
        bind: the URL to listen on. Default: with a SparkContext running, its
            ``spark.driver.bindAddress`` (else ``spark.driver.host``), the address
            Spark's own executors already reach; without one, ``127.0.0.1``. All
            interfaces (``tcp://0.0.0.0:0``) only when you pass them here. A
            ``zmtp+`` URL is refused (:class:`nanopy.AddressError`): tasks speak SP.
        port: the TCP port of the default bind address (default 0: any free
            port); fix it when a firewall lets only known ports through.
        advertise: the host name tasks should dial (default: ``spark.driver.host``
            with a SparkContext running, else the bound host, or this machine's
            name when bound to a wildcard address).
        progress: show the live progress line on ``progress_stream`` (stderr).
        task_timeout: seconds a task waits for an answer before giving up with
            :class:`CoordinatorLost` (the coordinator vanished).
        max_message: the largest request or answer in bytes (a chunk of items or
            results); raise it for big items or lower ``chunk_size``.

    Use as a context manager (or call :meth:`start` / :meth:`close`); inside,
    hand :meth:`client` to the Spark tasks, or let :meth:`map` run the job.
    """

    def __init__(
        self,
        items: Iterable[Any],
        *,
        chunk_size: int = 64,
        lease_timeout: float = 60.0,
        bind: str | None = None,
        port: int = 0,
        advertise: str | None = None,
        progress: bool = True,
        progress_stream: TextIO | None = None,
        task_timeout: float = 30.0,
        max_message: int = 64 << 20,
        name: str = "coordinator",
    ) -> None:
        if chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        self._items: list[Any] = list(items)
        self.total = len(self._items)
        self.chunk_size = chunk_size
        self.lease_timeout = float(lease_timeout)
        self.task_timeout = float(task_timeout)
        self.max_message = max_message
        if bind is not None and port:
            raise ValueError("pass either bind (a full URL) or port, not both")
        if bind is not None and carries_multipart(bind):
            raise AddressError(
                f"Coordinator(bind={bind!r}): zmtp+ URLs are for ZeroMQ peers, and the coordinator's "
                "peers are nanopy tasks speaking single-frame SP messages; bind tcp://, tls+tcp://, "
                "ws:// or ipc:// instead"
            )
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be 0..65535, got {port}")
        self._bind = bind
        self._port = port
        self._advertise = advertise
        self._show_progress = progress
        self._progress_stream = progress_stream
        self.name = name
        self._token = secrets.token_hex(8)
        self._token_bytes = self._token.encode()
        self._pending: deque[int] = deque(range(self.total))
        self._results: dict[int, Any] = {}
        self._owner: dict[int, int] = {}  # item id -> pipe id holding its lease
        self._leases: dict[int, dict[int, float]] = {}  # pipe id -> {item id: deadline}
        self._labels: dict[int, str] = {}  # pipe id -> worker label
        self._per_worker: dict[str, int] = {}  # label -> results accepted
        self._dropped_pipes: deque[int] = deque()
        self.duplicates = 0  # results for items already done (redone work)
        self.requeued = 0  # items put back after a lost connection or lease expiry
        self.cancelled = False
        self._done_event = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: Socket | None = None
        self.url: str | None = None
        self._bar: ProgressBar | None = None
        self._error: BaseException | None = None
        if self.total == 0:
            self._done_event.set()

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> Coordinator:
        """Bind the socket and start serving in a background thread."""
        if self._thread is not None:
            return self
        sock = Socket(ensure_registered(), name=self.name, recv_buffer=4096,
                      recv_max_size=self.max_message)
        sock.on_pipe_removed(lambda pipe: self._dropped_pipes.append(pipe.id))
        if self._bind is None:
            driver_host, bind_address = _spark_driver_address()
            host = bind_address or driver_host or "127.0.0.1"
            self._bind = f"tcp://{_bracket(host)}:{self._port}"
            self._advertise = self._advertise or driver_host
        try:
            ep = sock.bind(self._bind)
        except BaseException:
            sock.close(linger=0)
            raise
        self._sock = sock
        self.url = self._public_url(ep.url)
        if self._show_progress:
            self._bar = ProgressBar(self.total, self._progress_stream, label=self.name)
        self._thread = threading.Thread(target=self._serve, name=f"nanopy-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _public_url(self, url: str) -> str:
        scheme, _, rest = url.partition("://")
        if scheme not in ("tcp", "tls+tcp", "ws", "wss"):
            return url
        host, _, port = rest.rpartition(":")
        port = port.split("/")[0]
        if self._advertise:
            host = self._advertise
        elif host.strip("[]") in ("0.0.0.0", "::", "*", ""):
            host = _stdsocket.gethostname()
        host = _bracket(host.strip("[]"))
        return f"{scheme}://{host}:{port}"

    def close(self) -> None:
        """Stop serving and close the socket (tasks still running time out)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        if self._sock is not None:
            self._sock.close(linger=0.5)

    def __enter__(self) -> Coordinator:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def cancel(self) -> None:
        """Stop handing out items: tasks are told to stop at their next request."""
        self.cancelled = True
        self._done_event.set()

    # -- for tasks ---------------------------------------------------------------
    def client(self) -> TaskClient:
        """A picklable handle for Spark tasks (holds only the URL and settings)."""
        if self.url is None:
            raise RuntimeError("start the coordinator first (use it as a context manager)")
        return TaskClient(self.url, self._token, self.chunk_size, self.task_timeout, self.max_message)

    # -- results -----------------------------------------------------------------
    @property
    def done(self) -> int:
        return len(self._results)

    def finished(self) -> bool:
        return len(self._results) == self.total

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every item has a result (or :meth:`cancel`); False on timeout."""
        return self._done_event.wait(timeout)

    def results(self) -> list[Any]:
        """The results in item order (raises if some are missing)."""
        if not self.finished():
            missing = self.total - len(self._results)
            raise RuntimeError(f"{missing} of {self.total} items have no result")
        return [self._results[i] for i in range(self.total)]

    def result_map(self) -> dict[int, Any]:
        """Results so far, keyed by item index."""
        return dict(self._results)

    def in_flight(self) -> dict[str, int]:
        """Leased items per worker label."""
        out: dict[str, int] = {}
        for pid, leases in list(self._leases.items()):
            if leases:
                label = self._labels.get(pid, str(pid))
                out[label] = out.get(label, 0) + len(leases)
        return out

    def map(self, spark: Any, fn: Any, *, tasks: int | None = None, batch: bool = False,
            timeout: float | None = None) -> list[Any]:
        """Run ``fn`` over every item on Spark tasks and return the results in order.

        Starts ``tasks`` tasks (default: the context's ``defaultParallelism``), each
        pulling chunks from this coordinator until all items are done. ``spark``
        is a SparkSession or SparkContext. ``batch=True`` calls ``fn`` with a whole
        chunk (a list) and expects a list back.
        """
        sc = getattr(spark, "sparkContext", spark)
        n = tasks or sc.defaultParallelism
        with self:
            client = self.client()
            group = f"nanopy-coordinator-{self._token}"
            rdd = sc.parallelize(range(n), n).mapPartitions(
                lambda _it: client.process(fn, batch=batch)
            )
            job: dict[str, Any] = {}

            def run_job() -> None:
                # Job groups are per thread in PySpark: set it where the action runs.
                sc.setJobGroup(group, f"nanopy coordinator ({self.total} items)", interruptOnCancel=True)
                try:
                    job["rows"] = rdd.collect()
                except BaseException as exc:  # noqa: BLE001 - re-raised below
                    job["error"] = exc

            runner = threading.Thread(target=run_job, name="nanopy-coordinator-job", daemon=True)
            runner.start()
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                while runner.is_alive():
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise Timeout(f"coordinator map did not finish within {timeout}s")
                    runner.join(0.1 if left is None else min(0.1, left))
            except BaseException:  # timeout or Ctrl-C: stop the tasks, then the job
                self.cancel()
                sc.cancelJobGroup(group)
                runner.join(30)
                raise
            if "error" in job and not self.cancelled:
                raise job["error"]
            self.wait(5.0)
        if self.cancelled:
            return [self._results.get(i) for i in range(self.total)]
        return self.results()

    # -- the serving thread --------------------------------------------------------
    def _serve(self) -> None:
        sock = self._sock
        assert sock is not None
        recv_msg = sock.recv_msg
        next_check = time.monotonic() + 0.05
        try:
            while not self._stop.is_set():
                try:
                    msg = recv_msg(timeout=0.05)
                except Timeout:
                    msg = None
                except Closed:
                    return
                if msg is not None:
                    self._handle(sock, msg.pipe.id, msg.body)  # type: ignore[union-attr]
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + 0.05
                    self._housekeeping(now)
        except BaseException as exc:  # pragma: no cover - keep the driver informed
            self._error = exc
            log.exception("%s: serving thread failed", self.name)
        finally:
            if self._bar is not None:
                note = "cancelled" if self.cancelled else ""
                self._bar.finish(len(self._results), self.in_flight(), note)

    def _housekeeping(self, now: float) -> None:
        while self._dropped_pipes:
            pid = self._dropped_pipes.popleft()
            self._release(pid)
            self._labels.pop(pid, None)
        for pid, leases in list(self._leases.items()):
            expired = [i for i, d in leases.items() if d < now]
            for item_id in expired:
                del leases[item_id]
                if self._owner.get(item_id) == pid:
                    del self._owner[item_id]
                    self._pending.appendleft(item_id)
                    self.requeued += 1
        if self._bar is not None:
            flights = self.in_flight()
            note = "" if flights or self._results else "waiting for tasks"
            self._bar.update(len(self._results), flights, note)

    def _release(self, pid: int) -> None:
        """Put a dropped connection's leased items back at the front of the queue."""
        leases = self._leases.pop(pid, None)
        if not leases:
            return
        for item_id in leases:
            if self._owner.get(item_id) == pid:
                del self._owner[item_id]
                if item_id not in self._results:
                    self._pending.appendleft(item_id)
                    self.requeued += 1

    def _handle(self, sock: Socket, pid: int, body: bytes) -> None:
        route = pid.to_bytes(4, "big")
        size = len(self._token_bytes)
        if not hmac.compare_digest(body[:size], self._token_bytes):
            sock.send(route + pickle.dumps((0, "refused", "wrong coordinator token")), timeout=0)
            return
        try:
            rid, hello, results, want = pickle.loads(body[size:])
        except Exception:  # noqa: BLE001 - a broken request must not stop the server
            log.warning("%s: ignoring a malformed request from pipe %d", self.name, pid)
            return
        if hello is not None:
            self._labels[pid] = hello
        leases = self._leases.get(pid)
        if leases is None:
            leases = self._leases[pid] = {}
        if results:
            self._accept(pid, leases, results)
        if self.cancelled:
            sock.send(route + pickle.dumps((rid, "cancelled", None)), timeout=0)
            return
        now = time.monotonic()
        deadline = now + self.lease_timeout
        for item_id in leases:  # any contact renews the connection's leases
            leases[item_id] = deadline
        chunk: list[tuple[int, Any]] = []
        pending = self._pending
        items = self._items
        owner = self._owner
        results_map = self._results
        while pending and len(chunk) < want:
            item_id = pending.popleft()
            if item_id in results_map or item_id in owner:
                continue
            owner[item_id] = pid
            leases[item_id] = deadline
            chunk.append((item_id, items[item_id]))
        reply: tuple[Any, str, Any]
        if chunk:
            reply = (rid, "items", chunk)
        elif len(results_map) == self.total:
            reply = (rid, "done", None)
        else:
            reply = (rid, "wait", 0.05)
        sock.send(route + pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL), timeout=0)

    def _accept(self, pid: int, leases: dict[int, float], results: list[tuple[int, Any]]) -> None:
        results_map = self._results
        owner = self._owner
        accepted = 0
        for item_id, value in results:
            if item_id in results_map:
                self.duplicates += 1
            elif 0 <= item_id < self.total:
                results_map[item_id] = value
                accepted += 1
            leases.pop(item_id, None)
            holder = owner.get(item_id)
            if holder is not None:
                del owner[item_id]
                if holder != pid:  # it was re-leased elsewhere: that lease is moot now
                    other = self._leases.get(holder)
                    if other is not None:
                        other.pop(item_id, None)
        if accepted:
            label = self._labels.get(pid, str(pid))
            self._per_worker[label] = self._per_worker.get(label, 0) + accepted
            if len(results_map) == self.total:
                self._done_event.set()

    def per_worker(self) -> dict[str, int]:
        """Results accepted per worker label (``host:pid/partition.attempt``)."""
        return dict(self._per_worker)

    def __repr__(self) -> str:
        return f"<nanopy.spark.Coordinator {self.url} {len(self._results)}/{self.total}>"

