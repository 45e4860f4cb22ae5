"""The end-to-end tests' real Airflow: one ``sandbox`` fixture, configured by the test's ``sandbox`` marker.

By default it runs this executor on SQLite with this folder's dags/ at parallelism 4 (the switch DAG's
tasks). ``@pytest.mark.sandbox(...)`` takes :class:`~harness.sandbox.AirflowSandbox`'s parameters, and
``config=`` adds to its environment; a module's marker and a test's are merged, the test's last. A
module whose DAGs are its own overrides the ``sandbox_dags`` fixture. The tasks of dags/ leave their
marks in, and wait for a gate file in, the test's ``tmp_path``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.demo import EXECUTOR
from harness.sandbox import AirflowSandbox
from tests.e2e.helpers import DAGS, SWITCH_TASKS, TEST_DIR_ENVS


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "sandbox(**options): the sandbox fixture's AirflowSandbox parameters; config= adds variables",
    )


@pytest.fixture
def sandbox_dags() -> Path:
    """The DAGs folder the ``sandbox`` fixture's Airflow parses."""
    return DAGS


@pytest.fixture
def sandbox(request: pytest.FixtureRequest, tmp_path: Path, sandbox_dags: Path) -> Iterator[AirflowSandbox]:
    """A real Airflow for one test, started before it and stopped, leaving nothing, after it."""
    options: dict[str, Any] = {"executor": EXECUTOR, "dags_folder": sandbox_dags, "parallelism": SWITCH_TASKS}
    config = dict.fromkeys(TEST_DIR_ENVS, str(tmp_path))
    for marker in reversed(list(request.node.iter_markers("sandbox"))):
        options.update({k: v for k, v in marker.kwargs.items() if k != "config"})
        config.update(marker.kwargs.get("config", {}))
    with AirflowSandbox(extra_config=config, **options) as started:
        yield started
