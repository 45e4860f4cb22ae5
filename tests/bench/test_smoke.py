"""The benchmark suite's smoke profile runs end to end: both executors, every scenario, real Airflow.

It proves the harness works (JSON lines with every figure, sane values, charts, the results page); the
numbers themselves are too small to mean anything. So the CLI runs two at a time (``--jobs 2``: each
case's stock and ours side by side), which nearly halves the module's wait: every test here shares that
one run, and the first (test_the_cli_exits_0) carries it in its setup.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from benchmarks import roles
from benchmarks.metrics import METRICS
from benchmarks.runner import select_cases

# Seven scenarios (a case each) x two variants, twelve of them a real Airflow each (dispatch has none),
# two at a time: about 3.5 minutes on 2 cores (6.5 one after the other).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = ("throughput", "footprint", "burst", "dispatch", "ordinary", "imports", "starvation")
# Each case's own database (no --database given): burst runs on PostgreSQL as upstream #70526 did.
DATABASES = {
    "throughput": "sqlite",
    "footprint": "sqlite",
    "burst": "postgres",
    "dispatch": "sqlite",
    "ordinary": "sqlite",
    "imports": "sqlite",
    "starvation": "sqlite",
}
VARIANTS = ("stock", "ours")
JOBS = 2
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass
class Smoke:
    returncode: int
    output: str
    records: list[dict[str, Any]]
    charts: Path
    markdown: Path


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Smoke:
    tmp = tmp_path_factory.mktemp("bench")
    out, charts, markdown = tmp / "results.jsonl", tmp / "charts", tmp / "benchmarks.md"
    argv = [
        sys.executable, "-m", "benchmarks", "--profile", "smoke", "--variants", ",".join(VARIANTS),
        "--repeat", "1", "--jobs", str(JOBS), "--out", str(out), "--charts", str(charts),
        "--markdown", str(markdown),
    ]  # fmt: skip
    result = subprocess.run(
        argv,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1140,
        check=False,
    )
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return Smoke(result.returncode, result.stdout + result.stderr[-6000:], records, charts, markdown)


def of(smoke: Smoke, scenario: str, variant: str) -> list[dict[str, Any]]:
    return [r for r in smoke.records if r["scenario"] == scenario and r["variant"] == variant]


def by(smoke: Smoke, scenario: str, variant: str) -> dict[str, Any]:
    [record] = of(smoke, scenario, variant)
    return record


def stock_burst_did_not_end(record: dict[str, Any]) -> bool:
    """Whether this is the stock executor's burst run, given up on with its DAG run still running.

    The burst exists because the stock LocalExecutor can stop making progress in it, and the smoke run
    is the harness's check, not the executor's: there, such an end is a result to record, not a failure.
    At smoke size it is rare; the CI run of 2026-12-04 saw one (the run still "running" 217 s after the
    last clear, cause not recorded then, hence the burst's note on what was left unfinished). Its
    scheduler may also exit in it: twice on 2026-12-05, on Airflow's own ``StaleDataError`` (an
    ``UPDATE`` of ``task_instance`` that found no row, a clear having raced it), which the record's
    notes name. Ours is held to finishing.
    """
    return (
        record["scenario"] == "burst"
        and record["variant"] == "stock"
        and record["status"] in ("timeout", "stalled", "scheduler exited")
    )


def test_the_cli_exits_0(smoke: Smoke) -> None:
    assert smoke.returncode == 0, smoke.output


def test_one_json_line_per_case_and_variant(smoke: Smoke) -> None:
    cases = [(case.scenario, case.name) for case in select_cases("smoke", SCENARIOS)]
    assert sorted((r["scenario"], r["case"], r["variant"]) for r in smoke.records) == sorted(
        (s, c, v) for s, c in cases for v in VARIANTS
    )
    # Each record says how many runs shared the machine, and all are of one session.
    assert {r["jobs"] for r in smoke.records} == {JOBS}
    assert len({r["session"] for r in smoke.records}) == 1


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_record_carries_context_and_every_figure(smoke: Smoke, scenario: str, variant: str) -> None:
    records = of(smoke, scenario, variant)
    assert records
    for record in records:
        # A stock burst run given up on is checked in test_figures_are_sane; its context here all the same.
        assert stock_burst_did_not_end(record) or record["status"] == "ok", record["notes"]
        assert record["machine"]["cpus"] >= 1
        assert record["versions"]["apache-airflow"].startswith("3.3")
        assert record["config"]
        assert record["database"] == DATABASES[scenario]
        # Numbers in "metrics", words (the run's state) in "text": together, every registered figure.
        assert set(record["metrics"]) | set(record["text"]) == set(METRICS[scenario])
        assert not set(record["metrics"]) & set(record["text"])


@pytest.mark.parametrize("variant", VARIANTS)
def test_figures_are_sane(smoke: Smoke, variant: str) -> None:
    throughput = by(smoke, "throughput", variant)["metrics"]
    assert throughput["tasks_succeeded"] == by(smoke, "throughput", variant)["config"]["tasks"]
    assert 0 < throughput["makespan_s"] <= throughput["run_duration_s"] < 120
    assert throughput["tasks_per_s"] > 0
    assert 0 <= throughput["queued_to_start_p50_s"] <= throughput["queued_to_start_p95_s"]
    assert throughput["scheduler_cpu_s"] > 0
    assert throughput["api_server_cpu_s"] > 0
    assert throughput["executor_heartbeat_p50_ms"] > 0

    footprint = by(smoke, "footprint", variant)["metrics"]
    assert 10 < footprint["idle_uss_mb"] < footprint["peak_uss_mb"] < 20_000
    assert footprint["peak_running"] >= 1
    # A difference of two medians of 4 busy tasks: on a loaded machine (the suites side by side) it came
    # out at -14.8 MB, so at smoke size only a number is asked for; the full profile measures it.
    assert math.isfinite(footprint["per_task_uss_mb"])

    burst_record = by(smoke, "burst", variant)
    burst, size = burst_record["metrics"], burst_record["config"]
    if stock_burst_did_not_end(burst_record):
        # The record says what happened, with the figures up to the end of the wait and what was left.
        assert burst_record["text"]["run_state"] not in ("success", "failed")
        assert burst["run_finished"] == 0
        assert burst["clears"] <= size["clears"]  # a stall may end the run before the last clear
        assert any(
            note.startswith("unfinished task instances at the end: ") for note in burst_record["notes"]
        )
    else:
        _check_burst(burst_record)

    ordinary_record = by(smoke, "ordinary", variant)
    ordinary = ordinary_record["metrics"]
    assert ordinary_record["text"] == {"run_state": "success"}
    assert ordinary["tasks_succeeded"] == ordinary_record["config"]["tasks"]
    assert ordinary["tasks_failed"] == ordinary["tasks_lost"] == 0
    assert ordinary["state_mismatches"] >= 0
    assert 0 < ordinary["makespan_s"] <= ordinary["run_duration_s"] < 120
    # Airflow's own defaults, from the airflow.cfg it generated: one api-server worker, a 5 s client timeout.
    assert ordinary_record["airflow_cfg"] == "generated"
    assert ordinary_record["series"]["airflow_config"] == {
        "AIRFLOW__CORE__PARALLELISM": str(ordinary_record["config"]["parallelism"]),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__SCHEDULER__MAX_TIS_PER_QUERY": "16",
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "5.0",
    }

    dispatch = by(smoke, "dispatch", variant)["metrics"]
    assert dispatch["heartbeats"] > 0
    assert dispatch["heartbeat_p50_ms"] > 0
    assert dispatch["dispatched"] >= 1

    for record in of(smoke, "imports", variant):
        figures = record["metrics"]
        assert figures["tasks_succeeded"] == record["config"]["tasks"]
        assert 0 < figures["makespan_s"] <= figures["run_duration_s"] < 120
        assert 0 < figures["task_duration_p50_s"] <= figures["task_duration_p95_s"] <= figures["makespan_s"]
        # 4 no-op tasks: with the default preload each runs about 0.3 s, and the probes (a few samples a
        # second) may see none of them running; when they do, USS per task is a difference of two
        # medians, which the fork server's replacement in the idle window can push below zero. So at
        # smoke size only their presence is asked for.
        assert figures["peak_running"] >= 0
        if figures["peak_running"]:
            assert math.isfinite(figures["per_task_uss_mb"])
        # Every task said its own process's private memory in its log: a process that parsed a DAG file
        # importing pandas holds megabytes of its own, whoever forked it.
        assert len(record["series"]["task_process_uss_mb"]) == record["config"]["tasks"]
        assert 1 < figures["task_process_uss_mb"] <= figures["task_process_uss_p95_mb"] < 1024
        assert figures["scheduler_cpu_s"] > 0

    starvation_record = by(smoke, "starvation", variant)
    starvation, size = starvation_record["metrics"], starvation_record["config"]
    assert starvation_record["text"] == {"run_state": "success"}
    assert starvation["tasks_succeeded"] == size["crowd"] + 3
    # Fixed CPU work takes at least that long on the wall clock (process_time counts every thread of
    # the task process, hence the margin).
    assert starvation["long_cpu_wall_s"] >= 0.9 * size["cpu_seconds"]
    assert starvation["cpu_tasks_wall_s"] >= 0.9 * size["cpu_seconds"]
    assert starvation["long_cpu_stretch"] == pytest.approx(
        starvation["long_cpu_wall_s"] / size["cpu_seconds"]
    )
    assert 1 <= starvation["crowd_peak_running"] <= size["crowd"]
    assert 0 <= starvation["crowd_running_at_long_cpu_start"] <= size["crowd"]
    timeline = starvation_record["series"]["timeline"]
    assert len(timeline["crowd"]) == size["crowd"]
    # cpu_a and cpu_b wait for the whole crowd.
    crowd_end = max(end for _, end in timeline["crowd"])
    assert min(timeline["cpu_a"][0], timeline["cpu_b"][0]) >= crowd_end


def test_the_async_executor_never_accepts_past_parallelism_and_prefetch(smoke: Smoke) -> None:
    record = by(smoke, "dispatch", "ours")
    # prefetch_multiplier defaults to 1: as many again wait inside the executor for a slot.
    assert record["metrics"]["dispatched"] == 2 * record["config"]["parallelism"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the kernel's exit records (taskstats) need root")
def test_the_ordinary_and_burst_cases_account_their_tasks_cpu_by_role(smoke: Smoke) -> None:
    records = [
        record
        for scenario in ("ordinary", "burst")
        for variant in VARIANTS
        if not stock_burst_did_not_end(record := by(smoke, scenario, variant))
    ]
    accounted = [r for r in records if r["metrics"][roles.metric("task_process")] is not None]
    why = [note for r in records if r not in accounted for note in r["notes"] if "no CPU account" in note]
    # Runs side by side each have the kernel's records: only one whose scheduler was gone by the end
    # goes without, and says so.
    assert len(why) == len(records) - len(accounted), why
    assert all("the scheduler was gone" in note for note in why), why
    assert {("ordinary", "stock"), ("ordinary", "ours")} <= {(r["scenario"], r["variant"]) for r in accounted}
    for record in accounted:
        per_task = {role: record["metrics"][roles.metric(role)] for role in roles.ROLES}
        for role in ("scheduler_thread", "api_server", "task_process", "workload"):
            assert per_task[role] > 0, (record["scenario"], record["variant"], role, per_task)
        # Stock has neither, and its workers, which reap their tasks, never exit in between: nothing
        # it runs leaves an exit's work to place. Ours's are a few milliseconds per task, which at
        # smoke size /proc's 10 ms units may not show: the full-size runs quote them.
        if record["variant"] == "stock":
            assert per_task["loop_thread"] == per_task["fork_server"] == 0, per_task
            assert record["metrics"][roles.EXITS] == 0, record["metrics"]
    data = (smoke.charts / "roles.png").read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert "](charts/roles.png)" in smoke.markdown.read_text()


def test_charts_are_written(smoke: Smoke) -> None:
    for name in ("makespan.png", "memory.png", "heartbeat.png", "imports.png", "starvation.png"):
        data = (smoke.charts / name).read_bytes()
        assert data.startswith(PNG_MAGIC)
        assert len(data) > 5_000


def test_the_results_page_has_the_table(smoke: Smoke) -> None:
    text = smoke.markdown.read_text()
    assert "| scenario / case | figure | unit | stock | ours | ours/stock |" in text
    assert "makespan_s" in text
    # The run's state is a word, shown side by side with no ratio.
    assert "| `run_state` |  | success | success |  |" in text
    assert f"burst / {by(smoke, 'burst', 'stock')['case']} `postgres`" in text
    assert "](charts/imports.png)" in text
    assert "](charts/starvation.png)" in text
    # Runs that shared the machine are said to be no comparison.
    assert f"{JOBS} runs at a time (`--jobs {JOBS}`)" in text


def _check_burst(burst_record: dict[str, Any]) -> None:
    """A burst run that ended: every task succeeded, through three clears, with the deployment's settings."""
    burst, size = burst_record["metrics"], burst_record["config"]
    assert burst_record["text"] == {"run_state": "success"}
    assert burst["run_finished"] == 1
    # Every task instance cleared three times, an interval apart, from the first one running.
    assert burst["clears"] == size["clears"] == 3
    assert burst_record["series"]["clear_offsets_s"] == pytest.approx(
        [size["clear_interval"] * k for k in (1, 2, 3)], abs=1.0
    )
    assert burst["tasks_succeeded"] == size["tasks"]
    assert burst["tasks_failed"] == burst["tasks_lost"] == 0
    assert burst["tries"] > size["tasks"]
    assert burst["first_running_s"] + 3 * size["clear_interval"] < burst["makespan_s"] < size["timeout"]
    assert burst["job_heartbeat_max_gap_s"] < 60
    # The database recorded the scheduler's beats; with every beat, no gap is longer than the samples show.
    assert burst_record["series"]["job_heartbeats_recorded"] > 0
    assert burst["job_heartbeat_max_gap_s"] <= burst["job_heartbeat_max_gap_sampled_s"]
    assert burst_record["series"]["airflow_config"] == {
        "AIRFLOW__CORE__PARALLELISM": str(size["parallelism"]),
        "AIRFLOW__API__WORKERS": "2",
        "AIRFLOW__SCHEDULER__MAX_TIS_PER_QUERY": "0",
        # Every deployment runs on the airflow.cfg Airflow generated, with its defaults.
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "5.0",
    }
