"""A status file with a field of the wrong kind is read without it (``status_read.read_all``), and says so:
never an exception out of the readers, never a document the health endpoints could not write back as JSON.

Each case is a real status file, written by the executor's own StatusWriter (this test process is its
running writer), with one field then replaced as a broken or foreign writer could leave it.
"""

from __future__ import annotations

import io
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from async_local_executor.ops import cli, overview
from async_local_executor.ops.status_read import read_all
from tests.states import write_full

HOST = "scheduler-host"
NAN, INF = float("nan"), float("inf")
DEEP: Any = 1
for _ in range(50):
    DEEP = [DEEP]


def replace(data: dict[str, Any], where: tuple[str | int, ...], value: object) -> None:
    *parents, last = where
    holder: Any = data
    for step in parents:
        holder = holder[step]
    holder[last] = value


def remove(data: dict[str, Any], where: tuple[str | int, ...]) -> None:
    *parents, last = where
    holder: Any = data
    for step in parents:
        holder = holder[step]
    del holder[last]


MISSING = object()

CASES: list[tuple[tuple[str | int, ...], object, str]] = [
    # (where in the file, what is put there, the problem the reader reports)
    (("recent_finished",), [1, "x", None, []], "recent_finished[0]: not an object"),
    (("recent_finished",), "soon", "recent_finished: not a list"),
    (("recent_finished", 0, "at"), MISSING, "recent_finished[0]: no at"),
    (("recent_finished", 0, "at"), NAN, "recent_finished[0]: at not a finite number"),
    (("recent_finished", 0, "ran_s"), "1.5", "recent_finished[0].ran_s: not a finite number"),
    (("recent_finished", 0, "returncode"), 1.5, "recent_finished[0].returncode: not an integer"),
    (("running",), [3], "running[0]: not an object"),
    (("running",), {"pid": 1}, "running: not a list"),
    (("running", 0, "pid"), MISSING, "running[0]: no pid"),
    (("running", 0, "pid"), "12", "running[0]: pid not a pid"),
    (("running", 0, "memory_mb"), "12", "running[0].memory_mb: not a finite number"),
    (("running", 0, "age_s"), INF, "running[0].age_s: not a finite number"),
    (("running", 0, "key"), ["a"], "running[0]: key not a string"),
    (("waiting",), "3", "waiting: not a count"),
    (("waiting",), NAN, "waiting: not a count"),
    (("parallelism",), True, "parallelism: not a count"),
    (("parallelism",), -INF, "parallelism: not a count"),
    (("loop_lag_ms",), NAN, "loop_lag_ms: not a finite number"),
    (("peak_loop_lag_ms",), "slow", "peak_loop_lag_ms: not a finite number"),
    (("oldest_wait_s",), [], "oldest_wait_s: not a finite number"),
    (("health",), [], "health: not an object"),
    (("health", "status"), MISSING, "health: no status"),
    (("health", "reasons"), [1, {}], "health.reasons[0]: not a string"),
    (("health", "public_codes"), "launcher_degraded", "health.public_codes: not a list"),
    (("memory",), "low", "memory: not an object"),
    (("memory", "available_mb"), "lots", "memory.available_mb: not a finite number"),
    (("memory", "guard_holding"), "no", "memory.guard_holding: not true or false"),
    (("preload",), [1], "preload: not an object"),
    (("preload", "preloaded"), [1, {"kib": 3}], "preload.preloaded[0]: not an object"),
    (("preload", "preloaded", 0, "kib"), NAN, "preload.preloaded[0].kib: not a count"),
    (("preload", "preloaded", 0, "kib"), -1, "preload.preloaded[0].kib: not a count"),
    (("preload", "generation"), -2, "preload.generation: not a count"),
    (("preload", "refused", 0), {"reason": "x"}, "preload.refused[0]: no module"),
    (("preload", "pending"), "numpy", "preload.pending: not a list"),
    (("history",), [[1, 2], "x", [NAN, 1, 1]], "history[0]: not 3 numbers"),
    (("history",), {}, "history: not a list"),
    (("recent_launch_failures",), [None], "recent_launch_failures[0]: not an object"),
    (("recent_launch_failures", 0, "key"), MISSING, "recent_launch_failures[0]: no key"),
    (("totals",), {"ok": "many", "failed": NAN}, "totals.ok: not a count"),
    (("totals",), [], "totals: not an object"),
    (("containment",), "on", "containment: not an object"),
    (("containment", "detail"), 5, "containment.detail: not a string"),
    (("instance",), 3, "instance: not a string"),
    (("team",), 5, "team: not a string"),
    (("launcher_problem",), {}, "launcher_problem: not a string"),
    (("launcher_state",), 1, "launcher_state: not a string"),
    (("a_field_of_a_newer_version",), NAN, "a_field_of_a_newer_version: not a finite number"),
    (("a_field_of_a_newer_version",), DEEP, "a_field_of_a_newer_version: nested too deep"),
]


@pytest.mark.parametrize(
    ("where", "value", "problem"), CASES, ids=[f"{'.'.join(map(str, w))}={v!r:.20}" for w, v, _ in CASES]
)
def test_a_malformed_field_is_left_out_and_named_never_raised(
    tmp_path: Path,
    where: tuple[str | int, ...],
    value: object,
    problem: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = write_full(tmp_path, HOST)
    data = json.loads(path.read_text())
    if value is MISSING:
        remove(data, where)
    else:
        replace(data, where, value)
    path.write_text(json.dumps(data))  # NaN and Infinity as Python's json writes them
    caplog.set_level(logging.WARNING, "async_local_executor.ops.status")

    [found] = read_all(tmp_path)

    assert problem in found.problems
    assert found.stale is None  # its writer (this process) runs: the file is still its status
    now = time.time()
    public = overview.health([found], HOST, now)
    private = overview.status([found], HOST, now, tmp_path)
    # As the endpoints answer: NaN or Infinity would make their JSON responses fail.
    json.dumps(public, allow_nan=False)
    json.dumps(private, allow_nan=False)
    [executor] = private["executors"]
    assert problem in executor["problems"]
    Console(file=io.StringIO()).print(cli.render([found], tmp_path))
    cli.main(["status", "--check", "--state-dir", str(tmp_path)])
    [warning] = [r.getMessage() for r in caplog.records]
    assert str(path) in warning
    assert problem in warning


def test_an_intact_file_has_no_problems_and_keeps_every_field(tmp_path: Path) -> None:
    path = write_full(tmp_path, HOST)
    [found] = read_all(tmp_path)
    assert found.problems == ()
    assert found.data == json.loads(path.read_text())
    [executor] = overview.status([found], HOST, time.time(), tmp_path)["executors"]
    assert executor["problems"] == []


def test_an_unusable_health_field_makes_the_verdict_unknown(tmp_path: Path) -> None:
    path = write_full(tmp_path, HOST)
    data = json.loads(path.read_text())
    data["health"] = {"status": ["healthy"]}
    path.write_text(json.dumps(data))
    [found] = read_all(tmp_path)
    [instance] = overview.health([found], HOST, time.time())["instances"]
    assert (instance["verdict"], instance["reason_codes"]) == ("unknown", ["unknown_verdict"])
