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

    perf record -e cpu-clock -a -g -F 499 -o build/perf.data -- python -m benchmarks --profile quick \\
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
# A helper's own start (its imports), before it forks anything: once per helper, not per task.
START: Final = "fork server's start (imports), before its first fork"
# A sample's period is in ns only for the software clocks; a hardware event's counts cycles or the like.
CLOCK_EVENTS: Final = ("cpu-clock", "task-clock")
# The title this executor's workload process takes (adapter/startup.py), as its comm shows it.
WORKLOAD_TITLE: Final = "airflow worker"
_FORK: Final = re.compile(r"PERF_RECORD_FORK\((\d+):(\d+)\):\((\d+):(\d+)\)")
_COMM: Final = re.compile(r"PERF_RECORD_COMM(?: exec)?: (?P<name>.*):(?P<pid>\d+)/(?P<tid>\d+)\s*$")
_HEADER: Final = re.compile(
    r"^\s*(?P<comm>.*?)\s+(?P<pid>\d+)/(?P<tid>\d+)\s+[\d.]+:\s+(?P<period>\d+)\s+(?P<event>[\w-]+)"
)


class WrongEvent(ValueError):
    """The recording sampled another event than the CPU clock: its periods are not times."""


@dataclass(eq=False)
class _Life:
    """One process between its fork and the next fork of its pid (pids are reused)."""

    pid: int
    parent: _Life | None
    titled: bool = False  # took the workload's title
    forked: bool = False  # forked a process of its own


@dataclass(frozen=True)
class Split:
    """CPU seconds by (role, kind), and how many workload processes the helpers forked."""

    seconds: Mapping[tuple[str, str], float]
    workloads: int
    kernel_frames: bool  # whether any sample had a kernel frame this module knows (kptr_restrict hides them)

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


def _titles_a_workload(comm: re.Match[str]) -> bool:
    # The main thread's name is the process's title; a thread naming itself says nothing of the process.
    return comm["pid"] == comm["tid"] and comm["name"].startswith(WORKLOAD_TITLE)


class _Reader:
    """Reads ``perf script`` output, samples and task events in time order, one line at a time."""

    def __init__(self, helpers: set[int]) -> None:
        self._helpers = helpers
        self.lives: dict[int, _Life] = {}  # the current life of each pid
        self.every: list[_Life] = []
        self.spent: dict[tuple[_Life, str], float] = collections.defaultdict(float)
        self.kernel_frames = False
        self._sample: tuple[_Life, int, str] | None = None
        self._frames: list[str] = []

    def life(self, pid: int) -> _Life:
        found = self.lives.get(pid)
        if found is None:  # forked before the recording began
            found = self._begin(_Life(pid, None))
        return found

    def _begin(self, life: _Life) -> _Life:
        self.lives[life.pid] = life
        self.every.append(life)
        return life

    def line(self, text: str) -> None:
        if "PERF_RECORD_" in text:
            self._end_sample()
            self._event(text)
        elif not text.strip():
            self._end_sample()
        elif self._sample is not None:
            parts = text.split()
            if len(parts) >= 2:
                self._frames.append(parts[1])
        elif (header := _HEADER.match(text)) is not None:
            event = header["event"]
            if event not in CLOCK_EVENTS:
                raise WrongEvent(
                    f"the recording sampled {event}, not the CPU clock: record with -e cpu-clock"
                )
            self._sample = (self.life(int(header["pid"])), int(header["period"]), event)

    def _event(self, text: str) -> None:
        if (fork := _FORK.search(text)) is not None:
            if fork[1] == fork[2]:  # a new process (a new thread shares its pid)
                parent = self.life(int(fork[3]))
                parent.forked = True
                self._begin(_Life(int(fork[1]), parent))
        elif (comm := _COMM.search(text)) is not None and _titles_a_workload(comm):
            self.life(int(comm["pid"])).titled = True

    def _end_sample(self) -> None:
        if self._sample is not None:
            life, period, _ = self._sample
            kind = _kind(self._frames)
            self.kernel_frames = self.kernel_frames or kind != USER
            if life.pid in self._helpers and not life.forked:
                kind = START
            self.spent[(life, kind)] += period / 1e9
        self._sample, self._frames = None, []

    def finish(self) -> None:
        self._end_sample()


def split(lines: Iterable[str], helpers: Iterable[int]) -> Split:
    """Split the samples of ``perf script --show-task-events`` output by role and kind.

    A helper's child is a workload process once it takes the workload's title or forks the task's
    process; any other child of a helper (one forked to answer a check) is counted as the fork server's.
    The fork events name the forking process as parent, so a workload forked with ``CLONE_PARENT`` (the
    scheduler's child) is the helper's here.

    :param lines: the output of ``perf script --show-task-events -F comm,pid,tid,time,period,event,ip,sym``
    :param helpers: the fork-server helpers' pids
    :raises WrongEvent: when the samples are of another event than the CPU clock
    """
    helper_set = set(helpers)
    reader = _Reader(helper_set)
    for text in lines:
        reader.line(text)
    reader.finish()
    roles: dict[_Life, str | None] = {}

    def role(life: _Life) -> str | None:
        if life not in roles:
            parent = life.parent
            above = role(parent) if parent is not None else None
            if life.pid in helper_set and above is None:
                roles[life] = "fork server"
            elif above == "fork server":
                roles[life] = "workload process" if life.titled or life.forked else "fork server"
            elif above in ("workload process", "task process"):
                roles[life] = "task process"
            else:
                roles[life] = None
        return roles[life]

    seconds: dict[tuple[str, str], float] = collections.defaultdict(float)
    for (life, kind), spent in reader.spent.items():
        if (found := role(life)) is not None:
            seconds[(found, kind)] += spent
    workloads = sum(1 for life in reader.every if role(life) == "workload process")
    return Split(dict(seconds), workloads, reader.kernel_frames)


def _perf_script(data: Path) -> Iterator[str]:
    fields = "comm,pid,tid,time,period,event,ip,sym"
    command = ["perf", "script", "-i", str(data), "--show-task-events", "-F", fields]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, errors="replace") as perf:
        assert perf.stdout is not None
        yield from perf.stdout
    if perf.returncode:
        raise subprocess.CalledProcessError(perf.returncode, command)


def render(found: Split) -> str:
    """The split as a Markdown table, ms per workload process."""
    kinds = [START] + [k for k, _ in KINDS] + [USER]
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
    if not found.kernel_frames:
        lines += [
            "",
            "No sample had a kernel frame this split knows (is kernel.kptr_restrict set?): all is user code.",
        ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.perf_split", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "data", type=Path, help="perf.data of a `perf record -e cpu-clock -a -g` over the run"
    )
    parser.add_argument("logs", type=Path, nargs="+", help="the scheduler logs that name the helpers")
    args = parser.parse_args(argv)
    helpers = {pid for log in args.logs for pid in helper_pids(log.read_text(errors="replace"))}
    if not helpers:
        print("no fork-server helper is named in those logs (fork server ready (pid N)", file=sys.stderr)
        return 2
    try:
        found = split(_perf_script(args.data), helpers)
    except WrongEvent as exc:
        print(exc, file=sys.stderr)
        return 2
    print(render(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
