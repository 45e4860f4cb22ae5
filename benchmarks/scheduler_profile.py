"""Where the scheduler process's threads spend a run (``--profile-scheduler DIR``).

Two views of each thread over the measured part of a run, taken side by side:

- the kernel's own accounting (``/proc/<pid>/task/<tid>/schedstat``): the time the thread ran on a core,
  and the time it was ready to run and waited for one (the cores taken by everything else: task
  processes, the api-server, the database). What is left of the wall time, the thread slept: in a
  blocking call (a database round trip, the scheduler's idle sleep, a lock) or waiting for the GIL;
- two sampling profiles (py-spy, without pausing the scheduler): every thread's stack whatever it does
  (``--idle``), and only the stack of the thread that holds the GIL (``--gil``). The second says how
  much of the run each thread held the GIL, so how much of the others' sleep it can explain.

Each run writes ``<stem>.idle.txt`` and ``<stem>.gil.txt`` (py-spy's raw, collapsed stacks, which
flamegraph tools read) and ``<stem>.json``: per thread (threads of one kind summed, e.g. the loop's
worker threads), the seconds of each kind and where its samples fell (inclusive per function). The
figures are the profile's; the py-spy processes cost a share of a core themselves, so a profiled run
is for finding where time goes, not for the benchmark's own figures.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RATE = 50  # samples a second: enough for seconds-long stalls, and a small load on 2 cores
TOP = 30  # functions kept per thread in the summary
# py-spy names a thread by its native id in decimal (Python 3.11 on), by Python's ident in hex before.
_LINE = re.compile(
    r"^thread \((?P<tid>0x[0-9A-Fa-f]+|\d+)\)(?::\s*(?P<name>[^;]*))?;?(?P<stack>.*) (?P<count>\d+)$"
)


class ProfilerMissing(RuntimeError):
    """py-spy is not installed (``make install`` installs the bench extra, which has it)."""


@dataclass(frozen=True)
class ThreadTimes:
    name: str
    cpu_s: float
    runqueue_s: float


def thread_times(pid: int) -> dict[int, ThreadTimes]:
    """Each live thread of ``pid``: its kernel name and the seconds it ran and waited for a core."""
    found: dict[int, ThreadTimes] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            ran, waited, _ = (task / "schedstat").read_text().split()
            name = "main" if task.name == str(pid) else (task / "comm").read_text().strip()
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
        found[int(task.name)] = ThreadTimes(name, int(ran) / 1e9, int(waited) / 1e9)
    return found


def kind(name: str) -> str:
    """Threads of one kind share a name but for a number (``asyncio_3``, ``Thread-12``)."""
    return re.sub(r"\d+", "N", name) or "unnamed"


def py_spy() -> str:
    """The py-spy binary; checked before the runs, so a missing one costs no deployment.

    :raises ProfilerMissing: it is not installed
    """
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise ProfilerMissing("py-spy is not installed: make install (the bench extra has it)")
    return found


def output(stem: Path, suffix: str) -> Path:
    """``<stem><suffix>``: a stem may hold dots (a variant's label), which ``with_suffix`` would cut."""
    return stem.parent / f"{stem.name}{suffix}"


@contextlib.contextmanager
def profiled(pid: int, stem: Path) -> Iterator[None]:
    """Profile process ``pid`` while the block runs; the summary goes to ``<stem>.json``.

    A thread that ends during the block (a worker thread of the loop, say) counts in the sampled
    views, not in the kernel's times, which are read at the block's start and end.
    """
    binary = py_spy()
    stem.parent.mkdir(parents=True, exist_ok=True)
    common = ("record", "--pid", str(pid), "--threads", "--nonblocking", "--rate", str(RATE))
    samplers: dict[str, subprocess.Popen[bytes]] = {}
    before, began = thread_times(pid), time.monotonic()
    try:
        for view, flag in (("idle", "--idle"), ("gil", "--gil")):
            samplers[view] = subprocess.Popen(
                (binary, *common, flag, "--format", "raw", "--output", str(output(stem, f".{view}.txt"))),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        yield
    finally:
        after, wall = thread_times(pid), time.monotonic() - began
        errors = {}
        for view, sampler in samplers.items():
            sampler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            try:
                _, err = sampler.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                sampler.kill()
                _, err = sampler.communicate()
            if sampler.returncode not in (0, -signal.SIGINT):
                errors[view] = err.decode(errors="replace")[-2000:]
        try:
            summary = summarize(stem, before, after, wall)
            summary["errors"] = errors
            output(stem, ".json").write_text(json.dumps(summary, indent=1) + "\n")
        except Exception as exc:  # noqa: BLE001 - the block's own error, if any, is the one to see
            log.warning("cannot summarise the scheduler profile %s: %s", stem, exc)


def stacks(path: Path) -> tuple[list[tuple[int, str, list[str], int]], int]:
    """(tid, thread name, frames outermost first, samples) of each line of a raw profile, and how many
    lines were not such a line."""
    rows = []
    unread = 0
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text(errors="replace").splitlines():
            m = _LINE.match(line)
            if m is None:
                unread += bool(line.strip())
                continue
            frames = [f for f in m["stack"].split(";") if f]
            rows.append((int(m["tid"], 0), m["name"] or "", frames, int(m["count"])))
    return rows, unread


def _function(frame: str) -> str:
    """``name (path:line)`` without its line: samples of one function add up."""
    return re.sub(r":\d+\)$", ")", frame)


def summarize(
    stem: Path, before: dict[int, ThreadTimes], after: dict[int, ThreadTimes], wall: float
) -> dict[str, Any]:
    idle, unread_idle = stacks(output(stem, ".idle.txt"))
    gil, unread_gil = stacks(output(stem, ".gil.txt"))
    # Python's thread names where py-spy saw them (the kernel's is the process's for a thread that sets
    # none); the scheduler's own thread is "main" in both views.
    names = {tid: t.name for tid, t in {**before, **after}.items()}
    for tid, name, _, _ in idle + gil:
        if name and names.get(tid) != "main":
            names[tid] = name
    threads: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"threads": 0, "sampled_s": 0.0, "gil_s": 0.0, "cpu_s": 0.0, "runqueue_s": 0.0}
    )
    for name in names.values():
        threads[kind(name)]["threads"] += 1
    for tid, end in after.items():
        start = before.get(tid, ThreadTimes(end.name, 0.0, 0.0))
        entry = threads[kind(names[tid])]
        entry["cpu_s"] += end.cpu_s - start.cpu_s
        entry["runqueue_s"] += end.runqueue_s - start.runqueue_s
    # Per view: the seconds each kind of thread was sampled, and in which functions (inclusive).
    tops: dict[str, dict[str, Counter[str]]] = {
        "top_s": defaultdict(Counter),
        "top_gil_s": defaultdict(Counter),
    }
    for rows, seconds, top in ((idle, "sampled_s", "top_s"), (gil, "gil_s", "top_gil_s")):
        for tid, _, frames, count in rows:
            group = kind(names.get(tid, ""))
            threads[group][seconds] += count / RATE
            for function in dict.fromkeys(_function(f) for f in frames):
                tops[top][group][function] += count
    for group, entry in threads.items():
        for top, counted in tops.items():
            entry[top] = {f: round(n / RATE, 2) for f, n in counted[group].most_common(TOP)}
        for key in ("sampled_s", "gil_s", "cpu_s", "runqueue_s"):
            entry[key] = round(entry[key], 2)
    # The samples span the profilers' lives, a fraction of a second beyond the block's ``wall_s``.
    return {
        "wall_s": round(wall, 2),
        "rate": RATE,
        "unread_lines": unread_idle + unread_gil,
        "threads": dict(threads),
    }
