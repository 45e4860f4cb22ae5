"""A scheduler restart hands running tasks over: they run on and the next scheduler adopts them.

With the defaults (``on_stop = handover``, ``handover_timeout = 300``), a stopped scheduler exits within
seconds and a killed one leaves its tasks running; the next scheduler adopts them, so every task runs
once, at try 1, and its end is reported. Without a successor, the tasks kill themselves once
``handover_timeout`` has passed. An adopted task's run-time limit counts from its launch, not from its
adoption, also when its adopter crashes and the next scheduler adopts it again, and its grace period
counts from the limit's end, also across a stop inside it. A handed-over task whose
process is gone by the restart, or whose recorded pid another process runs now, is not adopted: the
scheduler resets it and it runs again, and the other process is left alone. Each task records every
execution it starts and ends (dags/handover.py, dags/handover_overrun.py), so the tests count executions
from the tasks themselves, not from Airflow's database alone.

Nothing is mocked: a real Airflow 3.3 (scheduler, api-server, dag-processor) on SQLite, the default
fork-server launcher, real task processes. The steps and checks these tests share with their Airflow 2
twins (tests/airflow2/test_handover.py) are tests/handover_scenarios.py's. What differs here: the
api-server, which can hold a task instance's row while Airflow's retried adoption looks for it, so the
retry's answer may come in two offers; the line with which the scheduler resets a task it did not adopt,
which these tests do not wait for; and the test without a next scheduler, which is this major's alone.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.sandbox import AirflowSandbox
from tests import handover_scenarios as scenarios
from tests.core.helpers import alive
from tests.e2e.helpers import QUICK_ORPHANS, bystander_at_recorded_pid, cmdline, first_tries, marks, since

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox(parallelism=4, config=QUICK_ORPHANS)]
AIRFLOW3 = scenarios.Major(
    dag_id="handover", overrun_dag_id="handover_overrun", awaits_reset=False, split_offers=True
)
TASKS = scenarios.TASKS


def test_a_stopped_scheduler_hands_its_running_tasks_to_the_next_which_adopts_them(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    run_id, launched = scenarios.running(sandbox, tmp_path, AIRFLOW3)
    scenarios.stop_within_the_bound(sandbox, launched)
    sandbox.restart("scheduler")
    scenarios.adopted(sandbox, launched)
    scenarios.finish_at_try_1(sandbox, tmp_path, AIRFLOW3, run_id)


def test_a_killed_scheduler_s_tasks_wait_for_the_next_which_adopts_them(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    run_id, launched = scenarios.running(sandbox, tmp_path, AIRFLOW3)
    sandbox.kill("scheduler")
    sandbox.restart("scheduler")
    scenarios.adopted(sandbox, launched)
    scenarios.finish_at_try_1(sandbox, tmp_path, AIRFLOW3, run_id)


HANDOVER_TIMEOUT = 5.0


@pytest.mark.sandbox(config={"AIRFLOW__ASYNC_LOCAL_EXECUTOR__HANDOVER_TIMEOUT": str(HANDOVER_TIMEOUT)})
def test_without_a_next_scheduler_nothing_a_task_started_outlives_the_handover_timeout(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    _, launched = scenarios.running(sandbox, tmp_path, AIRFLOW3)
    sandbox.kill("scheduler")
    killed = time.monotonic()
    deadline = killed + HANDOVER_TIMEOUT + 10.0
    while survivors := [pid for pid in launched if alive(pid)]:
        assert time.monotonic() < deadline, {pid: cmdline(pid) for pid in survivors}
        time.sleep(0.1)
    # They waited for a successor first: not killed with the scheduler.
    assert time.monotonic() - killed >= HANDOVER_TIMEOUT - 1.0
    assert marks(tmp_path, ".end") == []


def test_a_handed_over_task_whose_process_vanished_before_the_restart_is_reset_and_runs_again(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    run_id, _ = scenarios.running(sandbox, tmp_path, AIRFLOW3)
    hold0, hold1 = first_tries(tmp_path)
    scenarios.stop(sandbox, TASKS)
    scenarios.vanish(*hold0)
    offset = scenarios.restart(sandbox)
    scenarios.adopts_hold1_only(sandbox, AIRFLOW3, offset, hold1[1])
    retried = scenarios.runs_again(sandbox, tmp_path, hold0, hold1)
    scenarios.rerun_ends(sandbox, tmp_path, AIRFLOW3, run_id, hold0, hold1, retried)


@pytest.mark.sandbox(
    config={"AIRFLOW__ASYNC_LOCAL_EXECUTOR__HANDOVER_TIMEOUT": str(scenarios.HANDOVER_TIMEOUT_REUSED)}
)
def test_a_recorded_pid_another_process_runs_now_is_neither_adopted_nor_killed(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    run_id, _ = scenarios.running(sandbox, tmp_path, AIRFLOW3)
    hold0, hold1 = first_tries(tmp_path)
    scenarios.stop(sandbox, TASKS)
    stopped = time.monotonic()
    # Another process runs under the pid the journal records for hold0's workload (a pid reuse).
    with bystander_at_recorded_pid(sandbox, hold0[1]) as (other, other_start):
        offset = scenarios.restart(sandbox)
        scenarios.adopts_hold1_only(sandbox, AIRFLOW3, offset, hold1[1])
        scenarios.unrecorded_workload_ends(hold0, stopped)
        retried = scenarios.runs_again(sandbox, tmp_path, hold0, hold1)
        scenarios.rerun_ends(sandbox, tmp_path, AIRFLOW3, run_id, hold0, hold1, retried)
        scenarios.untouched(other, other_start)


@pytest.mark.sandbox(config=scenarios.overrun_config(scenarios.OVERRUN_TIMEOUT))
def test_an_adopted_task_times_out_when_what_was_left_of_its_limit_runs_out(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    overrun = scenarios.overrun_running(sandbox, tmp_path, AIRFLOW3)
    scenarios.stop(sandbox, 1)
    scenarios.without_a_scheduler(overrun)
    restarted = time.time()
    offset = scenarios.restart(sandbox)
    scenarios.ended_by_its_limit_from_launch(sandbox, AIRFLOW3, offset, overrun, scenarios.OVERRUN_TIMEOUT)
    text = since(sandbox, offset)
    scenarios.held_to_what_was_left(text, overrun, restarted)
    assert "workload handover_overrun.overrun try 1 failed: " in text, text
    scenarios.failed_in_its_one_execution(sandbox, tmp_path, AIRFLOW3, overrun)


@pytest.mark.sandbox(config=scenarios.spent_config())
def test_a_task_stopped_during_its_grace_is_killed_at_its_adoption_once_the_grace_is_spent(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    """Its limit runs out (SIGTERM, which it survives), the scheduler stops inside the grace period and
    hands it over, and the next one starts after the grace period is spent: that one kills it as soon as
    it holds it. Given a whole grace period again, it would run that much longer past its limit, and a
    slow start on top (the restart chaos test saw one run to its end)."""
    overrun = scenarios.overrun_running(sandbox, tmp_path, AIRFLOW3)
    terminating = scenarios.limit_ran_out(sandbox, overrun)
    scenarios.stop(sandbox, 1)
    scenarios.grace_spent_without_a_scheduler(overrun, terminating)
    offset = scenarios.restart(sandbox)
    scenarios.killed_once_held(sandbox, AIRFLOW3, offset, overrun)
    scenarios.failed_in_its_one_execution(sandbox, tmp_path, AIRFLOW3, overrun)


TWICE_TIMEOUT = 120.0  # the executor's run-time limit per task, for a task adopted twice
OPEN_AFTER = 85.0  # its gate opens then at the earliest: past a limit counted twice, well inside its own


@pytest.mark.sandbox(config=scenarios.overrun_config(TWICE_TIMEOUT))
def test_a_task_adopted_twice_after_its_adopter_crashed_finishes_inside_the_limit_counted_once(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    overrun = scenarios.overrun_running(sandbox, tmp_path, AIRFLOW3)
    offset = scenarios.adopted_twice_then_succeeds(
        sandbox, tmp_path, AIRFLOW3, overrun, TWICE_TIMEOUT, OPEN_AFTER
    )
    scenarios.not_timed_out(sandbox, tmp_path, offset, overrun)


# PostgreSQL, the database whose deadlocks and dropped connections make Airflow retry the transaction.
@pytest.mark.sandbox(database="postgres", config=scenarios.injecting(""))
def test_a_retried_adoption_gets_the_same_answer(sandbox: AirflowSandbox, tmp_path: Path) -> None:
    """Airflow retries its adoption's transaction with the same task instances: the executor adopts them
    again. The error is injected (tests/e2e/dags/chaos_adoption.py): a real deadlock at that point of
    Airflow's transaction cannot be staged reliably. Everything else is real.
    """
    run_id, launched = scenarios.running(sandbox, tmp_path, AIRFLOW3)
    scenarios.stop(sandbox, TASKS)
    offset = scenarios.restart_armed(sandbox)
    scenarios.adopted_again_after_the_injected_error(sandbox, AIRFLOW3, offset)
    # The retried transaction is the one that committed.
    scenarios.name_the_new_scheduler_s_job(sandbox, AIRFLOW3, run_id)
    scenarios.adopted(sandbox, launched)
    scenarios.finish_at_try_1(sandbox, tmp_path, AIRFLOW3, run_id)
    # Each end is reported once, by the scheduler that adopted it.
    text = scenarios.reported_once(sandbox, AIRFLOW3, offset, [("success", i, 1) for i in range(TASKS)])
    assert "Reset the following" not in text, text
