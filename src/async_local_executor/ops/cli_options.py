"""The ``status`` command's options, declared once for both command lines that offer it.

``async-local-executor status`` (:mod:`async_local_executor.ops.cli`) and ``airflow async-local-executor
status`` (the provider's command, :func:`async_local_executor.adapter.provider.get_cli_commands`) build
their options from :data:`STATUS_OPTIONS`. Kept apart from the command itself because Airflow builds
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
