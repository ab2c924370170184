"""Plug-in registries for transports (by URL scheme) and protocols (by name).

Lookup order: in-process registrations, then built-ins, then the entry-point
group. Built-ins win: a third-party distribution cannot take over ``tcp`` unless
someone calls ``register(..., override=True)``. Everything loads lazily, on first
use of a name, and is validated when loaded.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

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
        self._lock = threading.Lock()

    def register(self, name: str, obj: Any, *, override: bool = False) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"{self.kind} name must be a non-empty str")
        obj = self._validate(name, obj)
        with self._lock:
            taken = name in self._registered or name in self._builtins
            if taken and not override:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered; pass override=True to replace it"
                )
            self._registered[name] = obj
            self._loaded.pop(name, None)

    def unregister(self, name: str) -> None:
        with self._lock:
            self._registered.pop(name, None)
            self._loaded.pop(name, None)

    def names(self) -> list[str]:
        found = set(self._builtins) | set(self._registered)
        try:
            found |= {ep.name for ep in entry_points(group=self.group)}
        except Exception:  # pragma: no cover - broken metadata must not break lookups
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
        if target is None:
            eps = [ep for ep in entry_points(group=self.group) if ep.name == name]
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
            obj = getattr(importlib.import_module(module), attr)
        try:
            return self._validate(name, obj)
        except (TypeError, ValueError) as exc:
            raise self._error(f"{self.kind} plug-in {name!r} is broken: {exc}") from exc


def _validate_protocol(name: str, obj: Any) -> Any:
    from ._core import Core

    if not (isinstance(obj, type) and issubclass(obj, Core)):
        raise TypeError(f"protocol {name!r} must be a nanopy.protocols.Core subclass, got {obj!r}")
    for attr in ("protocol_id", "peer_id", "name", "peer_name"):
        if not hasattr(obj, attr):
            raise TypeError(f"protocol {name!r} lacks the class attribute {attr!r}")
    return obj


def _validate_transport(name: str, obj: Any) -> Any:
    from .transports._base import Transport

    if isinstance(obj, type) and issubclass(obj, Transport):
        obj = obj()
    if not isinstance(obj, Transport):
        raise TypeError(f"transport {name!r} must be a nanopy.transports.Transport, got {obj!r}")
    for method in ("listen", "dial"):
        if not callable(getattr(obj, method, None)):
            raise TypeError(f"transport {name!r} lacks {method}()")
    return obj


def _protocol_error(msg: str) -> Exception:
    return ValueError(msg)


def _address_error(msg: str) -> Exception:
    from ._errors import AddressError

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
}

protocols = Registry("nanopy.protocols", "protocol", BUILTIN_PROTOCOLS, _validate_protocol, _protocol_error)
transports = Registry("nanopy.transports", "transport", BUILTIN_TRANSPORTS, _validate_transport, _address_error)
