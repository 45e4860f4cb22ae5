"""Restart chaos: seeded sequences of scheduler stops, crashes, gaps and a second scheduler, played on one
real Airflow while tasks run, and the invariants every sequence must keep.

Shared by the end-to-end test (tests/e2e/test_restart_chaos.py, small size) and the benchmark's ``chaos``
case (benchmarks/scenarios/chaos.py, full size). A seed (``ALE_CHAOS_SEED``, else a random one, always
printed; the suite's small test plays a fixed one unless told otherwise) decides everything the test chooses: each sequence's tasks (how long each runs, whether it fails
on purpose, which limit it has and whether it ends inside it) and its steps (which, when, how long no
scheduler runs). The real Airflow decides the rest, so a seed replays the same plan, not the same
interleaving to the millisecond.

Steps (:data:`KINDS`), each once the run's mapped tasks are running:

- ``sigterm``: SIGTERM to the scheduler, which hands its running tasks over and exits; after ``down``
  seconds (none, under or over ``handover_timeout``) a new scheduler starts in the same home.
- ``kill9``: the same with SIGKILL.
- ``retried``: a ``sigterm`` whose next scheduler is started with the one injection this test makes: its
  ``try_adopt_task_instances`` raises ``OperationalError`` once after the real call, so Airflow's
  ``run_with_db_retries`` calls it again with the same task instances (tests/e2e/dags/chaos_adoption.py).
- ``ha``: a second ``airflow scheduler`` on the same database and state directory runs beside the first
  for ``down`` seconds, then gets SIGTERM or SIGKILL; the first runs on.

A sequence with more tasks than ``parallelism`` crowds its starts. Left out: a wall-clock step (stepping
the host's clock is not acceptable on a shared machine, and nothing lets a real scheduler, its workloads
and the api-server read another clock: the core's ``Clock`` is injectable inside one process only, and a
time namespace moves the monotonic and boot clocks, not the wall clock), and teams (the harness runs no
multi-team deployment).

The invariants (:func:`check`): every task instance ends in the state its own code decides, at try 1 with
one execution, the only exception being an execution left without a live owner for ``handover_timeout``
in all (summed as its custody watchdog sums it: over every scheduler that claimed it and exited within
``handover_timeout`` of the claim, see :func:`_stranded`), which must kill itself then (and its task
instance then runs again, at the next try); no two
executions of a task instance at once; no task killed before its limit, and each one over it ended by
it (the executor's ``task_timeout`` counted from its launch, Airflow's ``execution_timeout`` from its
start); nothing a task started outlives ``handover_timeout`` + 10 s without a scheduler; no workload left
at a lowered CPU share (``SCHED_IDLE``, or the lowest cgroup CPU weight) once fewer than the crowd
threshold run; a SIGTERM'd scheduler exits within 10 s; nothing left running when the run has ended.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import psutil
from typing_extensions import Self

from async_local_executor.core.cgroups import cgroup2_mount
from async_local_executor.core.cgroups.discovery import directory_of, mount_root, own_cgroups, v1_mounts
from async_local_executor.core.launchers import crowd
from async_local_executor.core.proc_identity import runs_as, start_ticks
from async_local_executor.ops.journal_file import START_KEY
from async_local_executor.ops.status_read import read_all
from harness.sandbox import AirflowSandbox, TaskInstanceRow
from tests.e2e.dags.chaos_adoption import INJECTED, ONCE_ENV
from tests.e2e.helpers import QUICK_ORPHANS, poll

SEED_ENV: Final[str] = "ALE_CHAOS_SEED"
DAG_ID: Final[str] = "chaos"
DIR_ENV: Final[str] = "ALE_CHAOS_DIR"
LIMIT_ENV: Final[str] = "ALE_CHAOS_LIMIT"
REPO: Final[Path] = Path(__file__).resolve().parents[2]
DAGS: Final[Path] = Path(__file__).with_name("dags")
# The executor under test, with the one injection (armed only in a scheduler started for a `retried` step).
EXECUTOR: Final[str] = "tests.e2e.dags.chaos_adoption.RetriedAdoptionExecutor"
BASE_ENV: Final[str] = "ALE_CHAOS_BASE"
SECOND: Final[str] = "scheduler2"  # the second scheduler of an `ha` step

KINDS: Final[tuple[str, ...]] = ("sigterm", "kill9", "retried", "ha")
GAPS: Final[tuple[str, ...]] = ("none", "under", "over")
GROUPS: Final[tuple[str, ...]] = ("plain", "limited", "timed")

EXIT_BOUND: Final[float] = 10.0  # a SIGTERM'd scheduler exits within this
OUTLIVE: Final[float] = 10.0  # nothing a task started outlives handover_timeout + this without a scheduler
SETTLE: Final[float] = 5.0  # a crowd's end to the moment every lowered share must be back
TOLERANCE: Final[float] = 1.5  # a limit's start as the task reads it (ticks, /proc/uptime) and the polls
POLL: Final[float] = 0.25
START_GUARD: Final[float] = 180.0  # a scheduler's start to its executor's start line
# A scheduler's start to Airflow's first offer of a stopped scheduler's task instances (at its first loop).
OFFER_GUARD: Final[float] = 60.0
STARTED: Final[str] = "AsyncLocalExecutor started:"


def say(line: str) -> None:
    print(f"[chaos] {line}", file=sys.stderr, flush=True)


def seed(default: int | None = None) -> int:
    """The seed: ``ALE_CHAOS_SEED`` (``random`` draws one), else ``default``, else a random one. Printed,
    so any run can be replayed."""
    raw = os.environ.get(SEED_ENV, "").strip()
    if raw and raw != "random":
        chosen = int(raw)
    elif default is not None and not raw:
        chosen = default
    else:
        chosen = random.SystemRandom().randrange(1, 2**31)
    say(f"seed {chosen} (replay with {SEED_ENV}={chosen})")
    return chosen


# ------------------------------------------------------------------ the plan


@dataclass(frozen=True)
class Size:
    """How big a chaos run is, and the timings its tasks and steps are drawn around."""

    sequences: int
    tasks: int  # mapped tasks of a crowded sequence: more than parallelism
    parallelism: int
    steps: int  # per sequence
    handover_timeout: float = 20.0
    limit: float = 30.0  # the limited tasks' task_timeout and the timed tasks' execution_timeout
    margin: float = 8.0  # a task inside its limit ends this long before it
    overrun: float = 30.0  # a task over its limit would end this long after it
    shortest: float = 10.0  # a plain task's duration
    longest: float = 40.0
    grace: float = 5.0  # termination_grace_period: a limit's SIGTERM to its SIGKILL
    after: tuple[float, float] = (2.0, 8.0)  # a step's seconds after the previous one, drawn between
    run_guard: float = 900.0  # a sequence's last step to its run's end, at most
    quick_orphans: bool = True  # Airflow notices a dead scheduler within seconds (QUICK_ORPHANS)

    def config(self, base: str | None = None) -> dict[str, str]:
        """The sandbox's environment for this size.

        :param base: the executor class the injected one extends; default this executor's
        """
        orphans = (
            QUICK_ORPHANS
            if self.quick_orphans
            else {
                "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "30",
                "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "10",
            }
        )
        return {
            **orphans,
            "AIRFLOW__CORE__EXECUTOR": EXECUTOR,
            BASE_ENV: base or "",
            ONCE_ENV: "",
            # The scheduler imports the injected executor from this repository.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
            "AIRFLOW__ASYNC_LOCAL_EXECUTOR__HANDOVER_TIMEOUT": f"{self.handover_timeout:g}",
            "AIRFLOW__ASYNC_LOCAL_EXECUTOR__TERMINATION_GRACE_PERIOD": f"{self.grace:g}",
            LIMIT_ENV: f"{self.limit:g}",
        }


# One sequence that takes every kind of step once, with each kind of gap, its starts crowded (7 tasks at
# parallelism 3, so the run lasts through its steps): what make test runs.
SMALL: Final[Size] = Size(
    sequences=1,
    tasks=7,
    parallelism=3,
    steps=4,
    handover_timeout=15.0,
    limit=20.0,
    margin=6.0,
    # Past what a handover allows a task over its limit: its grace period (5 s), a stop inside it that
    # takes a few seconds more, then handover_timeout (15 s) without an owner; or a crash inside it, whose
    # adopter grants a whole grace again (5 s) after up to handover_timeout. At 20 (grace and
    # handover_timeout summed, nothing left for the stop) such a task could reach its end just before
    # its end was due.
    overrun=30.0,
    shortest=8.0,
    longest=25.0,
    after=(1.0, 4.0),
    run_guard=300.0,
)


def full_size() -> Size:
    """The benchmark's size: 20 sequences of 100 tasks, each number overridable from the environment
    (``ALE_CHAOS_SEQUENCES``, ``ALE_CHAOS_TASKS``, ``ALE_CHAOS_PARALLELISM``, ``ALE_CHAOS_STEPS``).

    Parallelism defaults to 16 over this host's crowd threshold (24 running workloads per core, 64 on 2
    cores): at 32 no start would ever be crowded on a host of 2 cores or more, and the lowered CPU
    share would go unchecked.
    """

    def number(name: str, default: int) -> int:
        return int(os.environ.get(f"ALE_CHAOS_{name}") or default)

    return Size(
        sequences=number("SEQUENCES", 20),
        tasks=number("TASKS", 100),
        parallelism=number("PARALLELISM", crowd.threshold() + 16),
        steps=number("STEPS", 4),
        run_guard=1800.0,
        quick_orphans=False,
    )


@dataclass(frozen=True)
class Task:
    """One mapped task instance of the run, and how its own code ends it."""

    group: str  # plain, limited or timed
    index: int  # its map index
    seconds: float  # how long its code runs (limited: counted from its workload's launch)
    fail: bool = False  # its code raises at its end
    over: bool = False  # limited, timed: it runs past its limit, which must end it

    @property
    def key(self) -> tuple[str, int]:
        return (self.group, self.index)

    @property
    def decided(self) -> str:
        return "failed" if self.fail or self.over else "success"

    def describe(self) -> str:
        what = {"plain": "", "limited": " task_timeout", "timed": " execution_timeout"}[self.group]
        ends = "over" if self.over else "inside" if self.group != "plain" else "fails" if self.fail else "ok"
        return f"{self.group}[{self.index}] {self.seconds:g}s{what} {ends}"


# The tasks that hand each group its specs from the run's conf; they succeed.
PLAN_TASKS: Final[tuple[Task, ...]] = tuple(Task(f"plan_{group}", -1, 0.0) for group in GROUPS)


@dataclass(frozen=True)
class Step:
    kind: str  # one of KINDS
    after: float  # seconds after the previous step (or the first mapped task's start)
    down: float  # sigterm, kill9, retried: seconds without a scheduler; ha: seconds both run
    gap: str = "none"  # one of GAPS (ha: none)
    how: str = ""  # ha: how the second scheduler ends, sigterm or kill9

    def describe(self) -> str:
        if self.kind == "ha":
            return f"+{self.after:g}s ha {self.down:g}s then {self.how}"
        return f"+{self.after:g}s {self.kind}, down {self.down:g}s ({self.gap})"


@dataclass(frozen=True)
class Sequence:
    seed: int
    index: int
    tasks: tuple[Task, ...]
    steps: tuple[Step, ...]

    def conf(self) -> dict[str, list[dict[str, Any]]]:
        """The run's conf: each group's specs, by map index."""
        return {
            group: [{"seconds": t.seconds, "fail": t.fail} for t in self.tasks if t.group == group]
            for group in GROUPS
        }

    def describe(self) -> str:
        return (
            f"sequence {self.index} (seed {self.seed}): {len(self.tasks)} tasks: "
            + ", ".join(t.describe() for t in self.tasks)
            + "; steps: "
            + "; ".join(s.describe() for s in self.steps)
        )


def _deck(rng: random.Random, items: Iterable[str], count: int, first: str | None = None) -> list[str]:
    """``count`` draws that take each item once before any twice (each round shuffled), ``first`` first."""
    deck: list[str] = []
    while len(deck) < count:
        batch = [item for item in items if not (first is not None and not deck and item == first)]
        rng.shuffle(batch)
        deck += ([first] if first is not None and not deck else []) + batch
    return deck[:count]


def _tasks(rng: random.Random, count: int, size: Size) -> tuple[Task, ...]:
    # A limited task over its limit, one just inside it, and a timed one, then a mix.
    groups = ["limited", "limited", "timed"] + [
        rng.choice(("plain", "plain", "limited", "timed")) for _ in range(3, count)
    ]
    overs = [True, False, rng.random() < 0.5] + [rng.random() < 0.5 for _ in range(3, count)]
    tasks: list[Task] = []
    for group, over in sorted(
        zip(groups[:count], overs[:count], strict=True), key=lambda pair: GROUPS.index(pair[0])
    ):
        index = sum(1 for t in tasks if t.group == group)
        if group == "plain":
            seconds = round(rng.uniform(size.shortest, size.longest), 1)
            tasks.append(Task(group, index, seconds, fail=rng.random() < 0.3))
        else:
            seconds = size.limit + size.overrun if over else size.limit - size.margin
            tasks.append(Task(group, index, seconds, over=over))
    return tuple(tasks)


def _step(rng: random.Random, kind: str, gap: str, size: Size) -> Step:
    after = round(rng.uniform(*size.after), 1)
    if kind == "ha":
        return Step(kind, after, round(rng.uniform(6.0, 15.0), 1), how=rng.choice(("sigterm", "kill9")))
    down = {
        "none": 0.0,
        "under": round(rng.uniform(2.0, size.handover_timeout - 5.0), 1),
        "over": size.handover_timeout + OUTLIVE + 2.0,
    }[gap]
    return Step(kind, after, down, gap)


def generate(seed: int, size: Size) -> list[Sequence]:
    """The sequences a seed plays: every kind of step and of gap before any twice; every other sequence
    (the first among them) crowded, with more tasks than parallelism."""
    rng = random.Random(seed)  # noqa: S311 - a replayable draw, no secret
    kinds = _deck(rng, KINDS, size.sequences * size.steps)
    # A retried adoption needs its workloads alive when the next scheduler starts: no gap over the limit.
    gaps = iter(_deck(rng, GAPS, sum(1 for kind in kinds if kind in ("sigterm", "kill9")), first="over"))
    drawn = iter(kinds)
    sequences = []
    for index in range(size.sequences):
        crowded = index % 2 == 0
        count = size.tasks if crowded else max(3, size.parallelism - 1)
        tasks = _tasks(rng, count, size)
        steps = []
        for _ in range(size.steps):
            kind = next(drawn)
            gap = next(gaps) if kind in ("sigterm", "kill9") else rng.choice(("none", "under"))
            steps.append(_step(rng, kind, "none" if kind == "ha" else gap, size))
        sequences.append(Sequence(seed, index, tasks, tuple(steps)))
    return sequences


# ------------------------------------------------------------------ what the tasks recorded


@dataclass
class Execution:
    """One execution of a task instance's try, as its lines and the tracker's polls saw it."""

    task_id: str
    map_index: int
    try_number: int
    pid: int
    ticks: int | None
    ppid: int
    pticks: int | None
    start: float  # wall time, written by the task when its code started
    launch: float  # its workload's start (wall time), from how long before that it was launched
    end: float | None = None  # written by the task at its code's end; None: killed part-way
    gone: float | None = None  # the first poll that found it gone without an end

    @property
    def name(self) -> str:
        index = f"[{self.map_index}]" if self.map_index >= 0 else ""
        return f"{self.task_id}{index} try {self.try_number} (pid {self.pid})"

    @property
    def running(self) -> bool:
        return self.end is None and self.gone is None

    @property
    def until(self) -> float:
        """When it stopped running: its end, else when it was found gone, else now."""
        return self.end if self.end is not None else self.gone if self.gone is not None else time.time()


@dataclass
class Launch:
    """One workload an executor launched (or held) for the run, from its launch journal line."""

    label: str  # the executor's name for it: chaos.<task>[<map index>] try <n>
    pid: int
    ticks: int
    started: float  # wall time, from its start ticks
    gone: float | None = None  # the first poll that found its process gone

    @property
    def until(self) -> float:
        return self.gone if self.gone is not None else time.time()


def label(task_id: str, map_index: int, try_number: int) -> str:
    """The executor's name for a try of the chaos run's task instance, as its journal and log say it."""
    return f"{DAG_ID}.{task_id}{f'[{map_index}]' if map_index >= 0 else ''} try {try_number}"


def lowered(pid: int, cgroup2: Path | None, cpu_v1: Path | None) -> str | None:
    """Why process ``pid`` runs at a lowered CPU share (``core/launchers/crowd.py``), or None: its
    scheduling policy is ``SCHED_IDLE``, or its cgroup has the lowest CPU weight (v1: ``cpu.shares``)."""
    try:
        for line in Path(f"/proc/{pid}/sched").read_text().splitlines():
            if line.startswith("policy") and int(line.split(":", 1)[1]) == os.SCHED_IDLE:
                return "SCHED_IDLE"
    except (OSError, ValueError, IndexError):
        return None
    where = own_cgroups(f"/proc/{pid}/cgroup")
    checks = []
    if cgroup2 is not None and "" in where:
        checks.append((directory_of(cgroup2, mount_root(cgroup2), where[""]) / "cpu.weight", "1"))
    if cpu_v1 is not None and "cpu" in where:
        checks.append((directory_of(cpu_v1, mount_root(cpu_v1), where["cpu"]) / "cpu.shares", "2"))
    for path, lowest in checks:
        try:
            if path.read_text().strip() == lowest:
                return f"{path.name} {lowest} ({path.parent})"
        except OSError:
            continue
    return None


class Tracker:
    """Follows one run's executions from their lines and their processes, and its workloads from the
    executors' launch journals, every :data:`POLL` seconds, on a thread of its own; and watches every
    crowd's end for a share left lowered."""

    def __init__(self, folder: Path, state_dir: Path) -> None:
        self.folder = folder
        self.state_dir = state_dir
        self.threshold = crowd.threshold()
        self.start_threshold = crowd.start_threshold()
        self.executions: dict[tuple[str, int, int, int], Execution] = {}
        self.launches: dict[tuple[int, int], Launch] = {}
        # Journals outlive runs: a launch from before this tracker began is an earlier run's.
        self._since = int(float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK"))
        self._journals: dict[str, int] = {}
        self.problems: list[str] = []
        self.peak = 0  # the most executions running at once
        self.crowded = (
            False  # an executor ran `threshold` workloads or more, or started a crowd, at some point
        )
        self._offsets: dict[str, int] = {}
        self._below_since: float | None = None
        self._flagged: set[tuple[str, int, int, int]] = set()
        self._cgroup2 = cgroup2_mount()
        self._cpu_v1 = v1_mounts().get("cpu")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="chaos-tracker", daemon=True)
        self._rounds = 0

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()

    def _watch(self) -> None:
        # The executions' processes and files are the state polled here; nothing announces them.
        while not self._stop.wait(POLL):
            self.poll()

    def poll(self) -> None:
        now = time.time()
        with self._lock:
            self._read(now)
            self._read_journals(now)
            for execution in self.executions.values():
                if execution.running and not (execution.ticks and runs_as(execution.pid, execution.ticks)):
                    execution.gone = now
            for launch in self.launches.values():
                if launch.gone is None and not runs_as(launch.pid, launch.ticks):
                    launch.gone = now
            live = [e for e in self.executions.values() if e.running]
            self.peak = max(self.peak, len(live))
            self._rounds += 1
            if self._rounds % 4 == 0:
                self._crowd(now, live)

    def _read(self, now: float) -> None:
        if not self.folder.is_dir():
            return
        for path in self.folder.iterdir():
            offset = self._offsets.get(path.name, 0)
            try:
                with path.open("rb") as file:
                    file.seek(offset)
                    data = file.read()
            except OSError:
                continue
            complete = data[: data.rfind(b"\n") + 1]
            self._offsets[path.name] = offset + len(complete)
            task_id, _, index = path.name.rpartition(".")
            for raw in complete.splitlines():
                line = json.loads(raw)
                key = (task_id, int(index), int(line["try"]), int(line["pid"]))
                if line["event"] == "start":
                    self.executions[key] = Execution(
                        task_id,
                        int(index),
                        int(line["try"]),
                        int(line["pid"]),
                        line.get("ticks"),
                        int(line["ppid"]),
                        line.get("pticks"),
                        float(line["t"]),
                        float(line["t"]) - float(line.get("since_launch") or 0.0),
                    )
                elif key in self.executions:
                    self.executions[key].end = float(line["t"])

    def _read_journals(self, now: float) -> None:
        for path in self.state_dir.glob("*.launches"):
            offset = self._journals.get(path.name, 0)
            try:
                with path.open("rb") as file:
                    file.seek(offset)
                    data = file.read()
            except OSError:
                continue  # reclaimed meanwhile: what it held is in its reclaimer's journal
            complete = data[: data.rfind(b"\n") + 1]
            self._journals[path.name] = offset + len(complete)
            for raw in complete.splitlines():
                try:
                    entry = json.loads(raw)
                    pid, ticks, key = int(entry["+"]), int(entry[START_KEY]), str(entry["key"])
                except (ValueError, KeyError, TypeError):
                    continue  # a header, an end, a descendant
                if (
                    key.startswith(f"{DAG_ID}.")
                    and ticks >= self._since
                    and (pid, ticks) not in self.launches
                ):
                    uptime = float(Path("/proc/uptime").read_text().split()[0])
                    started = now - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
                    self.launches[(pid, ticks)] = Launch(key, pid, ticks, started)

    def _starts_crowd_end(self) -> float:
        """When the last crowd of starts (``start_threshold`` launches within the crowd's window) ended, or 0.

        From the launches' start ticks, not the executor's own clock: the margin of :data:`SETTLE` covers
        the difference (launches begun together fork a few milliseconds apart).
        """
        starts, window = sorted(launch.started for launch in self.launches.values()), crowd.START_WINDOW
        n = self.start_threshold
        ends = [
            starts[j - n + 1] + window
            for j in range(n - 1, len(starts))
            if starts[j] < starts[j - n + 1] + window
        ]
        return max(ends, default=0.0)

    def _crowd(self, now: float, live: list[Execution]) -> None:
        counts = [
            len(found.data.get("running") or []) for found in read_all(self.state_dir) if not found.stale
        ]
        if len(live) >= self.threshold or any(count >= self.threshold for count in counts):
            self.crowded = True
            self._below_since = None
            return
        # A crowd of starts lowers too, until the window after its last start has passed.
        starts_end = self._starts_crowd_end()
        if starts_end > now:
            self.crowded = True
            self._below_since = None
            return
        self._below_since = max(self._below_since or now, starts_end)
        if now - self._below_since < SETTLE:
            return
        for execution in live:
            key = (execution.task_id, execution.map_index, execution.try_number, execution.pid)
            if key in self._flagged:
                continue
            for pid, what in ((execution.pid, "task"), (execution.ppid, "workload")):
                why = lowered(pid, self._cgroup2, self._cpu_v1)
                if why is not None:
                    self._flagged.add(key)
                    self.problems.append(
                        f"{execution.name}: its {what} process {pid} is still at {why} "
                        f"{now - self._below_since:.0f}s after the crowd ended (fewer than {self.threshold} "
                        f"ran, and fewer than {self.start_threshold} started within {crowd.START_WINDOW:g}s)"
                    )
                    break

    def snapshot(self) -> list[Execution]:
        with self._lock:
            return [Execution(**vars(e)) for e in self.executions.values()]

    def launched(self) -> list[Launch]:
        with self._lock:
            return [Launch(**vars(launch)) for launch in self.launches.values()]

    def live_launches(self) -> list[Launch]:
        with self._lock:
            return [launch for launch in self.launches.values() if launch.gone is None]

    def running(self, mapped: bool = True) -> list[Execution]:
        with self._lock:
            return [e for e in self.executions.values() if e.running and (e.map_index >= 0 or not mapped)]

    def first_mapped_start(self) -> float | None:
        with self._lock:
            return min((e.start for e in self.executions.values() if e.map_index >= 0), default=None)


