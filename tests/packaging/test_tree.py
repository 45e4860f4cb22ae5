"""The shape of the source tree: old import paths that still lead somewhere."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("async_local_executor", "AsyncLocalExecutor"),
        ("async_local_executor.executor", "AsyncLocalExecutor"),
    ],
)
def test_class_and_target_paths_users_and_old_processes_name_still_resolve(module: str, name: str) -> None:
    code = f"import {module} as m; from async_local_executor.adapter.executor import AsyncLocalExecutor; print(m.{name}.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().startswith("async_local_executor.adapter.")


def test_old_python_m_entry_points_still_start() -> None:
    helper = subprocess.run(
        [sys.executable, "-m", "async_local_executor.launchers.forkserver_helper", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--target" in helper.stdout
