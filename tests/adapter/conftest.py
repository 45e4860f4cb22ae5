from __future__ import annotations

import os
import tempfile

# Airflow reads AIRFLOW_HOME when first imported: give this session a throwaway one (with its own
# SQLite file) before any test module imports Airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="ale-adapter-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


from collections.abc import Iterator

import pytest

from harness import cgroups


@pytest.fixture(autouse=True, scope="session")
def cgroup_root() -> Iterator[None]:
    """The session's executors make their cgroups under a root of their own, removed at the end."""
    env = cgroups.sandbox_env()
    os.environ.update(env)
    try:
        yield
    finally:
        cgroups.remove_from(env)
        for name in env:
            os.environ.pop(name, None)


@pytest.fixture(autouse=True, params=["forkserver", "subprocess"])
def launcher(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every adapter test runs on both launch paths."""
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__LAUNCHER", str(request.param))
    return str(request.param)
