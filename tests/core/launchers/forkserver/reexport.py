"""A fork-server target defined in another module, with a preload of its own (as the workload entry
points are: methods of a skeleton in ``adapter.workload.entry``, named as
``adapter.workload.airflow3:forked_main``)."""

from __future__ import annotations

from tests.core.launchers.forkserver import targets
from tests.core.launchers.forkserver.targets import python_c as run

__all__ = ["preload", "run"]


def preload() -> None:
    targets.REEXPORT_PRELOADED = True
