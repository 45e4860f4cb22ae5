"""A sandbox's home copied from a template holds what ``airflow db migrate`` would have left in it.

Two homes of one kind, one copied (harness/templates.py), one migrated by a real ``airflow db migrate``:
the same tables, columns and rows, and the same airflow.cfg but for the secrets Airflow draws at random.
The option ``db migrate`` writes into the database (the default pool's size) is given a value of its own,
after a home with the default: a template of another kind must not be the one copied. The comparison is
tests/home_template.py, which tests/airflow2 runs on Airflow 2.
"""

from __future__ import annotations

import pytest

from harness.sandbox import AirflowSandbox
from tests.home_template import check_copied_equals_migrated

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_a_copied_home_holds_what_migrating_it_would(database: str) -> None:
    check_copied_equals_migrated(AirflowSandbox, database)
