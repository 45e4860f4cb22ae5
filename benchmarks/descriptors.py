"""How many descriptors a scheduler running this executor holds: idle, and with N tasks running.

    .venv/bin/python -m benchmarks.descriptors [--tasks 16] [--launcher forkserver --launcher subprocess]

For each launcher, a real Airflow 3 (PostgreSQL) with ``parallelism`` = N runs the e2e DAG
``descriptor_table`` (tests/e2e/dags_descriptors): N tasks held at a gate. The scheduler's open
descriptors (``/proc/<pid>/fd``) are counted when its executor is ready and idle, while all N tasks run,
and idle again after they end; with the fork-server launcher, the fork server's too. Prints one table,
with what the running tasks added by kind (pipe, socket, pidfd, ...): what a deployment needs per unit of
``parallelism``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from async_local_executor.ops.status_read import read_all
from harness.demo import EXECUTOR
from harness.sandbox import AirflowSandbox

DAGS = Path(__file__).resolve().parent.parent / "tests" / "e2e" / "dags_descriptors"
DAG_ID = "descriptor_table"
GUARD = 300.0


@dataclass(frozen=True)
class Count:
    total: int
    kinds: Counter[str]


def descriptors(pid: int) -> Count:
    """The open descriptors of ``pid``, and how many of each kind (``pipe``, ``socket``, a file, ...)."""
    kinds: Counter[str] = Counter()
    fd = Path(f"/proc/{pid}/fd")
    for entry in fd.iterdir():
        try:
            target = os.readlink(entry)
        except OSError:
            continue  # closed meanwhile
        kinds[_kind(target)] += 1
    return Count(sum(kinds.values()), kinds)


def _kind(target: str) -> str:
    if target.startswith(("pipe:", "socket:")):
        return target.split(":", 1)[0]
    if target.startswith("anon_inode:"):
        return target.removeprefix("anon_inode:").strip("[]")
    return "file"


def _wait(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + GUARD
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {GUARD:.0f}s")
        time.sleep(0.2)


def fork_server(scheduler: int) -> int | None:
    for child in psutil.Process(scheduler).children():
        if "forkserver.helper" in " ".join(child.cmdline()):
            return int(child.pid)
    return None


def measure(launcher: str, tasks: int) -> dict[str, Count | None]:
    with tempfile.TemporaryDirectory(prefix="ale-descriptors-") as folder:
        config = {
            "ALE_DESCRIPTORS_DIR": folder,
            "ALE_DESCRIPTORS_TASKS": str(tasks),
            "AIRFLOW__ASYNC_LOCAL_EXECUTOR__LAUNCHER": launcher,
        }
        with AirflowSandbox(
            executor=EXECUTOR, database="postgres", dags_folder=DAGS, parallelism=tasks, extra_config=config
        ) as sandbox:
            scheduler = sandbox.pids["scheduler"]
            log = sandbox.process_logs["scheduler"]
            sandbox.wait_for_dag(DAG_ID, timeout=GUARD)
            if launcher == "forkserver":
                _wait(
                    "the fork server ready",
                    lambda: "fork server ready (pid" in log.read_text(errors="replace"),
                )
            found: dict[str, Count | None] = {"idle": descriptors(scheduler)}
            run_id = sandbox.trigger(DAG_ID)
            _wait("every task running", lambda: started(Path(folder)) == tasks)
            found["busy"] = descriptors(scheduler)
            helper = fork_server(scheduler)
            found["fork server busy"] = None if helper is None else descriptors(helper)
            (Path(folder) / "gate").touch()
            state = sandbox.wait_for_run(DAG_ID, run_id, timeout=GUARD)
            if state != "success":
                raise RuntimeError(f"the run ended {state}")
            _wait("no workload running", lambda: running(sandbox) == 0)
            found["idle after"] = descriptors(scheduler)
            return found


def started(folder: Path) -> int:
    """The tasks that have started, from the marks they left (``started.<i>``)."""
    return sum(1 for mark in folder.glob("started.*") if mark.suffix != ".tmp")


def running(sandbox: AirflowSandbox) -> int | None:
    """The workloads the executor's status file lists as running (None before it has one)."""
    for found in read_all(sandbox.home / "async_local_executor"):
        if not found.stale:
            return len(found.data.get("running", []))
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=16, help="tasks running at once (= parallelism)")
    parser.add_argument("--launcher", action="append", choices=("forkserver", "subprocess"))
    args = parser.parse_args()
    rows = []
    for launcher in args.launcher or ["forkserver", "subprocess"]:
        found = measure(launcher, args.tasks)
        idle, busy = found["idle"], found["busy"]
        assert idle is not None
        assert busy is not None
        added = busy.kinds - idle.kinds
        per = (busy.total - idle.total) / args.tasks
        helper = found["fork server busy"]
        after = found["idle after"]
        rows.append(
            (
                launcher,
                str(idle.total),
                str(busy.total),
                f"{per:.2f}",
                " ".join(f"{kind} {n / args.tasks:g}" for kind, n in sorted(added.items())),
                "-" if after is None else str(after.total),
                "-" if helper is None else str(helper.total),
            )
        )
    header = (
        "launcher",
        "idle",
        f"{args.tasks} running",
        "per task",
        "per task by kind",
        "idle after",
        "fork server",
    )
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
