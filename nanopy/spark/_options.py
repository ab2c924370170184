"""Parsing and checking of the ``.option(...)`` values of the nanopy data source.

Every option is a string. Names are case-insensitive (Spark lower-cases nothing,
users write ``maxRecordsPerBatch`` or ``maxrecordsperbatch``). An unknown name is
an error with a "did you mean" suggestion, raised when the query is defined
(``load()``, ``save()``, ``start()``), never at the first message.
"""

from __future__ import annotations

import difflib
import logging
import socket as _stdsocket
from collections.abc import Callable, Mapping
from typing import TypeVar

log = logging.getLogger("nanopy.spark")


class SourceOptionError(ValueError):
    """A nanopy data source option is missing or invalid."""


# Canonical spelling of every option, per role. Aliases map to their canonical name.
COMMON = ("url", "urls", "protocol", "mode")
ROLES: dict[str, tuple[str, ...]] = {
    "source": COMMON + ("subscriptions", "schema", "maxRecordsPerBatch", "maxOffsetsPerTrigger",
                        "maxBytesPerTrigger", "minPartitions", "maxPartitionBytes", "spoolPath", "maxBuffered",
                        "maxBufferedBytes", "recvBuffer", "recvBufferBytes", "recvMaxSize",
                        "pollTimeoutMs", "connectTimeout"),
    "batch read": COMMON + ("subscriptions", "schema", "count", "duration", "recvBuffer",
                            "recvMaxSize", "connectTimeout"),
    "sink": COMMON + ("column", "topicColumn", "tag", "sendTimeout", "flushTimeout", "peerTimeout",
                      "sendBuffer"),
}
ROLES["read"] = tuple(dict.fromkeys(ROLES["source"] + ROLES["batch read"]))  # load(): either read
ALIASES = {"subscribe": "subscriptions", "spool": "spoolPath"}
# Options Spark itself may pass down to a data source.
SPARK_OWN = {"path", "checkpointlocation", "queryname"}
PROTOCOLS = {"source": ("pull", "sub"), "batch read": ("pull", "sub"), "read": ("pull", "sub"),
             "sink": ("push", "pub")}
# TCP-based schemes: their host and port are checked (ZeroMQ's zmtp+tcp as tcp).
_DIALABLE = ("tcp", "tls+tcp", "ws", "wss", "zmtp+tcp")


def lower(options: Mapping[str, str]) -> dict[str, str]:
    out = {str(k).lower(): str(v) for k, v in dict(options).items()}
    for alias, name in ALIASES.items():
        if alias in out:
            out.setdefault(name.lower(), out.pop(alias))
    return out


def spelled(options: Mapping[str, str]) -> dict[str, str]:
    """How the user wrote each option: lower-cased canonical name -> their name."""
    out = {str(k).lower(): str(k) for k in dict(options)}
    for alias, name in ALIASES.items():
        if alias in out:
            out.setdefault(name.lower(), out[alias])
    return out


def _all_names() -> dict[str, str]:
    names = {n.lower(): n for role in ROLES.values() for n in role}
    return names


def check_names(opts: Mapping[str, str], role: str | None = None) -> None:
    """Refuse an option name that ``role`` (or, with ``None``, every role) does not know."""
    known = {n.lower(): n for n in ROLES[role]} if role else _all_names()
    for key in opts:
        if key in known or key in SPARK_OWN:
            continue
        everywhere = _all_names()
        if role and key in everywhere:
            users = [r for r, names in ROLES.items() if everywhere[key] in names and r != "read"]
            raise SourceOptionError(
                f'option "{everywhere[key]}" applies to the nanopy {" and ".join(users)}, '
                f"not the {role}"
            )
        close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
        hint = f'; did you mean "{known[close[0]]}"?' if close else ""
        what = f"nanopy {role}" if role else "nanopy data source"
        raise SourceOptionError(f'unknown {what} option "{key}"{hint} '
                                f"(known: {', '.join(sorted(known.values(), key=str.lower))})")


def urls(opts: dict[str, str]) -> list[str]:
    raw = opts.get("urls") or opts.get("url") or opts.get("path") or ""
    found = [u.strip() for u in raw.split(",") if u.strip()]
    if not found:
        raise SourceOptionError(
            'the nanopy data source needs .option("url", "tcp://host:port") '
            '(or "urls" with a comma-separated list)'
        )
    for url in found:
        scheme, sep, rest = url.partition("://")
        if not sep or not rest:
            raise SourceOptionError(f"url {url!r} is not an address like tcp://host:port")
        from .. import transports

        try:
            transports.get(scheme)
        except ValueError:
            raise SourceOptionError(f"url {url!r}: unknown transport {scheme!r}") from None
    return found


