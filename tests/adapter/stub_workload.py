"""Stands in for the workload entry points where no api-server (Airflow 3) or metadata database holding
the task (Airflow 2) is at hand; the end-to-end suites run the real ones. It reads the same stdin payload
as :mod:`~async_local_executor.adapter.workload.airflow3` (a workload) or
:mod:`~async_local_executor.adapter.workload.airflow2` (a command) and exits the way the real entry would,
chosen by the test: the task id (or connection id) names the behaviour."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from async_local_executor.adapter.workload.entry import Entry

# First on its command line (no flag: the entry's parser would take it for --custody-dir): the stub runs
# in custody, as the real entry does.
CUSTODY = "in-custody"


def main() -> int:
    return behave(sys.stdin.read(), sys.argv[1:])


def forked(argv: list[str], stdin: bytes) -> int:
    """The same stub as a fork-server target."""
    return behave(stdin.decode(), argv[1:])


def behave(raw: str, args: list[str]) -> int:
    payload = json.loads(raw)
    if "command" in payload:  # Airflow 2: airflow tasks run <dag_id> <task_id> <run_id> ...
        command = payload["command"]
        name = command[4]
        print(f"stub running {' '.join(command)}", flush=True)
    else:
        workload = payload["workload"]
        name = workload.get("ti", {}).get("task_id") or workload.get("connection_id") or "ok"
        timeout = os.environ.get("AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT")
        print(
            f"stub running {name} argv={args} server={payload['server']} client_timeout={timeout}", flush=True
        )
    if name == "crash":
        for i in range(30):
            print(f"crash line {i}")
        return 1
    if name == "gone":
        # What the real entry does when the api-server answers 404 not_found (workload.airflow3.ti_gone).
        return 4
    if name == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    if name.startswith("hold:"):
        # Held until the test removes the file: a process the test lets finish when it chooses.
        gate = name.split(":", 1)[1]
        open(f"{gate}.{os.getpid()}.started", "w").close()
        while os.path.exists(gate):
            time.sleep(0.01)
        # The test may choose the exit code by leaving it beside the gate.
        if os.path.exists(f"{gate}.code"):
            with open(f"{gate}.code") as f:
                return int(f.read())
    return 0


def _custody_entry() -> Entry[str]:
    """The real entry's skeleton (its custody, its exit record) around the stub's behaviour.

    Imported here, not at the top: the stub without custody starts as fast as it did.
    """
    from async_local_executor.adapter.workload.entry import Entry

    return Entry("tests.adapter.stub_workload", "workload", bytes.decode, lambda raw: behave(raw, []))


def custody_main() -> int:
    """The stub behind the flags the executor adds (``--parent-pid``, ``--handover-timeout``,
    ``--custody-dir``): in custody when they ask for it, its exit code recorded for an adopter."""
    return _custody_entry().main(sys.argv[2:])


def forked_custody(argv: list[str], stdin: bytes) -> int:
    """The same as a fork-server target."""
    return _custody_entry().forked_main(argv, stdin)


if __name__ == "__main__":
    sys.exit(custody_main() if sys.argv[1:2] == [CUSTODY] else main())
