"""Entry point inside each workload process: ``python -m async_local_executor.child``.

The workload arrives as JSON on stdin, never in argv or the environment, because it carries the task's
identity token and ``/proc/<pid>/cmdline`` is readable by every local user.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import traceback
from typing import Any

EXIT_OK = 0  # the workload ran to its end (whatever the task's own outcome, which it reports itself)
EXIT_CRASHED = 1  # running the workload raised
EXIT_BAD_INPUT = 2  # the payload on stdin could not be read as a workload
EXIT_ORPHANED = 3  # the executor was gone before we started

_PR_SET_PDEATHSIG = 1


def encode_payload(workload_json: str, server: str, proctitle: str) -> bytes:
    """Build what the executor writes to a child's stdin."""
    return json.dumps(
        {"server": server, "proctitle": proctitle, "workload": json.loads(workload_json)}
    ).encode()


def _die_with_parent(parent_pid: int) -> None:
    # The kernel sends the signal when the thread that forked us exits: the executor's loop thread,
    # which lives as long as the executor. Checking the parent right after closes the race where it
    # died before prctl ran.
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if parent_pid and os.getppid() != parent_pid:
        sys.exit(EXIT_ORPHANED)


def _read_payload() -> dict[str, Any]:
    data = json.loads(sys.stdin.buffer.read())
    if not isinstance(data, dict) or "workload" not in data:
        raise ValueError("payload must be an object with a 'workload' field")
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m async_local_executor.child")
    parser.add_argument("--parent-pid", type=int, default=0)
    args = parser.parse_args(argv)
    _die_with_parent(args.parent_pid)

    try:
        payload = _read_payload()
        from airflow.executors import workloads
        from pydantic import TypeAdapter

        workload = TypeAdapter(workloads.ExecutorWorkload).validate_python(payload["workload"])
    except Exception as exc:  # noqa: BLE001 - any unreadable payload is the same failure: bad input
        print(f"async_local_executor.child: invalid workload on stdin: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT

    from airflow.executors.base_executor import BaseExecutor
    from airflow.sdk.log import configure_logging
    from airflow.settings import dispose_orm

    # Our parent's engine is not ours to use, and the task reaches the database through the API.
    dispose_orm(do_log=False)
    configure_logging(output=sys.stdout.buffer)
    try:
        BaseExecutor.run_workload(
            workload,
            server=payload.get("server"),
            proctitle=payload.get("proctitle"),
            subprocess_logs_to_stdout=False,
        )
    except Exception:  # noqa: BLE001 - the exit code carries it; the traceback goes to our log
        traceback.print_exc()
        sys.stdout.flush()
        return EXIT_CRASHED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
