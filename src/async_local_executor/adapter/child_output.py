"""What the scheduler log gets of a workload process's own output: its last lines, when it failed.

At parallelism 256 the task supervisors write tens of thousands of lines a minute; relayed one by one
through the scheduler's logging, they cost the loop thread (and, through the GIL, the scheduler's own
thread) seconds of CPU and delayed everything else. The task's own log already holds what its task
wrote, so each workload keeps a bounded tail here, logged once with a failure. Every line is still
relayed at DEBUG for whoever turns that on for ``async_local_executor.child``; the fork server's own
output (low volume, and the only place a preload problem shows) is always relayed.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Hashable

from async_local_executor.core.launchers.forkserver import HELPER_KEY

log = logging.getLogger("async_local_executor.child")

TAIL_LINES = 20
TAIL_LINE_CHARS = 2000  # a longer line is cut in the tail (the whole line reaches DEBUG)


class ChildOutput:
    """The output sink for every workload: called on the loop thread; ``pop`` from any thread.

    :param describe: a workload key's name in log lines
    """

    def __init__(self, describe: Callable[[Hashable], str]) -> None:
        self._describe = describe
        self._tails: dict[Hashable, deque[str]] = {}

    def __call__(self, key: Hashable, line: str) -> None:
        if key == HELPER_KEY:
            log.info("[%s] %s", key, line)
            return
        if log.isEnabledFor(logging.DEBUG):
            log.debug("[%s] %s", self._describe(key), line)
        tail = self._tails.get(key)
        if tail is None:
            tail = self._tails[key] = deque(maxlen=TAIL_LINES)
        tail.append(line[:TAIL_LINE_CHARS])

    def pop(self, key: Hashable) -> list[str]:
        """The workload's last lines, forgotten here; call once its outcome is in (its output is drained)."""
        tail = self._tails.pop(key, None)
        return list(tail) if tail is not None else []
