"""A throwaway ``AIRFLOW_HOME`` for a test process that imports Airflow itself."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile


def use_throwaway_home(prefix: str) -> None:
    """Point ``AIRFLOW_HOME`` at a new temporary directory, removed as this process exits, unless it is set.

    Airflow reads ``AIRFLOW_HOME`` when first imported: call this before any test module imports it.
    """
    if "AIRFLOW_HOME" in os.environ:
        return
    home = tempfile.mkdtemp(prefix=prefix)
    os.environ["AIRFLOW_HOME"] = home
    atexit.register(shutil.rmtree, home, ignore_errors=True)
