"""What the suite measures on live processes: memory and CPU of process trees, scheduler heartbeats."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import psutil
import sqlalchemy as sa

MB = 1024.0 * 1024.0
# Under this much available memory a run is aborted rather than risk the machine's OOM killer.
MIN_AVAILABLE_BYTES = 1024 * 1024 * 1024


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` and every live descendant; empty when ``pid`` is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process tree, including children its members have reaped.

    A process is either alive (its own times count) or reaped (its times are in its parent's
    ``children_*``), never both, so differences of two snapshots are exact for processes that ran
    between them.
    """
    total = 0.0
    for proc in tree(pid):
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def own_cpu_seconds(pid: int) -> float:
    """CPU seconds of one process alone: not its children, live or reaped."""
    with contextlib.suppress(psutil.Error):
        t = psutil.Process(pid).cpu_times()
        return float(t.user + t.system)
    return 0.0


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of one process, by name: ``main`` for the thread it started with,
    else the thread's kernel name (``comm``; threads sharing a name are summed)."""
    ticks = float(os.sysconf("SC_CLK_TCK"))
    figures: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            stat = (task / "stat").read_text()
            name = "main" if task.name == str(pid) else (task / "comm").read_text().strip()
        except OSError:
            continue  # the thread ended meanwhile
        fields = stat.rsplit(")", 1)[1].split()
        figures[name] = figures.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return figures


@dataclass(frozen=True)
class MemorySample:
    t: float  # time.monotonic() of the sample
    uss_mb: float
    pss_mb: float
    rss_mb: float
    processes: int
    root_pss_mb: float = 0.0  # the root process alone (the scheduler): the floor of any executor in it


def tree_memory(pid: int, t: float) -> MemorySample:
    uss = pss = rss = root_pss = 0
    count = 0
    for proc in tree(pid):
        with contextlib.suppress(psutil.Error):
            info = proc.memory_full_info()
            uss += info.uss
            pss += getattr(info, "pss", 0)
            rss += info.rss
            count += 1
            if proc.pid == pid:
                root_pss = getattr(info, "pss", 0)
    return MemorySample(t, uss / MB, pss / MB, rss / MB, count, root_pss / MB)


class Periodic:
    """Calls ``fn(time.monotonic())`` every ``interval`` seconds on a daemon thread until stopped."""

    def __init__(self, name: str, interval: float, fn: Callable[[float], None]) -> None:
        self._interval = interval
        self._fn = fn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.started = time.monotonic()
        self.errors: list[str] = []

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self._fn(began)
            except Exception as exc:  # noqa: BLE001 - a probe failure must not end the run
                if len(self.errors) < 5:
                    self.errors.append(repr(exc))
            self._stop.wait(max(0.0, self._interval - (time.monotonic() - began)))

    def start(self) -> None:
        self.started = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


@dataclass
class MemoryProbe:
    """Samples the scheduler tree's USS/PSS at about 2 Hz (``memory_full_info`` reads smaps_rollup)."""

    pid: int
    interval: float = 0.5
    samples: list[MemorySample] = field(default_factory=list)
    low_memory: bool = False

    def _sample(self, t: float) -> None:
        self.samples.append(tree_memory(self.pid, t))
        if psutil.virtual_memory().available < MIN_AVAILABLE_BYTES:
            self.low_memory = True

    @contextlib.contextmanager
    def sampling(self) -> Iterator[MemoryProbe]:
        periodic = Periodic("bench-memory", self.interval, self._sample)
        periodic.start()
        try:
            yield self
        finally:
            periodic.stop()

    def between(self, start: float, end: float) -> list[MemorySample]:
        return [s for s in self.samples if start <= s.t <= end]


def as_utc(value: object) -> datetime | None:
    if value is None:
        return None
    parsed = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class LoopSample:
    t: float  # time.monotonic() of the sample
    latest_heartbeat: float | None  # unix time of the scheduler job's latest_heartbeat
    running: int


# Every heartbeat the scheduler job writes, as the database takes it: a trigger on Airflow's job table
# copies each new latest_heartbeat into a table of the benchmark's own (in the run's throwaway database).
_RECORD_DDL: dict[str, tuple[str, ...]] = {
    "postgresql": (
        "CREATE TABLE IF NOT EXISTS bench_scheduler_heartbeats (at TIMESTAMP WITH TIME ZONE NOT NULL)",
        """CREATE OR REPLACE FUNCTION bench_scheduler_heartbeats_copy() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF NEW.job_type = 'SchedulerJob' AND NEW.latest_heartbeat IS NOT NULL THEN
            INSERT INTO bench_scheduler_heartbeats (at) VALUES (NEW.latest_heartbeat);
          END IF;
          RETURN NULL;
        END $$""",
        "DROP TRIGGER IF EXISTS bench_scheduler_heartbeats ON job",
        """CREATE TRIGGER bench_scheduler_heartbeats AFTER INSERT OR UPDATE OF latest_heartbeat ON job
        FOR EACH ROW EXECUTE FUNCTION bench_scheduler_heartbeats_copy()""",
    ),
    "sqlite": (
        "CREATE TABLE IF NOT EXISTS bench_scheduler_heartbeats (at TEXT NOT NULL)",
        """CREATE TRIGGER IF NOT EXISTS bench_scheduler_heartbeats_inserted AFTER INSERT ON job FOR EACH ROW
        WHEN NEW.job_type = 'SchedulerJob' AND NEW.latest_heartbeat IS NOT NULL
        BEGIN INSERT INTO bench_scheduler_heartbeats (at) VALUES (NEW.latest_heartbeat); END""",
        """CREATE TRIGGER IF NOT EXISTS bench_scheduler_heartbeats_updated AFTER UPDATE OF latest_heartbeat
        ON job FOR EACH ROW WHEN NEW.job_type = 'SchedulerJob' AND NEW.latest_heartbeat IS NOT NULL
        BEGIN INSERT INTO bench_scheduler_heartbeats (at) VALUES (NEW.latest_heartbeat); END""",
    ),
}


