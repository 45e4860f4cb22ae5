"""The restart chaos checker (tests/e2e/chaos.py's :func:`~tests.e2e.chaos.check`) on made-up sequences:
no Airflow, no sandbox, nothing started; each test builds what a played sequence would have observed.

The timelines are CI seed 1066361626's and its neighbours, at the small size (``handover_timeout`` 15 s,
``task_timeout`` 20 s): a limited task launched at +0.3 s, a SIGTERM with a retried adoption at +2.4 s
(down 0 s), then a SIGKILL at +9.6 s with 27 s down. Its workload's custody watchdog
(core/custody.py) sums the time without a live owner over every scheduler that claimed it and exited
within ``handover_timeout`` of its claim: about 2.5 s in the first gap and 12.5 s in the second make
its 15 s, and it kills itself 12.5 s into the second gap. The checker must allow that, and nothing
that a sum the watchdog keeps cannot explain.
"""

from __future__ import annotations

import pytest

from harness.sandbox import TaskInstanceRow
from tests.e2e import chaos
from tests.e2e.chaos import PLAN_TASKS, SMALL, Execution, Gap, Observed, Sequence, Step, Task

ORIGIN = 1_000_000.0  # the first execution's start (wall time): every moment below is seconds after it
LIMITED = Task("limited", 0, SMALL.limit + SMALL.overrun, over=True)  # over its task_timeout: fails
INSIDE = Task("limited", 1, SMALL.limit - SMALL.margin)  # ends inside its task_timeout: succeeds
PLAIN = Task("plain", 0, 40.0)  # no limit: only its owner's absence ends it early; succeeds
TASKS = (LIMITED, INSIDE, PLAIN)
LAUNCH = 0.3  # the subject's first workload's launch

# The CI run's gaps: the retried adoption's SIGTERM (the scheduler exits in 0.6 s, the next one starts at
# once and claims the workload about 2.5 s after the exit, its start line seen at +6 s), then the SIGKILL
# with 27 s down.
RETRIED = (2.4, 3.0, 3.0, 6.0)  # signalled, exited, restarted, ready
KILLED = (9.6, 9.6, 36.6, 40.0)

Times = tuple[float, float, float, float]


def at(t: float) -> float:
    return ORIGIN + t


def row(task: Task, state: str, try_number: int = 1) -> TaskInstanceRow:
    return TaskInstanceRow(task.group, task.index, state, try_number, None, None, None, None)


def execution(task: Task, try_number: int, pid: int, launch: float, gone: float | None = None) -> Execution:
    """One execution whose code starts 0.2 s after its workload's launch (times: seconds after ORIGIN).
    Found ``gone`` without an end; else it ends as its code decides: a task over its limit is ended by
    it (``termination_grace_period`` / 2 later), any other runs to its end."""
    end = None
    if gone is None and task.over:
        gone = launch + SMALL.limit + SMALL.grace / 2
    elif gone is None:
        end = launch + task.seconds
    return Execution(
        task.group,
        task.index,
        try_number,
        pid,
        1000 + pid,
        pid - 1,
        999 + pid,
        at(launch + 0.2),
        at(launch),
        None if end is None else at(end),
        None if gone is None else at(gone),
    )


def observed(subject: Task, gone: float, gaps: list[Times]) -> Observed:
    """One sequence of the plan's tasks and :data:`TASKS`, in which ``subject``'s first execution,
    launched at :data:`LAUNCH`, is found gone at ``gone`` without an end, and its try 2, launched once the
    last scheduler's executor has started, ends as its code decides (a limited task over its limit: its
    executor's ``task_timeout``, which says so in the log). :data:`INSIDE` runs once from +0.5 s to its
    end; the other task waits for a free slot (parallelism 3) and runs once, launched with try 2.
    """
    pids = iter(range(4001, 5000, 2))
    executions = [execution(plan, 1, next(pids), -0.2) for plan in PLAN_TASKS]
    executions.append(execution(subject, 1, next(pids), LAUNCH, gone))
    again = max(g[3] for g in gaps) + 1.0
    executions.append(execution(subject, 2, next(pids), again))
    if subject is not INSIDE:
        executions.append(execution(INSIDE, 1, next(pids), 0.5))
    executions += [execution(t, 1, next(pids), again) for t in TASKS if t not in (subject, INSIDE)]
    log = "\n".join(
        f"{chaos.label(e.task_id, e.map_index, e.try_number)} ran longer than its {SMALL.limit:g}s task_timeout"
        for e in executions
        if e.task_id == "limited" and e.end is None and e.gone is not None and e.gone - e.launch > SMALL.limit
    )
    rows = [row(plan, "success") for plan in PLAN_TASKS]
    rows += [row(task, task.decided, 2 if task is subject else 1) for task in TASKS]
    return Observed(
        sequence=Sequence(
            1066361626, 0, TASKS, (Step("retried", 2.1, 0.0, "none"), Step("kill9", 7.2, 27.0, "over"))
        ),
        run_id="manual__chaos",
        state="failed",
        rows=rows,
        executions=executions,
        launches=[],
        gaps=[Gap(*map(at, g)) for g in gaps],
        stops=[at(g[0]) for g in gaps],
        log=log,
        problems=[],
        notes=[],
        seconds=120.0,
        exits=[g[1] - g[0] for g in gaps if g[1] > g[0]],
        peak=3,
        crowded=False,
    )


