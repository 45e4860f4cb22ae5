"""Where the executors on this host keep their journals and status files: ``[async_local_executor] state_dir``.

Resolved here for both readers of the option, the executor (which reads its configuration itself, team
aware) and the ``status`` command (which must find what the executors wrote), so they cannot disagree.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "AIRFLOW__ASYNC_LOCAL_EXECUTOR__STATE_DIR"
_SECTION = "async_local_executor"


def resolve(configured: str) -> Path:
    """The directory a configured ``state_dir`` names; empty: ``{AIRFLOW_HOME}/async_local_executor``."""
    if configured:
        return Path(configured)
    from airflow.configuration import AIRFLOW_HOME  # slow import: only when really needed

    return Path(AIRFLOW_HOME, "async_local_executor")


def from_airflow_config() -> Path:
    """The directory as the executor resolves it, read from Airflow's configuration."""
    configured = os.environ.get(ENV, "").strip()
    if not configured:  # the environment alone spares the status command Airflow's configuration
        from airflow.configuration import conf  # slow import: only when really needed

        configured = (conf.get(_SECTION, "state_dir", fallback="") or "").strip()
    return resolve(configured)
