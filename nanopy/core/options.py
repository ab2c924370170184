"""Typed, validated socket options, described by one table.

:data:`OPTION_TABLE` is the single source of truth: each :class:`OptionSpec` gives
an option's name, type, default, unit, the protocols it matters to and what it
does. From it come the attribute descriptors on :class:`nanopy.Socket` (so
``sock.recv_timeout = 2.0`` validates at once with ``TypeError``/``ValueError``
whose message names the option and its unit), the "Options" section of the
Socket docstring, and the option table in ``docs/api.md`` (a test compares them).
The protocol cores read the current values from the same :class:`Options` object.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

MiB = 1 << 20

Validator = Callable[["OptionSpec", Any], Any]


@dataclass(frozen=True)
class OptionSpec:
    """One socket option: what a user may set, and how it is checked."""

    name: str
    type: str  # as written in a signature: "float | None", "int", ...
    default: Any
    unit: str  # "seconds", "messages per pipe", "bytes", ... ("" = none)
    protocols: str  # "all", or the protocols that read it
    doc: str
    validate: Validator

    def check(self, value: Any) -> Any:
        """The validated value, or ``TypeError``/``ValueError`` naming this option."""
        return self.validate(self, value)

    @property
    def default_text(self) -> str:
        if self.name == "name":
            return "the protocol name"
        if self.default is None:
            return "None"
        if self.default == MiB and self.unit == "bytes":
            return "1048576 (1 MiB)"
        return repr(self.default)


# -- validators: each gets the spec, so its messages name the option and its unit ------


def _type_error(spec: OptionSpec, value: Any, expected: str) -> TypeError:
    return TypeError(f"{spec.name} must be {expected}, not {type(value).__name__} ({spec.doc})")


def seconds(*, allow_none: bool = False, positive: bool = False) -> Validator:
    """A duration in seconds: a non-negative int or float (optionally None, or > 0)."""

    def check(spec: OptionSpec, value: Any) -> float | None:
        if value is None:
            if allow_none:
                return None
            raise TypeError(f"{spec.name} must be a number of seconds; None is not allowed ({spec.doc})")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _type_error(spec, value, "a number of seconds")
        if math.isnan(value):
            raise ValueError(f"{spec.name} must be a number of seconds, not NaN")
        if value < 0 or (positive and value <= 0):
            bound = "greater than 0" if positive else "at least 0"
            raise ValueError(f"{spec.name} must be {bound} seconds, got {value!r}")
        return float(value)

    return check


def integer(lo: int, hi: int | None = None) -> Validator:
    """An int in ``lo..hi`` (no upper bound when ``hi`` is None), in the spec's unit."""

    def check(spec: OptionSpec, value: Any) -> int:
        unit = f" ({spec.unit})" if spec.unit else ""
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(spec, value, f"an int{unit}")
        if value < lo or (hi is not None and value > hi):
            rng = f"in {lo}..{hi}" if hi is not None else f"at least {lo}"
            raise ValueError(f"{spec.name} must be {rng}{unit}, got {value}")
        return value

    return check


