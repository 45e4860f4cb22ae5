from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import version

import pytest

from harness.cgroups import own_v1_cgroups
from tests.processes import spawned  # noqa: F401 - a fixture, for every test directory

# One suite, two Airflow majors: each environment collects what its Airflow can run. tests/core knows
# nothing of Airflow and runs under both.
AIRFLOW_MAJOR = int(version("apache-airflow").split(".", 1)[0])
collect_ignore = ["airflow2"] if AIRFLOW_MAJOR >= 3 else ["adapter", "e2e", "bench", "packaging"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Tests that start a real Airflow first: they take minutes where others take seconds, so with
    # pytest-xdist's workers (make test) they start early and no worker is left with one at the end.
    # The sort is stable: a module's tests keep their order, and its module-scoped Airflow runs once.
    items.sort(key=lambda item: item.get_closest_marker("e2e") is None)


@pytest.fixture(autouse=True, scope="session")
def worker_v1_cgroups() -> Iterator[None]:
    """Each pytest process (each pytest-xdist worker, and each suite make test runs beside the others) in
    cgroup v1 hierarchies of its own: executors reclaim there the cgroups of instances whose owner is
    gone, and test processes sharing one parent reclaimed each other's."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with own_v1_cgroups(f"pytest-{worker}-{os.getpid()}"):
        yield


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    # Every async test runs on plain asyncio and on uvloop: the executor picks uvloop when installed.
    # A test marked one_loop runs on uvloop alone: what it checks happens in another process.
    import uvloop

    if item.get_closest_marker("one_loop") is not None:
        return {"uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
