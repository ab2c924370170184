"""The task side of the coordinator: a picklable handle used inside Spark tasks."""

from __future__ import annotations

import os
import pickle
import socket as _stdsocket
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..core.errors import Timeout


class CoordinatorLost(TimeoutError):
    """The coordinator did not answer in time: the driver is gone or unreachable."""


class CoordinatorRefused(RuntimeError):
    """The coordinator does not know this task's token (a stale handle)."""


def worker_label(partition: int | None, attempt: int | None) -> str:
    label = f"{_stdsocket.gethostname()}:{os.getpid()}"
    if partition is not None:
        label += f"/p{partition}"
        if attempt:
            label += f".{attempt}"
    return label


def _task_context() -> tuple[int | None, int | None]:
    try:
        from pyspark import TaskContext
    except ImportError:  # usable outside Spark too
        return None, None
    ctx = TaskContext.get()
    if ctx is None:
        return None, None
    return ctx.partitionId(), ctx.attemptNumber()


class TaskClient:
    """What a Spark task needs to pull work from a :class:`Coordinator`.

    It holds only plain values (URL, token, settings), so closures capture it
    freely; the nanopy socket is created inside the task, in the worker process,
    and closed when the task ends -- also when it fails, which hands the task's
    leased items straight back to the coordinator.
    """

    def __init__(self, url: str, token: str, chunk_size: int = 64, timeout: float = 30.0,
                 max_message: int = 64 << 20) -> None:
        self.url = url
        self.token = token
        self.max_message = max_message
        self.chunk_size = chunk_size
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"<nanopy.spark.TaskClient {self.url}>"

    def run(self, fn: Callable[[Any], Any], *, batch: bool = False) -> int:
        """Process items until the coordinator says done (or cancelled).

        ``fn(item)`` returns the item's result; with ``batch=True`` ``fn`` gets a
        list of items and returns a list of results. Returns the number of items
        this task processed. An exception from ``fn`` propagates (the task fails,
        its leases return to the queue, Spark may retry it).

        Raises:
            CoordinatorLost: no answer within ``timeout`` seconds.
        """
        from ..socket.socket import Socket

        partition, attempt = _task_context()
        hello: str | None = worker_label(partition, attempt)
        processed = 0
        results: list[tuple[int, Any]] = []
        rid = 0
        sock = Socket("pair", name="nanopy-spark-task", send_timeout=self.timeout,
                      recv_timeout=self.timeout, reconnect_interval=0.05,
                      reconnect_interval_max=1.0, recv_max_size=self.max_message)
        token = self.token.encode()
        try:
            sock.connect(self.url)
            while True:
                rid += 1
                request = token + pickle.dumps((rid, hello, results, self.chunk_size),
                                               protocol=pickle.HIGHEST_PROTOCOL)
                hello = None
                kind, payload = self._exchange(sock, rid, request)
                results = []
                if kind == "items":
                    if batch:
                        values = fn([item for _, item in payload])
                        results = [(item_id, v) for (item_id, _), v in zip(payload, values, strict=True)]
                    else:
                        results = [(item_id, fn(item)) for item_id, item in payload]
                    processed += len(results)
                elif kind == "wait":
                    time.sleep(payload)
                elif kind in ("done", "cancelled"):
                    return processed
                elif kind == "refused":
                    raise CoordinatorRefused(f"coordinator at {self.url} refused this task: {payload}")
                else:  # pragma: no cover - a newer coordinator?
                    raise RuntimeError(f"unexpected coordinator answer {kind!r}")
        finally:
            sock.close(linger=0)

    def _exchange(self, sock: Any, rid: int, request: bytes) -> tuple[str, Any]:
        try:
            sock.send(request)
            deadline = time.monotonic() + self.timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Timeout("recv timed out")
                got_rid, kind, payload = pickle.loads(sock.recv(timeout=left))
                if got_rid == rid or kind == "refused":  # skip late answers to earlier requests
                    return kind, payload
        except Timeout:
            raise CoordinatorLost(
                f"no answer from the nanopy coordinator at {self.url} within {self.timeout}s; "
                "the driver may have stopped or be unreachable from this executor"
            ) from None

    def process(self, fn: Callable[[Any], Any], *, batch: bool = False) -> Iterator[tuple[str, int]]:
        """For ``mapPartitions``: run :meth:`run` and yield one ``(worker, count)`` row."""
        partition, attempt = _task_context()
        count = self.run(fn, batch=batch)
        yield (worker_label(partition, attempt), count)
