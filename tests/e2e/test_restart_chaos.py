"""Restart chaos: seeded sequences of scheduler stops, crashes, gaps, a second scheduler and a retried
adoption, played on one real Airflow 3.3 on PostgreSQL while tasks run (tests/e2e/chaos.py says which
steps, which invariants, and what is left out and why).

The seed comes from ``ALE_CHAOS_SEED`` (``random`` draws one); it is printed and named in every failure,
so a failing run replays with it. The small size (one sequence taking every kind of step once, its starts
crowded) runs with the suite on a fixed seed, :data:`SUITE_SEED`, so the suite is the same test on every
run: a retried adoption, a SIGKILL with a gap over ``handover_timeout``, a second scheduler SIGKILLed
and a SIGTERM, in that order, in which a limited task spends its timeout without a live owner across two
schedulers and kills itself (what a random seed found the checker did not yet allow). The full size
runs with ``ALE_CHAOS_FULL=1``, on a random seed unless one is given, or as the benchmark's ``chaos``
case (``python -m benchmarks --profile full --scenarios chaos --variants ours``), which is where new
interleavings are looked for.

The one thing injected: the scheduler loads the executor through a subclass whose
``try_adopt_task_instances`` raises ``OperationalError`` once after the real call, armed only in the
scheduler a ``retried`` step starts (tests/e2e/dags/chaos_adoption.py), because a real database deadlock
inside Airflow's ``run_with_db_retries`` cannot be staged reliably. Everything else is real: scheduler,
api-server, dag-processor, the fork-server launcher, task processes, signals.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.sandbox import AirflowSandbox
from tests.e2e import chaos

FULL = chaos.full_size()
REPLAY = "python -m pytest tests/e2e/test_restart_chaos.py"

pytestmark = [pytest.mark.e2e]


SUITE_SEED = 1066361626


def _play(sandbox: AirflowSandbox, size: chaos.Size, tmp_path: Path, test: str, default: int | None) -> None:
    seed = chaos.seed(default)
    result = chaos.run(sandbox, size, seed, tmp_path)
    message = result.message(f"{REPLAY}::{test}")
    chaos.say(message)
    assert not result.failed, message


@pytest.mark.timeout(900)
@pytest.mark.sandbox(
    executor=chaos.EXECUTOR,
    database="postgres",
    parallelism=chaos.SMALL.parallelism,
    config=chaos.SMALL.config(),
)
def test_restart_chaos(sandbox: AirflowSandbox, tmp_path: Path) -> None:
    _play(sandbox, chaos.SMALL, tmp_path, "test_restart_chaos", SUITE_SEED)


@pytest.mark.skipif(
    not os.environ.get("ALE_CHAOS_FULL"),
    reason="full size (20 sequences of 100 tasks): ALE_CHAOS_FULL=1, or the benchmark's chaos case",
)
@pytest.mark.timeout(0)
@pytest.mark.sandbox(
    executor=chaos.EXECUTOR,
    database="postgres",
    parallelism=FULL.parallelism,
    config=FULL.config(),
)
def test_restart_chaos_full(sandbox: AirflowSandbox, tmp_path: Path) -> None:
    _play(sandbox, FULL, tmp_path, "test_restart_chaos_full", None)
