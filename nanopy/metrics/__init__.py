"""Metrics of every nanopy socket, for Prometheus and OpenTelemetry.

::

    import nanopy.metrics
    nanopy.metrics.register_prometheus()        # prometheus_client's default registry
    nanopy.metrics.instrument()                 # OpenTelemetry's global meter provider
    server = nanopy.metrics.serve("127.0.0.1:9464")   # or a /metrics endpoint of our own

A series is labelled ``socket`` (the socket's ``name``, or ``"(unnamed)"`` for
every socket without one) and ``protocol``; the sockets that share a series are
summed, and a series' counters keep what its closed sockets counted, so no
counter ever goes down and short-lived sockets add no series (nanopy/socket/series.py).
Every number of ``SocketStats`` is exported by one rule (nanopy/metrics/families.py),
so a counter added there needs no edit here. Nothing is counted for the metrics: a
collection reads every live socket's ``stats()`` (a few lock rounds each), so
registering costs nothing between scrapes. docs/metrics.md has the list, the drop
reasons and a sample dashboard.

``register_prometheus`` needs the ``prometheus`` extra (prometheus_client),
``instrument`` the ``otel`` extra (opentelemetry-api); ``serve`` and the
``nanopy stat`` command need neither.
"""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .. import __version__, _fork
from ..socket import series as _series
from ..socket.series import Series
from .families import FAMILIES, Family

__all__ = ["MetricsServer", "Sample", "collect", "instrument", "register_prometheus", "render", "serve"]

#: The media type of the Prometheus text format that :func:`render` writes.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class Sample:
    """One value of one metric: what :func:`collect` yields.

    Attributes:
        family: the metric's name as Prometheus writes its family (counters
            without ``_total``).
        kind: ``"counter"`` or ``"gauge"``.
        help: one line on what it counts.
        labels: ``socket``, ``protocol`` and, for some metrics, ``reason`` or ``direction``.
        value: the count.
    """

    family: str
    kind: str
    help: str
    labels: dict[str, str]
    value: int


def _samples(family: Family, found: list[Series]) -> Iterator[tuple[dict[str, str], int]]:
    """The family's samples in every series: (labels, value)."""
    for series in found:
        socket_label, protocol = series.key
        for labels, value in family.values(series):
            yield {"socket": socket_label, "protocol": protocol, **labels}, value


def collect() -> list[Sample]:
    """Every metric of every series, now.

    A series is a socket ``name`` (or ``"(unnamed)"``) and a protocol: the sockets
    that share it are summed, and its counters keep what its closed sockets
    counted, so they never go down (docs/metrics.md, "Series").

    Returns:
        The samples, family by family (in the order of docs/metrics.md), series in
        the order they appeared.
    """
    found = _series.collect()
    return [
        Sample(family.name, family.kind, family.help, labels, value)
        for family in FAMILIES
        for labels, value in _samples(family, found)
    ]


# -- the Prometheus text format (no dependency) -------------------------------------------------


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(samples: Iterable[Sample] | None = None) -> str:
    """The samples (default: :func:`collect`) in the Prometheus text exposition format.

    Args:
        samples: what to write; None collects every series now.

    Returns:
        The exposition (``# HELP``, ``# TYPE`` and one line per series; counters
        end in ``_total``), as served by :func:`serve`.
    """
    lines: list[str] = []
    seen: set[str] = set()
    for sample in collect() if samples is None else samples:
        # (counters are written with their _total name throughout, as prometheus_client does)
        name = sample.family + ("_total" if sample.kind == "counter" else "")
        if name not in seen:
            seen.add(name)
            lines.append(f"# HELP {name} {sample.help}")
            lines.append(f"# TYPE {name} {sample.kind}")
        labels = ",".join(f'{key}="{_escape(value)}"' for key, value in sample.labels.items())
        lines.append(f"{name}{{{labels}}} {sample.value}")
    return "\n".join(lines) + "\n" if lines else ""


