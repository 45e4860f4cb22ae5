"""Tasks whose own code decides how they end, for the restart chaos test (tests/e2e/test_restart_chaos.py).

One run holds the tasks a chaos sequence planned (``tests/e2e/chaos.py``), passed in the run's conf: the
``plan_<group>`` tasks hand each group its specs, and each mapped task runs its spec's seconds, then ends as the
spec says (success, or a deliberate failure). No retries: a second execution of a task instance is never
a retry of Airflow's, always something to explain.

- ``plain``: no limit; runs ``seconds``, then succeeds or raises.
- ``limited``: the executor's run-time limit (``executor_config`` ``task_timeout`` = ``ALE_CHAOS_LIMIT``),
  which counts from the launch of the task's workload; its ``seconds`` count from that launch too, so a
  spec ends just inside the limit or runs past it whatever its start cost.
- ``timed``: Airflow's own ``execution_timeout`` = ``ALE_CHAOS_LIMIT``, which the task process enforces on
  itself from its start; its ``seconds`` count from its own start.

Every execution appends one JSON line when its code starts (its try, its pid and its workload's, how long
after its workload's launch) and one when it reaches its end, to ``<ALE_CHAOS_DIR>/<run_id>/<task>.<map
index>``; an execution killed part-way leaves no end line.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import dag, get_current_context, task

LIMIT = float(os.environ.get("ALE_CHAOS_LIMIT", "30"))
GROUPS = ("plain", "limited", "timed")


def _ticks(pid: int) -> int:
    """When process ``pid`` started, in clock ticks since boot (field 22 of its stat)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _since_launch() -> float:
    """Seconds since this task's workload process (its parent) started, on the boot clock."""
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - _ticks(os.getppid()) / os.sysconf("SC_CLK_TCK")


def _record(event: str, **fields: Any) -> None:
    ti = get_current_context()["ti"]
    folder = Path(os.environ["ALE_CHAOS_DIR"]) / ti.run_id
    folder.mkdir(parents=True, exist_ok=True)
    line = {"event": event, "try": ti.try_number, "pid": os.getpid(), "t": time.time(), **fields}
    # One write of one short line with O_APPEND: lines of two executions never mix.
    fd = os.open(folder / f"{ti.task_id}.{ti.map_index}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def _execute(spec: dict[str, Any], *, from_launch: bool) -> None:
    since = _since_launch()
    pid, ppid = os.getpid(), os.getppid()
    _record("start", ticks=_ticks(pid), ppid=ppid, pticks=_ticks(ppid), since_launch=since)
    # The task's own work: it lasts what its spec says, however the scheduler fares meanwhile.
    time.sleep(max(0.0, float(spec["seconds"]) - (since if from_launch else 0.0)))
    _record("end")
    if spec["fail"]:
        raise RuntimeError("this task fails on purpose: its chaos plan says so")


@dag(dag_id="chaos", schedule=None, catchup=False, max_active_runs=1, tags=["e2e"])
def chaos() -> None:
    @task(retries=0)
    def plan(group: str) -> list[dict[str, Any]]:
        _record("start", ticks=_ticks(os.getpid()), ppid=os.getppid(), pticks=_ticks(os.getppid()))
        conf = get_current_context()["dag_run"].conf or {}
        _record("end")
        return list(conf.get(group, []))

    @task(retries=0, do_xcom_push=False)
    def plain(spec: dict[str, Any]) -> None:
        _execute(spec, from_launch=False)

    @task(
        retries=0,
        do_xcom_push=False,
        executor_config={"async_local_executor": {"task_timeout": LIMIT}},
    )
    def limited(spec: dict[str, Any]) -> None:
        _execute(spec, from_launch=True)

    @task(retries=0, do_xcom_push=False, execution_timeout=timedelta(seconds=LIMIT))
    def timed(spec: dict[str, Any]) -> None:
        _execute(spec, from_launch=False)

    plain.expand(spec=plan.override(task_id="plan_plain")("plain"))
    limited.expand(spec=plan.override(task_id="plan_limited")("limited"))
    timed.expand(spec=plan.override(task_id="plan_timed")("timed"))


chaos()
