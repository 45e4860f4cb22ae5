"""A preload that starts a thread only later, when the helper gets SIGUSR1 (a test's cue).

Only the fork server's helper imports it (as a preload): the helper is single-threaded at startup and
must refuse to fork once this thread runs.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_stop = threading.Event()


def _start(signum: int, frame: FrameType | None) -> None:
    threading.Thread(target=_stop.wait, name="late-exporter", daemon=True).start()


signal.signal(signal.SIGUSR1, _start)
