"""Entry point inside each Airflow 3 workload process: ``python -m async_local_executor.adapter.workload.airflow3``.

The workload arrives as JSON on stdin, never in argv or the environment, because it carries the task's
identity token and ``/proc/<pid>/cmdline`` is readable by every local user.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from async_local_executor.adapter.tasklog import TaskLogFile
from async_local_executor.adapter.workload import shared_factories
from async_local_executor.adapter.workload.entry import EXIT_OK, EXIT_TI_GONE, Entry

__all__ = [
    "encode_payload",
    "forked_main",
    "main",
    "preload",
    "run_payload",
]


def encode_payload(workload_json: str, server: str, proctitle: str) -> bytes:
    """Build what the executor writes to a child's stdin."""
    return json.dumps(
        {"server": server, "proctitle": proctitle, "workload": json.loads(workload_json)}
    ).encode()


def preload() -> None:
    """Import everything a workload run needs; a fork server calls this once, before it forks.

    Whatever a child would import after the fork it pays for in every task, and its pages stop being
    shared (docs/design.md, "What is always preloaded"); so this covers the supervisor, the task
    runner and what the task process needs to parse a DAG file.
    """
    import importlib

    for module in _PRELOAD:
        with contextlib.suppress(ImportError):  # an optional provider may not be installed
            importlib.import_module(module)
    _workload_adapter()
    _watch_state_calls()
    # Stock workers are long-lived and fill these per-process caches once; a forked child would
    # refill them for every task. Filled here, every child inherits them:
    # - the task SDK's TLS context (loading the whole CA bundle: a third of a no-op task's CPU);
    # - the host name the SDK reports on task start (a resolver round trip, cached by Airflow).
    from airflow.sdk.api import client

    client.Client._get_ssl_context_cached(client.API_SSL_CA_FILE_PATH, client.API_SSL_CERT_PATH)
    client.get_hostname()  # type: ignore[no-untyped-call]
    # Validators the task SDK would build again in every task process (see shared_factories).
    shared_factories.share_comms_decoders()
    shared_factories.share_task_runner_adapters()
    # A stock worker inherits the scheduler's logging set-up; ours is set up once here, writing to
    # fd 1, which each child points at its own output pipe before the workload runs.
    _configure_logging()
    # Tasks reach the database through the API; the engine Airflow made at import is no child's.
    from airflow.settings import dispose_orm

    dispose_orm(do_log=False)


@functools.cache
def _workload_adapter() -> Any:
    # Building a TypeAdapter compiles a validator for the whole workload union (tens of ms).
    from airflow.executors import workloads
    from pydantic import TypeAdapter

    return TypeAdapter(workloads.ExecutorWorkload)


@functools.cache
def _configure_logging() -> None:
    from airflow.sdk.log import configure_logging

    configure_logging(output=sys.stdout.buffer)


_PRELOAD = (
    "airflow.executors.base_executor",
    "airflow.sdk",
    "airflow.sdk.execution_time.supervisor",
    "airflow.sdk.execution_time.task_runner",
    "airflow.sdk.execution_time.callback_supervisor",
    "airflow.sdk.execution_time.connection_test_supervisor",
    "airflow.sdk.log",
    "airflow.sdk._shared.logging.factory",
    "airflow.sdk._shared.logging.remote",
    "airflow.dag_processing.dagbag",
    "airflow.dag_processing.bundles.local",
    # What a DAG file written with the TaskFlow API imports while the task process parses it.
    "airflow.sdk.definitions.decorators",
    "airflow.sdk.definitions.decorators.setup_teardown",
    "airflow.sdk.definitions.decorators.task_group",
    "airflow.sdk.definitions.decorators.condition",
    "airflow.sdk.definitions.asset.metadata",
    "airflow.providers.standard.decorators.python",
    "airflow.providers.standard.operators.python",
    "airflow.providers.standard.operators.bash",
    "airflow.providers.standard.operators.empty",
    "airflow.version",
    "jinja2.ext",
    "setproctitle",
    # The codec the resolver and the HTTP client use for host names, imported on first use.
    "encodings.idna",
)


