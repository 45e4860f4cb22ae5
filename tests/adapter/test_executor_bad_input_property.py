"""Arbitrary values where a task or an operator supplies one, checked with hypothesis.

What a task carries (executor_config, Airflow 2's command and queue) goes through the real executor as
the scheduler hands it over: nothing escapes heartbeat(), and every workload gets exactly one final
event while a good one beside it still succeeds. Option values go through start(): either a ValueError
naming the option, or an executor that runs a workload to its end and stops without raising.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.utils.state import TaskInstanceState
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from async_local_executor.adapter.config import SECTION
from async_local_executor.core.health import Report
from tests.adapter import workloads
from tests.adapter.driver import RecordingExecutor, Scheduler, final_events, queue
from tests.adapter.workloads import with_config

# The launch path is itself one of the fuzzed options below; for the rest one path is enough.
pytestmark = [
    pytest.mark.usefixtures("launcher"),
    pytest.mark.parametrize("launcher", ["forkserver"], indirect=True),
]

# Hypothesis reuses the function-scoped executor across examples on purpose: one start per test.
SETTINGS = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

serials = itertools.count()  # keys stay unique across examples
FINAL = {TaskInstanceState.SUCCESS, TaskInstanceState.FAILED}
# Beyond 4300 digits repr() raises, and hypothesis could not print a failing example (a unit test in
# test_executor_bad_input has one).
EXTREMES = [10**400, -(10**400), 10**4000, 1e308, -1e308, 5e-324, -0.0, math.nan, math.inf, -math.inf]
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(EXTREMES),
)
json_ish = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
timeouts = st.one_of(
    json_ish, st.floats(min_value=0, max_value=30), st.sampled_from(["2.5", " 1e3 ", "1e400"])
)
our_section = st.one_of(
    json_ish,
    st.dictionaries(
        st.sampled_from(["task_timeout", "task_timout"]) | st.text(max_size=8), timeouts, max_size=3
    ),
)
executor_configs = st.one_of(
    st.fixed_dictionaries({SECTION: st.fixed_dictionaries({"task_timeout": st.sampled_from(EXTREMES)})}),
    st.fixed_dictionaries({SECTION: st.fixed_dictionaries({"task_timeout": timeouts})}),
    st.fixed_dictionaries({SECTION: our_section}),
    st.dictionaries(st.just(SECTION) | st.text(max_size=8), our_section, min_size=1, max_size=2),
    json_ish,
)
run_args = st.lists(st.text(max_size=8), max_size=3).map(lambda rest: ["airflow", "tasks", "run", *rest])
commands = st.one_of(
    run_args,
    st.lists(st.text(max_size=8) | st.integers(), max_size=3).map(
        lambda rest: ["airflow", "tasks", "run", *rest]
    ),
    json_ish,
)
queue_names = st.one_of(st.none(), st.text(max_size=8), json_ish)


@pytest.fixture
def executor() -> Iterator[RecordingExecutor]:
    ex = RecordingExecutor(parallelism=4)
    ex.start()
    yield ex
    ex.end()


def ended_once(ex: RecordingExecutor, scheduler: Scheduler, *keys: Any) -> None:
    finals = final_events(ex)
    for key in keys:
        assert finals[key] == 1, key
        assert scheduler.events[key][0] in FINAL


@given(executor_config=executor_configs)
@SETTINGS
def test_any_executor_config_ends_its_task_once_and_spares_the_others(
    executor: RecordingExecutor, executor_config: object
) -> None:
    fuzzed = with_config("ok", executor_config, next(serials))
    good = workloads.task("ok", map_index=next(serials))
    queue(executor, fuzzed, good)
    scheduler = Scheduler(executor)
    scheduler.run_until(lambda: fuzzed.key in scheduler.events and good.key in scheduler.events)
    ended_once(executor, scheduler, fuzzed.key, good.key)
    event(f"{scheduler.events[fuzzed.key][0].value}: {str(scheduler.events[fuzzed.key][1])[:28]}")
    assert scheduler.events[good.key] == (TaskInstanceState.SUCCESS, None)


@given(command=commands, queue_name=queue_names, executor_config=st.none() | executor_configs)
@SETTINGS
def test_any_airflow2_hand_over_ends_once(
    executor: RecordingExecutor, command: object, queue_name: object, executor_config: object
) -> None:
    # A valid command launches the stub entry, which ends it (with a crash when it names no task); an
    # invalid one fails unlaunched. Either way it ends once.
    key = TaskInstanceKey("adapter_dag", "a2", "manual__1", 1, next(serials))
    executor._process_tasks([(key, command, queue_name, executor_config)])  # type: ignore[list-item]
    scheduler = Scheduler(executor)
    scheduler.run_until(lambda: key in scheduler.events)
    ended_once(executor, scheduler, key)
    info = scheduler.events[key][1]
    assert info is None or isinstance(info, str)
    event("refused" if info is not None and info.startswith("not launched: ") else "launched")


# --- option values ---------------------------------------------------------------------------------


def seconds(most: float) -> st.SearchStrategy[str]:
    """Valid values of a number option, the edges included."""
    return st.one_of(
        st.sampled_from(["0", "-0", "1e-300", repr(most)]),
        st.floats(min_value=0, max_value=most).map(repr),
        st.floats(min_value=0, max_value=30).map(str),
    )


VALID: dict[str, st.SearchStrategy[str]] = {
    "shutdown_timeout": seconds(4611686003),
    "termination_grace_period": seconds(4611686003),
    "forkserver_idle_timeout": seconds(1e308),
    "prefetch_multiplier": seconds(1e6),
    "task_timeout": seconds(1e308),
    "min_available_memory_mb": seconds(1e302),  # above the host's memory: the guard holds the workload
    "health_loop_lag_limit": seconds(1e308),
    "health_wait_limit": seconds(1e308),
    "event_loop": st.sampled_from(["auto", "asyncio", "UVLOOP"]),
    "launcher": st.sampled_from(["forkserver", " subprocess "]),
    "queue_limits": st.sampled_from(["", "default:1", "reports:4, default:28"]),
    "workload_cpu_priority": st.sampled_from(["auto", "idle", "normal", "1", "19"]),
}
env_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=10)
numbers = st.one_of(
    st.floats().map(repr),
    st.integers().map(str),
    st.sampled_from(["1e10", "4611686004", "1e303", "1e309", "-1e-300", "nan", "-inf", "1_0", " 2 "]),
    env_text,
)
ANY: dict[str, st.SearchStrategy[str]] = {
    **dict.fromkeys(list(VALID)[:8], numbers),
    "event_loop": st.sampled_from(["trio", ""]) | env_text,
    "launcher": st.sampled_from(["spawn", "FORKSERVER"]) | env_text,
    "queue_limits": st.sampled_from(["default:0", "x", ":3", "a:1:2", "q:" + "9" * 5000]) | env_text,
    "workload_cpu_priority": st.sampled_from(["20", "0", "-1", "nice"]) | numbers,
}


# Values past what consumes them (a thread wait's limit, a float's range); each must be refused by name.
BEYOND: dict[str, list[str]] = {
    "shutdown_timeout": ["4611686004", "1e10"],
    "termination_grace_period": ["4611686004", "9.3e9"],
    "prefetch_multiplier": ["1e308", "1.7e308"],
    "min_available_memory_mb": ["1e303", "1.7e308"],
}


@st.composite
def option_values(draw: st.DrawFn) -> tuple[dict[str, str], str | None]:
    """Valid values for some options, and maybe one more value: arbitrary, or past a limit.

    :return: the options, and the one that may (or, past a limit, must) be refused
    """
    options = draw(st.fixed_dictionaries({}, optional=VALID))
    kind = draw(st.sampled_from(["valid", "arbitrary", "beyond"]))
    if kind == "valid":
        return options, None
    table: dict[str, Any] = ANY if kind == "arbitrary" else {k: st.sampled_from(v) for k, v in BEYOND.items()}
    name = draw(st.sampled_from(sorted(table)))
    options[name] = draw(table[name])
    return options, name


class Watching(RecordingExecutor):
    """Also keeps whether the memory guard is holding workloads back (a floor above the host's memory
    holds the test's workload forever: it then ends with terminate())."""

    memory_low = False

    def _on_report(self, report: Report) -> None:
        self.memory_low = report.state.memory_low
        super()._on_report(report)


@given(drawn=option_values())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_option_values_are_refused_by_name_or_run_a_workload_to_its_end(
    drawn: tuple[dict[str, str], str | None], tmp_path: Path
) -> None:
    options, suspect = drawn
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__STATE_DIR", str(tmp_path / "state"))
        for name, value in options.items():
            mp.setenv(f"AIRFLOW__ASYNC_LOCAL_EXECUTOR__{name.upper()}", value)
        ex = Watching(parallelism=2)
        try:
            ex.start()
        except ValueError as exc:
            refused = str(exc)
            event("refused at start")
            # Only the one value drawn beyond the valid ones may be refused, and the error names it.
            assert refused.startswith(f"[{SECTION}] {suspect} "), (refused, options)
            return
        assert suspect not in BEYOND or options[suspect] not in BEYOND[suspect], "accepted past its limit"
        item = workloads.task("ok", map_index=next(serials))
        scheduler = Scheduler(ex)
        try:
            queue(ex, item)
            scheduler.run_until(lambda: item.key in scheduler.events or ex.memory_low)
        finally:
            if item.key in scheduler.events:
                ex.end()
            else:
                ex.terminate()  # held by the memory guard: end() would wait shutdown_timeout for it
    scheduler.events.update(ex.get_event_buffer())
    ended_once(ex, scheduler, item.key)
    event(f"ran: {scheduler.events[item.key][0].value}")
