"""Runs the selected cases for every variant, alternating A B A B, and writes one JSON line per run."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Final

import psutil

from benchmarks.deployment import REPO_ROOT, Variant
from benchmarks.scenarios import (
    burst,
    chaos,
    control,
    dispatch,
    footprint,
    imports,
    ordinary,
    restart,
    starvation,
    throughput,
)
from benchmarks.scenarios.base import Case, RunContext
from harness.sandbox import installed_airflow_major

SCHEMA: Final[int] = 1
SCENARIOS: Final[dict[str, Callable[[str], list[Case]]]] = {
    "throughput": throughput.cases,
    "footprint": footprint.cases,
    "burst": burst.cases,
    "dispatch": dispatch.cases,
    "ordinary": ordinary.cases,
    "imports": imports.cases,
    "starvation": starvation.cases,
    # Full profile only: its cases have no smaller size.
    "restart": restart.cases,
    # Full profile only: the restart chaos test (tests/e2e/chaos.py) at full size.
    "chaos": chaos.cases,
    # Full profile only: live control (pause, drain, resize) at full size.
    "control": control.cases,
}
PROFILES: Final[tuple[str, ...]] = ("smoke", "quick", "full")
DEFAULT_REPEAT: Final[dict[str, int]] = {"smoke": 1, "quick": 1, "full": 3}

Record = dict[str, Any]


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine() -> dict[str, Any]:
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 1024**3, 1),
    }


def versions() -> dict[str, Any]:
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "python": platform.python_version(),
        "apache-airflow": _version("apache-airflow"),
        "apache-airflow-task-sdk": _version("apache-airflow-task-sdk"),
        "async-local-executor": _version("async-local-executor"),
        "uvloop": _version("uvloop"),
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "git_dirty": None if status is None else bool(status),
    }


def source_digest() -> str:
    """A short hash of the executor package's Python files as they are on disk now."""
    digest = hashlib.sha256()
    package = REPO_ROOT / "src" / "async_local_executor"
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def select_cases(profile: str, scenarios: Iterable[str]) -> list[Case]:
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    selected: list[Case] = []
    for name in scenarios:
        if name not in SCENARIOS:
            raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
        selected.extend(SCENARIOS[name](profile))
    return selected


def default_database() -> str:
    """The database of a case that names none: Airflow 2 refuses SQLite for parallel executors."""
    return "postgres" if installed_airflow_major() < 3 else "sqlite"


@dataclass(frozen=True)
class Plan:
    profile: str
    cases: Sequence[Case]
    variants: Sequence[Variant]
    repeat: int
    # --database: overrides every case's own choice when set.
    database: str | None = None
    # --airflow-cfg: what every deployment's airflow.cfg is (harness.environment.AIRFLOW_CFG_KINDS).
    airflow_cfg: str = "generated"
    # --jobs: how many runs at once. One for figures to compare; more only proves the harness works
    # sooner (the smoke test runs a case's A and B side by side), as runs sharing the cores slow each
    # other down.
    jobs: int = 1
    # --profile-scheduler: where each run that takes a scheduler profile writes it; None: none is taken.
    profile_dir: Path | None = None

    def runs(self) -> list[tuple[Case, int, Variant]]:
        # Paired runs sit next to each other in time: A B A B per case, so drift hits both sides.
        return [(case, rep, v) for case in self.cases for rep in range(self.repeat) for v in self.variants]

    def database_for(self, case: Case) -> str:
        return self.database or case.database or default_database()


class Listener:
    """Hooks for the terminal display; the defaults do nothing."""

    def run_started(self, index: int, total: int, case: Case, rep: int, variant: Variant) -> None: ...

    def run_finished(self, record: Record) -> None: ...

    def line(self, message: str) -> None: ...


def run_plan(plan: Plan, out: Path, listener: Listener, *, keep_home: bool = False) -> list[Record]:
    """Run every (case, repetition, variant) once; append each record to ``out`` as it finishes.

    With ``plan.jobs`` above one, that many runs go at once, in the plan's order (a case's variants side
    by side); the records come back in that order whichever finished first.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    session = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    host, vers = machine(), versions()
    runs = plan.runs()
    # The listener (a live terminal display) and the results file take one run's news at a time.
    lock = threading.Lock()

    def one(index: int) -> Record:
        case, rep, variant = runs[index]
        with lock:
            listener.run_started(index, len(runs), case, rep, variant)
        record = _run_one(plan, case, rep, variant, session, host, vers, listener, keep_home)
        with lock:
            with out.open("a") as fh:
                fh.write(json.dumps(record, default=str) + "\n")
            listener.run_finished(record)
        return record

    if plan.jobs <= 1:
        return [one(index) for index in range(len(runs))]
    with ThreadPoolExecutor(max_workers=plan.jobs, thread_name_prefix="bench-run") as pool:
        return list(pool.map(one, range(len(runs))))


def _run_one(
    plan: Plan,
    case: Case,
    rep: int,
    variant: Variant,
    session: str,
    host: dict[str, Any],
    vers: dict[str, Any],
    listener: Listener,
    keep_home: bool,
) -> Record:
    database = plan.database_for(case)
    stem = None
    if plan.profile_dir is not None:
        stem = plan.profile_dir / f"{session}-{case.scenario}-{case.name}-{variant.label}-{rep}"
    ctx = RunContext(variant, database, listener.line, keep_home, plan.airflow_cfg, stem)
    started_at = datetime.now(timezone.utc)
    began = time.monotonic()
    load = os.getloadavg()
    digest = source_digest()
    try:
        outcome = case.run(ctx)
        metrics, series, status, notes = outcome.metrics, outcome.series, outcome.status, outcome.notes
        info, text = outcome.info, outcome.text
    except Exception as exc:  # noqa: BLE001 - one failed run is a result, not the end of the suite
        metrics, series, status, info, text = {}, {}, "error", {}, {}
        notes = [f"{type(exc).__name__}: {exc}"[:4000], traceback.format_exc(limit=8)[-4000:]]
    return {
        "schema": SCHEMA,
        "session": session,
        "profile": plan.profile,
        "scenario": case.scenario,
        "case": case.name,
        "variant": variant.label,
        "executor": variant.executor,
        "variant_env": dict(variant.env),
        "executor_info": info,
        # Changes when the executor's source changed between runs (someone working on it).
        "source_digest": digest,
        "repetition": rep,
        "database": database,
        "airflow_cfg": plan.airflow_cfg,
        # How many runs shared the machine at most: above one, the figures are not for comparing.
        "jobs": plan.jobs,
        # The scheduler was profiled (its files' stem): the profilers' load is in its figures.
        "profiled": str(stem) if stem is not None else None,
        "command": python_command(),
        "started_at": started_at.isoformat(),
        "wall_s": round(time.monotonic() - began, 2),
        "load_avg_before": [round(x, 2) for x in load],
        "machine": host,
        "versions": vers,
        "config": dict(case.config),
        "status": status,
        "notes": notes,
        "metrics": metrics,
        "text": text,
        "series": series,
    }


def load_records(path: Path) -> list[Record]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def latest_session(records: list[Record]) -> list[Record]:
    if not records:
        return []
    last = max(r["session"] for r in records)
    return [r for r in records if r["session"] == last]


def python_command() -> str:
    return " ".join([Path(sys.executable).name, "-m", "benchmarks", *sys.argv[1:]])
