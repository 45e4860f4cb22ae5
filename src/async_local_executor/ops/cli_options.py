"""The commands and their options, declared once for both command lines that offer them.

``async-local-executor <command>`` (:mod:`async_local_executor.ops.cli`) and ``airflow
async-local-executor <command>`` (the provider's commands,
:func:`async_local_executor.adapter.provider.get_cli_commands`) build theirs from :data:`COMMANDS`. Kept apart from the command itself because Airflow builds
its whole CLI, the provider's commands included, on every ``airflow`` invocation: this imports nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Option:
    """One option. Its help is plain text: Airflow renders help as rich markup, where ``[...]`` vanishes."""

    flag: str
    help: str
    settings: Mapping[str, Any]  # the other keywords of ``ArgumentParser.add_argument``


STATUS_HELP = "Show what each AsyncLocalExecutor on this host is doing"
STATUS_OPTIONS = (
    Option("--json", "print the status files as one JSON list", {"action": "store_true"}),
    Option("--watch", "redraw every SECONDS until interrupted", {"type": float, "metavar": "SECONDS"}),
    Option(
        "--check",
        "print one line per executor; exit 0 only if every one is current and healthy (for probes)",
        {"action": "store_true"},
    ),
    Option(
        "--state-dir", "default: the state_dir option of the async_local_executor section", {"type": Path}
    ),
)

_TEAM = Option(
    "--team",
    "act on the executors of this team (Airflow's multi-team mode); default: the executors without a team",
    {"metavar": "NAME"},
)
_BY = Option(
    "--by",
    "who makes the change, as status and the executor page show it; default: this user",
    {"metavar": "NAME"},
)
_TIMEOUT = Option(
    "--timeout",
    "seconds to wait for each running executor to apply the change (it does on its next heartbeat); "
    "default 60",
    {"type": float, "default": 60.0, "metavar": "SECONDS"},
)
_CHANGE = (_TEAM, _BY, _TIMEOUT, STATUS_OPTIONS[-1])


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    options: tuple[Option, ...]


COMMANDS = (
    Command("status", STATUS_HELP, STATUS_OPTIONS),
    Command(
        "pause",
        "Hold every new task start on this host's running executor; running tasks go on, and Airflow keeps "
        "the rest scheduled. Lasts across scheduler restarts until resume. Exit 0 once the executor applied "
        "it, 1 if none runs or it did not apply it in time, 2 on bad input",
        _CHANGE,
    ),
    Command("resume", "Undo a pause or a drain: tasks start again (exit statuses as for pause)", _CHANGE),
    Command(
        "drain",
        "Hold every new task start, and report drained once no task runs (before patching the host or "
        "switching executors). At the deadline, what still runs is terminated (on_stop = terminate) or "
        "left to be handed over at the scheduler's stop (on_stop = handover), and named. Lasts until "
        "resume. Exit statuses as for pause; with --wait, 0 once drained, 3 if the deadline passed first",
        (
            Option(
                "--deadline",
                "seconds from now after which what still runs is handled as on_stop says; default: none",
                {"type": float, "metavar": "SECONDS"},
            ),
            Option("--wait", "wait until drained, showing what still runs", {"action": "store_true"}),
            *_CHANGE,
        ),
    ),
    Command(
        "resize",
        "Change the limits in force, live, without a restart or an edit of airflow.cfg: lowering one stops "
        "nothing that runs, new starts wait until fewer run. A value equal to the configured one goes back "
        "to it. Lasts across scheduler restarts. Exit statuses as for pause",
        (
            Option("--parallelism", "the executor-wide limit", {"type": int, "metavar": "N"}),
            Option(
                "--queue",
                "a queue's limit (one of queue_limits), as NAME=N; repeat for several",
                {"action": "append", "default": [], "metavar": "NAME=N"},
            ),
            *_CHANGE,
        ),
    ),
)
