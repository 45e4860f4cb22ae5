"""The workload state machine, driven with no processes and no event loop."""

from __future__ import annotations

import itertools

import pytest

from async_local_executor.core.errors import InvalidTransition
from async_local_executor.core.lifecycle import TRANSITIONS, Lifecycle, Phase, Step, transition


def walk(*steps: Step) -> Lifecycle:
    life = Lifecycle()
    for step in steps:
        life.advance(step)
    return life


# The table as the design states it, written out independently of TRANSITIONS so an edit to the table
# has to be made twice, on purpose.
ALLOWED = {
    (Phase.QUEUED, Step.ADMIT): Phase.LAUNCHING,
    (Phase.QUEUED, Step.DROP): Phase.FINISHED,
    (Phase.LAUNCHING, Step.LAUNCHED): Phase.RUNNING,
    (Phase.LAUNCHING, Step.LAUNCH_FAILED): Phase.FINISHED,
    (Phase.RUNNING, Step.TERMINATE): Phase.TERMINATING,
    (Phase.RUNNING, Step.EXIT): Phase.FINISHED,
    (Phase.TERMINATING, Step.EXIT): Phase.FINISHED,
    (Phase.QUEUED, Step.ABANDON): Phase.FINISHED,
    (Phase.LAUNCHING, Step.ABANDON): Phase.FINISHED,
    (Phase.RUNNING, Step.ABANDON): Phase.FINISHED,
    (Phase.TERMINATING, Step.ABANDON): Phase.FINISHED,
    (Phase.RUNNING, Step.RELEASE): Phase.RELEASED,
    (Phase.TERMINATING, Step.RELEASE): Phase.RELEASED,  # stopped for its timeout as a release began
}

# A legal way into each phase, so every pair can also be tried on a real Lifecycle.
REACH = {
    Phase.QUEUED: (),
    Phase.LAUNCHING: (Step.ADMIT,),
    Phase.RUNNING: (Step.ADMIT, Step.LAUNCHED),
    Phase.TERMINATING: (Step.ADMIT, Step.LAUNCHED, Step.TERMINATE),
    Phase.FINISHED: (Step.DROP,),
    Phase.RELEASED: (Step.ADMIT, Step.LAUNCHED, Step.RELEASE),
}


def test_the_table_is_the_documented_one() -> None:
    assert TRANSITIONS == ALLOWED


@pytest.mark.parametrize(("phase", "step"), list(itertools.product(Phase, Step)))
def test_every_phase_and_step(phase: Phase, step: Step) -> None:
    life = walk(*REACH[phase])
    assert life.phase is phase
    if (phase, step) in ALLOWED:
        assert transition(phase, step) is ALLOWED[phase, step]
        assert life.advance(step) is ALLOWED[phase, step]
        assert life.phase is ALLOWED[phase, step]
    else:
        message = f"cannot {step.value} a workload that is {phase.value}"
        with pytest.raises(InvalidTransition, match=message):
            transition(phase, step)
        with pytest.raises(InvalidTransition, match=message):
            life.advance(step)
        assert life.phase is phase  # a refused step changes nothing


@pytest.mark.parametrize(
    ("steps", "end"),
    [
        ((Step.ADMIT, Step.LAUNCHED, Step.EXIT), Phase.FINISHED),
        ((Step.ADMIT, Step.LAUNCHED, Step.TERMINATE, Step.EXIT), Phase.FINISHED),
        ((Step.ADMIT, Step.LAUNCH_FAILED), Phase.FINISHED),
        ((Step.DROP,), Phase.FINISHED),
        ((Step.ADMIT, Step.LAUNCHED, Step.TERMINATE), Phase.TERMINATING),
        ((Step.ADMIT, Step.LAUNCHED, Step.ABANDON), Phase.FINISHED),
        ((Step.ADMIT, Step.LAUNCHED, Step.RELEASE), Phase.RELEASED),
    ],
)
def test_legal_paths(steps: tuple[Step, ...], end: Phase) -> None:
    assert walk(*steps).phase is end


@pytest.mark.parametrize("step", list(Step))
def test_finished_is_final(step: Step) -> None:
    life = walk(Step.DROP)
    with pytest.raises(InvalidTransition):
        life.advance(step)
    assert life.phase is Phase.FINISHED


def test_the_phase_cannot_be_set_around_the_table() -> None:
    life = Lifecycle()
    with pytest.raises(AttributeError):
        life.phase = Phase.FINISHED  # type: ignore[misc]
    assert life.phase is Phase.QUEUED


@pytest.mark.parametrize("step", list(Step))
def test_released_is_final_and_not_finished_by_an_internal_error(step: Step) -> None:
    # A released workload's final event is its adopter's: nothing here may give it one, a bug included.
    life = walk(Step.ADMIT, Step.LAUNCHED, Step.RELEASE)
    assert life.finished
    with pytest.raises(InvalidTransition):
        life.advance(step)
    assert life.phase is Phase.RELEASED


def test_every_phase_but_finished_can_reach_finished() -> None:
    # Breadth-first over the table: a phase with no path to FINISHED would strand its workloads; a
    # released one is no longer this supervisor's to finish.
    for start in set(Phase) - {Phase.RELEASED}:
        seen, frontier = {start}, [start]
        while frontier:
            frontier = [nxt for (src, _), nxt in TRANSITIONS.items() if src in frontier and nxt not in seen]
            seen.update(frontier)
        assert Phase.FINISHED in seen, start