def task_processes(executions: Iterable[Execution], launches: Iterable[Launch]) -> list[tuple[int, int, str]]:
    """What the running executions and workloads started, as ``(pid, start ticks, whose)``: each task
    process, each workload process (launched or held), and every descendant of those."""
    found: dict[int, tuple[int, int, str]] = {}
    roots = [(e.pid, e.ticks, e.name) for e in executions] + [(e.ppid, e.pticks, e.name) for e in executions]
    roots += [(launch.pid, launch.ticks, launch.label) for launch in launches]
    for pid, ticks, whose in roots:
        if ticks is None or not runs_as(pid, ticks):
            continue
        found.setdefault(pid, (pid, ticks, whose))
        try:
            children = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            children = []
        for child in children:
            child_ticks = start_ticks(child.pid)
            if child_ticks is not None:
                found.setdefault(child.pid, (child.pid, child_ticks, whose))
    return list(found.values())


# ------------------------------------------------------------------ playing a sequence


@dataclass(frozen=True)
class Gap:
    """A time no scheduler ran: from the signal that stopped the last one, through its exit, to the next start,
    and on to that one's executor start line (by which it has claimed what it holds)."""

    signalled: float
    exited: float
    restarted: float
    ready: float

    @property
    def seconds(self) -> float:
        return self.restarted - self.exited


