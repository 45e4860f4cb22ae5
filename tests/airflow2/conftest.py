from __future__ import annotations

import os
import tempfile

# Airflow reads AIRFLOW_HOME when first imported: give this session a throwaway one before any test
# module imports Airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="ale-airflow2-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


from tests.executor_cgroups import cgroup_root  # noqa: F401 - a fixture, after AIRFLOW_HOME is set
