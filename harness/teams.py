"""A throwaway Airflow 3 in multi-team mode: one scheduler, one executor per team, one DAG bundle per team.

What Airflow 3.3 needs for it (read from its source):

- ``[core] multi_team = True``; without it, the team parts of ``[core] executor`` are ignored with a
  warning and a bundle with a ``team_name`` is refused (``executor_loader._get_team_executor_configs``,
  ``DagBundlesManager.parse_config``).
- ``[core] executor`` as ``<global>;<team>=<executor>;...``: at least one executor without a team, first
  (every task of a DAG without a team goes to it); a team's executor must say ``supports_multi_team``
  and is built with ``team_name=<team>`` (``ExecutorLoader.load_executor``).
- The teams as rows of the ``team`` table before any process starts: the scheduler's executor loader
  and the api-server's auth manager refuse teams the database lacks, and the dag-processor refuses a
  bundle whose team it lacks. ``airflow teams sync`` adds every team the bundle config names.
- A team owns DAGs through a bundle: ``[dag_processor] dag_bundle_config_list`` items with
  ``team_name``; the dag-processor writes the ``dag_bundle_team`` rows, and the scheduler resolves each
  task instance's team by DAG, bundle, team (``_get_team_names_for_dag_ids``) and offers it to that
  team's first executor only (``_executor_to_workloads``).
- A team's executor reads its configuration (``BaseExecutor.conf``, an ``ExecutorConf``) from
  ``AIRFLOW__<TEAM>___<SECTION>__<KEY>`` variables (or ``[<team>=<section>]`` in airflow.cfg) and then
  from the defaults, never from the deployment's own values: each team here gets a copy of the
  deployment's values of what this executor reads (its own section, where task processes reach the
  Execution API, where task logs go), unless ``extra_config`` gives the team its own.

Nothing else differs from :class:`~harness.sandbox.AirflowSandbox`: with no teams it is one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from harness.sandbox import AirflowSandbox

__all__ = ["GLOBAL_BUNDLE", "MIRRORED", "TeamsSandbox", "team_variable"]

# The bundle of the DAGs without a team: the sandbox's dags_folder, under Airflow's default bundle name.
GLOBAL_BUNDLE: Final[str] = "dags-folder"
# The deployment's variables each team's executor gets a copy of (see the module docstring): this
# executor's own section, the Execution API's address (a team's would otherwise be Airflow's default,
# http://localhost:8080/execution/, where no api-server of a sandbox listens) and the task log folder.
MIRRORED: Final[tuple[str, ...]] = (
    "AIRFLOW__ASYNC_LOCAL_EXECUTOR__",
    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
    "AIRFLOW__API__BASE_URL",
    "AIRFLOW__LOGGING__BASE_LOG_FOLDER",
)


def team_variable(team: str, variable: str) -> str:
    """The variable a team's executor reads for the deployment's ``AIRFLOW__<SECTION>__<KEY>``."""
    return f"AIRFLOW__{team.upper()}___{variable.removeprefix('AIRFLOW__')}"


class TeamsSandbox(AirflowSandbox):
    """An :class:`~harness.sandbox.AirflowSandbox` with ``[core] multi_team`` on and teams of its own.

    :param teams: team name -> the folder of that team's DAG bundle (a ``LocalDagBundle`` named after the
        team). Each team's executor is ``executor``, as is the global one; the global bundle is the
        sandbox's ``dags_folder``. Empty (the default): a plain sandbox, as the migration template of
        this class is made. The copies are made here: a later :meth:`reconfigure` of an executor option
        must name each team's variable (:func:`team_variable`) too.
    :param options: :class:`~harness.sandbox.AirflowSandbox`'s parameters.
    """

    def __init__(self, *, teams: Mapping[str, str | os.PathLike[str]] | None = None, **options: Any) -> None:
        # Read by _build_env, which the base constructor calls.
        self.teams = {name: Path(folder).resolve() for name, folder in (teams or {}).items()}
        for name, folder in self.teams.items():
            if not folder.is_dir():
                raise ValueError(f"team {name}'s DAG bundle folder not found: {folder}")
        super().__init__(**options)

    def _build_env(self) -> dict[str, str]:
        env = super()._build_env()
        if not self.teams:
            return env
        executor = env["AIRFLOW__CORE__EXECUTOR"]
        env["AIRFLOW__CORE__MULTI_TEAM"] = "True"
        env["AIRFLOW__CORE__EXECUTOR"] = ";".join([executor, *(f"{team}={executor}" for team in self.teams)])
        bundles = [
            {"name": GLOBAL_BUNDLE, "classpath": _LOCAL_BUNDLE, "kwargs": {"path": str(self.dags_folder)}},
            *(
                {"name": team, "classpath": _LOCAL_BUNDLE, "kwargs": {"path": str(folder)}, "team_name": team}
                for team, folder in self.teams.items()
            ),
        ]
        env["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"] = json.dumps(bundles)
        deployment = {k: v for k, v in env.items() if k.startswith(MIRRORED)}
        for team in self.teams:
            for variable, value in deployment.items():
                env.setdefault(team_variable(team, variable), value)
        return env

    def prepare(self) -> None:
        """The migrated home and database, with a row for each team: before any process starts."""
        super().prepare()
        if self.teams:
            with self._step(f"airflow teams sync ({', '.join(self.teams)})"):
                self.airflow("teams", "sync", timeout=self.startup_timeout)


_LOCAL_BUNDLE: Final[str] = "airflow.dag_processing.bundles.local.LocalDagBundle"
