"""Airflow 2.11/2.10: a home copied from a template holds what ``airflow db migrate`` would have left in it.

The comparison of tests/home_template.py, on PostgreSQL (Airflow 2's only database here).
"""

from __future__ import annotations

import pytest

from harness.airflow2 import Airflow2Sandbox
from tests.home_template import check_copied_equals_migrated

# Also on 2.10: its migrations differ from 2.11's, and every 2.10 test's home is such a copy.
pytestmark = [pytest.mark.e2e, pytest.mark.airflow210]


def test_a_copied_home_holds_what_migrating_it_would() -> None:
    check_copied_equals_migrated(Airflow2Sandbox, "postgres")
