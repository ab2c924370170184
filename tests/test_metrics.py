"""nanopy.metrics with the real client libraries: prometheus_client (its registry and its
text parser), the OpenTelemetry SDK (InMemoryMetricReader), a scrape of the HTTP endpoint
and ``nanopy stat``."""

from __future__ import annotations

import itertools
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import bind_url, wait_until

import nanopy
import nanopy.metrics
from nanopy._cli import stat as stat_cli
from nanopy.core.drops import DROP_REASONS
from nanopy.testing import connect_pair

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

MakeSocket = Callable[..., nanopy.Socket]
UNNAMED_PUB = {"socket": "(unnamed)", "protocol": "pub"}
_tests = itertools.count()


def unnamed_pub_no_peer() -> float:
    """What the unnamed PUBs' series counts as no_peer drops now (0 before any)."""
    got = series(nanopy.metrics.render())
    return got.get(("nanopy_messages_dropped_total", frozenset({**UNNAMED_PUB, "reason": "no_peer"}.items())), 0.0)


@pytest.fixture
def traffic(make_socket: MakeSocket) -> Any:
    """A named PUB feeding a named SUB (3 kept, 2 unsubscribed), and an unnamed PUB
    that sent 4 messages to nobody. Names are new in each test: a series keeps
    counting for the life of the process."""
    n = next(_tests)
    pub = make_socket("pub", name=f"feed-{n}")
    sub = make_socket("sub", name=f"client-{n}", recv_timeout=5)
    sub.subscribe(b"a")
    connect_pair(pub, sub, bind_url("inproc", "metrics"))
    for body in (b"a1", b"b1", b"a2", b"b2", b"a3"):
        pub.send(body)
    assert [sub.recv() for _ in range(3)] == [b"a1", b"a2", b"a3"]
    before = unnamed_pub_no_peer()
    lonely = make_socket("pub")
    for _ in range(4):
        lonely.send(b"x")
    return pub, sub, lonely, before


def series(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition, parsed by prometheus_client, keyed by name and labels."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(parsed: dict[Any, float], name: str, **labels: str) -> float:
    return parsed[(name, frozenset(labels.items()))]


def check_traffic(parsed: dict[Any, float], traffic: Any) -> None:
    pub, sub, lonely, before = traffic
    feed = {"socket": pub.name, "protocol": "pub"}
    client = {"socket": sub.name, "protocol": "sub"}
    assert value(parsed, "nanopy_messages_sent_total", **feed) == 5
    assert value(parsed, "nanopy_bytes_sent_total", **feed) == 10
    assert value(parsed, "nanopy_messages_received_total", **client) == 3
    assert value(parsed, "nanopy_bytes_received_total", **client) == 6
    assert value(parsed, "nanopy_messages_dropped_total", reason="unsubscribed", **client) == 2
    assert value(parsed, "nanopy_pipes", **feed) == 1
    assert value(parsed, "nanopy_queued_messages", direction="in", **client) == 0
    assert value(parsed, "nanopy_queued_messages", direction="out", **feed) == 0
    assert value(parsed, "nanopy_reconnects_total", **client) == 0
    assert value(parsed, "nanopy_protocol_errors_total", **client) == 0
    assert value(parsed, "nanopy_connects_total", **client) == 1
    # Unnamed sockets share one series per protocol.
    assert value(parsed, "nanopy_messages_dropped_total", **UNNAMED_PUB, reason="no_peer") == before + 4
    for reason in DROP_REASONS:  # every reason is exported, zeros included
        assert ("nanopy_messages_dropped_total",
                frozenset({**feed, "reason": reason}.items())) in parsed


def test_prometheus_collector(traffic: Any) -> None:
    pub, sub, lonely, before = traffic
    registry = prometheus_client.CollectorRegistry()
    collector = nanopy.metrics.register_prometheus(registry)
    assert nanopy.metrics.register_prometheus(registry) is collector  # idempotent
    parsed = series(prometheus_client.generate_latest(registry).decode())
    check_traffic(parsed, traffic)
    # A closed socket's counts stay in its series; its gauges leave it.
    lonely.close()
    pub.close()
    parsed = series(prometheus_client.generate_latest(registry).decode())
    assert value(parsed, "nanopy_messages_dropped_total", **UNNAMED_PUB, reason="no_peer") >= before + 4
    feed = {"socket": pub.name, "protocol": "pub"}
    assert value(parsed, "nanopy_messages_sent_total", **feed) == 5
    assert value(parsed, "nanopy_pipes", **feed) == 0
    registry.unregister(collector)


def test_opentelemetry_instruments(traffic: Any) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    pub, sub, lonely, before = traffic
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    instruments = nanopy.metrics.instrument(provider)
    assert nanopy.metrics.instrument(provider) is instruments
    points: dict[tuple[str, frozenset[tuple[str, Any]]], Any] = {}
    kinds = {}
    data = reader.get_metrics_data()
    for resource_metrics in data.resource_metrics:
        for scope in resource_metrics.scope_metrics:
            assert scope.scope.name == "nanopy"
            for metric in scope.metrics:
                kinds[metric.name] = metric.data.is_monotonic
                for point in metric.data.data_points:
                    points[(metric.name, frozenset(point.attributes.items()))] = point.value
    assert kinds["nanopy.messages.sent"] is True and kinds["nanopy.pipes"] is False
    assert set(kinds) >= {"nanopy.messages.sent", "nanopy.messages.received", "nanopy.bytes.sent",
                          "nanopy.bytes.received", "nanopy.messages.dropped", "nanopy.pipes", "nanopy.queued"}
    feed = {"socket": pub.name, "protocol": "pub"}
    client = {"socket": sub.name, "protocol": "sub"}
    assert points[("nanopy.messages.sent", frozenset(feed.items()))] == 5
    assert points[("nanopy.bytes.received", frozenset(client.items()))] == 6
    assert points[("nanopy.messages.dropped", frozenset({**client, "reason": "unsubscribed"}.items()))] == 2
    assert points[("nanopy.pipes", frozenset(client.items()))] == 1
    assert points[("nanopy.queued", frozenset({**client, "direction": "in"}.items()))] == 0
    lonely_attrs = {**UNNAMED_PUB, "reason": "no_peer"}
    assert points[("nanopy.messages.dropped", frozenset(lonely_attrs.items()))] == before + 4
    provider.shutdown()


@pytest.fixture
def server() -> Iterator[nanopy.metrics.MetricsServer]:
    with nanopy.metrics.serve("127.0.0.1:0") as srv:
        yield srv


def test_http_endpoint_scrape(traffic: Any, server: nanopy.metrics.MetricsServer) -> None:
    assert server.url == f"http://127.0.0.1:{server.port}/metrics"
    with urllib.request.urlopen(server.url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        check_traffic(series(response.read().decode()), traffic)
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(server.url.replace("/metrics", "/other"), timeout=10)
    assert info.value.code == 404


def test_serve_close_frees_the_port_and_addresses_are_checked() -> None:
    srv = nanopy.metrics.serve(("127.0.0.1", 0))
    port = srv.port
    srv.close()
    srv.close()  # idempotent
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))  # free again
    for bad in ("9464", ":9464", "localhost:http"):
        with pytest.raises(ValueError, match="127.0.0.1"):
            nanopy.metrics.serve(bad)
    with pytest.raises(TypeError):
        nanopy.metrics.serve(9464)  # type: ignore[arg-type]


