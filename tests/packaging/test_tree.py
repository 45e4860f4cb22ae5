"""The shape of the source tree: small modules, and old import paths that still lead somewhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 300


def test_every_module_under_src_is_small() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for path in (ROOT / "src").rglob("*.py")
    }
    assert sizes, "no module found"
    assert {path: lines for path, lines in sizes.items() if lines > MAX_LINES} == {}


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("async_local_executor", "AsyncLocalExecutor"),
        ("async_local_executor.executor", "AsyncLocalExecutor"),
        ("async_local_executor.child", "forked_main"),
        ("async_local_executor.child_cli", "forked_main"),
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
    # The workload entry reads its workload from stdin: an empty one is refused by the new module's code.
    child = subprocess.run(
        [sys.executable, "-m", "async_local_executor.child"],
        input="",
        capture_output=True,
        text=True,
        check=False,
    )
    assert child.returncode == 2
    assert "invalid workload on stdin" in child.stderr
