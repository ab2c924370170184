"""The plug-in loader behind the transport and protocol registries
(nanopy/transports/_registry.py, nanopy/protocols/_registry.py).

Lookup order: in-process registrations, then built-ins, then the entry-point
group. Built-ins win: a third-party distribution cannot take over ``tcp`` unless
someone calls ``register(..., override=True)``. Everything loads lazily, on first
use of a name, and is validated when loaded.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from . import _fork

log = logging.getLogger("nanopy")


class Registry:
    """Names to plug-ins of one kind: in-process registrations, built-ins (``module:attr``
    text, imported on first use), then the entry-point ``group``. ``extras`` names the
    nanopy extra a built-in's optional dependency comes with."""

    def __init__(
        self,
        group: str,
        kind: str,
        builtins: dict[str, str],
        validate: Callable[[str, Any], Any],
        error: Callable[[str], Exception],
        extras: dict[str, str] | None = None,
    ) -> None:
        self.group = group
        self._extras = extras or {}
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
                extra = self._extras.get(name)
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
