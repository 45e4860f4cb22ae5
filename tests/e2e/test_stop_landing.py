"""A scheduler stopped at random moments always exits 0 (adapter/stop_signals.py, docs/design.md "A stop
lands between transactions").

Opt-in, for its length: ``ALE_STOP_CYCLES=<n>`` runs it, ``ALE_STOP_MODE=terminate`` (default
``handover``) picks ``on_stop``, ``ALE_STOP_SEED`` the moments. Each cycle starts the scheduler (after
the first), waits for its loop to begin, in ``terminate`` mode triggers a run and waits for its tasks to
start (in ``handover`` mode, half the time, for the adoption of the running ones), waits a random 0-2 s,
and SIGTERMs it. Before the stop signal was held, Airflow's handler raised ``SystemExit`` inside the
scheduler's database work about one stop in 5 (``terminate``) and one in 35 (``handover``), and the
scheduler exited 1; the test fails on the first such exit, with its log.

A real Airflow 3.3 (scheduler, api-server, dag-processor) on SQLite, where the failure showed.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from harness.sandbox import AirflowSandbox
from tests.e2e.helpers import poll, since, stop_scheduler

CYCLES = int(os.environ.get("ALE_STOP_CYCLES", "0"))
MODE = os.environ.get("ALE_STOP_MODE", "handover")
SEED = int(os.environ.get("ALE_STOP_SEED", "1"))
DAG = "switch_back"  # dags/switch_back.py: 3 tasks that wait for a gate that stays shut
TASKS = 3
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not CYCLES, reason="opt-in: ALE_STOP_CYCLES=<n> runs it"),
    pytest.mark.timeout(300 + 60 * CYCLES),  # a terminate cycle takes 20-30 s on 2 cores
    pytest.mark.sandbox(
        parallelism=16,
        config={
            "AIRFLOW__ASYNC_LOCAL_EXECUTOR__ON_STOP": MODE,
            "AIRFLOW__ASYNC_LOCAL_EXECUTOR__SHUTDOWN_TIMEOUT": "3",
        },
    ),
]


def test_every_stop_at_a_random_moment_exits_0(sandbox: AirflowSandbox, tmp_path: Path) -> None:
    sandbox.wait_for_dag(DAG, timeout=120)
    moments = random.Random(SEED)  # noqa: S311 - moments to stop at, not secrets
    held = 0
    for cycle in range(CYCLES):
        before = sandbox.process_logs["scheduler"].stat().st_size

        def logged(line: str, offset: int = before) -> bool:
            return line in since(sandbox, offset)

        if cycle:
            sandbox.restart("scheduler")
            poll("the scheduler's loop to begin", lambda: logged("Starting the scheduler"))
        if MODE == "terminate" or not cycle:
            started = len(list(tmp_path.glob("work*.start")))
            sandbox.trigger(DAG)

            def launched(n: int = started) -> bool:
                return len(list(tmp_path.glob("work*.start"))) >= n + TASKS

            poll("the run's tasks to start", launched)
        elif moments.random() < 0.5:
            poll("the adoption", lambda: logged(f"adopted {TASKS} task instance(s)"))
        time.sleep(moments.uniform(0, 2))  # the moment is what the test varies, not a wait for anything
        stopped = stop_scheduler(sandbox)
        held += "inside a call of its loop" in stopped
        print(
            f"stop {cycle + 1}/{CYCLES}: exit 0{', held' if 'inside a call of its loop' in stopped else ''}"
        )
    print(f"{CYCLES} stops, every one exit 0; {held} found the scheduler inside a call of its loop")
