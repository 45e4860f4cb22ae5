"""Dispatch: each executor driven directly (queue_workload + heartbeat loop) with K workloads queued.

No Airflow deployment: a child process (``dispatch_driver``) plays the scheduler, so a heartbeat()
that blocks forever ends as "blocked" at the block limit, or at the hard timeout, instead of hanging
the suite.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from benchmarks.deployment import REPO_ROOT, executor_info
from benchmarks.scenarios.base import Case, Outcome, RunContext
from benchmarks.stats import percentile
from harness.sandbox import installed_airflow_major

MARKER_ENV = "ALE_BENCH_DISPATCH_ID"


@dataclass(frozen=True)
class Size:
    workloads: int
    parallelism: int
    window: float
    block_limit: float
    hard_timeout: float


def _sizes(ks: list[int], parallelism: int, window: float) -> list[Size]:
    return [Size(k, parallelism, window, block_limit=10.0, hard_timeout=window + 90.0) for k in ks]


SIZES = {
    "smoke": _sizes([20], parallelism=2, window=4),
    "quick": _sizes([100, 1000], parallelism=8, window=10),
    # The largest also at parallelism 256: the stock executor forks 256 workers sharing two pipes.
    "full": _sizes([100, 1000, 5000], parallelism=16, window=20) + _sizes([5000], parallelism=256, window=20),
}


def cases(profile: str) -> list[Case]:
    return [
        Case("dispatch", f"k{s.workloads}-p{s.parallelism}", asdict(s), functools.partial(run, s))
        for s in SIZES[profile]
    ]


@contextlib.contextmanager
def _silent_port() -> Iterator[int]:
    """A port that accepts TCP connections and never answers: every workload blocks on it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(4096)
        yield int(sock.getsockname()[1])


def _kill_marked(marker: str) -> None:
    # Task supervisors and task processes leave the driver's process group; the marker finds them.
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(MARKER_ENV) == marker:
                proc.kill()


def run(size: Size, ctx: RunContext) -> Outcome:
    variant = ctx.variant
    marker = uuid.uuid4().hex
    with (
        tempfile.TemporaryDirectory(prefix=f"ale-bench-dispatch-{variant.label}-") as tmp,
        _silent_port() as port,
    ):
        out = Path(tmp) / "heartbeats.txt"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update(
            {
                MARKER_ENV: marker,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
                "AIRFLOW_HOME": tmp,
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
                # One attempt and a timeout past the window: a started workload blocks for the whole run.
                "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "1",
                "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": str(size.hard_timeout + 60),
                **variant.env,
            }
        )
        if installed_airflow_major() < 3:
            # Airflow 2's tasks talk to the metadata database instead: the same silent port.
            env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"postgresql+psycopg2://bench@127.0.0.1:{port}/bench"
        argv = [
            sys.executable, "-m", "benchmarks.scenarios.dispatch_driver",
            "--executor", variant.executor,
            "--workloads", str(size.workloads),
            "--parallelism", str(size.parallelism),
            "--window", str(size.window),
            "--block-limit", str(size.block_limit),
            "--out", str(out),
        ]  # fmt: skip
        notes: list[str] = []
        with (Path(tmp) / "driver.log").open("wb") as log:
            proc = subprocess.Popen(
                argv, env=env, cwd=tmp, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            started = time.monotonic()
            try:
                proc.wait(timeout=size.hard_timeout)
            except subprocess.TimeoutExpired:
                notes.append(f"hard timeout after {size.hard_timeout:.0f}s: driver killed")
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                _kill_marked(marker)
            wall = time.monotonic() - started
        lines = out.read_text().splitlines() if out.exists() else []
        info = executor_info(Path(tmp) / "driver.log")
        if proc.returncode not in (0, -signal.SIGKILL) or not lines:
            notes.append(f"driver exit {proc.returncode}: {(Path(tmp) / 'driver.log').read_text()[-1500:]}")
    durations = [float(x.split()[1]) for x in lines if x.startswith("hb ")]
    dispatched = [int(x.split()[2]) for x in lines if x.startswith("hb ")]
    blocked_line = next((x for x in lines if x.startswith("blocked ")), None)
    done_line = next((x for x in lines if x.startswith("done ")), None)
    blocked = blocked_line is not None or done_line is None
    ms = [d * 1000 for d in durations]
    blocked_for = float(blocked_line.split()[2]) if blocked_line else None
    if blocked and blocked_line is None:
        blocked_for = wall
    last = (
        int(blocked_line.split()[1])
        if blocked_line
        else int(done_line.split()[1])
        if done_line
        else (dispatched[-1] if dispatched else 0)
    )
    all_ms = ms + ([blocked_for * 1000] if blocked_for is not None else [])
    metrics = {
        "heartbeat_p50_ms": percentile(ms, 50),
        "heartbeat_p99_ms": percentile(ms, 99),
        "heartbeat_max_ms": max(all_ms) if all_ms else None,
        "heartbeats": float(len(durations)),
        "dispatched": float(last),
        "blocked": 1.0 if blocked else 0.0,
        "blocked_after_dispatched": float(last) if blocked else None,
    }
    status = "blocked" if blocked else "ok"
    return Outcome(metrics, {"heartbeat_ms": ms}, status, notes, info)
