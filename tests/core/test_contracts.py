"""Argument checks; the import-weight rule of the fork-server helper (tests/packaging/test_layers.py has the
core's independence from Airflow)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from async_local_executor.core.launchers.base import LaunchRequest
from async_local_executor.core.launchers.forkserver.launcher import ForkServerLauncher
from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from async_local_executor.core.stopping import TerminationPolicy
from async_local_executor.core.supervisor import Supervisor
from tests.core.helpers import Recorder


def test_grace_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="grace must be >= 0"):
        TerminationPolicy(grace=-1)


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="limit must be >= 1"):
        Supervisor(SubprocessLauncher(), Recorder(), limit=0)


def test_request_needs_a_program() -> None:
    with pytest.raises(ValueError, match="argv must not be empty"):
        LaunchRequest("k", [])


def test_target_must_name_a_function() -> None:
    with pytest.raises(ValueError, match="target must look like module:function"):
        ForkServerLauncher(target="tests.core.launchers.forkserver.targets")


def test_helper_module_imports_nothing_heavy() -> None:
    code = "import sys, async_local_executor.core.launchers.forkserver.helper.__main__; print('anyio' in sys.modules, 'airflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False False"