def host_port(url: str) -> tuple[str, int] | None:
    """``(host, port)`` of a TCP-based URL, else ``None``."""
    scheme, _, rest = url.partition("://")
    if scheme not in _DIALABLE:
        return None
    hostport = rest.split("/", 1)[0]
    if ";" in hostport:  # tcp://local;remote:port -- check the remote part
        hostport = hostport.split(";", 1)[1]
    host, _, port = hostport.rpartition(":")
    host = host.strip("[]")
    try:
        return host, int(port)
    except ValueError:
        raise SourceOptionError(f"url {url!r} has no valid port") from None


# Options that only one protocol uses: (option, protocol, what to do instead).
PROTOCOL_ONLY = (("subscriptions", "sub"), ("topicColumn", "pub"))


def check_protocol_options(opts: Mapping[str, str], given: Mapping[str, str] | None = None) -> None:
    """Refuse an option the chosen protocol ignores (``subscribe`` on PULL, ...)."""
    protocol = opts.get("protocol", "").strip().lower() or None
    for name, needs in PROTOCOL_ONLY:
        if name.lower() not in opts:
            continue
        role_default = "push" if needs == "pub" else "pull"
        actual = protocol or role_default
        if actual != needs:
            spelled = (given or {}).get(name.lower(), name)
            raise SourceOptionError(
                f'option "{spelled}" applies to protocol "{needs}" only, and this is "{actual}"; '
                f'did you mean .option("protocol", "{needs}")? '
                + ("PULL receives every message pushed to it: drop the option."
                   if needs == "sub" else "PUSH has no topics: drop the option.")
            )


def check_addresses(urls_: list[str], mode: str, what: str) -> None:
    """URL shape (host and port for TCP-based transports, then the transport's own
    check, as ``bind``/``connect`` would make it) and a resolvable host."""
    from .. import transports
    from ..core.errors import AddressError

    for url in urls_:
        hp = host_port(url)
        if hp is not None:
            host, port = hp
            if not 0 < port < 65536 and not (mode == "bind" and port == 0):
                raise SourceOptionError(f"url {url!r}: port {port} is out of range")
            if mode == "connect" and host in ("", "*", "0.0.0.0", "::"):
                raise SourceOptionError(
                    f"url {url!r}: a {what} that connects needs the producer's host name or address "
                    f'(or .option("mode", "bind") to listen on this one)')
        transport = transports.get(url.partition("://")[0])
        try:
            (transport.check_dial_url if mode == "connect" else transport.check_url)(url)
        except AddressError as exc:
            raise SourceOptionError(f"{what}: {exc}") from None
    check_reachable(urls_, mode, what, probe=False)


def check_reachable(urls_: list[str], mode: str, what: str, probe: bool = True) -> None:
    """Fail at definition on a host that cannot be resolved; warn (with the URL) when
    nothing listens on a URL we are to dial. A producer that starts later is normal,
    so a refused connection is a warning, not an error."""
    for url in urls_:
        hp = host_port(url)
        if hp is None:
            continue
        host, port = hp
        if mode == "bind":  # our own address: nothing to resolve remotely or probe
            continue
        try:
            _stdsocket.getaddrinfo(host, port, type=_stdsocket.SOCK_STREAM)
        except OSError as exc:
            raise SourceOptionError(f"nanopy {what}: cannot resolve host {host!r} of {url} ({exc})") from None
        if not probe:
            continue
        try:
            with _stdsocket.create_connection((host, port), timeout=1.0):
                pass
        except OSError as exc:
            log.warning("nanopy %s: nothing is listening at %s yet (%s); the connection is retried "
                        "until a peer binds it", what, url, exc.strerror or exc)


def choice(opts: dict[str, str], key: str, allowed: tuple[str, ...], default: str) -> str:
    value = opts.get(key.lower(), default).strip().lower()
    if value not in allowed:
        raise SourceOptionError(f"option {key}={value!r}: expected one of {', '.join(allowed)}")
    return value


def integer(opts: dict[str, str], key: str, default: int, minimum: int = 0) -> int:
    return _at_least(opts, key, default, minimum, int, "an integer")


def number(opts: dict[str, str], key: str, default: float, minimum: float = 0.0) -> float:
    return _at_least(opts, key, default, minimum, float, "a number")


_Num = TypeVar("_Num", int, float)


def _at_least(
    opts: dict[str, str], key: str, default: _Num, minimum: _Num, parse: Callable[[str], _Num], kind: str
) -> _Num:
    """Option ``key`` read with ``parse`` (``default`` when unset or empty); at least ``minimum``."""
    raw = opts.get(key.lower())
    if raw is None or raw == "":
        return default
    try:
        value = parse(raw)
    except ValueError:
        raise SourceOptionError(f"option {key}={raw!r} must be {kind}") from None
    if value < minimum:
        raise SourceOptionError(f"option {key}={value} must be >= {minimum}")
    return value


def boolean(opts: dict[str, str], key: str, default: bool) -> bool:
    raw = opts.get(key.lower())
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise SourceOptionError(f"option {key}={raw!r} must be true or false")


def topics(opts: dict[str, str]) -> list[bytes]:
    raw = opts.get("subscriptions", "")
    return [t.encode() for t in raw.split(",")] if raw != "" else [b""]
