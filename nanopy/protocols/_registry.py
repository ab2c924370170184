"""The protocol registry: names to protocol cores (built-ins, ``register``, entry points).

The public functions are in nanopy/protocols/__init__.py; the loader is nanopy/_plugins.py.
"""

from __future__ import annotations

import re
from typing import Any

from .._plugins import Registry
from ..core.base import Core

_PROTOCOL_NAME = re.compile(r"[A-Za-z0-9_.\-]+\Z")


def _validate_protocol(name: str, obj: Any) -> Any:
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


def _protocol_error(msg: str) -> Exception:
    return ValueError(msg)


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

protocols = Registry("nanopy.protocols", "protocol", BUILTIN_PROTOCOLS, _validate_protocol, _protocol_error)
