"""What the scheduler log gets of a workload process's own output: its last lines, when it failed.

Rule: nothing is relayed line by line at INFO. Each workload keeps a bounded tail (``TAIL_LINES``, each
cut at ``TAIL_LINE_CHARS``), logged once with its failure; the tail is kept from every line, relayed or
not, so it always holds the true last lines. Lines are also relayed at DEBUG on the logger
``async_local_executor.child`` (the name operators turn on), and the fork server's own output at INFO,
both through a token bucket per workload (``RELAY_RATE`` lines a second, bursts of ``RELAY_BURST``, each
line cut at ``RELAY_LINE_CHARS``); lines beyond it are counted, and the count logged at most once every
``DROP_NOTICE_INTERVAL`` seconds per workload and once when it ends. Why: docs/design.md, "A tail per
workload, not every line at INFO".
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.launchers.base import HELPER_KEY

log = logging.getLogger("async_local_executor.child")

TAIL_LINES = 20
TAIL_LINE_CHARS = 2000  # a longer line is cut in the tail
RELAY_RATE = 100.0  # lines a second each workload may relay, on average
RELAY_BURST = 1000  # lines a workload may relay at once
RELAY_LINE_CHARS = 2000  # a longer line is cut where it is relayed
DROP_NOTICE_INTERVAL = 10.0  # seconds: at most one "lines dropped" notice per workload this often


@dataclass
class _Stream:
    """One workload's output: its tail and its relay budget. Loop thread only, until ``pop``."""

    tokens: float  # lines it may relay now
    refilled: float  # monotonic time the tokens were last topped up
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    dropped: int = 0  # lines not relayed since the last notice
    dropping_since: float = 0.0  # monotonic time of the first of them


class OutputRelay:
    """The output sink for every workload: called on the loop thread; ``pop`` from any thread.

    :param describe: a workload key's name in log lines
    :param clock: what the relay budget refills on
    :param rate: lines a second each workload may relay, on average
    :param burst: lines a workload may relay at once
    """

    def __init__(
        self,
        describe: Callable[[Hashable], str],
        *,
        clock: Clock = SYSTEM,
        rate: float = RELAY_RATE,
        burst: int = RELAY_BURST,
    ) -> None:
        self._describe = describe
        self._clock = clock
        self._rate = rate
        self._burst = burst
        self._streams: dict[Hashable, _Stream] = {}

    def __call__(self, key: Hashable, line: str) -> None:
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _Stream(float(self._burst), self._clock.monotonic())
        helper = key == HELPER_KEY
        if not helper:
            stream.tail.append(line[:TAIL_LINE_CHARS])
        level = logging.INFO if helper else logging.DEBUG
        if log.isEnabledFor(level) and self._admit(key, stream):
            log.log(level, "[%s] %s", key if helper else self._describe(key), _cut(line))

    def pop(self, key: Hashable) -> list[str]:
        """The workload's last lines, forgotten here; call once its outcome is in (its output is drained).

        Says how many of its lines were not relayed since the last notice, if any were.
        """
        stream = self._streams.pop(key, None)
        if stream is None:
            return []
        if stream.dropped:
            self._notice(key, stream)
        return list(stream.tail)

    def _admit(self, key: Hashable, stream: _Stream) -> bool:
        """Whether this line may be relayed; counts it (and says so, once an interval) if not."""
        now = self._clock.monotonic()
        stream.tokens = min(float(self._burst), stream.tokens + (now - stream.refilled) * self._rate)
        stream.refilled = now
        if stream.dropped and now - stream.dropping_since >= DROP_NOTICE_INTERVAL:
            self._notice(key, stream)
        if stream.tokens >= 1.0:
            stream.tokens -= 1.0
            return True
        if not stream.dropped:
            stream.dropping_since = now
        stream.dropped += 1
        return False

    def _notice(self, key: Hashable, stream: _Stream) -> None:
        log.info(
            "[%s] %d output lines dropped (limit %g lines/s, bursts of %d)",
            key if key == HELPER_KEY else self._describe(key),
            stream.dropped,
            self._rate,
            self._burst,
        )
        stream.dropped = 0


def _cut(line: str) -> str:
    if len(line) <= RELAY_LINE_CHARS:
        return line
    return f"{line[:RELAY_LINE_CHARS]} [{len(line) - RELAY_LINE_CHARS} more characters cut]"
