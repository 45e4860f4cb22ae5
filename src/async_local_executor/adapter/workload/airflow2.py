"""Entry point inside each Airflow 2 workload process: ``python -m async_local_executor.adapter.workload.airflow2``.

Airflow 2 hands an executor the command ``airflow tasks run <dag> <task> <run> --local ...``. This
runs that command in the process itself, as stock 2.x's LocalExecutor does in a forked worker: in a
fork-server child the CLI and the models are already imported, so a launch costs a fork instead of a
fresh interpreter. The command arrives on stdin (JSON), like Airflow 3's workloads, so both launch paths
take the same shape; an Airflow 2 command carries no token, but nothing forces it onto argv either.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from pathlib import Path

from async_local_executor.adapter.tasklog import TaskLogFile
from async_local_executor.adapter.workload.entry import EXIT_CRASHED, EXIT_OK, Entry

__all__ = [
    "encode_payload",
    "forked_main",
    "main",
    "preload",
    "run_payload",
    "tasks_run_command",
]

# What `airflow tasks run --local` touches, imported once by the fork server instead of once per task.
_PRELOAD = (
    "airflow.cli.cli_parser",
    "airflow.cli.commands.task_command",
    "airflow.jobs.local_task_job_runner",
    "airflow.task.task_runner.standard_task_runner",
    "airflow.models.dagbag",
    "airflow.models.taskinstance",
    "airflow.operators.python",
    "airflow.operators.bash",
    "airflow.operators.empty",
    "airflow.decorators",
    "airflow.utils.log.file_task_handler",
    # What `tasks run --local` still imported in each child after the fork (PYTHONPROFILEIMPORTTIME finds
    # them: docs/design.md, the fork server).
    "airflow.www.extensions.init_session",
    "airflow.models.serialized_dag",
    "airflow.models.taskinstancehistory",
    "airflow.models.errors",
    "airflow.operators.subdag",
    "airflow.api.common.experimental.get_task_instance",
    "airflow.datasets.metadata",
    "airflow.listeners.spec.dagrun",
    "airflow.listeners.spec.dataset",
    "airflow.listeners.spec.importerrors",
    "airflow.listeners.spec.lifecycle",
    "airflow.listeners.spec.taskinstance",
    "airflow.macros",
    "jinja2.ext",
    "setproctitle",
    "encodings.idna",
)


def encode_payload(command: list[str], proctitle: str) -> bytes:
    """Build what the executor writes to a child's stdin."""
    return json.dumps({"command": command, "proctitle": proctitle}).encode()


def tasks_run_command(command: object) -> list[str]:
    """``command`` itself when it is an ``airflow tasks run`` command, the only one a workload runs.

    :raises ValueError: naming the command otherwise
    """
    if not isinstance(command, list) or command[:3] != ["airflow", "tasks", "run"]:
        raise ValueError(f"not an `airflow tasks run` command: {command!r}")
    return command


def _read(raw: bytes) -> tuple[list[str], str]:
    """The command and the process title it runs under."""
    data = json.loads(raw)
    command = data.get("command") if isinstance(data, dict) else None
    if not isinstance(command, list) or not all(isinstance(part, str) for part in command):
        raise ValueError("payload must be an object whose 'command' is a list of strings")
    return tasks_run_command(command), str(data.get("proctitle") or "")


def preload() -> None:
    """Import what a task run needs; a fork server calls this once, before it forks."""
    import importlib

    for module in _PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    from airflow.cli.cli_parser import get_parser

    get_parser()  # builds every subcommand's parser: tens of ms a task would otherwise repeat
    # SQLAlchemy configures every mapper on a process's first query: the stock scheduler has queried
    # before it forks a task, a fresh helper has not, so each child would redo it (the largest share
    # of a no-op `tasks run --local`'s own CPU when profiled).
    from sqlalchemy.orm import configure_mappers

    configure_mappers()
    _dispose_engine()


def _dispose_engine() -> None:
    # Connections made before a fork must not be used on both sides of it: drop the pool's (without
    # closing them, which would close the parent's sockets too); each process then opens its own.
    from airflow import settings

    engine = getattr(settings, "engine", None)
    if engine is not None:
        engine.dispose(close=False)


def _run(read: tuple[list[str], str]) -> int:
    """Run one ``airflow tasks run`` command in this process; return the exit code."""
    command, proctitle = read
    _dispose_engine()
    if proctitle:
        with contextlib.suppress(ImportError):
            from setproctitle import setproctitle

            setproctitle(proctitle)
    from airflow.cli.cli_parser import get_parser

    try:
        args = get_parser().parse_args(command[1:])
        args.func(args)
    except SystemExit as exc:  # how the CLI ends a command, with or without an error
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_CRASHED)
    return EXIT_OK


def _task_log(_: tuple[list[str], str]) -> TaskLogFile | None:
    """The file the task's log handler writes, once ``tasks run`` has set it up (None before).

    Rendering its name ourselves would need the run's log template from the database; the handler the
    command set up (on ``airflow.task``, or moved to the root logger while the task runs) has it.
    """
    for logger in (logging.getLogger("airflow.task"), logging.getLogger()):
        for handler in logger.handlers:
            # FileTaskHandler keeps the file's own handler once set_context() has given it its task.
            name = getattr(getattr(handler, "handler", None), "baseFilename", None)
            if isinstance(name, str) and name:
                return TaskLogFile(Path(name), text=True)
    return None


# Named literally: run with `python -m`, this module's __name__ is "__main__".
_ENTRY = Entry("async_local_executor.adapter.workload.airflow2", "command", _read, _run, _task_log)
main = _ENTRY.main
forked_main = _ENTRY.forked_main
run_payload = _ENTRY.run_payload


if __name__ == "__main__":
    sys.exit(main())
