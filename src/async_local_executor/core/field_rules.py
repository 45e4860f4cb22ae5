"""What a field of an on-disk format must be beyond its Python type, said once for every format.

A format's :class:`~typing.TypedDict` annotates such a field with a rule (``Annotated[int, COUNT]``); its
reader checks the rule (:mod:`~async_local_executor.ops.status_read`). The rules live in ``core`` because
``core`` defines records of the status file too (the health verdict, the preload summary).
"""

from __future__ import annotations

import enum
from typing import Final


class Rule(enum.Enum):
    PID = "a pid (a positive integer)"
    COUNT = "a count (an integer, 0 or more)"
    SAMPLE = "a [time, running, waiting] sample"


PID: Final = Rule.PID
COUNT: Final = Rule.COUNT
SAMPLE: Final = Rule.SAMPLE
