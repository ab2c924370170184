"""Prometheus semantics of nanopy.metrics, read back with prometheus_client's parser.

Counters never go down for the life of the process: a closed (or renamed, or
garbage-collected) socket's counts stay in its series; sockets without a name share
one series per protocol, so churn adds no series; every SocketStats counter and
every drop reason is exported, by one rule, by both exporters and ``serve``.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import os
import threading
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import bind_url, reap_child, wait_until

import nanopy
import nanopy.metrics
from nanopy.core.drops import DROP_REASONS
from nanopy.core.stats import GAUGE_FIELDS, SocketStats
from nanopy.metrics.families import FAMILIES, NOT_EXPORTED, families_of, field_help
from nanopy.socket.series import UNNAMED, Series, counts_of
from nanopy.testing import wait_pipes

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

MakeSocket = Callable[..., nanopy.Socket]
Parsed = dict[tuple[str, frozenset[tuple[str, str]]], float]
_names = itertools.count()


def fresh(prefix: str) -> str:
    """A socket name no other test used (a series counts for the life of the process)."""
    return f"{prefix}-{os.getpid()}-{next(_names)}"


def scrape(text: str | None = None) -> Parsed:
    """Every sample of an exposition (default: render() now), parsed by prometheus_client."""
    out: Parsed = {}
    for family in text_string_to_metric_families(nanopy.metrics.render() if text is None else text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(parsed: Parsed, name: str, **labels: str) -> float:
    return parsed.get((name, frozenset(labels.items())), 0.0)


def label_sets(parsed: Parsed) -> set[tuple[str, str]]:
    return {(dict(labels)["socket"], dict(labels)["protocol"]) for _, labels in parsed}


# -- monotonic across close -------------------------------------------------------------


def test_sockets_sharing_a_name_sum_and_a_close_takes_nothing_away(make_socket: MakeSocket) -> None:
    # The example: two PUBs named alike sent 5 and 3; one closes.
    name = fresh("w")
    first, second = make_socket("pub", name=name), make_socket("pub", name=name)
    for _ in range(5):
        first.send(b"x")
    for _ in range(3):
        second.send(b"x")
    labels = {"socket": name, "protocol": "pub"}
    assert value(scrape(), "nanopy_messages_sent_total", **labels) == 8
    first.close()
    got = scrape()
    assert value(got, "nanopy_messages_sent_total", **labels) == 8
    assert value(got, "nanopy_messages_dropped_total", reason="no_peer", **labels) == 8
    second.close()
    assert value(scrape(), "nanopy_messages_sent_total", **labels) == 8
    # The series lives on; a new socket of that name adds to it.
    third = make_socket("pub", name=name)
    third.send(b"x")
    got = scrape()
    assert value(got, "nanopy_messages_sent_total", **labels) == 9
    assert value(got, "nanopy_bytes_sent_total", **labels) == 9


def test_a_closed_sockets_pipes_and_traffic_stay_counted(make_socket: MakeSocket, transport: str) -> None:
    name = fresh("pair")
    a, b = make_socket("pair", name=name), make_socket("pair", name=fresh("peer"), recv_timeout=5)
    b.connect(a.bind(bind_url(transport, "closed")).url)
    wait_pipes(a)
    for i in range(10):
        a.send(b"%d" % i)
    assert [b.recv() for _ in range(10)] == [b"%d" % i for i in range(10)]
    labels = {"socket": name, "protocol": "pair"}
    before = scrape()
    assert value(before, "nanopy_pipes", **labels) == 1
    a.close()
    after = scrape()
    for family in ("nanopy_messages_sent_total", "nanopy_bytes_sent_total", "nanopy_connects_total"):
        assert value(after, family, **labels) == value(before, family, **labels) > 0
    assert value(after, "nanopy_disconnects_total", **labels) == 1  # its close ended the pipe: counted
    assert value(after, "nanopy_pipes", **labels) == 0  # a gauge: only live sockets


def test_a_renamed_socket_counts_on_in_its_new_series(make_socket: MakeSocket) -> None:
    old, new = fresh("before"), fresh("after")
    sock = make_socket("pub", name=old)
    sock.send(b"1")
    sock.send(b"2")
    sock.name = new
    sock.send(b"3")
    got = scrape()
    assert value(got, "nanopy_messages_sent_total", socket=old, protocol="pub") == 2
    assert value(got, "nanopy_messages_sent_total", socket=new, protocol="pub") == 1
    sock.close()
    got = scrape()
    assert value(got, "nanopy_messages_sent_total", socket=old, protocol="pub") == 2
    assert value(got, "nanopy_messages_sent_total", socket=new, protocol="pub") == 1


def test_a_socket_collected_without_close_keeps_what_was_read_of_it() -> None:
    name = fresh("forgotten")
    sock = nanopy.Socket("pub", name=name)  # never bound or connected: nothing else holds it
    for _ in range(4):
        sock.send(b"x")
    labels = {"socket": name, "protocol": "pub"}
    assert value(scrape(), "nanopy_messages_sent_total", **labels) == 4
    del sock
    gc.collect()
    got = scrape()
    assert value(got, "nanopy_messages_sent_total", **labels) == 4
    assert value(got, "nanopy_messages_dropped_total", reason="no_peer", **labels) == 4


# -- unnamed sockets: one series per protocol ---------------------------------------------


def test_unnamed_sockets_share_one_series_per_protocol(make_socket: MakeSocket) -> None:
    protocols = ("req", "rep", "push", "pull", "pub", "sub", "pair", "bus", "surveyor", "respondent")
    for protocol in protocols:
        nanopy.Socket(protocol).close()  # (each unnamed series exists from here on)
    before = scrape()
    pubs = value(before, "nanopy_messages_sent_total", socket=UNNAMED, protocol="pub")
    for i in range(200):
        sock = nanopy.Socket(protocols[i % len(protocols)])
        if sock.protocol == "pub":
            sock.send(b"x")
        sock.close()
    after = scrape()
    assert label_sets(after) == label_sets(before)  # no series added by 200 sockets
    assert value(after, "nanopy_messages_sent_total", socket=UNNAMED, protocol="pub") == pubs + 20
    named = make_socket("push", name=fresh("watched"))
    assert label_sets(scrape()) == label_sets(before) | {(named.name, "push")}


def test_concurrent_churn_never_lowers_a_counter(make_socket: MakeSocket) -> None:
    """Sockets open, talk and close on two threads while the main thread scrapes:
    every counter of every series only goes up from one scrape to the next."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn(tag: int) -> None:
        try:
            n = 0
            while not stop.is_set():
                name = None if n % 2 else f"churn-{tag}-{n % 3}"
                opts = {"name": name} if name else {}
                pull = nanopy.Socket("pull", recv_timeout=5, **opts)
                push = nanopy.Socket("push", **opts)
                push.connect(pull.bind(bind_url("inproc" if n % 3 else "tcp", "churn")).url)
                push.send(b"x" * n)
                pull.recv()
                pub = nanopy.Socket("pub", **opts)
                pub.send(b"nobody")
                for sock in (push, pull, pub):
                    sock.close(linger=0)
                n += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    try:
        last: Parsed = {}
        for _ in range(60):
            got = scrape()
            for key, seen in last.items():
                if key[0].endswith("_total"):
                    assert got[key] >= seen, f"{key} went down: {seen} -> {got[key]}"
            last = got
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not errors, errors
    assert value(last, "nanopy_messages_received_total", socket="churn-0-0", protocol="pull") > 0