@dataclass
class HeartbeatRecord:
    """Every scheduler job heartbeat from the moment it is installed, recorded by the database itself.

    Sampling ``latest_heartbeat`` sees only the beats still there at each sample: a sampler kept off the
    CPU (a burst's crowd of starts is when that happens) misses the ones in between, and their gaps read
    as one longer gap. A trigger sees every beat, whoever is starved.
    """

    engine: sa.Engine

    def install(self) -> None:
        with self.engine.begin() as conn:
            for statement in _RECORD_DDL[self.engine.dialect.name]:
                conn.execute(sa.text(statement))

    def beats(self) -> list[float]:
        """Unix times of the beats recorded so far."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT at FROM bench_scheduler_heartbeats")).all()
        return sorted(when.timestamp() for (at,) in rows if (when := as_utc(at)) is not None)


@dataclass
class LoopProbe:
    """Polls the scheduler job's ``latest_heartbeat`` and the running task count from the database."""

    query: Callable[[str], list[tuple[object, ...]]]
    record: HeartbeatRecord | None = None
    """Where the database records every beat (:meth:`gaps` then misses none); else the samples alone."""
    interval: float = 0.5
    samples: list[LoopSample] = field(default_factory=list)
    recorded: list[float] = field(default_factory=list)
    record_error: str | None = None  # why the record could not be read (the gaps are then the samples')
    ended_at: float = 0.0

    def _sample(self, t: float) -> None:
        beat = self.query(
            "SELECT latest_heartbeat FROM job WHERE job_type = 'SchedulerJob' ORDER BY id DESC LIMIT 1"
        )
        running = self.query("SELECT count(*) FROM task_instance WHERE state = 'running'")
        when = as_utc(beat[0][0]) if beat else None
        self.samples.append(
            LoopSample(t, when.timestamp() if when else None, int(str(running[0][0])) if running else 0)
        )

    @contextlib.contextmanager
    def sampling(self) -> Iterator[LoopProbe]:
        if self.record is not None:
            self.record.install()
        periodic = Periodic("bench-loop", self.interval, self._sample)
        periodic.start()
        self.ended_at = 0.0
        try:
            yield self
        finally:
            periodic.stop()
            self.ended_at = time.time()
            if self.record is not None:
                # Read while the database is still there (a deployment drops its own when it ends); a
                # failed read leaves the samples alone, and never hides what ended the body.
                try:
                    self.recorded = [at for at in self.record.beats() if at <= self.ended_at]
                except sa.exc.SQLAlchemyError as exc:
                    self.record_error = f"{type(exc).__name__}: {exc}"[:300]

    def gaps(self, *, sampled_only: bool = False) -> list[float]:
        """Gaps between distinct heartbeats, plus the open gap up to the end of polling.

        :param sampled_only: from the samples alone, as a probe without a record sees them
        """
        beats = sorted(
            {s.latest_heartbeat for s in self.samples if s.latest_heartbeat is not None}
            | (set() if sampled_only else set(self.recorded))
        )
        gaps = [b - a for a, b in itertools.pairwise(beats)]
        if beats and self.ended_at:
            gaps.append(max(0.0, self.ended_at - beats[-1]))
        return gaps

    def seconds_since_heartbeat(self) -> float | None:
        for sample in reversed(self.samples):
            if sample.latest_heartbeat is not None:
                return time.time() - sample.latest_heartbeat
        return None

    def peak_running(self) -> int:
        return max((s.running for s in self.samples), default=0)


@dataclass(frozen=True)
class HeartbeatLog:
    """What ``timed_executor`` wrote: completed durations and a call still open at read time."""

    durations: list[float]
    open_for: float | None

    @classmethod
    def read(cls, path: Path, now: float | None = None) -> HeartbeatLog:
        durations: list[float] = []
        open_since: float | None = None
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            return cls([], None)
        for line in lines:
            parts = line.split()
            if len(parts) == 2 and parts[0] == "b":
                open_since = float(parts[1])
            elif len(parts) == 3 and parts[0] == "e":
                durations.append(float(parts[2]))
                open_since = None
        now = time.time() if now is None else now
        return cls(durations, None if open_since is None else now - open_since)

    @property
    def longest(self) -> float | None:
        candidates = [*self.durations, *([self.open_for] if self.open_for is not None else [])]
        return max(candidates) if candidates else None
