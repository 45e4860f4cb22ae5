"""Two teams' executors in one scheduler, sharing one state directory, each adopt only their own tasks.

Airflow 3's multi-team mode (``[core] multi_team = True``) builds one executor per team in one scheduler
and starts them one after another, the global one first; it offers each team's task instances to that
team's executor alone. Every team's executor here is this one, and none sets a ``state_dir``, so all keep
their launch journals in the same default directory under AIRFLOW_HOME. A stopped scheduler's team
executors each hand their running tasks over; at the restart, each must hold only the workloads its own
team's predecessor handed over (the journal's owner key), or the first to start would take every
team's, and Airflow, offering each team's task instances to its own executor, would reset them all.

Nothing is mocked: a real Airflow 3.3 (scheduler, api-server, dag-processor) on SQLite in multi-team mode
(:class:`harness.teams.TeamsSandbox`), two teams with a DAG bundle each (dags_teams/handover_team.py),
the default fork-server launcher, real task processes that record every execution.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from async_local_executor.ops.status_format import ADOPTION_ADOPTED
from async_local_executor.ops.status_read import adoption_of, read_all
from harness.demo import EXECUTOR
from harness.teams import TeamsSandbox
from tests.core.helpers import alive
from tests.e2e.helpers import QUICK_ORPHANS, poll, since, stop_scheduler

pytestmark = [pytest.mark.e2e]

TEAMS = ("team_a", "team_b")
TASKS = 2  # per team's DAG (dags_teams/handover_team.py)
DAG_FILE = Path(__file__).with_name("dags_teams") / "handover_team.py"
ADOPTED = re.compile(
    r"adopted (\d+) task instance\(s\) whose workloads were handed over to this scheduler; (\d+)"
)
# Each executor rewrites its status file every few seconds: a bound for the adoption to show there.
STATUS_GUARD = 60.0
HANDED_OVER = re.compile(r"handed over (\d+) running task workload\(s\)")


def dag_id(team: str) -> str:
    return f"handover_{team}"


@pytest.fixture
def marks_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "marks"
    folder.mkdir()
    return folder


@pytest.fixture
def teams_sandbox(tmp_path: Path, marks_dir: Path) -> Iterator[TeamsSandbox]:
    """Two teams, each with a bundle holding its own copy of the DAG file; no DAG without a team."""
    bundles: dict[str, Path] = {}
    for team in TEAMS:
        bundles[team] = tmp_path / "bundles" / team  # the folder's name is the DAG's team
        bundles[team].mkdir(parents=True)
        shutil.copy(DAG_FILE, bundles[team])
    no_team = tmp_path / "bundles" / "no_team"
    no_team.mkdir()
    with TeamsSandbox(
        executor=EXECUTOR,
        dags_folder=no_team,
        parallelism=TASKS * len(TEAMS),
        teams=bundles,
        extra_config={"ALE_HANDOVER_DIR": str(marks_dir), **QUICK_ORPHANS},
    ) as started:
        yield started


def marks(folder: Path, suffix: str) -> list[str]:
    """``<team>.hold<i>.try<N>.pid<P>``, one per execution that left a ``suffix`` mark, sorted."""
    return sorted(p.name.removesuffix(suffix) for p in folder.glob(f"*{suffix}"))


def owned_by(sandbox: TeamsSandbox) -> dict[str, str | None]:
    """Each DAG's team, as the scheduler resolves it (DAG, bundle, team)."""
    rows = sandbox.query(
        "SELECT dag.dag_id, dag_bundle_team.team_name FROM dag "
        "LEFT JOIN dag_bundle_team ON dag_bundle_team.dag_bundle_name = dag.bundle_name"
    )
    return {str(found): team for found, team in rows}


def adopted_per_team(sandbox: TeamsSandbox) -> dict[str | None, list[str]]:
    """What each live executor's status file says it adopted (claimed), by its team (None: the global)."""
    adopted: dict[str | None, list[str]] = {}
    for found in read_all(sandbox.home / "async_local_executor"):
        if found.stale is None:
            rows = found.data.get("running", [])
            adopted[found.data.get("team")] = sorted(
                str(row["key"]) for row in rows if adoption_of(row) == ADOPTION_ADOPTED
            )
    return adopted


