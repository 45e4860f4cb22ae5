"""Tasks on two executors, depending on each other: the default one (ours) and CeleryExecutor.

Every task returns who ran it: its pid, its ancestors' pids and command lines (those of the sandbox's
deployment), and the ASYNC_LOCAL_EXECUTOR_INSTANCE mark our executor puts on every process it launches.
"""

from __future__ import annotations

import os
from typing import Any

import psutil
from airflow.sdk import dag, task

CELERY = "CeleryExecutor"
# The default executor named explicitly, as a task would to pin itself to one host.
OURS = "async_local_executor.AsyncLocalExecutor"


def _deployment_ancestors(me: psutil.Process) -> list[dict[str, Any]]:
    # Up to the first ancestor outside the deployment (the test runner): an environment without the
    # sandbox's marker. A process that set its title (setproctitle) has its /proc environ overwritten
    # by it; that one has no PATH there, and belongs to the deployment.
    marker = os.environ.get("AIRFLOW_SANDBOX_ID")
    found = []
    for parent in me.parents():
        try:
            env = parent.environ()
        except psutil.Error:
            env = {}
        if "PATH" in env and env.get("AIRFLOW_SANDBOX_ID") != marker:
            break
        found.append({"pid": parent.pid, "cmdline": " ".join(parent.cmdline()).strip()})
    return found


def _who_ran_me(*upstream: Any) -> dict[str, Any]:
    me = psutil.Process()
    return {
        "pid": me.pid,
        "ancestors": _deployment_ancestors(me),
        "instance": os.environ.get("ASYNC_LOCAL_EXECUTOR_INSTANCE"),
        "upstream_pids": [u["pid"] for u in upstream],
    }


@dag(dag_id="hybrid_celery", schedule=None, catchup=False, tags=["e2e"])
def hybrid_celery() -> None:
    @task
    def local_first() -> dict[str, Any]:
        return _who_ran_me()

    @task(executor=CELERY)
    def celery_a(first: Any) -> dict[str, Any]:  # Any: it is called with an XComArg
        return _who_ran_me(first)

    @task(executor=CELERY)
    def celery_b(first: Any) -> dict[str, Any]:
        return _who_ran_me(first)

    @task(executor=OURS)
    def local_join(a: Any, b: Any) -> dict[str, Any]:
        return _who_ran_me(a, b)

    @task(executor=CELERY)
    def celery_last(joined: Any) -> dict[str, Any]:
        return _who_ran_me(joined)

    @task
    def local_side() -> dict[str, Any]:
        return _who_ran_me()

    first = local_first()
    celery_last(local_join(celery_a(first), celery_b(first)))
    local_side()


hybrid_celery()
