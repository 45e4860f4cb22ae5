"""What kind of CPU this executor's per-task processes spend: a split of ``perf record -a -g`` samples.

The role account (:mod:`benchmarks.roles`) says how much CPU each role takes per task; this says what
the fork server's processes spend it on, from the kernel's call chains: copying page tables at a fork,
copy-on-write page faults, tearing an address space down at exit, other system calls, or user code
(the interpreter running Python). A forked workload shares the fork server's preloaded pages until it
writes to them; each first write to a shared page is a fault that copies it, and CPython writes to an
object's page whenever it changes the object's reference count.

Roles, from the recording's fork events:

- ``fork server``: the helpers the scheduler's log names as ready (``fork server ready (pid N``);
- ``workload process``: what a helper forked (the entry process, which runs Airflow's task supervisor);
- ``task process``: what a workload process forked, and everything below it.

Usage, from a recording of a run that kept its homes::

    perf record -a -g -F 499 -o build/perf.data -- python -m benchmarks --profile quick \\
        --scenarios ordinary --variants ours --repeat 1 --database postgres --keep-homes
    python -m benchmarks.perf_split build/perf.data /tmp/ale-bench-ours-*/logs/scheduler.log

Samples of processes outside the helpers' trees (the stock variant's, Airflow's) are left out.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from benchmarks.roles import helper_pids

ROLES: Final[tuple[str, ...]] = ("fork server", "workload process", "task process")
# Checked in this order against a sample's kernel frames; the first kind that matches is the sample's.
KINDS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("fork: page tables copied", ("copy_process", "dup_mm", "copy_page_range")),
    ("exit: address space torn down", ("exit_mmap", "mmput", "do_exit", "do_group_exit")),
    ("page fault: copy-on-write", ("do_wp_page", "wp_page_copy")),
    ("page fault: other", ("asm_exc_page_fault", "exc_page_fault")),
    ("other system calls", ("entry_SYSCALL_64", "do_syscall_64")),
)
USER: Final = "user code (the interpreter)"
_FORK: Final = re.compile(r"PERF_RECORD_FORK\((\d+):(\d+)\):\((\d+):(\d+)\)")
_HEADER: Final = re.compile(r"^\s*(?P<comm>.*?)\s+(?P<pid>\d+)/(?P<tid>\d+)\s+[\d.]+:\s+(?P<period>\d+)\s")


@dataclass(frozen=True)
class Split:
    """CPU seconds by (role, kind), and how many workload processes the helpers forked."""

    seconds: Mapping[tuple[str, str], float]
    workloads: int

    def per_task_ms(self, role: str, kind: str | None = None) -> float:
        """Milliseconds per workload process of ``role`` (of one ``kind``, or all of them)."""
        total = sum(s for (r, k), s in self.seconds.items() if r == role and kind in (None, k))
        return 1000.0 * total / self.workloads if self.workloads else 0.0


def _kind(frames: Sequence[str]) -> str:
    present = set(frames)
    for kind, names in KINDS:
        if present.intersection(names):
            return kind
    return USER


def _samples(lines: Iterable[str]) -> Iterator[tuple[int, int, list[str]]]:
    """(pid, period in ns, symbols of its call chain, innermost first) per sample of ``perf script``."""
    current: tuple[int, int] | None = None
    frames: list[str] = []
    for line in lines:
        if not line.strip():
            if current is not None:
                yield current[0], current[1], frames
            current, frames = None, []
            continue
        if current is None:
            match = _HEADER.match(line)
            if match:
                current = (int(match["pid"]), int(match["period"]))
            continue
        parts = line.split()
        if len(parts) >= 2:
            frames.append(parts[1])
    if current is not None:
        yield current[0], current[1], frames


def split(script: Iterable[str], events: Iterable[str], helpers: Iterable[int]) -> Split:
    """Split ``perf script``'s samples (``script``) by role and kind.

    :param script: the output of ``perf script -F comm,pid,tid,time,period,ip,sym``
    :param events: the lines of ``perf script --show-task-events`` (only the fork records are read)
    :param helpers: the fork-server helpers' pids
    """
    parent: dict[int, int] = {}
    for line in events:
        match = _FORK.search(line)
        if match and match[1] == match[2]:  # a new process (a thread has its own tid)
            parent[int(match[1])] = int(match[3])
    helper_set = set(helpers)
    role: dict[int, str] = dict.fromkeys(helper_set, "fork server")
    # Fork events come in time order, so a process's parent has its role before the process does.
    for pid, ppid in parent.items():
        if ppid in helper_set:
            role[pid] = "workload process"
        elif role.get(ppid) in ("workload process", "task process"):
            role[pid] = "task process"
    seconds: dict[tuple[str, str], float] = collections.defaultdict(float)
    for pid, period, frames in _samples(script):
        if pid in role:
            seconds[(role[pid], _kind(frames))] += period / 1e9
    workloads = sum(1 for r in role.values() if r == "workload process")
    return Split(dict(seconds), workloads)


def _perf_script(data: Path, *args: str) -> list[str]:
    result = subprocess.run(
        ["perf", "script", "-i", str(data), *args],
        check=True,
        capture_output=True,
        text=True,
        errors="replace",
    )
    return result.stdout.splitlines()


def render(found: Split) -> str:
    """The split as a Markdown table, ms per workload process."""
    kinds = [k for k, _ in KINDS] + [USER]
    lines = [
        f"ms of CPU per workload process ({found.workloads} forked), by what it was spent on:",
        "",
        "| | " + " | ".join(ROLES) + " |",
        "|---|" + "---|" * len(ROLES),
    ]
    lines.extend(
        f"| {kind} | " + " | ".join(f"{found.per_task_ms(r, kind):.1f}" for r in ROLES) + " |"
        for kind in kinds
    )
    lines.append("| **total** | " + " | ".join(f"**{found.per_task_ms(r):.1f}**" for r in ROLES) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.perf_split", description=__doc__.split("\n")[0]
    )
    parser.add_argument("data", type=Path, help="perf.data of a `perf record -a -g` over the run")
    parser.add_argument("logs", type=Path, nargs="+", help="the scheduler logs that name the helpers")
    args = parser.parse_args(argv)
    helpers = {pid for log in args.logs for pid in helper_pids(log.read_text(errors="replace"))}
    if not helpers:
        print("no fork-server helper is named in those logs (fork server ready (pid N)", file=sys.stderr)
        return 2
    events = [line for line in _perf_script(args.data, "--show-task-events", "-F", "pid") if "FORK" in line]
    script = _perf_script(args.data, "-F", "comm,pid,tid,time,period,ip,sym")
    print(render(split(script, events, helpers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
