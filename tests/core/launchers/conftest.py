"""Fixtures of the contained launch paths' tests: which launch path, and a scratch cgroup for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.core import cgroup_helpers
from tests.core.cgroup_helpers import Scratch


@pytest.fixture(params=["subprocess", "forkserver"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def box() -> Iterator[Scratch]:
    with cgroup_helpers.scratch() as made:
        yield made
