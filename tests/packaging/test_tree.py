"""The class paths users configure lead to the executor."""

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
def test_the_class_paths_users_configure_resolve(module: str, name: str) -> None:
    code = f"import {module} as m; from async_local_executor.adapter.executor import AsyncLocalExecutor; print(m.{name}.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().startswith("async_local_executor.adapter.")