# -- prometheus_client ----------------------------------------------------------------------------

_prometheus_lock = _fork.process_lock()
_prometheus_collectors: dict[int, tuple[Any, Any]] = {}  # id(registry) -> (registry, collector)


def _missing(extra: str, package: str, what: str, exc: ImportError) -> ImportError:
    return ImportError(
        f"nanopy.metrics.{what} needs the {package} package: pip install 'nanopy[{extra}]'"
        f" ({exc})"
    )


class _PrometheusCollector:
    """A prometheus_client collector over every live nanopy socket."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        families: dict[str, Any] = {}
        for sample in collect():
            family = families.get(sample.family)
            if family is None:
                kind = CounterMetricFamily if sample.kind == "counter" else GaugeMetricFamily
                family = families[sample.family] = kind(sample.family, sample.help, labels=list(sample.labels))
            family.add_metric(list(sample.labels.values()), sample.value)
        yield from families.values()

    def describe(self) -> list[Any]:
        return []  # (nothing known before a scrape: the registry then skips its duplicate check)


def register_prometheus(registry: Any = None) -> Any:
    """Export every socket's metrics (:func:`collect`) through prometheus_client.

    Idempotent per registry. The collector reads the sockets at each scrape;
    until then it costs nothing.

    Args:
        registry: a ``prometheus_client.CollectorRegistry``; None uses the
            default ``prometheus_client.REGISTRY``.

    Returns:
        The collector (``registry.unregister(collector)`` removes it).

    Raises:
        ImportError: prometheus_client is not installed; the message names the
            ``nanopy[prometheus]`` extra.
    """
    try:
        import prometheus_client
    except ImportError as exc:
        raise _missing("prometheus", "prometheus_client", "register_prometheus", exc) from None
    if registry is None:
        registry = prometheus_client.REGISTRY
    with _prometheus_lock:
        known = _prometheus_collectors.get(id(registry))
        if known is not None and known[0] is registry:
            return known[1]
        collector = _PrometheusCollector()
        registry.register(collector)
        _prometheus_collectors[id(registry)] = (registry, collector)
        return collector


# -- OpenTelemetry --------------------------------------------------------------------------------

_otel_lock = _fork.process_lock()
_otel_instruments: dict[int, tuple[Any, list[Any]]] = {}  # id(provider) -> (provider, instruments)
# An OpenTelemetry collection calls every instrument's callback in turn: they share
# one read of the sockets. A callback asking again (its instrument's next collection)
# reads them anew, so no callback ever sees an older read than it saw before.
_recent_lock = _fork.process_lock()
_recent: list[Series] | None = None
_recent_served: set[str] = set()  # the families given _recent


def _recent_series(family: str) -> list[Series]:
    global _recent
    with _recent_lock:
        if _recent is None or family in _recent_served:
            _recent = _series.collect()
            _recent_served.clear()
        _recent_served.add(family)
        return _recent


@_fork.reset_in_child
def _forget_recent() -> None:
    global _recent
    _recent = None
    _recent_served.clear()


def instrument(meter_provider: Any = None) -> list[Any]:
    """Export every socket's metrics as OpenTelemetry observable instruments.

    One instrument per metric of docs/metrics.md (``nanopy.messages.sent``,
    ``nanopy.messages.dropped`` with the attribute ``reason``, ``nanopy.dead_pipes``,
    ...): counters as observable counters, gauges (``nanopy.pipes``, and
    ``nanopy.queued`` with the attribute ``direction``) as observable up-down
    counters; every one with the attributes ``socket`` and ``protocol``, by the
    series rules of :func:`collect`. Their callbacks read the sockets at each
    collection (once for all instruments); until then they cost nothing.
    Idempotent per meter provider.

    Args:
        meter_provider: an OpenTelemetry ``MeterProvider``; None uses the global one.

    Returns:
        The instruments made (or made before for this provider).

    Raises:
        ImportError: opentelemetry-api is not installed; the message names the
            ``nanopy[otel]`` extra.
    """
    try:
        from opentelemetry import metrics as otel_metrics
        from opentelemetry.metrics import Observation
    except ImportError as exc:
        raise _missing("otel", "opentelemetry-api", "instrument", exc) from None
    provider = meter_provider if meter_provider is not None else otel_metrics.get_meter_provider()
    with _otel_lock:
        known = _otel_instruments.get(id(provider))
        if known is not None and known[0] is provider:
            return known[1]
        meter = provider.get_meter("nanopy", __version__)

        def callback(family: Family) -> Any:
            def observe(options: Any) -> list[Any]:
                return [Observation(value, labels) for labels, value in _samples(family, _recent_series(family.name))]

            return observe

        instruments = []
        for family in FAMILIES:
            make = meter.create_observable_counter if family.kind == "counter" else \
                meter.create_observable_up_down_counter
            instruments.append(make(family.otel, callbacks=[callback(family)], unit=family.unit,
                                    description=family.help))
        _otel_instruments[id(provider)] = (provider, instruments)
        return instruments


# -- the HTTP endpoint ----------------------------------------------------------------------------


def _parse_address(address: str | tuple[str, int]) -> tuple[str, int]:
    if isinstance(address, tuple):
        host, port = address
    elif isinstance(address, str):
        text = address.split("://", 1)[-1].rstrip("/")
        host, sep, port_text = text.rpartition(":")
        if not sep or not port_text.isdigit():
            raise ValueError(f"serve({address!r}): give an address as 'HOST:PORT', e.g. '127.0.0.1:9464'")
        port = int(port_text)
    else:
        raise TypeError(f"serve: the address must be 'HOST:PORT' or a (host, port) tuple, not {type(address).__name__}")
    host = host.strip("[]")
    if not host:
        raise ValueError(
            f"serve({address!r}): name the interface to listen on, e.g. '127.0.0.1:{port}' "
            f"(or '0.0.0.0:{port}' to listen on all of them)"
        )
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"serve({address!r}): port {port} is out of range")
    return host, int(port)


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        if self.path.split("?", 1)[0] not in ("/", "/metrics"):
            self.send_error(404, "nanopy serves its metrics at /metrics")
            return
        body = render().encode()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # (a scrape every few seconds must not fill stderr)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, port: int) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), _Handler)


class MetricsServer:
    """An HTTP endpoint serving the metrics of every socket (:func:`serve`).

    Attributes:
        host: the interface it listens on.
        port: its port (the real one when 0 was asked).
        url: ``http://HOST:PORT/metrics``, what ``nanopy stat`` and Prometheus scrape.
    """

    def __init__(self, host: str, port: int) -> None:
        self._server = _Server(host, port)
        _fork.own(self._server.socket)  # (a forked child closes its copy: the port frees with the parent's close)
        self.host = host
        self.port = int(self._server.server_address[1])
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}/metrics"
        # (the loop looks for a close every 0.2 s: close() returns within that)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.2,), name="nanopy-metrics",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and free the port (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<nanopy.metrics.MetricsServer {self.url}>"


def serve(address: str | tuple[str, int]) -> MetricsServer:
    """Serve every socket's metrics (:func:`collect`) over HTTP, in the Prometheus text format.

    Opt-in: nothing listens until this is called. The endpoint answers
    ``GET /metrics`` (and ``/``) from a daemon thread; each request reads the
    sockets then. Needs no extra package.

    Args:
        address: ``"HOST:PORT"`` or ``(host, port)``; port 0 picks a free port.
            Name the interface: ``"127.0.0.1:9464"`` keeps it on this machine.

    Returns:
        The running :class:`MetricsServer` (``.url``, ``.close()``; a context manager).

    Raises:
        ValueError: a malformed address, or no host.
        OSError: the address cannot be bound (in use, not local).
    """
    host, port = _parse_address(address)
    return MetricsServer(host, port)