def test_a_forked_child_starts_its_own_series(make_socket: MakeSocket) -> None:
    parent = make_socket("pub", name=fresh("parent"))
    parent.send(b"x")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            child = nanopy.Socket("pub", name="child")
            child.send(b"y")
            seen = label_sets(scrape())
            code = 0 if seen == {("child", "pub")} else 2
            child.close()
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(reap_child(pid, 20)) == 0
    assert (parent.name, "pub") in label_sets(scrape())


# -- every counter, every reason, both exporters ---------------------------------------------


def test_every_stats_number_is_exported_by_the_rule() -> None:
    by_field = {part[0]: family for family in FAMILIES for part in family.parts}
    docs = field_help()
    for f in dataclasses.fields(SocketStats):
        if f.name in NOT_EXPORTED:
            continue
        family = by_field[f.name]
        assert family.kind == ("gauge" if f.name in GAUGE_FIELDS else "counter")
        assert f.name in docs, f"SocketStats.{f.name} has no line in the docstring (its HELP)"
        assert family.help and "``" not in family.help
    # docs/metrics.md lists every family under its exported name
    text = open(os.path.join(os.path.dirname(__file__), "..", "docs", "metrics.md")).read()
    for family in FAMILIES:
        shown = family.name + ("_total" if family.kind == "counter" else "")
        assert f"`{shown}`" in text, f"docs/metrics.md does not list {shown}"
        assert f"`{family.otel}`" in text, f"docs/metrics.md does not list {family.otel}"
    for reason in DROP_REASONS:
        assert f"| `{reason}` |" in text, f"docs/metrics.md does not explain the drop reason {reason}"


