from __future__ import annotations

import os

from tests.airflow_home import use_throwaway_home

# Before any test module imports Airflow, which reads AIRFLOW_HOME then (and its SQLite file there).
use_throwaway_home("ale-airflow2-")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


from tests.executor_cgroups import cgroup_root  # noqa: F401 - a fixture, after AIRFLOW_HOME is set