def first(subject: Task) -> str:
    """How a violation or a note about ``subject``'s first execution begins."""
    return f"{subject.group}[{subject.index}]: {subject.group}[{subject.index}] try 1 "


def ran_again(found: list[str], subject: Task) -> bool:
    return any(line.startswith(first(subject)) and "and the task ran again" in line for line in found)


def killed_itself(o: Observed, subject: Task) -> bool:
    return any(note.startswith(first(subject)) and "killed itself" in note for note in o.notes)


def test_the_ci_timeline_sums_both_gaps_and_breaks_nothing() -> None:
    # 2.4 s to 6 s unowned at most in the first gap, then killed 12.5 s into the second: 15 s in all.
    o = observed(LIMITED, KILLED[0] + 12.5, [RETRIED, KILLED])
    assert chaos.check(o, SMALL) == []
    assert killed_itself(o, LIMITED), o.notes


def test_a_try_2_that_succeeds_after_the_ci_timeline_breaks_nothing() -> None:
    # The same timeline for a task without a limit: its try 2 runs to its end and succeeds.
    o = observed(PLAIN, KILLED[0] + 12.5, [RETRIED, KILLED])
    assert chaos.check(o, SMALL) == []
    assert killed_itself(o, PLAIN), o.notes


@pytest.mark.parametrize(
    "gaps",
    [pytest.param([KILLED], id="one-gap"), pytest.param([RETRIED, KILLED], id="after-the-retried-adoption")],
)
def test_a_self_kill_3s_into_the_gap_is_too_early(gaps: list[Times]) -> None:
    # Without the first gap nothing was summed before; with it, at most 3.6 s: 3 s more make no 15 s.
    o = observed(LIMITED, KILLED[0] + 3.0, gaps)
    found = chaos.check(o, SMALL)
    assert ran_again(found, LIMITED), found
    assert not any("killed itself" in note for note in o.notes)


def test_an_owner_that_kept_it_a_whole_timeout_gives_it_the_whole_timeout_again() -> None:
    # The retried adoption's scheduler claimed it by +6 s and ran until +25 s: 19 s, over 15 s. What the
    # first gap summed is forgotten, so a kill 12.5 s into the next gap comes 2.5 s too early. A task
    # without a limit: a limited one would have been ended by its 20 s task_timeout while that owner ran.
    late = (25.0, 25.0, 52.0, 55.0)
    o = observed(PLAIN, late[0] + 12.5, [RETRIED, late])
    found = chaos.check(o, SMALL)
    assert ran_again(found, PLAIN), found
    # The same gap with the whole timeout spent in it is allowed.
    o = observed(PLAIN, late[0] + SMALL.handover_timeout, [RETRIED, late])
    assert chaos.check(o, SMALL) == []


def test_a_workload_that_outlives_its_timeout_and_the_bound_is_a_violation() -> None:
    # The second gap lasts 40 s: a workload still alive 35 s into it, past 15 s + OUTLIVE, broke the bound.
    long = (9.6, 9.6, 49.6, 52.6)
    bound = long[1] + SMALL.handover_timeout + chaos.OUTLIVE
    found = chaos.check(observed(LIMITED, bound + 10.0, [RETRIED, long]), SMALL)
    assert ran_again(found, LIMITED), found
    # Just inside the bound it is allowed.
    o = observed(LIMITED, bound - 0.5, [RETRIED, long])
    assert chaos.check(o, SMALL) == []