def boolean(spec: OptionSpec, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _type_error(spec, value, "True or False")
    return value


def text(spec: OptionSpec, value: Any) -> str:
    if not isinstance(value, str):
        raise _type_error(spec, value, "a str")
    return value


def choice(*allowed: str) -> Validator:
    """One of the strings ``allowed``."""
    listed = ", ".join(map(repr, allowed))

    def check(spec: OptionSpec, value: Any) -> str:
        if not isinstance(value, str):
            raise _type_error(spec, value, f"a str, one of {listed}")
        if value not in allowed:
            raise ValueError(f"{spec.name} must be one of {listed}, got {value!r}")
        return value

    return check


#: ``overflow`` modes; a protocol core lists the ones it honours in ``overflow_modes``.
OVERFLOW_MODES = ("drop", "drop-newest", "block")


def check_for_protocol(core_cls: Any, name: str, value: Any) -> None:
    """Refuse a valid value the socket's protocol cannot honour (e.g. overflow="block" on PUSH)."""
    if name == "resend_unacked" and value and core_cls is not None and not getattr(core_cls, "requeues", False):
        _refuse_resend(core_cls)
    if name == "overflow" and core_cls is not None:
        modes = getattr(core_cls, "overflow_modes", ("drop",))
        if value not in modes:
            raise ValueError(
                f"overflow={value!r} is not available on {core_cls.name.upper()} sockets; "
                f"they accept {', '.join(map(repr, modes))} (PUB: 'drop', 'block'; "
                "SUB: 'drop', 'drop-newest', 'block')"
            )


def _refuse_resend(core_cls: Any) -> None:
    from .errors import ProtocolError

    name = core_cls.name.upper()
    if getattr(core_cls, "raw_class", None) is not None and getattr(core_cls.raw_class, "requeues", False):
        raise ProtocolError(
            f"resend_unacked is for raw {name} sockets (devices): a cooked {name} already sends every "
            "request again, whole, when its pipe dies (docs/partitions.md); leave it off, or use raw=True"
        )
    raise ProtocolError(
        f"resend_unacked is not available on {name} sockets: it sends a dead pipe's unacknowledged "
        "messages to another peer, which only PUSH and raw REQ may do (any of their peers takes any "
        "message); see docs/partitions.md"
    )


# -- the table ------------------------------------------------------------------------


def _kernel_bytes(name: str, default: int, doc: str) -> OptionSpec:
    """A size in bytes that a tcp-based pipe hands to its kernel socket (0: the kernel's own)."""
    return OptionSpec(name, "int", default, "bytes", "all", doc, integer(0, 1 << 30))


_SENDERS = "all that send"
_RECEIVERS = "all that receive"

OPTION_TABLE: tuple[OptionSpec, ...] = (
    OptionSpec("send_timeout", "float | None", None, "seconds", _SENDERS,
               "how long send() may block; None waits forever, 0 never waits",
               seconds(allow_none=True)),
    OptionSpec("recv_timeout", "float | None", None, "seconds", _RECEIVERS,
               "how long recv() may block; None waits forever, 0 never waits",
               seconds(allow_none=True)),
    OptionSpec("send_buffer", "int", 1024, "messages per pipe", _SENDERS,
               "messages queued for each pipe; send() blocks when every pipe it may use is full "
               "(PUB drops for that pipe instead, unless overflow is 'block')",
               integer(1, 1 << 24)),
    OptionSpec("recv_buffer", "int", 1024, "messages per pipe", _RECEIVERS,
               "messages held for each pipe before nanopy stops reading it (back-pressure); "
               "by default SUB never stops reading and drops that pipe's oldest message instead "
               "(see overflow); "
               "SURVEYOR keeps at most this many answers per survey",
               integer(1, 1 << 24)),
    OptionSpec("reconnect_interval", "float", 0.1, "seconds", "all",
               "first delay before a connect() retries; doubles (jittered) after each failure",
               seconds(positive=True)),
    OptionSpec("reconnect_interval_max", "float", 5.0, "seconds", "all",
               "the largest delay between reconnect attempts",
               seconds(positive=True)),
    OptionSpec("recv_max_size", "int", MiB, "bytes", "all",
               "largest message accepted from a wire; a bigger one closes its pipe; 0 = no limit",
               integer(0)),
    OptionSpec("linger", "float", 1.0, "seconds", "all",
               "how long close() waits for queued sends to be written",
               seconds()),
    OptionSpec("resend_interval", "float | None", 60.0, "seconds", "req",
               "a request not answered in this time is sent again; None never resends",
               seconds(allow_none=True, positive=True)),
    OptionSpec("survey_deadline", "float", 1.0, "seconds", "surveyor",
               "how long a survey collects answers",
               seconds(positive=True)),
    OptionSpec("max_ttl", "int", 8, "hops", "rep, respondent, pair1",
               "messages that crossed more devices than this are dropped (loop guard)",
               integer(1, 255)),
    OptionSpec("handshake_timeout", "float", 10.0, "seconds", "all",
               "time a new connection gets to finish its SP handshake",
               seconds(positive=True)),
    OptionSpec("dead_peer_timeout", "float | None", 10.0, "seconds", "all",
               "a tcp, tls+tcp, ws, wss, zmtp+tcp or zmtp+ipc peer that answers nothing for this "
               "long is taken for dead and its pipe closed (TCP keepalive and TCP_USER_TIMEOUT, "
               "WebSocket PINGs, ZMTP 3.1 PINGs; see docs/partitions.md); None leaves dead-peer "
               "detection to the kernel's defaults",
               seconds(allow_none=True, positive=True)),
    OptionSpec("connect_timeout", "float | None", 10.0, "seconds", "all",
               "how long one connect attempt (every dialing transport) may wait for the peer to "
               "accept before the dialer gives up on it and tries again after what is left of its "
               "back-off; also a connect() keyword; None leaves it to the kernel (about 2 minutes "
               "for TCP); see docs/partitions.md",
               seconds(allow_none=True, positive=True)),
    OptionSpec("resend_unacked", "bool", False, "", "push, raw req",
               "when a pipe ends, send again on the other pipes the messages whose bytes its peer's kernel "
               "never acknowledged (tcp, tls+tcp, ws, wss, zmtp+tcp on Linux): at-least-once, a message may "
               "arrive twice (stats().messages_resent); off, they are counted lost (see docs/partitions.md)",
               boolean),
    OptionSpec("tcp_nodelay", "bool", True, "", "all",
               "disable Nagle's algorithm on tcp (and tls+tcp, ws) pipes",
               boolean),
    _kernel_bytes("kernel_unsent_max", 128 * 1024,
                  "TCP_NOTSENT_LOWAT of every tcp-based pipe (tcp, tls+tcp, ws, wss, zmtp+tcp; where the "
                  "system has it: Linux, macOS): the most the kernel holds not yet sent beyond send_buffer, "
                  "without capping the TCP window; 0 leaves it to the kernel (up to its whole send buffer); "
                  "see docs/performance.md, 'Queue budget per pipe'"),
    _kernel_bytes("kernel_send_buffer", 0,
                  "SO_SNDBUF of every tcp-based pipe: the most the kernel holds for the peer, sent or not "
                  "(Linux doubles the value for its bookkeeping); it also caps the bytes in flight on the "
                  "wire, so a long link needs about its bandwidth x round trip; 0 leaves it to the kernel "
                  "(autotuned: up to 4 MiB on Linux)"),
    _kernel_bytes("kernel_recv_buffer", 0,
                  "SO_RCVBUF of every tcp-based pipe: the most the kernel holds from the peer before "
                  "nanopy reads it, and so the TCP window the peer may fill (Linux doubles the value; a "
                  "long link needs about its bandwidth x round trip); 0 leaves it to the kernel "
                  "(autotuned: up to tcp_rmem's maximum on Linux)"),
    OptionSpec("overflow", "str", "drop", "", "pub, sub",
               "what a full pipe queue does: 'drop' (PUB skips that pipe, SUB drops its oldest "
               "message), 'drop-newest' (SUB drops the arriving message) or 'block' (SUB stops "
               "reading the pipe; PUB waits up to send_timeout until every pipe has room): "
               "lossless, but one stuck subscriber stalls the publisher",
               choice(*OVERFLOW_MODES)),
    OptionSpec("name", "str", None, "", "all",
               "a label for this socket in stats, logs and error messages",
               text),
)

OPTIONS_BY_NAME: dict[str, OptionSpec] = {spec.name: spec for spec in OPTION_TABLE}


def option_rows() -> list[tuple[str, str, str, str, str, str]]:
    """The table as text rows: name, type, default, unit, protocols, meaning."""
    return [(s.name, s.type, s.default_text, s.unit or "-", s.protocols, s.doc) for s in OPTION_TABLE]


def markdown_table() -> str:
    """The option table in Markdown, as ``docs/api.md`` shows it."""
    lines = ["| option | type | default | unit | protocols | meaning |", "|---|---|---|---|---|---|"]
    for name, typ, default, unit, protocols, doc in option_rows():
        typ = typ.replace("|", "\\|")  # a bare | would end the table cell
        lines.append(f"| `{name}` | `{typ}` | {default} | {unit} | {protocols} | {doc} |")
    return "\n".join(lines)


def docstring_section() -> str:
    """The "Options" part of the Socket docstring (Google style, read by Sphinx napoleon)."""
    lines = ["Options:"]
    for spec in OPTION_TABLE:
        unit = f", {spec.unit}" if spec.unit else ""
        lines.append(f"    {spec.name} ({spec.type}, default {spec.default_text}{unit}; {spec.protocols}):")
        lines += textwrap.wrap(f"{spec.doc[0].upper()}{spec.doc[1:]}.", 80,
                               initial_indent=" " * 8, subsequent_indent=" " * 8)
    return "\n".join(lines)


# -- runtime ----------------------------------------------------------------------------


class Option(Generic[T]):
    """A descriptor for one validated option stored on ``obj._options``."""

    def __init__(self, spec: OptionSpec) -> None:
        self.spec = spec
        self.name = spec.name
        unit = f", {spec.unit}" if spec.unit else ""
        self.__doc__ = (f"{spec.doc[0].upper()}{spec.doc[1:]} "
                        f"({spec.type}, default {spec.default_text}{unit}; {spec.protocols}).")

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(obj._options, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        value = self.spec.check(value)
        check_for_protocol(getattr(obj, "_core_cls", None), self.name, value)
        setattr(obj._options, self.name, value)
        obj._option_changed(self.name)


class OptionAttributes:
    """The options' types, for type checkers and readers (tests keep them equal to the table).

    :class:`nanopy.Socket` inherits these declarations; at run time each name is an
    :class:`Option` descriptor made from :data:`OPTION_TABLE`.
    """

    send_timeout: float | None
    recv_timeout: float | None
    send_buffer: int
    recv_buffer: int
    reconnect_interval: float
    reconnect_interval_max: float
    recv_max_size: int
    linger: float
    resend_interval: float | None
    survey_deadline: float
    max_ttl: int
    handshake_timeout: float
    dead_peer_timeout: float | None
    connect_timeout: float | None
    resend_unacked: bool
    tcp_nodelay: bool
    kernel_unsent_max: int
    kernel_send_buffer: int
    kernel_recv_buffer: int
    overflow: str
    name: str


class Options(OptionAttributes):
    """The current option values of one socket (read by cores and the engine)."""


def new_options(protocol_name: str) -> Options:
    opts = Options()
    for spec in OPTION_TABLE:
        setattr(opts, spec.name, spec.default)
    opts.name = protocol_name
    return opts


def make_descriptors() -> dict[str, Option[Any]]:
    return {spec.name: Option(spec) for spec in OPTION_TABLE}


def validate_priority(name: str, value: Any) -> int:
    """An endpoint's ``priority``/``recv_priority``: an int in 1..16 (1 = highest)."""
    spec = OptionSpec(name, "int", 8, "1 = highest", "all", "1 (highest) .. 16 (lowest)", integer(1, 16))
    result: int = spec.check(value)
    return result
