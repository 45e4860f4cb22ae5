"""A task forked by the fork server observes what a freshly started task observes (Airflow 3).

The fingerprint DAG's tasks record their own process (tests/e2e/fingerprint.py says what, holds the
tests, and says how runs are compared) under the stock LocalExecutor, under this executor with
``launcher = subprocess`` (a fresh interpreter per task), and under the defaults: the fork server with
learned preloading, which has decided on the DAG file's pandas, numpy and more_itertools before the run
(``preload_interval`` is 5 s instead of 60 s, so that the decisions come sooner). One deployment whose
scheduler is restarted with each executor: real api-server, scheduler and dag-processor on SQLite;
nothing is mocked.
"""

from __future__ import annotations

import pytest

from harness.sandbox import AirflowSandbox
from tests.e2e import fingerprint

# The shared tests, collected here with this module's runs.
from tests.e2e.fingerprint import (  # noqa: F401
    test_a_task_holds_no_descriptor_a_stock_task_would_not,
    test_a_task_observes_what_it_observes_under_the_stock_executor,
    test_every_task_draws_its_own_random_numbers,
    test_the_defaults_preloaded_pandas_and_numpy_and_refused_the_shared_generator,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> fingerprint.Runs:
    return fingerprint.observe_all(AirflowSandbox, tmp_path_factory)


@pytest.mark.parametrize("variant", ["subprocess", "defaults"])
def test_the_only_file_a_task_holds_open_is_its_log(runs: fingerprint.Runs, variant: str) -> None:
    kinds = fingerprint.descriptor_kinds(runs[variant])
    assert {k for k in kinds if k.startswith("file")} == {"file: its log"}
