"""A fork-server target defined in another module, with a preload of its own (as the workload entry
points are: methods of a skeleton in ``adapter.workload.entry``, named as
``adapter.workload.airflow3:forked_main``)."""

from __future__ import annotations

import tests.core.forkserver_targets as targets
from tests.core.forkserver_targets import python_c as run

__all__ = ["preload", "run"]


def preload() -> None:
    targets.REEXPORT_PRELOADED = True