def _read(raw: bytes) -> tuple[Any, dict[str, Any]]:
    """The validated workload and the payload it came in."""
    payload = json.loads(raw)
    if not isinstance(payload, dict) or "workload" not in payload:
        raise ValueError("payload must be an object with a 'workload' field")
    return _workload_adapter().validate_python(payload["workload"]), payload


def _run(read: tuple[Any, dict[str, Any]]) -> int:
    workload, payload = read
    from airflow.executors.base_executor import BaseExecutor
    from airflow.settings import dispose_orm

    # Our parent's engine is not ours to use, and the task reaches the database through the API.
    dispose_orm(do_log=False)
    _configure_logging()
    _watch_state_calls()
    try:
        BaseExecutor.run_workload(
            workload,
            server=payload.get("server"),
            proctitle=payload.get("proctitle"),
            subprocess_logs_to_stdout=False,
        )
    except Exception as exc:
        if ti_gone(exc):
            return _gone(exc)
        if not _refused:
            raise
        # After the api-server disowned this try, whatever else failed can be reported to no one; its
        # traceback still goes to the workload's output (the scheduler log's DEBUG lines), for a bug.
        traceback.print_exc()
    if _refused:
        # The supervisor took that answer as the end of the task (it killed it, or gave up reporting its
        # state) and returned as from any end: no state was recorded for this try. Exiting 0 would
        # report a success under a key a task instance running under the new id may hold now.
        return _gone(_refused[0])
    return EXIT_OK


def _gone(exc: BaseException) -> int:
    print(
        "async_local_executor: the api-server no longer has this task instance (it was cleared while "
        f"this workload started or ran): {exc}",
        file=sys.stderr,
        flush=True,
    )
    return EXIT_TI_GONE


# The api-server's "not found" answers to this process's own task instance (see _watch_state_calls).
_refused: list[BaseException] = []

# What Airflow's supervisor asks of the api-server for its own task instance, by that id: the start, the
# heartbeat and each terminal state. It handles a refusal of most of them itself: a heartbeat's kills the
# task, a terminal state's is passed to the task or logged, and run_workload returns as from any end.
_STATE_CALLS = ("start", "heartbeat", "succeed", "finish", "retry", "defer", "reschedule", "await_input")


def _watch_state_calls() -> None:
    """Note each of those calls the api-server refuses as "not found", then let the refusal go on.

    Wrapped once per process; the fork server does it in ``preload``, so its children inherit the wraps
    and an empty list. A task SDK without one of these methods leaves that one unwatched.
    """
    from airflow.sdk.api.client import TaskInstanceOperations

    for name in _STATE_CALLS:
        call = getattr(TaskInstanceOperations, name, None)
        if call is not None and not getattr(call, _WATCHED, False):
            setattr(TaskInstanceOperations, name, _watched(call))


def _watched(call: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(call)
    def watched(*args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            if ti_gone(exc):
                _refused.append(exc)
            raise

    setattr(watched, _WATCHED, True)
    return watched


_WATCHED = "_async_local_executor_watched"


def _task_log(read: tuple[Any, dict[str, Any]]) -> TaskLogFile | None:
    """The task's log file, where the task SDK's supervisor in this process writes it."""
    relative = getattr(read[0], "log_path", None)
    from airflow.configuration import conf

    folder = conf.get("logging", "base_log_folder", fallback="")
    return TaskLogFile(Path(folder, relative)) if relative and folder else None


def ti_gone(exc: BaseException) -> bool:
    """Whether ``exc`` is the api-server saying the task instance's id no longer exists.

    Only the Execution API's own answer counts (a 404, or a 410 when the id went to the task-instance
    history, whose detail says ``not_found``): a 404 from a wrong server URL has a plain detail and stays
    a crash, so a misconfiguration is never taken for a clear.
    """
    response = getattr(exc, "response", None)
    detail = getattr(exc, "detail", None)
    return (
        getattr(response, "status_code", None) in (404, 410)
        and isinstance(detail, dict)
        and detail.get("reason") == "not_found"
    )


# Named literally: run with `python -m`, this module's __name__ is "__main__".
_ENTRY = Entry("async_local_executor.adapter.workload.airflow3", "workload", _read, _run, _task_log)
main = _ENTRY.main
forked_main = _ENTRY.forked_main
run_payload = _ENTRY.run_payload


if __name__ == "__main__":
    sys.exit(main())