def test_a_new_counter_is_exported_without_another_edit() -> None:
    @dataclass(frozen=True)
    class Later(SocketStats):
        """SocketStats with two more counters, as a later change may add them.

        Attributes:
            widgets_lost: widgets that went missing.
            losses: messages lost, by reason.
        """

        widgets_lost: int = 0
        losses: Mapping[str, int] = field(default_factory=lambda: {"gone": 0, "eaten": 0})

    families = {f.name: f for f in families_of(Later)}
    widgets, losses = families["nanopy_widgets_lost"], families["nanopy_losses"]
    assert (widgets.kind, widgets.otel) == ("counter", "nanopy.widgets_lost")
    assert widgets.help == "Widgets that went missing."
    assert losses.kind == "counter"
    counts = counts_of(Later(widgets_lost=3, losses={"gone": 2, "eaten": 0}))
    series = Series(("s", "push"), counts, {})
    assert list(widgets.values(series)) == [({}, 3)]
    assert list(losses.values(series)) == [({"reason": "gone"}, 2), ({"reason": "eaten"}, 0)]
    assert {f.name for f in families_of(SocketStats)} <= set(families)


def otel_points(provider_reader: Any) -> dict[tuple[str, frozenset[tuple[str, Any]]], Any]:
    points = {}
    for resource_metrics in provider_reader.get_metrics_data().resource_metrics:
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    points[(metric.name, frozenset(point.attributes.items()))] = point.value
    return points


@pytest.mark.parametrize("reason", DROP_REASONS)
def test_each_drop_reason_is_exported_and_stays_after_close(make_socket: MakeSocket, reason: str) -> None:
    # Counted through the engine side's hook, as a dead pipe or an oversized message is;
    # tests/test_drops.py and the ZMTP tests make each reason happen for real.
    sock = make_socket("push", name=fresh(reason))
    sock._driver.count_drop(reason, 2)
    labels = {"socket": sock.name, "protocol": "push", "reason": reason}
    registry = prometheus_client.CollectorRegistry()
    nanopy.metrics.register_prometheus(registry)
    assert value(scrape(prometheus_client.generate_latest(registry).decode()), "nanopy_messages_dropped_total",
                 **labels) == 2
    sock.close()
    assert value(scrape(), "nanopy_messages_dropped_total", **labels) == 2
    assert value(scrape(prometheus_client.generate_latest(registry).decode()), "nanopy_messages_dropped_total",
                 **labels) == 2


