"""Protocol cores and the protocol registry.

A protocol is a :class:`nanopy.protocols.Core` subclass (Sans-I/O, see
``nanopy/core/base.py`` for the contract). Built-ins and third-party protocols are
found through the ``nanopy.protocols`` entry-point group (name = protocol name);
:func:`register` adds one in-process. The building blocks the built-in cores
are made of (``LoadBalancing``, ``Distributing``, ``FairQueuing``, ``BodyQueuing``)
are exported for third-party protocols.
"""

from __future__ import annotations

from ..core.base import ARM_TIMER as ARM_TIMER
from ..core.base import CANCEL_TIMER as CANCEL_TIMER
from ..core.base import CLOSE_PIPE as CLOSE_PIPE
from ..core.base import READY as READY
from ..core.base import RESUME_READ as RESUME_READ
from ..core.base import TRANSMIT as TRANSMIT
from ..core.base import ActionKind as ActionKind
from ..core.base import BodyQueuing as BodyQueuing
from ..core.base import Core as Core
from ..core.base import Distributing as Distributing
from ..core.base import FairQueue as FairQueue
from ..core.base import FairQueuing as FairQueuing
from ..core.base import LoadBalancer as LoadBalancer
from ..core.base import LoadBalancing as LoadBalancing
from ..core.base import PipeInfo as PipeInfo
from ._registry import protocols as _registered


def register(name: str, core: type[Core], *, override: bool = False) -> None:
    """Register a protocol core class under ``name`` for ``nanopy.Socket(name)``."""
    _registered.register(name, core, override=override)


def get(name: str) -> type[Core]:
    """The core class registered as ``name`` (raises ``ValueError`` naming the known ones)."""
    core: type[Core] = _registered.get(name)
    return core
