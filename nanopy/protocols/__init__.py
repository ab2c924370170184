"""Protocol cores and the protocol registry.

A protocol is a :class:`nanopy.protocols.Core` subclass (Sans-I/O, see
``nanopy/_core.py`` for the contract). Built-ins and third-party protocols are
found through the ``nanopy.protocols`` entry-point group (name = protocol name);
:func:`register` adds one in-process. The building blocks the built-in cores
are made of (``LoadBalancing``, ``Distributing``, ``FairQueuing``, ``BodyQueuing``)
are exported for third-party protocols.
"""

from __future__ import annotations

from .._core import (
    ARM_TIMER as ARM_TIMER,
    CANCEL_TIMER as CANCEL_TIMER,
    CLOSE_PIPE as CLOSE_PIPE,
    READY as READY,
    RESUME_READ as RESUME_READ,
    TRANSMIT as TRANSMIT,
    ActionKind as ActionKind,
    BodyQueuing as BodyQueuing,
    Core as Core,
    Distributing as Distributing,
    FairQueue as FairQueue,
    FairQueuing as FairQueuing,
    LoadBalancer as LoadBalancer,
    LoadBalancing as LoadBalancing,
    PipeInfo as PipeInfo,
)
from .._registry import protocols as _registry


def register(name: str, core: type[Core], *, override: bool = False) -> None:
    """Register a protocol core class under ``name`` for ``nanopy.Socket(name)``."""
    _registry.register(name, core, override=override)


def get(name: str) -> type[Core]:
    """The core class registered as ``name`` (raises ``ValueError`` naming the known ones)."""
    return _registry.get(name)
