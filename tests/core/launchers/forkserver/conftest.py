"""Fixtures of the fork server's tests: the throwaway site its learning reads
(tests/core/launchers/forkserver/fake_site.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.core.launchers.forkserver import fake_site


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    """A fake installed distribution, DAG files importing it and a learning directory, under ``tmp_path``."""
    return fake_site.world(tmp_path)
