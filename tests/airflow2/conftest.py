from __future__ import annotations

import os
import tempfile

# Airflow reads AIRFLOW_HOME when first imported: give this session a throwaway one before any test
# module imports Airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="ale-airflow2-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

import pytest


@pytest.fixture(autouse=True, params=["forkserver", "subprocess"])
def launcher(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every Airflow 2 executor test runs on both launch paths."""
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__LAUNCHER", str(request.param))
    return str(request.param)
