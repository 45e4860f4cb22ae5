"""A preload that starts a thread at import, as tracing and monitoring SDKs do (their exporters).

Only the fork server's helper imports it (as a preload): a helper with this thread must not fork.
"""

from __future__ import annotations

import threading

_stop = threading.Event()
threading.Thread(target=_stop.wait, name="sdk-exporter", daemon=True).start()