def test_render_escapes_label_values(make_socket: MakeSocket) -> None:
    make_socket("push", name='say "hi"\\\n')
    parsed = series(nanopy.metrics.render())
    assert value(parsed, "nanopy_pipes", socket='say "hi"\\\n', protocol="push") == 0


def test_nanopy_stat_once(traffic: Any, server: nanopy.metrics.MetricsServer,
                          capsys: pytest.CaptureFixture[str]) -> None:
    pub, sub, lonely, before = traffic
    assert stat_cli.main([f"127.0.0.1:{server.port}", "--once"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header[:5] == ["SOCKET", "PROTO", "PIPES", "SENT", "RECV"]
    rows = {tuple(line.split()[:2]): line for line in lines[1:]}
    assert rows[(pub.name, "pub")].split()[2:5] == ["1", "5", "0"]
    assert rows[(sub.name, "sub")].split()[2:5] == ["1", "0", "3"]
    assert rows[(sub.name, "sub")].endswith("unsubscribed=2")
    assert f"no_peer={before + 4:.0f}" in rows[("(unnamed)", "pub")]


def test_nanopy_stat_refreshes_with_rates(traffic: Any, server: nanopy.metrics.MetricsServer,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert stat_cli.main([server.url, "--count", "2", "--interval", "0.05"]) == 0
    tables = capsys.readouterr().out.strip().split("\n\n")
    assert len(tables) == 2
    first, second = ({line.split()[0]: line.split() for line in t.splitlines()[2:]} for t in tables)
    feed = traffic[0].name
    assert first[feed][5] == "-" and second[feed][5] == "0"  # SENT/s: known from the second table on


def test_nanopy_stat_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    assert stat_cli.main([f"http://127.0.0.1:{port}", "--once", "--timeout", "2"]) == 1
    assert "can't read" in capsys.readouterr().err


def test_nanopy_stat_is_a_command() -> None:
    from nanopy.__main__ import COMMANDS

    assert COMMANDS["stat"][0] == "nanopy._cli.stat:main"


def test_missing_extras_name_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"pip install 'nanopy\[prometheus\]'"):
        nanopy.metrics.register_prometheus()
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ImportError, match=r"pip install 'nanopy\[otel\]'"):
        nanopy.metrics.instrument()


def test_a_scrape_during_traffic_stays_consistent(make_socket: MakeSocket) -> None:
    # Collecting while messages flow: every sample is a number, no socket is skipped.
    push, pull = make_socket("push", name="busy-push"), make_socket("pull", name="busy-pull")
    connect_pair(pull, push, bind_url("tcp", "busy"))
    for i in range(2000):
        push.send(b"%d" % i)
        if i % 500 == 0:
            names = {s.labels["socket"] for s in nanopy.metrics.collect()}
            assert {"busy-push", "busy-pull"} <= names
    got = pull.recv_batch(2000, timeout=5)
    while len(got) < 2000:
        got += pull.recv_batch(2000, timeout=5)
    wait_until(lambda: value(series(nanopy.metrics.render()), "nanopy_messages_received_total",
                             socket="busy-pull", protocol="pull") == 2000, what="2000 counted")
