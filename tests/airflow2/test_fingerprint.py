"""Airflow 2.11/2.10: a task forked by the fork server observes what a freshly started task observes.

The same fingerprint DAG and tests as tests/e2e/test_fingerprint.py (written once in
tests/e2e/fingerprint.py), under the stock 2.x LocalExecutor, this executor with ``launcher =
subprocess``, and its defaults (the fork server with learned preloading, decided on the DAG file's
libraries before the run; ``preload_interval`` 5 s). One deployment whose real scheduler, on
PostgreSQL, is restarted with each executor; each task is ``airflow tasks run --local``, whose raw
task process records what it observes.
"""

from __future__ import annotations

import pytest

from harness.airflow2 import Airflow2Sandbox
from tests.e2e import fingerprint

# The shared tests, collected here with this module's runs.
from tests.e2e.fingerprint import (  # noqa: F401
    test_a_task_holds_no_descriptor_a_stock_task_would_not,
    test_a_task_observes_what_it_observes_under_the_stock_executor,
    test_every_task_draws_its_own_random_numbers,
    test_the_defaults_preloaded_pandas_and_numpy_and_refused_the_shared_generator,
)

# Also on 2.10: what a forked task observes comes from the modules the helper preloaded, whose import-time
# state differs between 2.10 and 2.11 (tests/airflow2/README.md).
pytestmark = [pytest.mark.e2e, pytest.mark.airflow210]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> fingerprint.Runs:
    return fingerprint.observe_all(Airflow2Sandbox, tmp_path_factory)
