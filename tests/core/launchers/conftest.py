"""Fixtures of the contained launch paths' tests: a scratch cgroup (the launch path is tests/core's ``kind``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.core.cgroups import helpers as cgroup_helpers
from tests.core.cgroups.helpers import Scratch


@pytest.fixture
def box() -> Iterator[Scratch]:
    with cgroup_helpers.scratch() as made:
        yield made
