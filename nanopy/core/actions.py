"""The actions a protocol core emits (see nanopy/core/base.py's docstring for their fields)."""

from __future__ import annotations

import enum
from typing import Any


class ActionKind(enum.IntEnum):
    """The first element of every action tuple a core emits."""

    TRANSMIT = 1
    CLOSE_PIPE = 2
    RESUME_READ = 3
    ARM_TIMER = 4
    CANCEL_TIMER = 5
    READY = 6
    READY_CALLER = 7


TRANSMIT = ActionKind.TRANSMIT
CLOSE_PIPE = ActionKind.CLOSE_PIPE
RESUME_READ = ActionKind.RESUME_READ
ARM_TIMER = ActionKind.ARM_TIMER
CANCEL_TIMER = ActionKind.CANCEL_TIMER
READY = ActionKind.READY
READY_CALLER = ActionKind.READY_CALLER

#: ``(ActionKind, ...)``: see the module docstring for each kind's fields.
Action = tuple[Any, ...]