def test_every_counter_reads_what_stats_says_in_both_exporters(make_socket: MakeSocket) -> None:
    """A socket with every counter different from 0 (the partition counters set as
    the engine sets them when a pipe ends): each exported value is its stats() field,
    in the text format and in OpenTelemetry, and stays so after the close."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    pull = make_socket("pull", name=fresh("all"), recv_timeout=5)
    push = make_socket("push", reconnect_interval=0.01)
    push.connect(pull.bind(bind_url("tcp", "all")).url)
    wait_pipes(pull)
    push.send(b"hello")
    assert pull.recv() == b"hello"
    # (what PipeLosses.pipe_ended and the requeue count for a pipe found dead)
    counts = pull._host.counts  # (the socket's connection counters: nanopy/socket/pipes.py)
    counts.losses.dead_pipes, counts.losses.lost_pipes_unacked, counts.losses.lost_unacked_bytes = 2, 3, 4000
    pull._driver.requeued = 5
    counts.dial_failures, counts.handshake_failures, counts.auth_failures, counts.reconnected = 6, 7, 8, 9
    counts.protocol_errors, counts.too_large = 10, 11
    stats = pull.stats()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    nanopy.metrics.instrument(provider)
    labels = {"socket": pull.name, "protocol": "pull"}
    for when in ("open", "closed"):
        text, points = scrape(), otel_points(reader)
        for family in FAMILIES:
            for field_name, _labels, reasons in family.parts:
                if family.kind == "gauge" or reasons is not None:
                    continue
                want = getattr(stats, field_name)
                assert value(text, family.name + "_total", **labels) == want, (when, family.name)
                assert points[(family.otel, frozenset(labels.items()))] == want, (when, family.otel)
        pull.close()
        stats = dataclasses.replace(stats, disconnects=1)  # (its close ended its pipe)
    provider.shutdown()


def test_serve_follows_the_same_series(make_socket: MakeSocket) -> None:
    name = fresh("served")
    sock = make_socket("pub", name=name)
    sock.send(b"x")
    sock.close()
    with nanopy.metrics.serve("127.0.0.1:0") as server:
        with urllib.request.urlopen(server.url, timeout=10) as response:
            got = scrape(response.read().decode())
    assert value(got, "nanopy_messages_sent_total", socket=name, protocol="pub") == 1
    assert value(got, "nanopy_queued_messages", socket=name, protocol="pub", direction="out") == 0


def test_live_sockets_is_the_registry_and_metrics_reads_no_engine_internals() -> None:
    from nanopy.socket import series as _series

    sock = nanopy.Socket("push")
    assert sock in _series.live_sockets()
    sock.close()
    assert sock not in _series.live_sockets()  # its close has finished: it left its series
    source = open(nanopy.metrics.__file__).read()
    assert "_engine" not in source and "_sockets" not in source


# -- dials, handshakes, refusals, reconnects -----------------------------------------------------


def test_failed_dials_are_not_reconnects(make_socket: MakeSocket) -> None:
    with __import__("socket").socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    push = make_socket("push", name=fresh("dialer"), reconnect_interval=0.01, reconnect_interval_max=0.02)
    push.connect(f"tcp://127.0.0.1:{port}")
    wait_until(lambda: push.stats().dial_failures >= 3, what="3 refused dials")
    stats = push.stats()
    assert stats.reconnects == stats.handshake_failures == 0
    assert stats.reconnect_attempts >= stats.dial_failures >= 3
    assert value(scrape(), "nanopy_dial_failures_total", socket=push.name, protocol="push") >= 3


def test_a_refused_handshake_counts_on_both_sides(make_socket: MakeSocket) -> None:
    pub = make_socket("pub", name=fresh("listener"))
    push = make_socket("push", name=fresh("wrong-peer"), reconnect_interval=0.01, reconnect_interval_max=0.02)
    push.connect(pub.bind(bind_url("tcp", "refused")).url)  # PUSH to a PUB: the SP header says no
    wait_until(lambda: pub.stats().handshake_failures >= 2 and push.stats().handshake_failures >= 2,
               what="handshakes refused on both sides")
    assert pub.stats().auth_failures == push.stats().auth_failures == 0
    assert push.stats().dial_failures == push.stats().reconnects == 0
    got = scrape()
    assert value(got, "nanopy_handshake_failures_total", socket=pub.name, protocol="pub") >= 2
    assert value(got, "nanopy_handshake_failures_total", socket=push.name, protocol="push") >= 2


def test_a_dialer_that_connects_again_counts_a_reconnect(make_socket: MakeSocket, transport: str) -> None:
    url = bind_url(transport, "again")
    pull = nanopy.Socket("pull")
    url = pull.bind(url).url
    push = make_socket("push", name=fresh("redial"), reconnect_interval=0.01, reconnect_interval_max=0.05)
    push.connect(url)
    wait_pipes(push)
    assert push.stats().reconnects == 0
    pull.close()
    again = make_socket("pull", bind=url)
    wait_until(lambda: push.stats().reconnects == 1 and len(again.pipes) == 1, what="the dialer back")
    assert value(scrape(), "nanopy_reconnects_total", socket=push.name, protocol="push") == 1


def test_a_refused_curve_client_is_an_auth_failure_of_the_listener(make_socket: MakeSocket) -> None:
    pytest.importorskip("nacl")
    public, secret = nanopy.zmtp.curve_keypair()
    known_public, known_secret = nanopy.zmtp.curve_keypair()
    _, stranger_secret = nanopy.zmtp.curve_keypair()
    rep = make_socket("rep", name=fresh("curve-server"))
    ep = rep.bind("zmtp+tcp://127.0.0.1:0", curve_secret_key=secret, curve_clients=[known_public])
    stranger = make_socket("req", name=fresh("stranger"), reconnect_interval=0.01, reconnect_interval_max=0.05)
    stranger.connect(ep.url, curve_server_key=public, curve_secret_key=stranger_secret)
    wait_until(lambda: rep.stats().auth_failures >= 2, what="the stranger refused twice")
    assert rep.stats().handshake_failures >= rep.stats().auth_failures
    assert rep.stats().reconnects == 0 and rep.pipes == []
    wait_until(lambda: stranger.stats().handshake_failures >= 2, what="the stranger counts its refusals")
    assert stranger.stats().auth_failures == 0  # (the listener refused it, not the other way round)
    known = make_socket("req", reconnect_interval=0.01)
    known.connect(ep.url, curve_server_key=public, curve_secret_key=known_secret)
    wait_pipes(rep)
    got = scrape()
    assert value(got, "nanopy_auth_failures_total", socket=rep.name, protocol="rep") >= 2
    assert value(got, "nanopy_auth_failures_total", socket=stranger.name, protocol="req") == 0


def test_a_refused_plain_client_and_a_refused_tls_client_are_auth_failures(make_socket: MakeSocket) -> None:
    from tls_certs import tls_files

    pull = make_socket("pull", name=fresh("plain-server"))
    ep = pull.bind("zmtp+tcp://127.0.0.1:0", plain_auth=lambda user, password: password == "right")
    wrong = make_socket("push", reconnect_interval=0.01, reconnect_interval_max=0.05)
    wrong.connect(ep.url, plain=("user", "wrong"))
    wait_until(lambda: pull.stats().auth_failures >= 1, what="the wrong password refused")

    t = tls_files()
    tls = make_socket("pull", name=fresh("mtls-server"))
    tls_ep = tls.bind("tls+tcp://127.0.0.1:0", ssl_context=t.mtls_server_ctx)
    anonymous = make_socket("push", reconnect_interval=0.01, reconnect_interval_max=0.05)
    anonymous.connect(tls_ep.url, ssl_context=t.client_ctx)  # no client certificate
    wait_until(lambda: tls.stats().auth_failures >= 1, what="the anonymous TLS client refused")
    assert tls.pipes == []
