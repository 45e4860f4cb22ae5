"""Stands in for ``async_local_executor.child`` where no api-server runs (the end-to-end suite runs the
real one). It reads the same stdin payload and exits the way the real child would, chosen by the test:
the workload's task id (or connection id) names the behaviour."""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def main() -> int:
    payload = json.loads(sys.stdin.read())
    workload = payload["workload"]
    name = workload.get("ti", {}).get("task_id") or workload.get("connection_id") or "ok"
    print(f"stub running {name} argv={sys.argv[1:]}", flush=True)
    if name == "crash":
        return 1
    if name == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    if name.startswith("hold:"):
        # Held until the test removes the file: a child the test lets finish when it chooses.
        gate = name.split(":", 1)[1]
        while os.path.exists(gate):
            time.sleep(0.01)
    return 0


if __name__ == "__main__":
    sys.exit(main())
