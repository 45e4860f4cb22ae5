"""Stands in for ``async_local_executor.adapter.child_cli`` where no metadata database holds the task (the
end-to-end tests run the real `airflow tasks run`). It reads the same stdin payload and exits the way
the real child would, chosen by the test: the command's task id names the behaviour."""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def main() -> int:
    return behave(sys.stdin.read())


def forked(argv: list[str], stdin: bytes) -> int:
    """The same stub as a fork-server target."""
    return behave(stdin.decode())


def behave(raw: str) -> int:
    command = json.loads(raw)["command"]
    name = command[4]  # airflow tasks run <dag_id> <task_id> <run_id> ...
    print(f"stub running {' '.join(command)}", flush=True)
    if name == "crash":
        return 1
    if name == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    if name.startswith("hold:"):
        # Held until the test removes the file: a child the test lets finish when it chooses.
        gate = name.split(":", 1)[1]
        open(f"{gate}.{os.getpid()}.started", "w").close()
        while os.path.exists(gate):
            time.sleep(0.01)
    return 0


if __name__ == "__main__":
    sys.exit(main())
