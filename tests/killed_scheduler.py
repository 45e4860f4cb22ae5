"""kill -9 of a real scheduler with ``handover_timeout = 0``, on Airflow 3 and on Airflow 2: the checks both
majors' tests share (tests/e2e/test_scheduler_killed.py, tests/airflow2/test_scheduler_lifecycle.py).

What the parent-death chain reaches (the scheduler's session) dies within :data:`ORPHAN_DEADLINE`; a
BashOperator's shell, which Airflow runs in a session of its own, is out of that chain's reach and
survives the kill, until the restarted scheduler's executor kills it before it launches anything. Then the
run finishes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from harness.sandbox import AirflowSandbox
from tests.core.helpers import alive
from tests.e2e.helpers import cmdline, poll

ORPHAN_DEADLINE = 10.0  # upstream #23520: a task that outlives a killed scheduler runs beside its retry
SHELL = "sleep 600"  # the BashOperator's command, on its first try


def running_with_the_shell(
    sandbox: AirflowSandbox, dag_id: str, run_id: str, tasks: int, launched: Callable[[], Sequence[int]]
) -> None:
    """Wait until the run's ``tasks`` task instances run and the shell is among the ``launched`` processes."""
    poll(
        f"{tasks} running tasks and the shell's sleep",
        lambda: (
            sum(r.state == "running" for r in sandbox.task_instances(dag_id, run_id)) == tasks
            and any(SHELL in " ".join(cmdline(pid)) for pid in launched())
        ),
    )


def by_session(scheduler: int, launched: Sequence[int]) -> tuple[list[int], list[int]]:
    """``launched`` split into what stays in the scheduler's session (the chain reaches it) and what left it;
    a process that ended since the listing has no session and is neither."""
    session = os.getsid(scheduler)
    sessions = {pid: _session(pid) for pid in launched}
    chained = [pid for pid, sid in sessions.items() if sid == session]
    escaped = [pid for pid, sid in sessions.items() if sid is not None and sid != session]
    assert escaped, [" ".join(cmdline(pid)) for pid in launched]
    return chained, escaped


def chain_ends(chained: Sequence[int]) -> None:
    """Once the scheduler is killed: everything of its session is gone within :data:`ORPHAN_DEADLINE`."""
    deadline = time.monotonic() + ORPHAN_DEADLINE
    while survivors := [pid for pid in chained if alive(pid)]:
        assert time.monotonic() < deadline, f"still alive {ORPHAN_DEADLINE:.0f}s after kill -9: " + str(
            [" ".join(cmdline(pid)) for pid in survivors]
        )
        time.sleep(0.1)


def shell_survives(escaped: Sequence[int]) -> list[int]:
    """What escaped the chain and still runs after the kill, the shell among it: only the successor's
    reclaim ends it. (A process of what escaped may end by itself meanwhile: one did in one run.)"""
    surviving = [pid for pid in escaped if alive(pid)]
    assert any(SHELL in " ".join(cmdline(pid)) for pid in surviving), {pid: cmdline(pid) for pid in escaped}
    return surviving


def restart_finishes_and_reclaims(
    sandbox: AirflowSandbox, dag_id: str, run_id: str, escaped: Sequence[int]
) -> str:
    """Restart the scheduler: the run succeeds, and its executor has killed each process in ``escaped``.

    :returns: the scheduler's log
    """
    sandbox.restart("scheduler")
    poll("the run to finish", lambda: sandbox.run_state(dag_id, run_id) in ("success", "failed"))
    assert sandbox.run_state(dag_id, run_id) == "success", sandbox.task_instances(dag_id, run_id)
    log = sandbox.process_logs["scheduler"].read_text(errors="replace")
    assert [pid for pid in escaped if alive(pid)] == [], log[-5000:]
    for pid in escaped:
        assert f"killed pid {pid} (" in log
    return log


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None
