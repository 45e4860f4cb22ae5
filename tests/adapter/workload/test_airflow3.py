"""The Airflow 3 workload entry point, on the paths that need no api-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from async_local_executor.adapter.workload import airflow3, entry


def run_child(stdin: bytes, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "async_local_executor.adapter.workload.airflow3", *args],
        input=stdin.decode(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_bad_json_exits_with_bad_input_and_says_why() -> None:
    result = run_child(b"{not json", "--parent-pid", str(os.getpid()))
    assert result.returncode == entry.EXIT_BAD_INPUT
    assert "invalid workload on stdin" in result.stderr


def test_unknown_workload_type_is_bad_input() -> None:
    payload = json.dumps({"server": "http://127.0.0.1:1/execution/", "workload": {"type": "Nope"}})
    result = run_child(payload.encode(), "--parent-pid", str(os.getpid()))
    assert result.returncode == entry.EXIT_BAD_INPUT


def test_a_child_whose_parent_is_gone_exits_at_once() -> None:
    result = run_child(b"", "--parent-pid", "1")
    assert result.returncode == entry.EXIT_ORPHANED


def test_payload_round_trips_the_workload() -> None:
    from tests.adapter import workloads

    workload = workloads.task("ok")
    data = json.loads(airflow3.encode_payload(workload.model_dump_json(), "http://srv/execution/", "title"))
    assert data["server"] == "http://srv/execution/"
    assert data["workload"]["token"] == workloads.TOKEN
    assert data["workload"]["ti"]["task_id"] == "ok"


PRELOAD_PROBE = """
import json, sys
from async_local_executor.adapter.workload import airflow3
before = set(sys.modules)
airflow3.preload()
from airflow.sdk.api import client
from airflow.utils import net
import socket
from airflow.sdk.execution_time import task_runner
from airflow.sdk.execution_time.comms import CommsDecoder
from pydantic import JsonValue
a, b = (CommsDecoder(socket=s) for s in socket.socketpair())
airflow3._watch_state_calls()  # again, as each workload's run does: it must not wrap the wrap
heartbeat = client.TaskInstanceOperations.heartbeat
print(json.dumps({
    "heartbeat_watched": [getattr(heartbeat, airflow3._WATCHED, False),
        getattr(heartbeat.__wrapped__, airflow3._WATCHED, False)],
    "decoders": [a.body_decoder is b.body_decoder, a.err_decoder is b.err_decoder],
    "json_adapter": task_runner.TypeAdapter(JsonValue) is task_runner.TypeAdapter(JsonValue),
    "tls": client.Client._get_ssl_context_cached.cache_info().currsize,
    "hostname": net.getfqdn.cache_info().currsize,
    "validator": airflow3._workload_adapter.cache_info().currsize,
    "logging": airflow3._configure_logging.cache_info().currsize,
    "imported": sorted(m for m in ("encodings.idna", "jinja2.ext", "setproctitle",
        "airflow.sdk.definitions.decorators.task_group") if m in sys.modules and m not in before),
}))
"""


def test_preload_fills_the_per_process_caches_a_forked_task_would_refill() -> None:
    # Run in a fresh interpreter: preload configures logging and imports, as the fork server does.
    done = subprocess.run([sys.executable, "-c", PRELOAD_PROBE], capture_output=True, text=True, check=True)
    filled = json.loads(done.stdout.strip().splitlines()[-1])
    assert filled == {
        "heartbeat_watched": [True, False],
        "decoders": [True, True],
        "json_adapter": True,
        "tls": 1,
        "hostname": 1,
        "validator": 1,
        "logging": 1,
        "imported": [
            "airflow.sdk.definitions.decorators.task_group",
            "encodings.idna",
            "jinja2.ext",
            "setproctitle",
        ],
    }


def _server_error(status: int, body: object) -> Exception:
    import httpx
    from airflow.sdk.api.client import ServerResponseError

    request = httpx.Request("PATCH", "http://127.0.0.1:8080/execution/task-instances/0191/run")
    error = ServerResponseError.from_response(httpx.Response(status, json=body, request=request))
    assert error is not None
    return error


def test_only_the_execution_apis_not_found_means_the_task_instance_is_gone() -> None:
    # Real errors as Airflow's task SDK client builds them from a response.
    gone = _server_error(404, {"detail": {"reason": "not_found", "message": "Task Instance not found"}})
    assert airflow3.ti_gone(gone)
    # A wrong server URL answers 404 with a plain detail: a misconfiguration, never taken for a clear.
    assert not airflow3.ti_gone(_server_error(404, {"detail": "Not Found"}))
    assert not airflow3.ti_gone(_server_error(409, {"detail": {"reason": "invalid_state", "message": "no"}}))
    assert not airflow3.ti_gone(ValueError("not found"))


def test_the_history_tables_gone_answer_means_the_task_instance_is_gone_too() -> None:
    # The api-server answers 410 for an id a clear moved to the task-instance history, with the same reason.
    moved = _server_error(
        410, {"detail": {"reason": "not_found", "message": "Task Instance not found, moved"}}
    )
    assert airflow3.ti_gone(moved)
    assert not airflow3.ti_gone(_server_error(410, {"detail": "Gone"}))


# A workload run whose supervisor makes one call about its task instance through Airflow's real task SDK
# client, against a stand-in api-server (httpx's MockTransport: no api-server runs in a unit test;
# tests/e2e/test_cleared_while_waiting.py runs the real one) that answers with argv's status and reason.
# The supervisor is a stand-in too, doing with a refusal what Airflow's does, raising nothing: a refused
# heartbeat kills the task (exit -15); a refused success report is handed to the task, which exits 0.
STATE_CALL_PROBE = """
import sys, uuid
from datetime import datetime, timezone
import httpx
from airflow.executors.base_executor import BaseExecutor
from airflow.sdk.api.client import Client, ServerResponseError
from async_local_executor.adapter.workload import airflow3
from tests.adapter import workloads

