"""The benchmark cases are configured as documented: no Airflow is started here (test_smoke does that)."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from benchmarks import deployment as deployment_module
from benchmarks import report, runner
from benchmarks.deployment import KNOWN_VARIANTS, Variant
from benchmarks.report import markdown_table
from benchmarks.runner import PROFILES, Plan, default_database, select_cases
from benchmarks.scenarios import burst, imports, ordinary, restart, starvation
from benchmarks.scenarios.base import Case, Outcome, RunContext
from benchmarks.summary import summarize, words
from harness.environment import HomeLayout, prepare_home
from harness.sandbox import AirflowSandbox, SandboxError, TaskInstanceRow

TIMEOUT_ENV = "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT"


def test_the_full_burst_is_the_upstream_report_s_scenario() -> None:
    size = burst.SIZES["full"]
    assert (size.tasks, size.sleep, size.parallelism) == (300, 30, 256)
    assert (size.clears, size.clear_interval) == (3, 15)
    assert (size.api_workers, size.max_tis_per_query) == (2, 0)


@pytest.mark.parametrize("profile", PROFILES)
def test_every_burst_size_keeps_the_shape(profile: str) -> None:
    for size in (burst.SIZES[profile], *([burst.LARGER[profile]] if profile in burst.LARGER else [])):
        assert size.tasks > size.parallelism  # a second wave waits for slots
        assert size.sleep >= 2 * size.clear_interval  # every clear finds tasks running
        assert size.clears == 3
        assert (size.api_workers, size.max_tis_per_query) == (2, 0)
        assert size.stall_abort < size.timeout


def test_the_full_profile_bursts_the_report_s_size_and_twice_its_tasks() -> None:
    names = [case.name for case in burst.cases("full")]
    assert names == ["300x30s-p256-3-clears", "600x30s-p256-3-clears"]
    assert [case.name for case in burst.cases("quick")] == ["60x12s-p48-3-clears"]


def test_ordinary_load_is_200_noop_tasks_at_parallelism_32_with_one_api_worker() -> None:
    for profile in ("quick", "full"):
        size = ordinary.SIZES[profile]
        assert (size.tasks, size.parallelism, size.api_workers) == (200, 32, 1)


def test_the_full_imports_cases_are_100_tasks_at_parallelism_16_and_one_held_wave() -> None:
    assert [case.name for case in select_cases("full", ["imports"])] == [
        "pandas-100-tasks-p16",
        "real-imports-100-tasks-p16",
        "pandas-held-16-tasks-p16",
    ]
    assert [case.config["dag_id"] for case in imports.cases("full")] == [
        "bench_import_pandas",
        "bench_real_imports",
        "bench_import_pandas",
    ]
    held = imports.cases("full")[-1].config
    # One wave (as many tasks as slots), running long after stock's tasks have imported pandas.
    assert held["tasks"] == held["parallelism"] == 16
    assert held["hold_s"] >= 20
    assert [(case.config["dag_id"], case.config["hold_s"]) for case in imports.cases("smoke")] == [
        ("bench_import_pandas", 0.0)
    ]


def test_both_imports_dag_files_parse_and_their_task_s_import_is_installed() -> None:
    # The smoke profile runs one of the two DAGs; the other must still parse as its cases expect.
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(imports.DAGS_FOLDER))
    assert bag.import_errors == {}
    assert set(imports.DAG_IDS.values()) <= set(bag.dag_ids)
    assert importlib.util.find_spec("matplotlib") is not None  # bench_real_imports' task imports it


def test_only_the_imports_scenario_parses_dag_files_that_import_pandas() -> None:
    assert imports.DAGS_FOLDER != deployment_module.DAGS_FOLDER
    assert not deployment_module.DAGS_FOLDER.is_relative_to(imports.DAGS_FOLDER)
    assert not imports.DAGS_FOLDER.is_relative_to(deployment_module.DAGS_FOLDER)
    shared = {p.name: p.read_text() for p in deployment_module.DAGS_FOLDER.rglob("*.py")}
    assert shared
    assert not [name for name, text in shared.items() if "import pandas" in text]
    own = {p.name: p.read_text() for p in imports.DAGS_FOLDER.glob("*.py")}
    assert sorted(own) == ["bench_import_pandas.py", "bench_real_imports.py"]
    assert all("\nimport pandas" in text for text in own.values())


def test_burst_defaults_to_postgres_and_the_other_scenarios_keep_theirs() -> None:
    cases = select_cases(
        "smoke", ["throughput", "footprint", "burst", "dispatch", "ordinary", "imports", "starvation"]
    )
    plan = Plan("smoke", cases, [KNOWN_VARIANTS["stock"]], 1)
    chosen = {case.scenario: plan.database_for(case) for case in cases}
    fallback = default_database()
    assert chosen == {
        "throughput": fallback,
        "footprint": fallback,
        "burst": "postgres",
        "dispatch": fallback,
        "ordinary": fallback,
        "imports": fallback,
        "starvation": fallback,
    }
    override = Plan("smoke", cases, [KNOWN_VARIANTS["stock"]], 1, "sqlite")
    assert {override.database_for(case) for case in cases} == {"sqlite"}


def test_runs_two_at_a_time_go_side_by_side_and_come_back_in_the_plan_s_order(tmp_path: Path) -> None:
    # Each case's run waits for its other variant's to have started: only runs side by side both end.
    started = {name: {label: threading.Event() for label in ("stock", "ours")} for name in ("a", "b")}

    def run(name: str, ctx: RunContext) -> Outcome:
        started[name][ctx.variant.label].set()
        other = "ours" if ctx.variant.label == "stock" else "stock"
        assert started[name][other].wait(10), "the other variant's run never started beside this one"
        return Outcome({"makespan_s": 1.0 if ctx.variant.label == "stock" else 2.0})

    cases = [Case("throughput", name, {}, functools.partial(run, name), "sqlite") for name in ("a", "b")]
    variants = [KNOWN_VARIANTS["stock"], KNOWN_VARIANTS["ours"]]
    events: list[str] = []

    class Recorder(runner.Listener):
        def run_started(self, index: int, total: int, case: Case, rep: int, variant: Variant) -> None:
            events.append(f"start {case.name} {variant.label}")

        def run_finished(self, record: dict[str, Any]) -> None:
            events.append(f"end {record['case']} {record['variant']}")

    out = tmp_path / "results.jsonl"
    records = runner.run_plan(Plan("smoke", cases, variants, 1, jobs=2), out, Recorder())
    order = [("a", "stock"), ("a", "ours"), ("b", "stock"), ("b", "ours")]
    assert [(r["case"], r["variant"]) for r in records] == order
    assert {r["status"] for r in records} == {"ok"}
    assert {r["jobs"] for r in records} == {2}
    assert sorted((r["case"], r["variant"]) for r in runner.load_records(out)) == sorted(order)
    assert sorted(events) == sorted(f"{what} {c} {v}" for what in ("start", "end") for c, v in order)


def test_the_sandbox_leaves_airflow_cfg_to_airflow_and_the_client_timeout_to_it(tmp_path: Path) -> None:
    default = AirflowSandbox(home=tmp_path / "a", progress=None)
    assert default.airflow_cfg == "generated"
    # Not in the environment: the value Airflow writes into its airflow.cfg (5.0) is what applies.
    assert TIMEOUT_ENV not in default.env
    # An operator's choice is an explicit variant.
    chosen = AirflowSandbox(home=tmp_path / "c", progress=None, execution_api_timeout=7.5)
    assert chosen.env[TIMEOUT_ENV] == "7.5"
    with pytest.raises(ValueError, match="execution_api_timeout"):
        AirflowSandbox(home=tmp_path / "d", progress=None, execution_api_timeout=0)
    with pytest.raises(ValueError, match="airflow_cfg must be one of generated, empty"):
        AirflowSandbox(home=tmp_path / "e", progress=None, airflow_cfg="blank")


@pytest.mark.parametrize(("kind", "written"), [("generated", False), ("empty", True)])
def test_a_home_gets_an_airflow_cfg_beforehand_only_when_asked_for_an_empty_one(
    tmp_path: Path, kind: str, written: bool
) -> None:
    layout = HomeLayout(tmp_path / "home")
    prepare_home(layout, {}, tmp_path / "callbacks", kind)
    cfg = layout.root / "airflow.cfg"
    # No file: Airflow's first command writes its own, as on a deployment's first start.
    assert cfg.exists() is written
    if written:
        assert cfg.read_text() == ""
        assert cfg.stat().st_mode & 0o777 == 0o600


def test_a_deployment_hands_the_case_s_config_to_the_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    class Recorder:
        def __init__(self, **kwargs: Any) -> None:
            seen.update(kwargs)

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(deployment_module, "AirflowSandbox", Recorder)
    monkeypatch.setattr(deployment_module, "Airflow2Sandbox", Recorder)
    with deployment_module.deployment(
        KNOWN_VARIANTS["stock"],
        parallelism=32,
        database="sqlite",
        dag_env={"ALE_BENCH_TASKS": "3"},
        progress=None,
        airflow_env={"AIRFLOW__API__WORKERS": "2"},
        airflow_cfg="empty",
    ):
        pass
    assert seen["airflow_cfg"] == "empty"
    assert seen["extra_config"]["AIRFLOW__API__WORKERS"] == "2"
    assert seen["extra_config"]["ALE_BENCH_TASKS"] == "3"
    assert seen["dags_folder"] == deployment_module.DAGS_FOLDER


def _record(variant: str, rep: int, state: str, succeeded: float) -> dict[str, Any]:
    return {
        "scenario": "burst",
        "case": "c",
        "variant": variant,
        "repetition": rep,
        "status": "ok" if state == "success" else "stalled",
        "metrics": {"tasks_succeeded": succeeded},
        "text": {"run_state": state},
    }


def test_the_run_state_is_shown_side_by_side_with_the_numbers() -> None:
    records = [
        _record("stock", 0, "running", 100.0),
        _record("ours", 0, "success", 300.0),
        _record("stock", 1, "running", 120.0),
        _record("ours", 1, "success", 300.0),
    ]
    summary = summarize(records)
    state, succeeded = summary.rows
    assert (state.name, state.text) == ("run_state", {"stock": "running", "ours": "success"})
    assert succeeded.medians == {"stock": 110.0, "ours": 300.0}
    table = markdown_table(summary)
    assert "| burst / `c` | `run_state` |  | running | success |  |" in table


def test_words_over_repetitions() -> None:
    assert words(["success", "success"]) == "success"
    assert words(["running", "success", "running"]) == "2x running, 1x success"
    assert words([]) == "-"


class _Exits:
    """Stands in for a deployment whose scheduler crashed (a real crash takes minutes of load)."""

    def check_processes(self) -> None:
        raise SandboxError(
            "scheduler exited with code 1; log tail:\n  File x\n"
            "sqlalchemy.orm.exc.StaleDataError: UPDATE statement on table 'task_instance' expected to "
            "update 1 row(s); 0 were matched.\n[info] Shutting down"
        )


def test_a_crashed_scheduler_is_a_result_of_the_burst_not_a_harness_error() -> None:
    reason = burst._exited(_Exits())  # type: ignore[arg-type]
    assert reason == (
        "scheduler exited: sqlalchemy.orm.exc.StaleDataError: UPDATE statement on table 'task_instance' "
        "expected to update 1 row(s); 0 were matched."
    )


def test_the_task_process_uss_is_read_from_every_task_log_that_says_it(tmp_path: Path) -> None:
    # As Airflow 3 writes a task's print (a JSON event) and as Airflow 2 does (a plain line).
    logs = tmp_path / "dag_id=bench_import_pandas"
    first = logs / "run_id=r" / "task_id=noop" / "map_index=0" / "attempt=1.log"
    second = logs / "run_id=r" / "task_id=noop" / "map_index=1" / "attempt=1.log"
    silent = logs / "run_id=r" / "task_id=noop" / "map_index=2" / "attempt=1.log"
    for path in (first, second, silent):
        path.parent.mkdir(parents=True)
    first.write_text('{"event": "ale-bench-task-uss-kib=20480", "chan": "stdout"}\n')
    second.write_text("[2026-12-02] {logging_mixin.py:190} INFO - ale-bench-task-uss-kib=10240\n")
    silent.write_text('{"event": "Task failed"}\n')
    assert imports.task_process_uss_mb([first, second, silent]) == [20.0, 10.0]
    assert imports.task_process_uss_mb([tmp_path / "none" / "attempt=1.log"]) == []


def test_every_imports_dag_task_prints_the_line_the_benchmark_reads() -> None:
    for path in imports.DAGS_FOLDER.glob("*.py"):
        assert f'print(f"{imports.USS_MARKER}{{kib}}")' in path.read_text(), path.name


def test_an_imports_case_is_labelled_on_two_short_lines_under_its_bars() -> None:
    labels = [report._case_label(case.name) for case in imports.cases("full")]
    assert labels == ["pandas\n100 tasks p16", "real-imports\n100 tasks p16", "pandas-held\n16 tasks p16"]
    assert report._case_label("no-size") == "no-size"


def test_the_starvation_crowd_is_more_than_24_per_core_on_2_cores_and_all_of_it_runs_at_once() -> None:
    assert [case.name for case in select_cases("full", ["starvation"])] == ["crowd-100x30s-cpu-60s-p128"]
    for profile in ("quick", "full"):
        size = starvation.SIZES[profile]
        assert (size.crowd, size.crowd_sleep, size.cpu_seconds, size.parallelism) == (100, 30, 60, 128)
        assert size.crowd > starvation.CROWD_PER_CORE * 2
        # The whole crowd and long_cpu at once; cpu_a and cpu_b come after the crowd.
        assert size.parallelism >= size.crowd + 1
        assert size.tasks == size.crowd + 3
        # long_cpu can wait for cpu_a and cpu_b when starved: three times its CPU work, and the crowd.
        assert size.timeout > size.crowd_sleep + 3 * size.cpu_seconds + 300
    assert starvation.SIZES["smoke"].crowd < starvation.SIZES["quick"].crowd


def _starvation_dag(monkeypatch: pytest.MonkeyPatch) -> Any:
    # The file reads its sizes at import: a module of its own, under the quick size's crowd.
    monkeypatch.setenv("ALE_BENCH_CROWD", str(starvation.SIZES["quick"].crowd))
    path = deployment_module.DAGS_FOLDER / "bench_starvation.py"
    spec = importlib.util.spec_from_file_location("bench_starvation_under_test", path)
    assert spec is not None
    assert spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.bench_starvation()


def test_the_starvation_dag_queues_the_crowd_first_and_long_cpu_last(monkeypatch: pytest.MonkeyPatch) -> None:
    dag = _starvation_dag(monkeypatch)
    assert dag.dag_id == starvation.DAG_ID
    # [core] max_active_tasks_per_dag is 16 by default: the DAG lifts it above the crowd.
    assert dag.max_active_tasks > starvation.SIZES["quick"].crowd
    crowd, long_cpu = dag.get_task("crowd"), dag.get_task("long_cpu")
    assert crowd.priority_weight > long_cpu.priority_weight
    assert {str(crowd.weight_rule), str(long_cpu.weight_rule)} == {"absolute"}
    assert long_cpu.upstream_task_ids == set()
    for task_id in starvation.CPU_TASKS:
        assert dag.get_task(task_id).upstream_task_ids == {"crowd"}
    assert all(task.retries == 0 for task in dag.tasks)


T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _row(task_id: str, start: float, end: float, map_index: int = -1) -> TaskInstanceRow:
    return TaskInstanceRow(
        task_id=task_id,
        map_index=map_index,
        state="success",
        try_number=1,
        start_date=T0 + timedelta(seconds=start),
        end_date=T0 + timedelta(seconds=end),
        queued_dttm=T0,
        duration=end - start,
    )


def test_the_starvation_figures_come_from_the_task_instances_start_and_end() -> None:
    rows = [
        _row("crowd", 0, 30, 0),
        _row("crowd", 1, 31, 1),
        # Ends as long_cpu starts: not running then.
        _row("crowd", 2, 5, 2),
        # Starts as long_cpu starts: running then.
        _row("crowd", 5, 33, 3),
        _row("long_cpu", 5, 125),
        _row("cpu_a", 34, 96),
        _row("cpu_b", 34, 100),
    ]
    figures = starvation.timeline_figures(rows, cpu_seconds=60)
    assert figures == {
        "long_cpu_wall_s": 120.0,
        "cpu_tasks_wall_s": 64.0,
        "long_cpu_stretch": 2.0,
        "crowd_running_at_long_cpu_start": 3.0,
        # Spans that touch do not overlap: 0..30, 1..31 and 5..33 at once, 2..5 ended.
        "crowd_peak_running": 3.0,
    }
    assert starvation.timeline(rows) == {
        "crowd": [[0.0, 30.0], [1.0, 31.0], [2.0, 5.0], [5.0, 33.0]],
        "long_cpu": [5.0, 125.0],
        "cpu_a": [34.0, 96.0],
        "cpu_b": [34.0, 100.0],
    }


def test_a_task_that_never_ran_leaves_its_starvation_figures_empty() -> None:
    rows = [
        _row("crowd", 0, 30, 0),
        TaskInstanceRow("long_cpu", -1, "upstream_failed", 0, None, None, None, None),
    ]
    figures = starvation.timeline_figures(rows, cpu_seconds=60)
    assert figures["long_cpu_wall_s"] is figures["long_cpu_stretch"] is None
    assert figures["crowd_running_at_long_cpu_start"] is figures["cpu_tasks_wall_s"] is None
    assert figures["crowd_peak_running"] == 1.0
    assert "long_cpu" not in starvation.timeline(rows)


def _starvation_record(variant: str, rep: int, long_wall: float) -> dict[str, Any]:
    return {
        "scenario": "starvation",
        "case": "c",
        "variant": variant,
        "repetition": rep,
        "metrics": {"long_cpu_wall_s": long_wall, "long_cpu_stretch": long_wall / 60},
        "series": {
            "timeline": {
                "crowd": [[0.0, 30.0], [1.0, 31.0]],
                "long_cpu": [1.0, 1.0 + long_wall],
                "cpu_a": [32.0, 95.0],
                "cpu_b": [32.0, 96.0],
            }
        },
    }


# The other charts have no data in these records, and say so when they draw their legends.
@pytest.mark.filterwarnings("ignore:No artists with labels found:UserWarning")
def test_the_starvation_chart_draws_each_variant_s_median_run(tmp_path: Path) -> None:
    records = [
        _starvation_record("stock", 0, 80.0),
        _starvation_record("ours", 0, 200.0),
        _starvation_record("stock", 1, 90.0),
        _starvation_record("ours", 1, 150.0),
        _starvation_record("stock", 2, 70.0),
        _starvation_record("ours", 2, 170.0),
    ]
    assert report.median_run(records, "starvation", "stock", "long_cpu_wall_s") == records[0]
    assert report.median_run(records, "starvation", "ours", "long_cpu_wall_s") == records[5]
    # An even count: the lower of the two middle runs.
    assert report.median_run(records[:4], "starvation", "ours", "long_cpu_wall_s") == records[3]
    assert report.median_run(records, "starvation", "other", "long_cpu_wall_s") is None
    written = report.write_charts(records, ["stock", "ours"], tmp_path)
    assert tmp_path / report.STARVATION_CHART in written
    assert (tmp_path / report.STARVATION_CHART).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_the_restart_cases_are_24_tasks_of_90_s_at_parallelism_32_on_postgres_full_profile_only() -> None:
    cases = select_cases("full", ["restart"])
    assert [case.name for case in cases] == ["24x90s-p32-sigterm", "24x90s-p32-kill9"]
    for case, signal_name in zip(cases, ("sigterm", "kill9"), strict=True):
        config = case.config
        assert (config["tasks"], config["sleep"], config["parallelism"]) == (24, 90, 32)
        assert config["signal"] == signal_name
        # 20 s after the first start: every task is mid-sleep when the scheduler stops.
        assert config["signal_after"] == 20 < config["sleep"]
        # Long enough for a task instance a dead scheduler left running (Airflow's 300 s timeouts).
        assert config["timeout"] > 300 + config["sleep"]
        assert case.database == "postgres"
        assert Plan("full", cases, [KNOWN_VARIANTS["stock"]], 1).database_for(case) == "postgres"
    assert restart.SIGNALS == {"sigterm": 15, "kill9": 9}
    # Four deployments of minutes each: not in the smoke suite, nor in `make bench`.
    assert select_cases("smoke", ["restart"]) == select_cases("quick", ["restart"]) == []


def _restart_dag(monkeypatch: pytest.MonkeyPatch, executions: Path) -> ModuleType:
    monkeypatch.setenv("ALE_BENCH_RESTART_TASKS", "24")
    monkeypatch.setenv("ALE_BENCH_EXECUTIONS_DIR", str(executions))
    path = deployment_module.DAGS_FOLDER / "bench_restart.py"
    spec = importlib.util.spec_from_file_location("bench_restart_under_test", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_restart_dag_parses_with_no_retries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(deployment_module.DAGS_FOLDER / "bench_restart.py"))
    assert bag.import_errors == {}
    assert restart.DAG_ID in bag.dag_ids
    dag = _restart_dag(monkeypatch, tmp_path).bench_restart()
    assert dag.dag_id == restart.DAG_ID
    assert [task.task_id for task in dag.tasks] == ["sleep"]
    assert all(task.retries == 0 for task in dag.tasks)
    # [core] max_active_tasks_per_dag is the deployment's parallelism: every task runs at once.
    assert restart.SIZES["full"].parallelism >= restart.SIZES["full"].tasks


def test_what_a_restart_task_records_is_what_the_benchmark_reads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    module = _restart_dag(monkeypatch, tmp_path)
    ti = SimpleNamespace(dag_id="bench_restart", run_id="r", task_id="sleep", map_index=3, try_number=2)
    module.sleep_and_record(ti, 0.0, str(tmp_path))
    log = restart.ExecutionLog(tmp_path)
    log.poll()
    [execution] = log.executions.values()
    assert (execution.map_index, execution.try_number) == (3, 2)
    assert execution.pid == os.getpid()
    assert execution.start_ticks == module.start_ticks(os.getpid())
    assert execution.end is not None
    assert execution.start <= execution.end
    assert not execution.running
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def _execution_file(
    directory: Path, index: int, try_number: int, pid: int, start: float, end: float | None
) -> None:
    data = {
        "map_index": index,
        "try_number": try_number,
        "pid": pid,
        "start_ticks": 1,
        "start": start,
        "end": end,
    }
    (directory / f"{index}-{try_number}-{pid}.json").write_text(json.dumps(data))


def test_executions_killed_part_way_and_two_at_once_are_found_from_the_files(tmp_path: Path) -> None:
    alive = {101: False, 102: True, 103: True}
    log = restart.ExecutionLog(tmp_path, alive=lambda pid, ticks: alive.get(pid, False))
    _execution_file(tmp_path, 0, 1, 100, start=0.0, end=90.0)  # ran to its end
    _execution_file(tmp_path, 1, 1, 101, start=0.0, end=None)  # killed part-way: gone at the first poll
    _execution_file(tmp_path, 2, 1, 102, start=0.0, end=None)  # an orphan that runs on...
    log.poll(now=50.0)
    _execution_file(tmp_path, 2, 2, 103, start=40.0, end=None)  # ...while its task instance runs again
    log.poll(now=60.0)
    alive[102] = False
    log.poll(now=70.0)
    by_pid = {e.pid: e for e in log.executions.values()}
    assert by_pid[101].gone == 50.0
    assert by_pid[102].gone == 70.0
    assert by_pid[103].running
    assert by_pid[103].seen == 70.0
    assert restart.overlaps(log.executions.values()) == {2: 30.0}  # 40 s to 70 s
    assert restart.execution_figures(list(log.executions.values())) == {
        "executions": 4.0,
        "executions_killed": 3.0,
        "tasks_ran_twice_at_once": 1.0,
        "ran_twice_overlap_max_s": 30.0,
    }
    assert restart.timeline(log.executions.values(), origin=0.0) == [
        [0, 1, 0.0, 90.0, True],
        [1, 1, 0.0, 50.0, False],
        [2, 1, 0.0, 70.0, False],
        [2, 2, 40.0, 70.0, False],
    ]


def test_one_execution_after_another_is_not_twice_at_once() -> None:
    first = restart.Execution(0, 1, 100, None, start=0.0, gone=30.0)
    second = restart.Execution(0, 2, 101, None, start=30.0, end=120.0)
    assert restart.overlaps([first, second]) == {}


def _restart_record(variant: str, case: str) -> dict[str, Any]:
    return {
        "scenario": "restart",
        "case": case,
        "variant": variant,
        "repetition": 0,
        "metrics": {"makespan_s": 150.0, "old_scheduler_exit_s": 60.0, "tasks_succeeded": 24.0},
        "text": {"run_state": "success"},
        "series": {
            "timeline": [[0, 1, 0.0, 80.0, False], [0, 2, 85.0, 175.0, True], [1, 1, 0.5, 90.5, True]],
            "events": {"signal": 20.0, "exit": 80.0, "restart": 80.5, "run_end": 176.0},
        },
    }


@pytest.mark.filterwarnings("ignore:No artists with labels found:UserWarning")
def test_the_restart_chart_draws_every_case_and_variant(tmp_path: Path) -> None:
    records = [_restart_record(v, f"24x90s-p32-{s}") for s in ("sigterm", "kill9") for v in ("stock", "ours")]
    written = report.write_charts(records, ["stock", "ours"], tmp_path)
    assert tmp_path / report.RESTART_CHART in written
    assert (tmp_path / report.RESTART_CHART).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_the_control_cases_are_full_profile_postgres_and_their_dag_parses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    from benchmarks.scenarios import control

    cases = select_cases("full", ["control"])
    assert [case.name for case in cases] == [
        "pause-40-held300s-qt120",
        "drain-16x60s-deadline30s-handover",
        "drain-16x60s-deadline30s-terminate",
        "drain-16x60s-deadline120s-handover",
        "resize-40x30s-4-16-2",
    ]
    assert {case.database for case in cases} == {"postgres"}
    # Held past task_queued_timeout, and the drain's short deadline inside its tasks' sleep.
    assert cases[0].config["hold"] > cases[0].config["queued_timeout"]
    assert cases[1].config["deadline"] < cases[1].config["sleep"] < cases[3].config["deadline"]
    assert select_cases("smoke", ["control"]) == select_cases("quick", ["control"]) == []
    monkeypatch.setenv("ALE_BENCH_CONTROL_TASKS", "7")
    bag = DagBag(dag_folder=str(deployment_module.DAGS_FOLDER / "bench_restart.py"))
    assert bag.import_errors == {}
    assert control.DAG_ID in bag.dag_ids
    dag = _restart_dag(monkeypatch, tmp_path).bench_control()
    assert [task.task_id for task in dag.tasks] == ["sleep"]
    assert all(task.retries == 0 for task in dag.tasks)
