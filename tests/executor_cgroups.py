"""The cgroup root of the executors a test session starts in its own process (tests/adapter, tests/airflow2).

A fixture for a conftest to import: without it, those executors make their instance cgroups at the
cgroup2 root, and what an ended executor leaves there (a handed-over workload's cgroup, left for an
adopter that never comes) outlives the session.
"""

from __future__ import annotations

import os
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
