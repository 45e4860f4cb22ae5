"""What a task observes of its process, compared between executors (both Airflow majors use this).

Each task of ``dags_fingerprint/fingerprint_dag.py`` returns an observation of its own process. A run's
tasks are summed up per item (its distinct values); a run under this executor must then equal the run
under the stock LocalExecutor in every item, except the deliberate differences listed in
docs/design.md ("What a task observes"), which :data:`DELIBERATE` names with the reason given there.

The tests are written once, here: a test module imports them and supplies a ``runs`` fixture (the
summary of each of :data:`VARIANT_NAMES`' runs, from :func:`observe_all`).
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from harness.sandbox import AirflowSandbox
from tests.e2e.helpers import poll, preload, preloaded, stop_stock_scheduler

DAG_FILE = Path(__file__).with_name("dags_fingerprint") / "fingerprint_dag.py"
# Six tasks are enough to tell a generator shared between them from one of their own. The DAG file
# is told their number (ALE_FINGERPRINT_TASKS in the deployment's environment); a measurement of more
# changes it here.
DAG_ID, TASK_ID, TASKS = "fingerprint", "look", 6
DRAWS = ("draw.random", "draw.numpy", "draw.module_generator")
# Differs from task to task under any executor.
PER_TASK = ("pid", "dags")
# Deliberate differences (docs/design.md, "What a task observes"): item -> why no task is harmed.
DELIBERATE: dict[str, str] = {
    "modules": "what is imported: a stock task is forked from the scheduler and holds the scheduler's "
    "modules, ours the executor's entry and the fork server's preloads; a module imported before is "
    "the same module, and a preload whose import changes what a task observes is refused",
    "fds": "descriptors: ours holds only its own (its log, its supervisor's sockets and pipes); a stock "
    "task also holds the scheduler's (its database file, its log, its workers' pipes)",
    "threads": "native threads: NumPy's OpenBLAS workers start at a task's first BLAS call instead of at "
    "import (the fork server stops them before forking); the same number then runs",
    "exit hooks": "registered exit hooks: a stock task counts the scheduler's too; none inherited runs at "
    "a task's exit (Airflow 3's task SDK clears them in the task process, Airflow 2 ends it with os._exit)",
    "gc frozen": "a frozen GC generation (Airflow 2): the workload process freezes its objects before it "
    "forks the task, so the task's collector never scans them; the task's own objects are collected "
    "as usual (Airflow 3's stock task has one too)",
}
# Environment variables only this executor sets for a task: its crash-recovery mark, and the
# execution-API client timeout while [workers] execution_api_timeout is Airflow's default.
OURS_ENV = frozenset({"ASYNC_LOCAL_EXECUTOR_INSTANCE", "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT"})
# Handlers a stock task inherits from the scheduler it is forked from (SIGQUIT's stack dump, an ignored
# SIGHUP); ours, like a task any other executor starts in a fresh process, has the defaults.
SCHEDULER_SIGNALS = frozenset({"1", "3"})


# What the DAG file imports at its top; under the defaults, each is preloaded or refused before the run.
LEARNED = frozenset({"pandas", "numpy", "more_itertools"})


def observe(sandbox: AirflowSandbox, *, learns: bool) -> dict[str, Any]:
    """Run the fingerprint DAG once; the run's summary.

    :param learns: the executor learns what to preload: the run waits until it decided on each of
        :data:`LEARNED` (preloaded, under ``"preloaded"`` in the summary, or refused)
    """
    if learns:

        def decided() -> bool:
            refused = {r["module"] for r in preload(sandbox).get("refused", [])}
            return preloaded(sandbox) | refused >= LEARNED

        poll("the DAG file's libraries to be decided on", decided)
    run_id = sandbox.trigger(DAG_ID)
    assert sandbox.wait_for_run(DAG_ID, run_id, timeout=600) == "success"
    observed = [sandbox.xcom(DAG_ID, run_id, TASK_ID, map_index=i) for i in range(TASKS)]
    result = summary(observed)
    result["preloaded"] = sorted(preloaded(sandbox))
    result["refused"] = {r["module"]: r["reason"] for r in preload(sandbox).get("refused", [])}
    return result


def normalised(observation: dict[str, Any]) -> dict[str, Any]:
    """Without what differs by design (each deployment's paths, the test's own options, ``OURS_ENV``)."""
    home = observation["home"]
    out = {k: v for k, v in observation.items() if k != "home"}
    text = json.dumps(out).replace(home, "$AIRFLOW_HOME").replace(observation["dags"], "$DAGS")
    out = dict(json.loads(text))
    out["environment"] = [
        name
        for name in out["environment"]
        if name not in OURS_ENV and not name.startswith("AIRFLOW__ASYNC_LOCAL_EXECUTOR__")
    ]
    out["signals"] = {s: h for s, h in out["signals"].items() if s not in SCHEDULER_SIGNALS}
    # Kinds only (socket, pipe, file: path): numbers depend on what a process opened before.
    kinds = {
        "file: its log" if k.startswith("file:$AIRFLOW_HOME/logs/dag_id=") else k for k in out["fds"].values()
    }
    out["fds"] = sorted(kinds - {"gone"})
    return out


def summary(observations: list[dict[str, Any]]) -> dict[str, Any]:
    """Per item, the sorted distinct values the run's tasks observed (draws: how many were distinct)."""
    assert len(observations) == TASKS, len(observations)
    observations = [normalised(o) for o in observations]
    out: dict[str, Any] = {}
    for key in observations[0]:
        if key in PER_TASK:
            continue
        values = {json.dumps(o[key], sort_keys=True) for o in observations}
        out[key] = len(values) if key in DRAWS else sorted(values)
    return out


