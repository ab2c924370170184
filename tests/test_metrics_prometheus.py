"""A real Prometheus server (Debian's ``prometheus`` package) scrapes
``nanopy.metrics.serve`` every 200 ms while 1,000 sockets open, talk and close:
read back through its HTTP API, no counter ever went down (``resets()`` and the raw
samples agree) and the number of series stayed bounded (churn added none).

Prometheus runs on loopback with a config and a storage directory of its own, on a
free port, and is ended by its PID; without the binary the test is skipped, except
under CI, where it must be installed (README's CI command installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

import nanopy
import nanopy.metrics

pytestmark = pytest.mark.interop

SCRAPE_SECONDS = 0.2
SOCKETS = 1000
PER_ROUND = 8  # sockets opened and closed per round (between two waits for a scrape)
NAMES = ("churn-a", "churn-b")  # named sockets share these; the others have no name


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not installed; CI installs it (apt-get install prometheus: README.md)")
        pytest.skip("Debian's prometheus is not installed (apt-get install prometheus)")
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Prometheus:
    """One Prometheus server on loopback, scraping one target; its HTTP API."""

    def __init__(self, binary: str, target: str, workdir: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = os.path.join(workdir, "prometheus.yml")
        with open(config, "w") as f:
            f.write(
                "global:\n"
                f"  scrape_interval: {int(SCRAPE_SECONDS * 1000)}ms\n"
                f"  scrape_timeout: {int(SCRAPE_SECONDS * 1000)}ms\n"
                "scrape_configs:\n"
                "  - job_name: nanopy\n"
                f"    static_configs: [{{targets: ['{target}']}}]\n"
            )
        self.log = open(os.path.join(workdir, "prometheus.log"), "wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={os.path.join(workdir, 'data')}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )

    def stop(self) -> None:
        self.proc.terminate()  # (by its PID)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()

    def logged(self) -> str:
        with open(self.log.name, "rb") as f:
            return f.read().decode("utf-8", "replace")[-3000:]

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"prometheus exited ({self.proc.returncode}):\n{self.logged()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.05)  # (polling a server that has no readiness event to wait on)
        pytest.fail(f"prometheus not ready in {timeout} s:\n{self.logged()}")

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=10) as r:
                answer = json.load(r)
        except urllib.error.HTTPError as exc:
            pytest.fail(f"{promql}: {exc}: {exc.read().decode('utf-8', 'replace')}")
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def last_scrape(self) -> float:
        """When the target was last scraped (epoch seconds; 0 before the first)."""
        got = self.query('timestamp(up{job="nanopy"})')  # (of the sample: not of a comparison's result)
        return float(got[0]["value"][1]) if got else 0.0

    def wait_scrape_after(self, moment: float, timeout: float = 10.0) -> float:
        """Wait for a scrape later than ``moment`` (a scrape's timestamp, or now); returns its timestamp."""
        deadline = time.monotonic() + timeout
        while (last := self.last_scrape()) <= moment:
            if time.monotonic() > deadline:
                pytest.fail(f"no scrape after {moment} within {timeout} s:\n{self.logged()}")
            time.sleep(SCRAPE_SECONDS / 4)  # (polling: Prometheus has no event to wait on)
        return last


@pytest.fixture
def prometheus() -> Iterator[tuple[Prometheus, nanopy.metrics.MetricsServer]]:
    binary = prometheus_binary()
    workdir = tempfile.mkdtemp(prefix="nanopy-prometheus-")
    server = nanopy.metrics.serve("127.0.0.1:0")
    prom = Prometheus(binary, f"127.0.0.1:{server.port}", workdir)
    try:
        prom.wait_ready()
        yield prom, server
    finally:
        prom.stop()
        server.close()
        shutil.rmtree(workdir, ignore_errors=True)


def churn_round(first: int) -> list[nanopy.Socket]:
    """PER_ROUND sockets: a PUSH/PULL pair that talks (inproc or tcp), a PUB that
    sends to nobody, a REQ or a REP; named (two names) or not. Returned open."""
    made = []
    for i in range(first, first + PER_ROUND, 4):
        opts = {"name": NAMES[i // 4 % 2]} if i // 4 % 3 == 0 else {}
        url = "tcp://127.0.0.1:0" if i // 4 % 2 else f"inproc://churn-{os.getpid()}-{i}"
        pull = nanopy.Socket("pull", recv_timeout=5, **opts)
        push = nanopy.Socket("push", **opts)
        push.connect(pull.bind(url).url)
        for n in range(i % 7 + 1):
            push.send(b"m" * n)
        assert len(pull.recv_batch(8, timeout=5)) >= 1
        pub = nanopy.Socket("pub", **opts)
        pub.send(b"to nobody")
        made += [push, pull, pub, nanopy.Socket("req" if i % 8 else "rep", **opts)]
    return made


def run_churn(scraped: threading.Event, failures: list[BaseException]) -> None:
    """Open and close SOCKETS sockets, a round's sockets closed after the next round
    opened (so every scrape finds some alive, some just closed); every 64 sockets,
    wait until a scrape saw the churn so far."""
    try:
        previous: list[nanopy.Socket] = []
        for first in range(0, SOCKETS, PER_ROUND):
            made = churn_round(first)
            for sock in previous:
                sock.close(linger=0)
            previous = made
            if first % (PER_ROUND * 8) == PER_ROUND * 7:
                assert scraped.wait(10), "no scrape for 10 s"
                scraped.clear()
        for sock in previous:
            sock.close(linger=0)
    except BaseException as exc:  # pragma: no cover - reported by the test
        failures.append(exc)


@pytest.mark.timeout(60)
def test_prometheus_sees_no_counter_go_down_through_socket_churn(
    prometheus: tuple[Prometheus, nanopy.metrics.MetricsServer],
) -> None:
    prom, server = prometheus
    prom.wait_scrape_after(0.0)
    before = {(s.labels["socket"], s.labels["protocol"]) for s in nanopy.metrics.collect()}
    start = time.time()
    last = prom.wait_scrape_after(start)
    scraped = threading.Event()
    failures: list[BaseException] = []
    worker = threading.Thread(target=run_churn, args=(scraped, failures))
    worker.start()
    while worker.is_alive():
        last = prom.wait_scrape_after(last)
        scraped.set()
    worker.join()
    assert not failures, failures
    end = time.time()
    final = nanopy.metrics.collect()
    prom.wait_scrape_after(end)
    window = f"{int(time.time() - start) + 2}s"

    raw = prom.query(f'{{job="nanopy", __name__=~"nanopy_.+"}}[{window}]')  # every sample of the churn

    # Prometheus' own verdict: no counter reset in any series over the whole churn
    # (one query per counter: resets() drops the metric name).
    counters = {series["metric"]["__name__"] for series in raw} | {s.family + "_total" for s in final}
    for name in sorted(n for n in counters if n.endswith("_total")):
        resets = prom.query(f'resets({name}{{job="nanopy"}}[{window}]) > 0')
        assert resets == [], f"{name} went down: {resets}"

    # Scrapes covered the churn (one may time out on a busy machine: it adds no sample,
    # it cannot lower one); the raw samples agree with resets(), series by series.
    (up,) = prom.query(f'up{{job="nanopy"}}[{window}]')
    scrapes = sum(v == "1" for _, v in up["values"])
    assert scrapes >= 10 and scrapes >= len(up["values"]) * 3 // 4, f"scrapes (1 = ok): {up['values']}"
    for series in raw:
        if series["metric"]["__name__"].endswith("_total"):
            values = [float(v) for _, v in series["values"]]
            assert values == sorted(values), f"{series['metric']} went down: {values}"

    # Bounded: every series Prometheus saw is one nanopy still exports (none came and
    # went), and the churn added at most its own label sets, not one per socket.
    assert len(raw) == len(final), (len(raw), len(final))
    label_sets = {(s["metric"]["socket"], s["metric"]["protocol"]) for s in raw}
    churn = {(name, protocol) for name in (*NAMES, "(unnamed)") for protocol in ("push", "pull", "pub", "req", "rep")}
    assert label_sets <= before | churn
    assert len(label_sets - before) <= len(churn)

    # What Prometheus holds last is what nanopy counted.
    sent = prom.query('sum(nanopy_messages_sent_total{job="nanopy", protocol="push"})')
    assert float(sent[0]["value"][1]) == sum(
        s.value for s in final if s.family == "nanopy_messages_sent" and s.labels["protocol"] == "push"
    )
    print(f"\nprometheus: {scrapes} scrapes in {end - start:.1f} s of churn ({SOCKETS} sockets), "
          f"{len(raw)} series ({len(label_sets)} label sets), {sum(len(s['values']) for s in raw)} samples, no reset")
