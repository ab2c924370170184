"""The transport registry: URL schemes to transports (built-ins, ``register``, entry points).

The public functions are in nanopy/transports/__init__.py; the loader is nanopy/_plugins.py.
"""

from __future__ import annotations

import re
from typing import Any

from .._plugins import Registry
from ..core.errors import AddressError
from ._base import Transport

# RFC 3986 scheme syntax, lower case only (URLs are matched exactly).
_SCHEME = re.compile(r"[a-z][a-z0-9+.\-]*\Z")


def _validate_transport(name: str, obj: Any) -> Any:
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


def _address_error(msg: str) -> Exception:
    return AddressError(msg)


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

transports = Registry(
    "nanopy.transports", "transport", BUILTIN_TRANSPORTS, _validate_transport, _address_error, OPTIONAL_EXTRAS
)


def carries_multipart(url: str) -> bool:
    """Whether ``url``'s transport carries multipart messages (``Transport.carries_multipart``).

    The scheme is looked up in the registry, so a plug-in transport that declares
    the capability counts as the ZMTP ones do. An unknown scheme, or one whose
    transport cannot load, carries none (bind/connect report it, not this).
    """
    scheme, sep, _ = url.partition("://")
    if not sep:
        return False
    try:
        transport = transports.get(scheme)
    except (AddressError, ImportError, ValueError):
        return False
    return bool(getattr(transport, "carries_multipart", False))