def expected_adoptions() -> dict[str | None, list[str]]:
    return {
        None: [],
        **{team: [f"{dag_id(team)}.hold[{i}] try 1" for i in range(TASKS)] for team in TEAMS},
    }


def test_each_team_s_executor_adopts_only_the_tasks_its_own_predecessor_handed_over(
    teams_sandbox: TeamsSandbox, marks_dir: Path
) -> None:
    sandbox = teams_sandbox
    for team in TEAMS:
        sandbox.wait_for_dag(dag_id(team), timeout=120)
    assert owned_by(sandbox) == {dag_id(team): team for team in TEAMS}
    runs = {team: sandbox.trigger(dag_id(team)) for team in TEAMS}
    every = TASKS * len(TEAMS)
    poll("every team's tasks running", lambda: len(marks(marks_dir, ".start")) == every)
    tasks = [int(mark.rsplit(".pid", 1)[1]) for mark in marks(marks_dir, ".start")]
    workloads = [psutil.Process(pid).ppid() for pid in tasks]
    # Launched by this scheduler's executors: each task's workload process is the scheduler's child.
    assert all(psutil.Process(pid).ppid() == sandbox.pids["scheduler"] for pid in workloads), workloads
    launched = [*workloads, *tasks]

    stopped = stop_scheduler(sandbox)
    # Each team's executor handed over its own two; the global one ran nothing to hand over.
    handed_over = [int(n) for n in HANDED_OVER.findall(stopped)]
    assert sorted(n for n in handed_over if n) == [TASKS] * len(TEAMS), stopped
    assert all(alive(pid) for pid in launched), {pid: alive(pid) for pid in launched}

    offset = sandbox.process_logs["scheduler"].stat().st_size
    sandbox.restart("scheduler")
    poll(
        "each team's executor to adopt its task instances",
        lambda: len(ADOPTED.findall(since(sandbox, offset))) >= len(TEAMS),
    )
    started = since(sandbox, offset)
    # Airflow offered each team's two to its executor alone, once: each adopted both, refused none.
    assert sorted(ADOPTED.findall(started)) == [(str(TASKS), "0")] * len(TEAMS), started
    assert "Reset the following" not in started, started
    # Each team's executor finds the other team's predecessor's cgroups without a journal (the other
    # executor reclaimed it just before, in this process): no news, so nothing above DEBUG says so.
    assert not re.search(r"\[info\s*\] no launch journal", started), started
    # And each holds the workloads of its own team's DAG, claimed; the global executor holds none.
    poll(
        "every executor's status to say what it adopted",
        lambda: adopted_per_team(sandbox) == expected_adoptions(),
        guard=STATUS_GUARD,
    )
    assert all(alive(pid) for pid in launched), {pid: alive(pid) for pid in launched}

    (marks_dir / "gate").write_text("")

    def ended() -> bool:
        return all(sandbox.run_state(dag_id(t), runs[t]) in ("success", "failed") for t in TEAMS)

    poll("every team's run to end", ended)
    for team in TEAMS:
        rows = sandbox.task_instances(dag_id(team), runs[team])
        assert sandbox.run_state(dag_id(team), runs[team]) == "success", rows
        assert [(r.state, r.try_number) for r in rows] == [("success", 1)] * TASKS, rows
    # One execution per task, which ran to its end: nothing was killed and nothing ran again.
    assert marks(marks_dir, ".start") == marks(marks_dir, ".end")
    assert sorted(m.split(".pid")[0] for m in marks(marks_dir, ".start")) == [
        f"{team}.hold{i}.try1" for team in TEAMS for i in range(TASKS)
    ]
    assert "Reset the following" not in since(sandbox, offset)
    poll("every process of every execution to end", lambda: not any(alive(pid) for pid in launched))
