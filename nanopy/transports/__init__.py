"""Transports and the transport registry.

Third-party packages add URL schemes through the ``nanopy.transports`` entry-point
group (name = scheme, value = a :class:`Transport` instance or class); nanopy loads
one the first time a URL with its scheme is used. In-process code can call
:func:`register`. Built-in schemes cannot be replaced silently: ``register`` raises
unless ``override=True``, and an entry point claiming a built-in name is ignored
with a warning. Plug-ins are validated when loaded (scheme syntax, a
:class:`Transport` with ``listen``/``dial``/``check_url``, ``endpoint_options`` a
tuple of str); a broken one gives an :class:`nanopy.AddressError` naming it.
See ``docs/transports.md`` for the interface and a worked example.
"""

from __future__ import annotations

from ._base import ChannelConnection as ChannelConnection
from ._base import Connection as Connection
from ._base import Listener as Listener
from ._base import PipeContext as PipeContext
from ._base import Transport as Transport
from ._registry import transports as _registered


def register(scheme: str, transport: Transport | type[Transport], *, override: bool = False) -> None:
    """Register ``transport`` for URLs ``scheme://...`` in this process.

    Raises:
        ValueError: the scheme is taken (a built-in, an installed plug-in or an
            earlier registration) and ``override`` is False, or it is not a valid
            lower-case URL scheme.
        TypeError: ``transport`` is not a :class:`Transport` (a class is instantiated).
    """
    _registered.register(scheme, transport, override=override)


def unregister(scheme: str) -> None:
    """Forget an in-process registration (built-ins and entry points stay)."""
    _registered.unregister(scheme)


def get(scheme: str) -> Transport:
    """The transport for ``scheme`` (raises :class:`nanopy.AddressError` naming the known ones)."""
    transport: Transport = _registered.get(scheme)
    return transport


def schemes() -> list[str]:
    """Every scheme known: built-in, registered and installed plug-ins."""
    return _registered.names()
