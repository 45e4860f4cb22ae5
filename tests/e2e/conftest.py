"""The end-to-end tests' real Airflow: one ``sandbox`` fixture, configured by the test's ``sandbox`` marker.

By default it runs this executor on SQLite with this folder's dags/ at parallelism 4 (the switch DAG's
tasks). ``@pytest.mark.sandbox(...)`` takes :class:`~harness.sandbox.AirflowSandbox`'s parameters, and
``config=`` adds to its environment; a module's marker and a test's are merged, the test's last. A
module whose DAGs are its own overrides the ``sandbox_dags`` fixture. The tasks of dags/ leave their
marks in, and wait for a gate file in, the test's ``tmp_path``.

Each test gets a deployment of its own, started before it and stopped after it, unless its module's
marker says ``shared=True``: then every test of the module gets the one deployment the module started
(the ``shared_sandbox`` fixture), with the module marker's options. That is for tests that only run
DAGs and read what happened, each with runs of its own; a test that stops, kills, reconfigures or
breaks a deployment needs its own. On a shared deployment a test names its own folder for its tasks'
marks and gate: the switch DAG takes it from the run's conf (``{"folder": str(tmp_path)}``), and the
gate in ``tmp_path`` is opened after each test, so that a failed test leaves no task holding a slot.
It reads only its own runs, and the logs from where they stood when it began (``helpers.log_size``).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.demo import EXECUTOR
from harness.sandbox import AirflowSandbox
from tests.e2e.helpers import DAGS, SWITCH_TASKS, TEST_DIR_ENVS


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "sandbox(**options): the sandbox fixture's AirflowSandbox parameters; config= adds variables; "
        "shared=True (a module's marker): one deployment for all the module's tests",
    )


def _options(
    markers: Iterable[pytest.Mark], folder: Path, dags: Path
) -> tuple[dict[str, Any], dict[str, str]]:
    """AirflowSandbox's parameters and extra configuration from ``markers`` (nearest first)."""
    options: dict[str, Any] = {"executor": EXECUTOR, "dags_folder": dags, "parallelism": SWITCH_TASKS}
    config = dict.fromkeys(TEST_DIR_ENVS, str(folder))
    for marker in reversed(list(markers)):
        options.update({k: v for k, v in marker.kwargs.items() if k not in ("config", "shared")})
        config.update(marker.kwargs.get("config", {}))
    return options, config


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        item.stash[_FAILED] = True
    return report


_FAILED = pytest.StashKey[bool]()


def _failed(item: pytest.Item) -> bool:
    return item.stash.get(_FAILED, False)


def _shared(markers: Iterable[pytest.Mark]) -> bool:
    return any(marker.kwargs.get("shared") for marker in markers)


@pytest.fixture
def sandbox_dags() -> Path:
    """The DAGs folder the ``sandbox`` fixture's Airflow parses."""
    return DAGS


@pytest.fixture(scope="module")
def shared_sandbox(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AirflowSandbox]:
    """A real Airflow for every test of a module marked ``sandbox(shared=True)``, stopped after the last."""
    markers = list(request.node.iter_markers("sandbox"))
    if not _shared(markers):
        raise pytest.UsageError(f"{request.node.nodeid}: shared_sandbox needs a sandbox(shared=True) marker")
    options, config = _options(markers, tmp_path_factory.mktemp("shared"), DAGS)
    with AirflowSandbox(extra_config=config, **options) as started:
        yield started


@pytest.fixture
def sandbox(request: pytest.FixtureRequest, tmp_path: Path, sandbox_dags: Path) -> Iterator[AirflowSandbox]:
    """A real Airflow for one test, started before it and stopped, leaving nothing, after it; or the
    module's shared one (the module docstring says when)."""
    markers = list(request.node.iter_markers("sandbox"))
    if not _shared(markers):
        options, config = _options(markers, tmp_path, sandbox_dags)
        with AirflowSandbox(extra_config=config, **options) as started:
            yield started
            # A failed test's home stays, with its logs and the stacks of whatever ignored SIGTERM.
            started.keep_home = started.keep_home or _failed(request.node)
        return
    if [m for m in request.node.own_markers if m.name == "sandbox"] or sandbox_dags != DAGS:
        raise pytest.UsageError(
            f"{request.node.nodeid}: a test on its module's shared deployment has no sandbox options of its "
            "own (the module's marker has them, dags_folder= too)"
        )
    shared: AirflowSandbox = request.getfixturevalue("shared_sandbox")
    shared.check_processes()
    yield shared
    (tmp_path / "gate").touch()
    # A test that broke the deployment fails here, not the next test.
    shared.check_processes()
