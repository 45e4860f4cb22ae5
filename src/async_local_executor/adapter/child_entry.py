"""What both workload entry points (``child`` on Airflow 3, ``child_cli`` on Airflow 2) read from argv.

Only what is no secret travels on argv (``/proc/<pid>/cmdline`` is world-readable): the workload itself
comes on stdin or, from the fork server, in memory.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from async_local_executor.core import cpu_priority


@dataclass(frozen=True)
class EntryArgs:
    parent_pid: int  # 0: not checked
    cpu_priority: str


def parse(argv: Sequence[str] | None) -> EntryArgs:
    """The entry flags; anything else on the command line (the interpreter, ``-m module``) is ignored."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--parent-pid", type=int, default=0)
    parser.add_argument("--cpu-priority", default=cpu_priority.NORMAL)
    args, _ = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    return EntryArgs(int(args.parent_pid), str(args.cpu_priority))


def argv_flags(parent_pid: int, priority: str) -> tuple[str, ...]:
    """The flags the executor puts on a workload's command line."""
    return ("--parent-pid", str(parent_pid), "--cpu-priority", priority)


def lower_priority(args: EntryArgs) -> None:
    """Apply the CPU priority; a failure is said on stderr (the scheduler log) and the workload runs."""
    # Both launchers make the workload process the scheduler's own child: its parent is the scheduler.
    problem = cpu_priority.apply(args.cpu_priority, os.getppid())
    if problem:
        print(f"async_local_executor: {problem}", file=sys.stderr, flush=True)
