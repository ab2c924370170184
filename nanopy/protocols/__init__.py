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
)
from .._core import (
    CANCEL_TIMER as CANCEL_TIMER,
)
from .._core import (
    CLOSE_PIPE as CLOSE_PIPE,
)
from .._core import (
    READY as READY,
)
from .._core import (
    RESUME_READ as RESUME_READ,
)
from .._core import (
    TRANSMIT as TRANSMIT,
)
from .._core import (
    ActionKind as ActionKind,
)
from .._core import (
    BodyQueuing as BodyQueuing,
)
from .._core import (
    Core as Core,
)
from .._core import (
    Distributing as Distributing,
)
from .._core import (
    FairQueue as FairQueue,
)
from .._core import (
    FairQueuing as FairQueuing,
)
from .._core import (
    LoadBalancer as LoadBalancer,
)
from .._core import (
    LoadBalancing as LoadBalancing,
)
from .._core import (
    PipeInfo as PipeInfo,
)
from .._registry import protocols as _registry


def register(name: str, core: type[Core], *, override: bool = False) -> None:
    """Register a protocol core class under ``name`` for ``nanopy.Socket(name)``."""
    _registry.register(name, core, override=override)


def get(name: str) -> type[Core]:
    """The core class registered as ``name`` (raises ``ValueError`` naming the known ones)."""
    core: type[Core] = _registry.get(name)
    return core
