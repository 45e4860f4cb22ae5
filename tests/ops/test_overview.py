"""What the health endpoint and the dashboard make of this host's status files (ops/overview.py).

Real status files, written by the executor's own StatusWriter and read back by read_all, so the
liveness checks (the writer's pid and start time) are the real ones: a file of this test process is
a running executor's, one of a process that exited is a stopped scheduler's.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import time
from pathlib import Path

from rich.console import Console

from async_local_executor.core.health import Health, Report, Thresholds, Verdict, assess
from async_local_executor.core.state import LaunchFailure, RunningWorkload
from async_local_executor.ops import cli, overview
from async_local_executor.ops.status import StatusWriter, status_path
from async_local_executor.ops.status_read import STALE_AFTER, Found, read_all
from tests.core.helpers import py
from tests.states import meta, quiet

HOST = "scheduler-host"


def write(
    directory: Path, instance: str, health: Health, *, pid: int | None = None, **fields: object
) -> None:
    state = quiet(running=(RunningWorkload("etl.load[3] try 2", os.getpid(), time.time() - 5, "default"),))
    writer = StatusWriter(
        status_path(directory, instance),
        meta(instance, **{"pid": pid or os.getpid(), "hostname": HOST, **fields}),
    )
    writer.write(Report(time.monotonic(), 0.0, 0.0, health, state))


def exited_pid() -> int:
    gone = subprocess.Popen(py("pass"))
    gone.wait()
    return gone.pid


def test_a_running_healthy_executor_is_healthy_and_its_workloads_are_listed(tmp_path: Path) -> None:
    write(tmp_path, "a", Health(Verdict.HEALTHY))
    found = read_all(tmp_path)
    health = overview.health(found, HOST, time.time())
    assert health["status"] == "healthy"
    [instance] = health["instances"]
    assert set(instance) == {
        "hostname",
        "instance",
        "verdict",
        "reasons",
        "reason_codes",
        "updated_at",
        "age_s",
    }
    assert (instance["hostname"], instance["instance"], instance["verdict"]) == (HOST, "a", "healthy")
    assert instance["reasons"] == instance["reason_codes"] == []
    assert 0 <= instance["age_s"] < STALE_AFTER
    status = overview.status(found, HOST, time.time(), tmp_path)
    [executor] = status["executors"]
    [row] = executor["running"]
    assert (row["task"], row["try"], row["pid"]) == ("etl.load[3]", 2, os.getpid())
    assert (executor["verdict"], executor["parallelism"], executor["prefetched"]) == ("healthy", 4, 0)
    assert status["state_dir"] == str(tmp_path)


def test_the_public_document_names_no_task_and_no_pid(tmp_path: Path) -> None:
    failures = tuple(LaunchFailure(time.time(), "etl.secret_task try 1", "boom") for _ in range(3))
    problem = f"fork server (pid {os.getpid()}) is not running; a new one is starting"
    health = assess(quiet(launcher_problem=problem, recent_failures=failures), 0.0, Thresholds(), time.time())
    write(tmp_path, "a", health)
    found = read_all(tmp_path)
    public = overview.health(found, HOST, time.time())
    assert public["status"] == "unhealthy"
    assert public["instances"][0]["reasons"] == ["the launch path is degraded", "launches keep failing"]
    assert public["instances"][0]["reason_codes"] == ["launcher_degraded", "launch_failures"]
    text = json.dumps(public)
    assert "secret_task" not in text
    assert "etl.load" not in text
    assert str(os.getpid()) not in text
    # The authenticated document has them all.
    [executor] = overview.status(found, HOST, time.time(), tmp_path)["executors"]
    assert executor["reasons"] == list(health.reasons)


def test_a_stopped_scheduler_is_unknown_and_does_not_hide_a_running_one(tmp_path: Path) -> None:
    write(tmp_path, "old", Health(Verdict.HEALTHY), pid=exited_pid())
    found = read_all(tmp_path)
    alone = overview.health(found, HOST, time.time())
    assert alone["status"] == "unknown"
    assert alone["instances"][0]["verdict"] == "unknown"
    assert alone["instances"][0]["reasons"] == ["its scheduler is not running"]
    assert alone["instances"][0]["reason_codes"] == ["scheduler_gone"]
    [executor] = overview.status(found, HOST, time.time(), tmp_path)["executors"]
    assert executor["gone"]
    assert "is not running: stopped or killed" in executor["reasons"][0]

    write(tmp_path, "new", Health(Verdict.HEALTHY))
    both = overview.health(read_all(tmp_path), HOST, time.time())
    assert both["status"] == "healthy"
    assert {i["instance"]: i["verdict"] for i in both["instances"]} == {"old": "unknown", "new": "healthy"}


def test_a_running_scheduler_whose_status_stopped_is_unhealthy(tmp_path: Path) -> None:
    write(tmp_path, "a", Health(Verdict.HEALTHY))
    later = time.time() + STALE_AFTER + 30
    health = overview.health(read_all(tmp_path, now=later), HOST, later)
    assert health["status"] == "unhealthy"
    assert health["instances"][0]["reasons"] == [
        "its scheduler runs, but its executor stopped updating its status"
    ]
    [executor] = overview.status(read_all(tmp_path, now=later), HOST, later, tmp_path)["executors"]
    [reason] = executor["reasons"]
    assert reason.startswith("its scheduler runs, but its status was not updated for ")


def test_a_status_from_another_host_is_never_healthy(tmp_path: Path) -> None:
    # Its pid happens to run here (it is this test's own): that says nothing about the other host.
    write(tmp_path, "a", Health(Verdict.HEALTHY), hostname="other-host")
    health = overview.health(read_all(tmp_path), HOST, time.time())
    assert health["status"] == "unknown"
    [instance] = health["instances"]
    assert (instance["hostname"], instance["verdict"]) == ("other-host", "unknown")
    assert instance["reason_codes"] == ["other_host"]
    assert "other-host" not in json.dumps(instance["reasons"])  # its name is in "hostname", once
    [executor] = overview.status(read_all(tmp_path), HOST, time.time(), tmp_path)["executors"]
    assert "written on host other-host, and this api-server runs on scheduler-host" in executor["reasons"][0]


def test_no_status_at_all_is_unknown_and_says_why(tmp_path: Path) -> None:
    health = overview.health([], HOST, time.time())
    assert health["status"] == "unknown"
    assert health["instances"] == []
    assert "no executor status on host scheduler-host" in health["reason"]
    assert overview.status([], HOST, time.time(), tmp_path)["reason"] == health["reason"]


def test_an_unhealthy_executor_makes_the_host_unhealthy(tmp_path: Path) -> None:
    write(tmp_path, "a", Health(Verdict.HEALTHY))
    write(
        tmp_path,
        "b",
        Health(Verdict.UNHEALTHY, ("event loop lagging 3.0s (limit 1s)",), codes=("loop_lagging",)),
    )
    health = overview.health(read_all(tmp_path), HOST, time.time())
    assert health["status"] == "unhealthy"
    assert {i["instance"]: i["reasons"] for i in health["instances"]} == {
        "a": [],
        "b": ["the executor's event loop is lagging"],
    }


def test_a_launcher_problem_naming_a_module_and_a_pid_goes_public_as_a_code_and_fixed_words(
    tmp_path: Path,
) -> None:
    problem = (
        "fork server could not start (pid 31337: preloading secret_vendor_sdk.client failed: ImportError: "
        "/opt/secret/lib.so); workloads start fresh interpreters until it is back"
    )
    write(tmp_path, "a", assess(quiet(launcher_problem=problem), 0.0, Thresholds(), time.time()))
    found = read_all(tmp_path)
    [instance] = overview.health(found, HOST, time.time())["instances"]
    assert (instance["reason_codes"], instance["reasons"]) == (
        ["launcher_degraded"],
        ["the launch path is degraded"],
    )
    [executor] = overview.status(found, HOST, time.time(), tmp_path)["executors"]
    assert executor["reasons"] == [problem]
    assert executor["reason_codes"] == ["launcher_degraded"]


def test_what_a_status_file_says_in_words_never_goes_public(tmp_path: Path) -> None:
    # A file of an older version (its public reasons in words, pids stripped but module names kept), or
    # one of a newer version with codes this one does not know.
    write(tmp_path, "a", Health(Verdict.HEALTHY))
    path = status_path(tmp_path, "a")
    data = json.loads(path.read_text())
    data["health"] = {
        "status": "unhealthy",
        "reasons": ["fork server could not start (preloading secret_mod failed)"],
        "public_reasons": ["fork server could not start (preloading secret_mod failed)"],
        "public_codes": ["launcher_degraded", "<b>secret_mod</b>", "memory_low", "launcher_degraded"],
    }
    path.write_text(json.dumps(data))
    [instance] = overview.health(read_all(tmp_path), HOST, time.time())["instances"]
    assert instance["reason_codes"] == ["launcher_degraded", "reasons_withheld", "memory_low"]
    assert instance["reasons"] == [
        "the launch path is degraded",
        "the reasons are in the authenticated status",
        "the memory guard is holding workloads until memory frees up",
    ]
    assert "secret_mod" not in json.dumps(instance)


def rendered(found: list[Found], directory: Path) -> str:
    out = io.StringIO()
    Console(file=out, width=200).print(cli.render(found, directory))
    return out.getvalue()


def test_a_handed_over_workload_is_marked_held_until_claimed_then_adopted(tmp_path: Path) -> None:
    # Three workloads of this process's (no cgroup of their own: their memory comes from /proc): one a
    # predecessor handed over whose task instance Airflow has not offered yet, one it offered and the
    # executor claimed, and one launched here.
    held, claimed, launched = os.getpid(), os.getppid(), os.getpid()
    state = quiet(
        running=(
            RunningWorkload("etl.load[3] try 2", held, time.time() - 5, "default", adopted=True),
            RunningWorkload("etl.load[5] try 1", claimed, time.time() - 3, "default", adopted=True),
            RunningWorkload("etl.load[4] try 1", launched, time.time() - 1, "default"),
        )
    )
    writer = StatusWriter(
        status_path(tmp_path, "a"),
        meta("a"),
        claimed=lambda pid: pid == claimed,
    )
    writer.write(Report(time.monotonic(), 0.0, 0.0, Health(Verdict.HEALTHY), state))

    [found] = read_all(tmp_path)
    assert [row.get("adoption") for row in found.data["running"]] == ["held", "adopted", None]
    [shown] = overview.status([found], HOST, time.time(), tmp_path)["executors"]
    assert [(w["task"], w.get("adoption")) for w in shown["running"]] == [
        ("etl.load[3]", "held"),
        ("etl.load[5]", "adopted"),
        ("etl.load[4]", None),
    ]
    lines = rendered([found], tmp_path).splitlines()
    assert [line.split("  ")[0] for line in lines if line.startswith("etl.")] == [
        "etl.load[3] try 2 (held for adoption)",
        "etl.load[5] try 1 (adopted)",
        "etl.load[4] try 1",
    ]


def test_a_writer_not_told_which_are_claimed_marks_every_handed_over_workload_adopted(tmp_path: Path) -> None:
    state = quiet(
        running=(RunningWorkload("etl.load[3] try 2", os.getpid(), time.time() - 5, "default", adopted=True),)
    )
    writer = StatusWriter(status_path(tmp_path, "a"), meta("a"))
    writer.write(Report(time.monotonic(), 0.0, 0.0, Health(Verdict.HEALTHY), state))
    [found] = read_all(tmp_path)
    assert found.data["running"][0]["adoption"] == "adopted"
    [shown] = overview.status([found], HOST, time.time(), tmp_path)["executors"]
    assert shown["running"][0]["adoption"] == "adopted"
    assert "etl.load[3] try 2 (adopted)" in rendered([found], tmp_path)


def _controlled(directory: Path, fields: dict[str, object]) -> list[Found]:
    base: dict[str, object] = {
        "by": "alice",
        "at": 1000.0,
        "deadline": None,
        "overdue": False,
        "still_running": [],
        "serial": 3,
        "parallelism": 8,
        "configured_parallelism": 4,
        "queue_limits": {},
        "configured_queue_limits": {},
    }
    control = {**base, **fields}
    writer = StatusWriter(
        status_path(directory, "a"),
        meta("a", pid=os.getpid(), hostname=HOST),
        control=lambda: control,  # type: ignore[arg-type,return-value]
    )
    writer.write(Report(time.monotonic(), 0.0, 0.0, Health(Verdict.HEALTHY), quiet()))
    return read_all(directory)


def test_a_paused_executor_is_healthy_and_says_who_paused_it_and_an_overdue_drain_is_a_warning(
    tmp_path: Path,
) -> None:
    found = _controlled(tmp_path, {"mode": "paused", "note": "paused by alice at 1970-01-01 00:16:40 UTC"})
    health = overview.health(found, HOST, time.time())
    [instance] = health["instances"]
    assert health["status"] == "healthy"
    assert (instance["control"], instance["control_note"], instance["warnings"]) == (
        "paused",
        "paused by alice at 1970-01-01 00:16:40 UTC",
        [],
    )
    # The live limit, not the configured one, is what the page's slots count against.
    [executor] = overview.status(found, HOST, time.time(), tmp_path)["executors"]
    assert executor["control"]["parallelism"] == 8
    console = Console(file=io.StringIO(), width=200)
    console.print(cli.render(found, tmp_path))
    shown = console.file.getvalue()  # type: ignore[attr-defined]
    assert "live control: paused by alice at 1970-01-01 00:16:40 UTC; parallelism 8 (configured 4)" in shown

    late = _controlled(
        tmp_path,
        {
            "mode": "draining",
            "note": "draining by alice",
            "overdue": True,
            "still_running": ["etl.load try 1"],
        },
    )
    [instance] = overview.health(late, HOST, time.time())["instances"]
    assert instance["verdict"] == "healthy"
    assert instance["warnings"] == [overview.OVERDUE]
    assert "etl.load" not in json.dumps(overview.health(late, HOST, time.time()))
    console = Console(file=io.StringIO(), width=200)
    console.print(cli.render(late, tmp_path))
    assert "the drain passed its deadline while these ran: etl.load try 1" in console.file.getvalue()  # type: ignore[attr-defined]
