"""Typed, validated socket options.

Options are plain attributes on :class:`nanopy.Socket` backed by descriptors, so
``sock.recv_timeout = 2.0`` validates at once (``TypeError``/``ValueError``) and the
protocol cores read the current value from the same :class:`Options` object.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

MiB = 1 << 20


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if math.isnan(value):
        raise ValueError(f"{name} must not be NaN")
    return float(value)


def seconds(*, allow_none: bool = False, minimum: float = 0.0, positive: bool = False) -> Callable[[str, Any], Any]:
    def check(name: str, value: Any) -> float | None:
        if value is None:
            if allow_none:
                return None
            raise TypeError(f"{name} must be a number of seconds (None is not allowed)")
        v = _number(name, value)
        if v < minimum or (positive and v <= 0):
            bound = "greater than 0" if positive else f"at least {minimum}"
            raise ValueError(f"{name} must be {bound}, got {value!r}")
        return v

    return check


def integer(lo: int, hi: int | None = None) -> Callable[[str, Any], int]:
    def check(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
        if value < lo or (hi is not None and value > hi):
            rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise ValueError(f"{name} must be in {rng}, got {value}")
        return value

    return check


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {type(value).__name__}")
    return value


def text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    return value


def choice(*allowed: str) -> Callable[[str, Any], str]:
    def check(name: str, value: Any) -> str:
        if not isinstance(value, str):
            choices = ", ".join(map(repr, allowed))
            raise TypeError(f"{name} must be a str, one of {choices}; not {type(value).__name__}")
        if value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
        return value

    return check


#: ``overflow`` modes; a protocol core lists the ones it supports in ``overflow_modes``.
OVERFLOW_MODES = ("drop", "drop-newest", "block")


def check_for_protocol(core_cls: Any, name: str, value: Any) -> None:
    """Refuse a valid value the socket's protocol cannot honour (e.g. overflow="block" on PUSH)."""
    if name == "overflow" and core_cls is not None:
        modes = getattr(core_cls, "overflow_modes", ("drop",))
        if value not in modes:
            raise ValueError(
                f"overflow={value!r} is not available on {core_cls.name.upper()} sockets; "
                f"they accept {', '.join(map(repr, modes))} (PUB: 'drop', 'block'; "
                "SUB: 'drop', 'drop-newest', 'block')"
            )


class Option(Generic[T]):
    """A descriptor for one validated option stored on ``obj._options``."""

    def __init__(self, default: Any, validate: Callable[[str, Any], Any], doc: str = "") -> None:
        self.default = default
        self.validate = validate
        self.__doc__ = doc
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(obj._options, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        value = self.validate(self.name, value)
        check_for_protocol(getattr(obj, "_core_cls", None), self.name, value)
        setattr(obj._options, self.name, value)
        obj._option_changed(self.name)


class Options:
    """The current option values of one socket (read by cores and the engine)."""

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
    tcp_nodelay: bool
    overflow: str
    name: str


# name -> (default, validator, doc). The single source of truth for socket options.
SOCKET_OPTIONS: dict[str, tuple[Any, Callable[[str, Any], Any], str]] = {
    "send_timeout": (None, seconds(allow_none=True), "seconds a send may block; None = forever, 0 = never"),
    "recv_timeout": (None, seconds(allow_none=True), "seconds a recv may block; None = forever, 0 = never"),
    "send_buffer": (1024, integer(1, 1 << 24), "messages queued per pipe before send blocks"),
    "recv_buffer": (1024, integer(1, 1 << 24), "messages held per pipe before reading pauses"),
    "reconnect_interval": (0.1, seconds(positive=True), "first reconnect delay (doubles, jittered)"),
    "reconnect_interval_max": (5.0, seconds(positive=True), "largest reconnect delay"),
    "recv_max_size": (MiB, integer(0), "largest accepted message in bytes; 0 = no limit"),
    "linger": (1.0, seconds(), "seconds close() waits to flush queued sends"),
    "resend_interval": (60.0, seconds(allow_none=True, positive=True), "REQ: seconds before a resend"),
    "survey_deadline": (1.0, seconds(positive=True), "SURVEYOR: seconds a survey collects answers"),
    "max_ttl": (8, integer(1, 255), "hop limit through devices"),
    "handshake_timeout": (10.0, seconds(positive=True), "seconds allowed for the SP handshake"),
    "tcp_nodelay": (True, boolean, "disable Nagle's algorithm on tcp pipes"),
    "overflow": (
        "drop",
        choice(*OVERFLOW_MODES),
        "PUB/SUB when a pipe's queue is full: 'drop' (PUB skips the pipe, SUB drops its oldest "
        "message), 'drop-newest' (SUB drops the arriving message) or 'block' (SUB stops reading "
        "the pipe; PUB waits up to send_timeout until every pipe has room) -- lossless, but one "
        "stuck subscriber stalls the publisher",
    ),
    "name": (None, text, "label used in stats, logs and errors"),
}


def new_options(protocol_name: str) -> Options:
    opts = Options()
    for key, (default, _, _) in SOCKET_OPTIONS.items():
        setattr(opts, key, default)
    opts.name = protocol_name
    return opts


def make_descriptors() -> dict[str, Option[Any]]:
    return {key: Option(default, check, doc) for key, (default, check, doc) in SOCKET_OPTIONS.items()}


def validate_priority(name: str, value: Any) -> int:
    return integer(1, 16)(name, value)