@dataclass
class Observed:
    """What one sequence did: the run, every execution, the gaps, the schedulers' logs meanwhile."""

    sequence: Sequence
    run_id: str
    state: str | None
    rows: list[TaskInstanceRow]
    executions: list[Execution]
    launches: list[Launch]
    gaps: list[Gap]
    stops: list[float]  # when each scheduler (either) was signalled to stop
    log: str
    problems: list[str]  # what the player saw go wrong while it played
    notes: list[str]  # what happened that breaks no invariant
    seconds: float
    exits: list[float]  # each SIGTERM'd scheduler's signal to its exit
    peak: int
    crowded: bool
    # When each second scheduler of an `ha` step was signalled: what it launched had no owner until the
    # first scheduler's executor adopted it, at a moment the test does not see.
    seconds_stopped: list[float] = field(default_factory=list)


class Player:
    """Plays sequences on one sandbox whose ``scheduler`` runs, one after another."""

    def __init__(
        self, sandbox: AirflowSandbox, size: Size, folder: Path, report: Callable[[str], None] = say
    ):
        self.sandbox = sandbox
        self.size = size
        self.folder = folder
        self.say = report
        self.up: dict[str, float] = {"scheduler": time.time()}
        self._down: tuple[float, float] | None = None  # (signalled, exited) of the last stop with none left
        self._stops: list[float] = []
        self._seconds_stopped: list[float] = []

    def play(self, sequence: Sequence) -> Observed:
        self.say(f"playing sequence {sequence.index}")
        began = time.time()
        logs = {name: _size(path) for name, path in self._logs().items()}
        problems: list[str] = []
        notes: list[str] = []
        gaps: list[Gap] = []
        exits: list[float] = []
        self._stops = []
        self._seconds_stopped = []
        run_id = self.sandbox.trigger(DAG_ID, conf=sequence.conf())
        state: str | None = None
        with Tracker(self.folder / run_id, self.sandbox.home / "async_local_executor") as tracker:
            poll(
                "a mapped task to start", lambda: tracker.first_mapped_start() is not None, guard=START_GUARD
            )
            last = tracker.first_mapped_start() or time.time()
            for number, step in enumerate(sequence.steps):
                self._until(last + step.after, "the step's moment")
                poll(
                    "a mapped task to run, or the run to end",
                    lambda: bool(tracker.running()) or self._over(run_id),
                    guard=self.size.run_guard,
                )
                if not tracker.running():
                    notes.append(f"step {number} ({step.describe()}) skipped: the run had ended")
                    continue
                self.say(f"step {number}: {step.describe()}; {len(tracker.running())} mapped running")
                self._step(step, tracker, problems, notes, gaps, exits)
                last = time.time()
            poll("the run to end", lambda: self._over(run_id), guard=self.size.run_guard)
            state = self.sandbox.run_state(DAG_ID, run_id)
            ended = time.time()
            left = self.size.handover_timeout + OUTLIVE + 30.0
            try:
                poll(
                    "every execution's and workload's processes to end",
                    lambda: not tracker.running(mapped=False) and not tracker.live_launches(),
                    guard=left,
                )
            except TimeoutError:
                problems.append(
                    f"still running {left:.0f}s after the run ended: "
                    + ", ".join(
                        [e.name for e in tracker.running(mapped=False)]
                        + [f"workload {w.label} (pid {w.pid})" for w in tracker.live_launches()]
                    )
                )
            problems += tracker.problems
            if tracker.crowded:
                notes.append(
                    f"a crowd: {tracker.threshold} or more workloads ran at once, or "
                    f"{tracker.start_threshold} started within {crowd.START_WINDOW:g}s"
                )
        log = "".join(_since(path, logs.get(name, 0)) for name, path in self._logs().items())
        self.say(f"sequence {sequence.index}: run {state} {ended - began:.0f}s after its trigger")
        return Observed(
            sequence,
            run_id,
            state,
            self.sandbox.task_instances(DAG_ID, run_id),
            tracker.snapshot(),
            tracker.launched(),
            gaps,
            self._stops,
            log,
            problems,
            notes,
            time.time() - began,
            exits,
            tracker.peak,
            tracker.crowded,
            self._seconds_stopped,
        )

    def _logs(self) -> dict[str, Path]:
        return {
            name: path for name, path in self.sandbox.process_logs.items() if name in ("scheduler", SECOND)
        }

    def _over(self, run_id: str) -> bool:
        return self.sandbox.run_state(DAG_ID, run_id) in ("success", "failed")

    def _until(self, moment: float, what: str) -> None:
        # A step's own timing: the time the plan chose, not a wait for something to happen.
        poll(what, lambda: time.time() >= moment, guard=max(0.0, moment - time.time()) + 5.0)

    def _step(
        self,
        step: Step,
        tracker: Tracker,
        problems: list[str],
        notes: list[str],
        gaps: list[Gap],
        exits: list[float],
    ) -> None:
        if step.kind == "ha":
            self._start(SECOND, False, notes)
            self._until(time.time() + step.down, "both schedulers running")
            self._seconds_stopped.append(time.time())
            self._stop(SECOND, step.how, problems, exits)
            return
        self._stop("scheduler", "kill9" if step.kind == "kill9" else "sigterm", problems, exits)
        assert self._down is not None, "a second scheduler was still running"
        signalled, exited = self._down
        if step.gap == "over":
            # Everything the running tasks started must be gone handover_timeout + 10 s after the stop.
            started = task_processes(tracker.running(mapped=False), tracker.live_launches())
            self._until(exited + self.size.handover_timeout + OUTLIVE, "the handover timeout to run out")
            survivors = [(pid, whose) for pid, ticks, whose in started if runs_as(pid, ticks)]
            if survivors:
                problems.append(
                    f"{len(survivors)} process(es) tasks started outlived handover_timeout + {OUTLIVE:g}s "
                    f"without a scheduler: " + ", ".join(f"pid {pid} of {whose}" for pid, whose in survivors)
                )
        self._until(exited + step.down, "the time without a scheduler")
        ready = self._start("scheduler", step.kind == "retried", notes)
        gaps.append(Gap(signalled, exited, self.up["scheduler"], ready))

    def _stop(self, name: str, how: str, problems: list[str], exits: list[float]) -> None:
        signalled = time.time()
        self._stops.append(signalled)
        if how == "kill9":
            self.sandbox.kill(name)
        else:
            status = self.sandbox.signal_and_wait(name, signal.SIGTERM, timeout=120)
            took = time.time() - signalled
            exits.append(took)
            if took > EXIT_BOUND or status != 0:
                problems.append(
                    f"{name} exited with {status} {took:.1f}s after SIGTERM (bound {EXIT_BOUND:g}s)"
                )
        del self.up[name]
        if not self.up:
            self._down = (signalled, time.time())

    def _start(self, name: str, inject: bool, notes: list[str]) -> float:
        """Start ``name``; when its executor's start line was seen."""
        path = self.sandbox.proc_logs_dir / f"{name}.log"
        offset = _size(path)
        if inject:
            self.sandbox.reconfigure({ONCE_ENV: "1"})
        try:
            if name in self.sandbox.pids:
                self.sandbox.restart(name)
            else:
                self.sandbox.start_another(name, ("scheduler", "--skip-serve-logs"))
        finally:
            if inject:
                self.sandbox.reconfigure({ONCE_ENV: ""})
        self.up[name] = time.time()
        self._down = None
        poll(f"{name}'s executor to start", lambda: STARTED in _since(path, offset), guard=START_GUARD)
        ready = time.time()
        if inject:
            self._retried(path, offset, notes)
        return ready

    def _retried(self, path: Path, offset: int, notes: list[str]) -> None:
        """Wait for the injected error (raised after the first offer that adopted something), or for an
        offer that adopted nothing: a workload held at the start may have ended before Airflow's offer."""
        if "holding " not in _since(path, offset):
            notes.append("retried adoption: the new scheduler held nothing, so nothing was adopted twice")
            return
        try:
            poll(
                "the injected adoption error",
                lambda: (
                    INJECTED in _since(path, offset) or "adopted 0 task instance(s)" in _since(path, offset)
                ),
                guard=OFFER_GUARD,
            )
        except TimeoutError:
            notes.append(f"retried adoption: no offer of task instances within {OFFER_GUARD:g}s")
            return
        if INJECTED in _since(path, offset):
            notes.append("retried adoption: Airflow called try_adopt_task_instances again after the error")
        else:
            notes.append("retried adoption: the first offer adopted nothing, so nothing was adopted twice")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _since(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as file:
            file.seek(offset)
            return file.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


# ------------------------------------------------------------------ the invariants


def _stranded(launched: float, gone: float | None, o: Observed, timeout: float) -> Gap | None:
    """The gap in which a workload launched at ``launched`` and found gone at ``gone`` killed itself as its
    custody watchdog must (core/custody.py): once its time without a live owner reached ``timeout``, summed
    over every scheduler that claimed it and exited within ``timeout`` of its claim (one that kept it
    longer gives it the whole timeout again). None: no gap explains its end.

    The test sees each owner's exit and the next one's start and start line, not the claim in between, so
    each sum is a range: at least the time no scheduler process ran, at most until the next executor's start
    line. What a second scheduler launched had no owner from its stop until an adoption it does not see,
    so an ``ha`` stop widens the top of the range up to the next gap.
    """
    if gone is None:
        return None
    least = most = 0.0  # the seconds it spent without a live owner, since it last had the whole timeout
    early = late = launched  # the earliest and the latest its owner of the time can have claimed it
    for gap in sorted(o.gaps, key=lambda g: g.exited):
        if gap.exited <= launched:
            continue
        if gone < gap.signalled:
            return None  # it ended while a scheduler ran
        for stopped in o.seconds_stopped:
            if early <= stopped < gap.signalled:
                most += gap.signalled - stopped
                late = gap.signalled
        if gap.signalled - late >= timeout:
            least = most = 0.0  # its owner surely kept it for a whole timeout
        elif gap.exited - early >= timeout:
            least = 0.0  # it may have
        if gone <= gap.ready + TOLERANCE:
            earliest = gap.signalled + timeout - most - TOLERANCE
            latest = gap.exited + timeout - least + OUTLIVE
            return gap if earliest <= gone <= latest else None
        least += gap.restarted - gap.exited
        most += gap.ready - gap.signalled
        early, late = gap.restarted, gap.ready
    return None


def _how_it_ended(e: Execution, origin: float) -> str:
    if e.end is not None:
        return f"ran to its end at +{e.end - origin:.1f}s"
    if e.gone is not None:
        return (
            f"was killed part-way, gone at +{e.gone - origin:.1f}s ({e.gone - e.start:.1f}s after its start, "
            f"{e.gone - e.launch:.1f}s after its workload's launch)"
        )
    return "still runs"


def _limit_broken(task: Task, e: Execution, o: Observed, size: Size, origin: float) -> list[str]:
    """What the last execution of a limited or timed task did wrong with its limit. A limited task over
    it is ended by an executor, which says so, or by itself while no scheduler runs."""
    name, limit = e.name, size.limit
    if task.group == "plain":
        return [] if e.end is not None else [f"{name}: {_how_it_ended(e, origin)}; it has no limit"]
    kind = "task_timeout" if task.group == "limited" else "execution_timeout"
    counted = e.launch if task.group == "limited" else e.start
    since = "launch" if task.group == "limited" else "start"
    if not task.over:
        if e.end is None:
            at = f"{e.until - counted:.1f}s after its {since}" if e.gone is not None else "never"
            return [
                f"{name}: killed {at}, before its end, which comes {task.seconds:g}s after it, inside its {limit:g}s {kind}"
            ]
        return []
    found = []
    if e.end is not None:
        found.append(f"{name}: ran to its end past its {limit:g}s {kind}: the limit did not end it")
    elif e.gone is not None:
        ran = e.gone - counted
        if ran < limit - TOLERANCE:
            found.append(
                f"{name}: killed {ran:.1f}s after its {since}, {limit - ran:.1f}s before its {limit:g}s {kind}"
            )
        if task.group == "timed" and ran > limit + size.grace + 15.0:
            found.append(
                f"{name}: ended {ran:.1f}s after its start, {ran - limit:.0f}s past its {limit:g}s {kind}"
            )
    said = f"{label('limited', e.map_index, e.try_number)} ran longer than its"
    alone = e.gone is not None and any(gap.exited <= e.gone <= gap.restarted for gap in o.gaps)
    if task.group == "limited" and e.end is None and said not in o.log and not alone:
        found.append(f"{name}: ended, but no executor said its {limit:g}s {kind} ran out ({said!r})")
    return found


def _unexecuted(
    task: Task, number: int, o: Observed, timeout: float, before: float, origin: float
) -> tuple[bool, str]:
    """Whether try ``number`` of ``task``, whose code never started, is explained, and what became of it.

    Explained: it was never launched and a scheduler stopped before the next try (Airflow resets a queued
    try of a stopped scheduler), or its workload was launched, then left without a live owner for
    ``handover_timeout`` in all (:func:`_stranded`) and killed itself, unadopted, as a running one does.
    """
    mine = [w for w in o.launches if w.label == label(task.group, task.index, number)]
    if not mine:
        stops = [t for t in o.stops if t < before]
        if stops:
            return (
                True,
                f"never launched; Airflow reset it after the scheduler stop at +{stops[-1] - origin:.1f}s",
            )
        return False, "never launched, and no scheduler stopped before the next try"
    for w in mine:
        gap = _stranded(w.started, w.gone, o, timeout)
        if gap is not None:
            return True, (
                f"its workload (pid {w.pid}) was launched and its code not started yet when the last scheduler "
                f"stopped at +{gap.signalled - origin:.1f}s; it killed itself {w.until - gap.exited:.0f}s later"
            )
    w = mine[0]
    ended = f"ended at +{w.gone - origin:.1f}s" if w.gone is not None else "still runs"
    return (
        False,
        f"its workload (pid {w.pid}) was launched at +{w.started - origin:.1f}s and {ended}, its code never started",
    )


def check(observed: Observed, size: Size) -> list[str]:
    """Every invariant one sequence broke, one line each, naming the task instance and what it saw.

    What happened that the invariants allow (an execution or a try ended by ``handover_timeout`` without
    a live owner, a queued try reset after a stop) goes to the sequence's notes.
    """
    o = observed
    found = list(o.problems)
    if o.state not in ("success", "failed"):
        found.append(f"the run did not end: {o.state}")
    origin = min((e.start for e in o.executions), default=0.0)
    timeout = size.handover_timeout
    by_ti: dict[tuple[str, int], list[Execution]] = {}
    for e in o.executions:
        by_ti.setdefault((e.task_id, e.map_index), []).append(e)
    rows = {(r.task_id, r.map_index): r for r in o.rows}
    for task in (*PLAN_TASKS, *o.sequence.tasks):
        ti = f"{task.group}[{task.index}]" if task.index >= 0 else task.group
        row = rows.pop(task.key, None)
        runs = sorted(by_ti.pop(task.key, []), key=lambda e: e.start)
        if row is None or not runs:
            state = "no task instance" if row is None else f"{row.state} at try {row.try_number}"
            found.append(f"{ti}: {state}, {len(runs)} execution(s)")
            continue
        if row.state != task.decided:
            found.append(f"{ti}: {row.state}, where its code decides {task.decided}")
        # Every execution but the last must have killed itself for want of a live owner.
        for number, earlier in enumerate(runs[:-1]):
            gap = _stranded(earlier.launch, None if earlier.end is not None else earlier.gone, o, timeout)
            if gap is not None:
                o.notes.append(
                    f"{ti}: {earlier.name} killed itself {earlier.until - gap.exited:.0f}s after the last "
                    f"scheduler stopped at +{gap.signalled - origin:.1f}s (none ran for {gap.seconds:.0f}s), "
                    f"its {timeout:g}s without an owner summed since its launch at +{earlier.launch - origin:.1f}s"
                )
            else:
                again = ", ".join(e.name for e in runs[number + 1 :])
                found.append(
                    f"{ti}: {earlier.name} {_how_it_ended(earlier, origin)}, and the task ran again: {again}"
                )
        # Every try that never ran the task's code must be explained.
        tries = [e.try_number for e in runs]
        for number in sorted(set(range(1, tries[-1])) - set(tries)):
            before = min((e.start for e in runs if e.try_number > number), default=time.time())
            allowed, what = _unexecuted(task, number, o, timeout, before, origin)
            (o.notes if allowed else found).append(f"{ti}: try {number} {what}")
        if row.try_number != tries[-1]:
            found.append(f"{ti}: at try {row.try_number}, its last execution was try {tries[-1]}")
        for a, b in itertools.pairwise(runs):
            if a.until > b.start + TOLERANCE:
                found.append(f"{ti}: {a.name} and {b.name} ran at once for {a.until - b.start:.1f}s")
        if task not in PLAN_TASKS:
            found += _limit_broken(task, runs[-1], o, size, origin)
        elif runs[-1].end is None:
            found.append(f"{ti}: {runs[-1].name} {_how_it_ended(runs[-1], origin)}")
    for (task_id, index), row in rows.items():
        if not (row.state == "skipped" and index < 0 and (task_id, index) not in by_ti):
            found.append(f"{task_id}[{index}]: {row.state} at try {row.try_number}, not in the plan")
    found += [f"{key[0]}[{key[1]}]: executions of a task instance the plan does not have" for key in by_ti]
    return found


# ------------------------------------------------------------------ a whole chaos run


@dataclass
class Result:
    seed: int
    size: Size
    observed: list[Observed] = field(default_factory=list)
    violations: list[list[str]] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(1 for found in self.violations if found)

    def seconds_per_sequence(self) -> float | None:
        return statistics.median(o.seconds for o in self.observed) if self.observed else None

    def message(self, replay: str) -> str:
        lines = [f"seed {self.seed}: {self.failed} of {len(self.observed)} sequence(s) broke an invariant"]
        for observed, found in zip(self.observed, self.violations, strict=True):
            lines.append(f"{observed.sequence.describe()} ({observed.seconds:.0f}s, run {observed.state})")
            lines += [f"  - {line}" for line in found] or ["  ok"]
            lines += [f"  note: {note}" for note in observed.notes]
        lines.append(f"replay: {SEED_ENV}={self.seed} {replay}")
        return "\n".join(lines)


def run(
    sandbox: AirflowSandbox, size: Size, chosen: int, folder: Path, report: Callable[[str], None] = say
) -> Result:
    """Play every sequence ``chosen`` generates for ``size`` on ``sandbox``, checking each after its run."""
    result = Result(chosen, size)
    sequences = generate(chosen, size)
    for sequence in sequences:
        report(sequence.describe())
    sandbox.wait_for_dag(DAG_ID, timeout=START_GUARD)
    player = Player(sandbox, size, folder, report)
    for sequence in sequences:
        observed = player.play(sequence)
        found = check(observed, size)
        dump(observed, found, folder / f"sequence{sequence.index}.json")
        result.observed.append(observed)
        result.violations.append(found)
        report(
            f"sequence {sequence.index}: {len(found)} violation(s) in {observed.seconds:.0f}s"
            + "".join(f"\n  - {line}" for line in found)
        )
    return result


def dump(observed: Observed, found: list[str], path: Path) -> None:
    """What one sequence did and broke, as JSON, for a person to read after a failure."""
    o = observed
    origin = min((e.start for e in o.executions), default=0.0)

    def at(t: float | None) -> float | None:
        return None if t is None else round(t - origin, 2)

    data = {
        "sequence": o.sequence.describe(),
        "run": {"id": o.run_id, "state": o.state, "seconds": round(o.seconds, 1)},
        "violations": found,
        "notes": o.notes,
        "task_instances": [[r.task_id, r.map_index, r.state, r.try_number] for r in o.rows],
        "executions (seconds from the first start)": [
            [e.name, at(e.launch), at(e.start), at(e.end), at(e.gone)]
            for e in sorted(o.executions, key=lambda e: e.start)
        ],
        "launches (seconds from the first start)": [
            [w.label, w.pid, at(w.started), at(w.gone)] for w in sorted(o.launches, key=lambda w: w.started)
        ],
        "gaps": [[at(g.signalled), at(g.exited), at(g.restarted)] for g in o.gaps],
        "stops": [at(t) for t in o.stops],
        "sigterm_exits_s": [round(x, 2) for x in o.exits],
        "peak_running": o.peak,
    }
    path.write_text(json.dumps(data, indent=1))


def executions_per_task(result: Result) -> Iterator[int]:
    for observed in result.observed:
        counts: dict[tuple[str, int], int] = {}
        for e in observed.executions:
            counts[(e.task_id, e.map_index)] = counts.get((e.task_id, e.map_index), 0) + 1
        yield from counts.values()
