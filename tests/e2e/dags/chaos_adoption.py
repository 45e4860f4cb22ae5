"""The one thing the restart chaos test, and the retried-adoption handover tests, inject into a
scheduler: a retried adoption.

Airflow's ``adopt_or_reset_orphaned_tasks`` calls ``executor.try_adopt_task_instances`` inside
``run_with_db_retries``: a database error there (a deadlock with another scheduler, a dropped connection)
rolls its transaction back, and Airflow calls again with the same task instances. A real deadlock cannot
be staged reliably, so this subclass of the executor under test raises ``OperationalError`` once, right
after the real call has returned having adopted something, in a scheduler started with
``ALE_CHAOS_ADOPTION_ERROR=1``. Nothing else differs from the class it extends (``ALE_CHAOS_BASE``,
this executor by default; on Airflow 2, ``async_local_executor.executor.AsyncLocalExecutor``, the path
its configurations name). A scheduler loads it through its module path, with the repository on
``PYTHONPATH`` (tests/e2e/chaos.py, and ``test_a_retried_adoption_gets_the_same_answer`` in
tests/e2e/test_handover.py and tests/airflow2/test_handover.py); the file never names what the file
processor looks for, so it is not parsed as a workflow file.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy.exc import OperationalError

BASE_ENV: Final[str] = "ALE_CHAOS_BASE"
ONCE_ENV: Final[str] = "ALE_CHAOS_ADOPTION_ERROR"
DEFAULT_BASE: Final[str] = "async_local_executor.AsyncLocalExecutor"
# What the scheduler log says when the error is raised.
INJECTED: Final[str] = "chaos: OperationalError injected after try_adopt_task_instances"

log = logging.getLogger(__name__)


def _resolve(path: str) -> type[Any]:
    module, _, name = path.rpartition(".")
    cls: type[Any] = getattr(importlib.import_module(module), name)
    return cls


_base = _resolve(os.environ.get(BASE_ENV) or DEFAULT_BASE)
# Armed once per scheduler process, by the environment it was started with.
_armed = [os.environ.get(ONCE_ENV) == "1"]


def _try_adopt_task_instances(self: Any, tis: Sequence[Any]) -> Sequence[Any]:
    refused: Sequence[Any] = _base.try_adopt_task_instances(self, tis)
    if _armed[0] and len(refused) < len(tis):
        _armed[0] = False
        log.warning(
            "%s: %d offered, %d refused; Airflow rolls back and calls again with the same ones",
            INJECTED,
            len(tis),
            len(refused),
        )
        raise OperationalError(
            "try_adopt_task_instances", None, Exception("deadlock detected (injected by the chaos test)")
        )
    return refused


# Built with type() because the base class is only known at import time.
RetriedAdoptionExecutor: type[Any] = type(
    "RetriedAdoptionExecutor",
    (_base,),
    {"try_adopt_task_instances": _try_adopt_task_instances, "__module__": __name__},
)