call, status, reason = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def answer(request):
    if status == 204:
        return httpx.Response(204, request=request)
    return httpx.Response(status, json={"detail": {"reason": reason, "message": "no"}}, request=request)

def supervise(workload, **_):
    client = Client(base_url="http://api/execution/", token="t", transport=httpx.MockTransport(answer))
    ti_id = uuid.UUID(str(workload.ti.id))
    try:
        if call == "heartbeat":
            client.task_instances.heartbeat(ti_id, pid=1)
        else:
            client.task_instances.succeed(ti_id, datetime.now(tz=timezone.utc), [], [], None)
    except ServerResponseError as exc:
        if exc.response.status_code in (404, 409, 410):
            return -15 if call == "heartbeat" else 0
        raise
    return 0

BaseExecutor.run_workload = staticmethod(supervise)
print(airflow3._run((workloads.task("ok"), {"server": "http://api/execution/"})))
"""


def _exit_after(call: str, status: int, reason: str) -> int:
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", STATE_CALL_PROBE, call, str(status), reason],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
        timeout=120,
    )
    return int(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("call", ["heartbeat", "succeed"])
@pytest.mark.parametrize("status", [404, 410])
def test_a_state_call_refused_as_not_found_ends_the_workload_as_gone(call: str, status: int) -> None:
    # Its task instance was cleared while it ran: exiting 0 would report a success under a key that a
    # task instance running under a new id may hold, which the scheduler would fail.
    assert _exit_after(call, status, "not_found") == entry.EXIT_TI_GONE


@pytest.mark.parametrize(
    ("call", "status", "reason"),
    [
        ("heartbeat", 204, ""),
        ("succeed", 204, ""),
        ("heartbeat", 409, "running_elsewhere"),
        ("heartbeat", 409, "not_running"),
    ],
)
def test_a_state_call_answered_or_refused_otherwise_ends_the_workload_as_it_ended(
    call: str, status: int, reason: str
) -> None:
    # 409: the task instance is there but another process runs it, or it was marked: no clear to report.
    assert _exit_after(call, status, reason) == entry.EXIT_OK