def differences(stock: dict[str, Any], ours: dict[str, Any], deliberate: dict[str, str]) -> dict[str, Any]:
    """Items whose values differ between the runs and are no deliberate difference."""
    found = {}
    for key in sorted(set(stock) | set(ours)):
        if key in deliberate or key in ("preloaded", "refused"):
            continue
        if stock.get(key) != ours.get(key):
            found[key] = {"stock": stock.get(key), "ours": ours.get(key)}
    return found


def descriptor_kinds(summary: dict[str, Any]) -> set[str]:
    """Every kind of descriptor any task of the run held."""
    return {kind for value in summary["fds"] for kind in json.loads(value)}


# The runs a test module's ``runs`` fixture makes (:func:`observe_all`), in this order: stock, this
# executor's defaults (the fork server with learned preloading; 5 s between two fork servers instead
# of 60 s, so that its decisions come sooner), and this executor with a fresh interpreter per task.
# Executor, then configuration; each variant's options only add to those before it (the deployment's
# environment keeps them), and the preload interval means nothing to the subprocess launcher.
EXECUTOR = "async_local_executor.AsyncLocalExecutor"
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    # Stock's tasks keep Airflow's 5 s api client timeout, which a busy host (a CI run's three lanes) can
    # exceed, failing the run a fingerprint needs whole; a longer one changes nothing a task observes
    # (the variable is in OURS_ENV, left out of every comparison).
    "stock": ("LocalExecutor", {"AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "30"}),
    "defaults": (EXECUTOR, {"AIRFLOW__ASYNC_LOCAL_EXECUTOR__PRELOAD_INTERVAL": "5"}),
    "subprocess": (EXECUTOR, {"AIRFLOW__ASYNC_LOCAL_EXECUTOR__LAUNCHER": "subprocess"}),
}
# How long a stopped scheduler may take to exit between two runs (it runs no task by then).
STOP_WAIT = 60.0
VARIANT_NAMES = tuple(VARIANTS)
Runs = dict[str, dict[str, Any]]


def observe_all(kind: type[AirflowSandbox], folders: pytest.TempPathFactory) -> Runs:
    """One run of each of :data:`VARIANTS`, in order, on one deployment of ``kind``.

    Between two runs the scheduler is stopped and started again with the next variant's executor and
    options, as an operator switching executors does; the tasks' processes are the scheduler's, so
    each run observes its own executor. One after another, not side by side: under load the stock
    executor's own tasks fail (its task processes time out on the api-server), and a fingerprint must
    compare runs that succeeded.
    """
    dags = folders.mktemp("fingerprint")
    shutil.copy(DAG_FILE, dags / DAG_FILE.name)
    (first, (executor, config)), *rest = VARIANTS.items()
    config = {**config, "ALE_FINGERPRINT_TASKS": str(TASKS)}
    with kind(executor=executor, dags_folder=dags, parallelism=TASKS, extra_config=config) as sandbox:
        sandbox.wait_for_dag(DAG_ID, timeout=300)
        runs = {first: observe(sandbox, learns=False)}
        previous = first
        for name, (executor, config) in rest:
            stop_between_runs(sandbox, previous)
            previous = name
            sandbox.reconfigure({"AIRFLOW__CORE__EXECUTOR": executor, **config})
            sandbox.restart("scheduler")
            sandbox.wait_healthy()
            runs[name] = observe(sandbox, learns=name == "defaults")
    return runs


def stop_between_runs(sandbox: AirflowSandbox, variant: str) -> None:
    """Stop the scheduler of ``variant``'s run (its tasks have all ended): SIGTERM, exit 0; the stock
    one with a bound (:func:`~tests.e2e.helpers.stop_stock_scheduler`)."""
    if variant == "stock":
        stop_stock_scheduler(sandbox)
        return
    assert sandbox.signal_and_wait("scheduler", signal.SIGTERM, STOP_WAIT) == 0


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_every_task_draws_its_own_random_numbers(runs: Runs, variant: str) -> None:
    draws = {key: runs[variant][key] for key in DRAWS}
    assert draws == dict.fromkeys(DRAWS, TASKS)


def test_the_defaults_preloaded_pandas_and_numpy_and_refused_the_shared_generator(runs: Runs) -> None:
    assert {"pandas", "numpy"} <= set(runs["defaults"]["preloaded"])
    assert "random.Random" in runs["defaults"]["refused"]["more_itertools"]


@pytest.mark.parametrize("variant", ["subprocess", "defaults"])
def test_a_task_observes_what_it_observes_under_the_stock_executor(runs: Runs, variant: str) -> None:
    assert differences(runs["stock"], runs[variant], DELIBERATE) == {}


@pytest.mark.parametrize("variant", ["subprocess", "defaults"])
def test_a_task_holds_no_descriptor_a_stock_task_would_not(runs: Runs, variant: str) -> None:
    assert descriptor_kinds(runs[variant]) <= descriptor_kinds(runs["stock"])
