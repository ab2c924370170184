"""Plug-in registries for transports (by URL scheme) and protocols (by name).

Lookup order: in-process registrations, then built-ins, then the entry-point
group. Built-ins win: a third-party distribution cannot take over ``tcp`` unless
someone calls ``register(..., override=True)``. Everything loads lazily, on first
use of a name, and is validated when loaded.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from . import _fork

log = logging.getLogger("nanopy")


class Registry:
    def __init__(
        self,
        group: str,
        kind: str,
        builtins: dict[str, str],
        validate: Callable[[str, Any], Any],
        error: Callable[[str], Exception],
    ) -> None:
        self.group = group
        self.kind = kind
        self._builtins = builtins
        self._validate = validate
        self._error = error
        self._loaded: dict[str, Any] = {}
        self._registered: dict[str, Any] = {}
        # (taken before os.fork(): a child never inherits a plug-in half imported)
        self._lock = _fork.loading_lock()

    def register(self, name: str, obj: Any, *, override: bool = False) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"{self.kind} name must be a non-empty str")
        obj = self._validate(name, obj)
        with self._lock:
            if not override:
                owner = self._owner(name)
                if owner is not None:
                    raise ValueError(
                        f"{self.kind} {name!r} is already provided by {owner}; "
                        "pass override=True to replace it in this process"
                    )
            elif name in self._builtins:
                log.info("%s %r: built-in replaced by %r (override=True)", self.kind, name, obj)
            self._registered[name] = obj
            self._loaded.pop(name, None)

    def _owner(self, name: str) -> str | None:
        """Who provides ``name`` already (None if nobody)."""
        if name in self._registered:
            return "an earlier register() call"
        if name in self._builtins:
            return "nanopy (built-in)"
        for ep in self._entry_points(name):
            return f"the installed plug-in {ep.value!r}"
        return None

    def _entry_points(self, name: str) -> list[Any]:
        try:
            return [ep for ep in entry_points(group=self.group) if ep.name == name]
        except Exception:  # noqa: BLE001  # pragma: no cover - broken metadata must not break lookups
            return []

    def unregister(self, name: str) -> None:
        with self._lock:
            self._registered.pop(name, None)
            self._loaded.pop(name, None)

    def names(self) -> list[str]:
        found = set(self._builtins) | set(self._registered)
        try:
            found |= {ep.name for ep in entry_points(group=self.group)}
        except Exception:  # noqa: BLE001  # pragma: no cover - broken metadata must not break lookups
            pass
        return sorted(found)

    def get(self, name: str) -> Any:
        obj = self._registered.get(name) or self._loaded.get(name)
        if obj is not None:
            return obj
        with self._lock:
            obj = self._registered.get(name) or self._loaded.get(name)
            if obj is None:
                obj = self._load(name)
                self._loaded[name] = obj
        return obj

    def _load(self, name: str) -> Any:
        target = self._builtins.get(name)
        if target is not None:
            # A third-party distribution claiming a built-in name is ignored, but not silently.
            for ep in self._entry_points(name):
                if ep.value != target:
                    log.warning(
                        "ignoring %s plug-in %r = %r: %r is built in (use register(..., override=True))",
                        self.kind, name, ep.value, name,
                    )
        if target is None:
            eps = self._entry_points(name)
            if not eps:
                raise self._error(
                    f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())}"
                )
            if len(eps) > 1:
                log.warning("several distributions provide %s %r; using %s", self.kind, name, eps[0].value)
            try:
                obj = eps[0].load()
            except Exception as exc:
                raise self._error(
                    f"{self.kind} plug-in {name!r} ({eps[0].value}) failed to load: {exc!r}"
                ) from exc
        else:
            module, _, attr = target.partition(":")
            try:
                obj = getattr(importlib.import_module(module), attr)
            except ModuleNotFoundError as exc:
                extra = OPTIONAL_EXTRAS.get(name)
                if extra is None or not exc.name or exc.name.startswith("nanopy"):
                    raise
                raise self._error(
                    f"the {name!r} {self.kind} needs the optional package {exc.name!r}: "
                    f"pip install 'nanopy[{extra}]'"
                ) from exc
        try:
            return self._validate(name, obj)
        except Exception as exc:
            raise self._error(f"{self.kind} plug-in {name!r} is broken: {exc}") from exc


# RFC 3986 scheme syntax, lower case only (URLs are matched exactly).
_SCHEME = re.compile(r"[a-z][a-z0-9+.\-]*\Z")
_PROTOCOL_NAME = re.compile(r"[A-Za-z0-9_.\-]+\Z")


def _validate_protocol(name: str, obj: Any) -> Any:
    from .core.base import Core

    if not _PROTOCOL_NAME.match(name):
        raise ValueError(f"protocol name {name!r} may hold only letters, digits, '_', '.' and '-'")
    if not (isinstance(obj, type) and issubclass(obj, Core)):
        raise TypeError(f"protocol {name!r} must be a nanopy.protocols.Core subclass, got {obj!r}")
    for attr in ("protocol_id", "peer_id"):
        value = getattr(obj, attr, None)
        if not isinstance(value, int) or not 0 <= value <= 0xFFFF:
            raise TypeError(f"protocol {name!r}: class attribute {attr} must be an int 0..65535, got {value!r}")
    for attr in ("name", "peer_name"):
        if not isinstance(getattr(obj, attr, None), str):
            raise TypeError(f"protocol {name!r}: class attribute {attr} must be a str")
    return obj


def _validate_transport(name: str, obj: Any) -> Any:
    from .transports._base import Transport

    if not _SCHEME.match(name):
        raise ValueError(
            f"transport scheme {name!r} is not a valid URL scheme (lower-case letter, then a-z 0-9 + . -)"
        )
    if isinstance(obj, type) and issubclass(obj, Transport):
        obj = obj()
    if not isinstance(obj, Transport):
        raise TypeError(f"transport {name!r} must be a nanopy.transports.Transport, got {obj!r}")
    for method in ("listen", "dial", "check_url"):
        if not callable(getattr(obj, method, None)):
            raise TypeError(f"transport {name!r} lacks {method}()")
    options = getattr(obj, "endpoint_options", ())
    if isinstance(options, str) or not all(isinstance(o, str) for o in options):
        raise TypeError(f"transport {name!r}: endpoint_options must be a tuple of str, got {options!r}")
    schemes = tuple(getattr(obj, "schemes", ()) or ())
    if schemes and name not in schemes:
        raise ValueError(f"transport registered as {name!r} declares schemes {schemes!r}")
    return obj


def _protocol_error(msg: str) -> Exception:
    return ValueError(msg)


def _address_error(msg: str) -> Exception:
    from .core.errors import AddressError

    return AddressError(msg)


BUILTIN_PROTOCOLS = {
    "pair": "nanopy.protocols.pair:Pair0",
    "pair1": "nanopy.protocols.pair1:Pair1",
    "push": "nanopy.protocols.pipeline:Push0",
    "pull": "nanopy.protocols.pipeline:Pull0",
    "pub": "nanopy.protocols.pubsub:Pub0",
    "sub": "nanopy.protocols.pubsub:Sub0",
    "req": "nanopy.protocols.reqrep:Req0",
    "rep": "nanopy.protocols.reqrep:Rep0",
    "surveyor": "nanopy.protocols.survey:Surveyor0",
    "respondent": "nanopy.protocols.survey:Respondent0",
    "bus": "nanopy.protocols.bus:Bus0",
}

BUILTIN_TRANSPORTS = {
    "tcp": "nanopy.transports.tcp:transport",
    "ipc": "nanopy.transports.ipc:transport",
    "inproc": "nanopy.transports.inproc:transport",
    "ws": "nanopy.transports.ws:transport",
    "wss": "nanopy.transports.ws:secure_transport",
    "tls+tcp": "nanopy.transports.tls:transport",
    "zmtp+tcp": "nanopy.transports.zmtp._transport:tcp_transport",
    "zmtp+ipc": "nanopy.transports.zmtp._transport:ipc_transport",
}

# Built-ins that need an optional dependency: name -> the nanopy extra that installs it.
OPTIONAL_EXTRAS = {"ws": "ws", "wss": "ws"}

protocols = Registry("nanopy.protocols", "protocol", BUILTIN_PROTOCOLS, _validate_protocol, _protocol_error)
transports = Registry("nanopy.transports", "transport", BUILTIN_TRANSPORTS, _validate_transport, _address_error)
