"""The workload state machine, driven with no processes and no event loop."""

from __future__ import annotations

import pytest

from async_local_executor.core.errors import InvalidTransition
from async_local_executor.core.lifecycle import TRANSITIONS, Lifecycle, Phase, Step


def walk(*steps: Step) -> Lifecycle:
    life = Lifecycle()
    for step in steps:
        life.advance(step)
    return life


@pytest.mark.parametrize(
    ("steps", "end"),
    [
        ((Step.ADMIT, Step.LAUNCHED, Step.EXIT), Phase.FINISHED),
        ((Step.ADMIT, Step.LAUNCHED, Step.TERMINATE, Step.EXIT), Phase.FINISHED),
        ((Step.ADMIT, Step.LAUNCH_FAILED), Phase.FINISHED),
        ((Step.DROP,), Phase.FINISHED),
        ((Step.ADMIT, Step.LAUNCHED, Step.TERMINATE), Phase.TERMINATING),
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


def test_illegal_step_leaves_phase_unchanged() -> None:
    life = walk(Step.ADMIT)
    with pytest.raises(InvalidTransition, match="cannot terminate a workload that is launching"):
        life.advance(Step.TERMINATE)
    assert life.phase is Phase.LAUNCHING


def test_every_phase_but_finished_can_reach_finished() -> None:
    for phase in Phase:
        if phase is Phase.FINISHED:
            continue
        assert any(src is phase for src, _ in TRANSITIONS)
