from __future__ import annotations

import os

from tests.airflow_home import use_throwaway_home

# Before any test module imports Airflow, which reads AIRFLOW_HOME then (and its SQLite file there).
use_throwaway_home("ale-adapter-")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
# These tests' workloads are stubs that run no custody (core/custody.py), so a stop here terminates them
# as on_stop = terminate does; the handover is tests/adapter/test_adoption_handover.py's and the end-to-end tests'.
os.environ.setdefault("AIRFLOW__ASYNC_LOCAL_EXECUTOR__ON_STOP", "terminate")


from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.adapter.driver import RecordingExecutor
from tests.executor_cgroups import cgroup_root  # noqa: F401 - a fixture, for this directory

StartExecutor = Callable[..., RecordingExecutor]


LAUNCHER_ENV = "AIRFLOW__ASYNC_LOCAL_EXECUTOR__LAUNCHER"
# What a test that did not ask for a launch path runs with: no launch path at all, so an executor it
# starts refuses to (``[async_local_executor] launcher must be one of ...``) instead of running on the
# default path alone.
UNCHOSEN = "unchosen-ask-for-the-launcher-fixture"


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a test that starts an executor runs once per launch path: it asks for :func:`launcher`
    (directly or through :func:`start_executor`); the others run once, with no launch path set."""
    monkeypatch.setenv(LAUNCHER_ENV, UNCHOSEN)


@pytest.fixture(params=["forkserver", "subprocess"])
def launcher(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, no_launcher: None) -> str:
    """The launch path of the executors this test starts: every such test runs on both."""
    monkeypatch.setenv(LAUNCHER_ENV, str(request.param))
    return str(request.param)


@pytest.fixture
def start_executor(launcher: str) -> Iterator[StartExecutor]:
    """Start a :class:`~tests.adapter.driver.RecordingExecutor` (keyword arguments as for its constructor,
    and ``argv`` for the workload command); every one started is ended when the test ends.

    A test that ends one itself (to check what ending does) may: ending twice is a no-op.
    """
    started: list[RecordingExecutor] = []

    def start(argv: tuple[str, ...] | None = None, **kwargs: Any) -> RecordingExecutor:
        executor = RecordingExecutor(**kwargs)
        if argv is not None:
            executor.argv = argv
        started.append(executor)
        executor.start()
        return executor

    yield start
    for executor in reversed(started):
        executor.end()


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    """A file a ``hold:<gate>`` workload waits on while it exists: the test removes it to let them end."""
    path = tmp_path / "gate"
    path.touch()
    return path
