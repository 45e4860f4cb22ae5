"""The plugin's API on a real api-server: who may read what, the documents' shape, and the verdict as it
changes (healthy with a running executor, unhealthy while the fork server is down, unknown once the
scheduler is gone).

Nothing is mocked: a real Airflow on SQLite whose simple auth manager asks for a login, the default
fork-server launcher, the switch DAG's tasks held at a gate the test opens. To hold the executor in
"fork server down" for as long as the test looks, the helper is killed and its replacement is
SIGSTOPped before it can finish importing the task SDK, so the new one stays "starting".
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness.sandbox import AirflowSandbox
from tests.e2e.helpers import SWITCH_TASKS, cmdline, get, health, open_the_gate, poll

USERS = {"admin": "admin", "viewer": "viewer"}
pytestmark = [pytest.mark.e2e, pytest.mark.sandbox(users=USERS)]
INSTANCE_KEYS = {
    "hostname",
    "instance",
    "verdict",
    "reasons",
    "reason_codes",
    "updated_at",
    "age_s",
    "control",
    "control_note",
    "warnings",
}


def executor(sandbox: AirflowSandbox, token: str) -> dict[str, Any]:
    """The one executor in the authenticated status."""
    code, body = get(sandbox, "/async-local-executor/status", token)
    assert code == 200
    [only] = body["executors"]
    assert isinstance(only, dict)
    return only


def helpers_of(scheduler: int) -> list[int]:
    return [
        p.pid for p in psutil.Process(scheduler).children() if "forkserver.helper" in " ".join(cmdline(p.pid))
    ]


def test_health_and_status_on_a_real_api_server(sandbox: AirflowSandbox, tmp_path: Path) -> None:
    viewer = sandbox.token("viewer")
    scheduler = sandbox.pids["scheduler"]

    # Healthy while the scheduler runs this executor, in the shape of Airflow's own health entries.
    poll("a healthy executor", lambda: health(sandbox)["status"] == "healthy")
    [instance] = health(sandbox)["instances"]
    assert set(instance) == INSTANCE_KEYS
    assert (instance["verdict"], instance["reasons"]) == ("healthy", [])

    # Airflow lists the plugin, with its nav entry and its dashboard card, and no import error of ours.
    code, plugins = get(sandbox, "/api/v2/plugins", viewer)
    assert code == 200
    [plugin] = [p for p in plugins["plugins"] if p["name"] == "async_local_executor"]
    assert [v["name"] for v in plugin["external_views"]] == ["Executor"]
    assert [a["destination"] for a in plugin["react_apps"]] == ["dashboard"]
    assert [a["url_prefix"] for a in plugin["fastapi_apps"]] == ["/async-local-executor"]
    code, errors = get(sandbox, "/api/v2/plugins/importErrors", viewer)
    assert code == 200
    assert not [e for e in errors["import_errors"] if "async_local_executor" in e["source"]]

    # The status is for an authenticated user only.
    assert get(sandbox, "/async-local-executor/status")[0] == 401
    assert get(sandbox, "/async-local-executor/status", "not-a-token")[0] == 403
    status = executor(sandbox, viewer)
    assert (status["pid"], status["parallelism"], status["verdict"]) == (scheduler, SWITCH_TASKS, "healthy")
    poll(
        "the fork server ready",
        lambda: executor(sandbox, viewer)["launcher_state"].startswith("fork server running (pid "),
    )

    # While tasks run: each with its task, try and pid; the public document names none of them.
    run_id = sandbox.trigger("switch")
    poll("the tasks at the gate", lambda: len(list(tmp_path.glob("started.*"))) == SWITCH_TASKS)
    poll(
        "the running tasks in the status",
        lambda: len(executor(sandbox, viewer)["running"]) == SWITCH_TASKS,
    )
    status = executor(sandbox, viewer)
    rows = status["running"]
    assert sorted((r["task"], r["try"]) for r in rows) == [
        (f"switch.hold[{i}]", 1) for i in range(SWITCH_TASKS)
    ]
    assert all(psutil.pid_exists(r["pid"]) for r in rows)
    public = health(sandbox)
    assert "switch.hold" not in json.dumps(public)
    assert [set(i) for i in public["instances"]] == [INSTANCE_KEYS]  # no field for a pid or a task

    # Unhealthy while the fork server is down; healthy again once a new one serves.
    [first] = helpers_of(scheduler)
    psutil.Process(first).kill()
    poll("a new fork server process", lambda: helpers_of(scheduler) not in ([], [first]), guard=60)
    [second] = helpers_of(scheduler)
    os.kill(second, signal.SIGSTOP)
    try:
        poll("an unhealthy verdict", lambda: health(sandbox)["status"] == "unhealthy", guard=60)
        [instance] = health(sandbox)["instances"]
        assert (instance["reason_codes"], instance["reasons"]) == (
            ["launcher_degraded"],
            ["the launch path is degraded"],
        )
        status = executor(sandbox, viewer)
        assert status["reasons"] == [f"fork server (pid {first}) is not running; a new one is starting"]
    finally:
        os.kill(second, signal.SIGCONT)
    poll("a healthy verdict again", lambda: health(sandbox)["status"] == "healthy", guard=120)

    # The finished tasks are listed, the latest first.
    tries, _ = open_the_gate(sandbox, tmp_path, run_id)
    assert tries == [("success", 1)] * SWITCH_TASKS
    poll(
        "the finished tasks in the status",
        lambda: len(executor(sandbox, viewer)["recent_finished"]) == SWITCH_TASKS,
    )
    status = executor(sandbox, viewer)
    assert {(f["outcome"], f["returncode"]) for f in status["recent_finished"]} == {("ok", 0)}
    assert sum(sample[1] for sample in status["history"]) > 0  # the chart saw them run

    # The scheduler killed: its file stays, and is reported as a stopped scheduler's, never as running.
    sandbox.kill("scheduler")
    poll("an unknown verdict", lambda: health(sandbox)["status"] == "unknown", guard=60)
    [instance] = health(sandbox)["instances"]
    assert instance["reasons"] == ["its scheduler is not running"]
    status = executor(sandbox, viewer)
    assert status["gone"]
    assert status["verdict"] == "unknown"
