"""The skeleton both workload entry points share: exit codes, what it says, and the order of its steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from async_local_executor.adapter.workload import airflow2, entry
from async_local_executor.core import lifeline


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What the skeleton did, in order; the tie to the process is recorded instead of armed here."""
    done: list[str] = []
    monkeypatch.setattr(lifeline, "tie_direct_children", lambda: done.append("tie"))
    return done


def skeleton(steps: list[str], run: object = 0) -> entry.Entry[str]:
    def read(raw: bytes) -> str:
        steps.append(f"read {raw.decode()}")
        if raw == b"bad":
            raise ValueError("no such payload")
        return raw.decode()

    def execute(payload: str) -> int:
        steps.append(f"run {payload}")
        if isinstance(run, BaseException):
            raise run
        assert isinstance(run, int)
        return run

    return entry.Entry("tests.entry", "thing", read, execute)


def test_a_payload_is_read_then_tied_then_run_and_its_code_returned(steps: list[str]) -> None:
    assert skeleton(steps, run=7).run_payload(b"job") == 7
    assert steps == ["read job", "tie", "run job"]


def test_an_unreadable_payload_is_bad_input_said_on_stderr_and_never_run(
    steps: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert skeleton(steps).run_payload(b"bad") == entry.EXIT_BAD_INPUT
    assert steps == ["read bad"]
    assert capsys.readouterr().err == "tests.entry: invalid thing on stdin: no such payload\n"


def test_a_run_that_raises_is_a_crash_with_its_traceback(
    steps: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert skeleton(steps, run=RuntimeError("boom")).run_payload(b"job") == entry.EXIT_CRASHED
    assert "RuntimeError: boom" in capsys.readouterr().err


def test_forked_main_runs_the_payload_handed_over_in_memory(steps: list[str]) -> None:
    code = skeleton(steps, run=5).forked_main(["--cpu-priority", "normal"], b"in memory")
    assert (code, steps) == (5, ["read in memory", "tie", "run in memory"])


def test_both_entry_points_use_the_lifelines_exit_code_for_an_orphan() -> None:
    assert entry.EXIT_ORPHANED == lifeline.EXIT_ORPHANED
    assert (entry.EXIT_OK, entry.EXIT_CRASHED, entry.EXIT_BAD_INPUT) == (0, 1, 2)


@pytest.mark.parametrize(
    "command",
    [
        ["airflow", "dags", "list"],
        ["airflow", "tasks"],
        "airflow tasks run d t r",
        None,
    ],
)
def test_only_an_airflow_tasks_run_command_is_accepted(command: object) -> None:
    with pytest.raises(ValueError, match=r"^not an `airflow tasks run` command: "):
        airflow2.tasks_run_command(command)


def test_an_airflow_tasks_run_command_is_returned_as_it_is() -> None:
    command = ["airflow", "tasks", "run", "dag", "task", "run", "--local"]
    assert airflow2.tasks_run_command(command) is command


def test_the_airflow_2_entry_refuses_any_other_command_as_bad_input(
    steps: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    payload = airflow2.encode_payload(["airflow", "dags", "list"], "title")
    assert airflow2.run_payload(payload) == entry.EXIT_BAD_INPUT
    assert steps == []  # refused before anything was tied or run
    err = capsys.readouterr().err
    assert err.startswith(
        "async_local_executor.adapter.workload.airflow2: invalid command on stdin: not an `airflow"
    )


FREEZE_PROBE = """
import gc, json, os
from async_local_executor.adapter.workload import entry

entry.freeze_before_first_fork()
held = [[i] for i in range(1000)]
assert gc.get_freeze_count() == 0

def fork_and_report():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the task's own process: its own forks freeze nothing
        os.close(r)
        inherited = gc.get_freeze_count()
        made = [[i] for i in range(1000)]
        grandchild = os.fork()
        if grandchild == 0:
            os._exit(0)
        os.waitpid(grandchild, 0)
        os.write(w, json.dumps([inherited, gc.get_freeze_count()]).encode())
        os._exit(0)
    os.close(w)
    seen = json.loads(os.read(r, 100))
    os.waitpid(pid, 0)
    return seen

first = fork_and_report()
after_first = gc.get_freeze_count()
more = [[i] for i in range(1000)]
second = fork_and_report()
print(json.dumps({"first": first, "after_first": after_first, "second": second, "end": gc.get_freeze_count()}))
"""


def test_the_workload_process_freezes_its_objects_before_its_first_fork_only() -> None:
    # A fresh interpreter: forking the test process (and freezing its objects) is not this test's to do.
    done = subprocess.run([sys.executable, "-c", FREEZE_PROBE], capture_output=True, text=True, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    frozen = seen["after_first"]
    assert frozen >= 1000  # what it held at its first fork, the list above included
    for inherited, after_its_fork in (seen["first"], seen["second"]):
        # The task's process inherits them (all but the few of its own that `threading`, which the entry
        # module imports, replaces in a forked child), and freezes no more when it forks in turn.
        assert frozen - 8 <= inherited <= frozen
        assert after_its_fork == inherited
    assert seen["second"] == seen["first"]  # a second fork of the workload process: nothing more frozen
    assert seen["end"] == frozen


def test_a_fresh_workload_interpreter_takes_the_scheduler_s_first_path_entry(tmp_path: Path) -> None:
    # `python -m` puts the working directory first on sys.path; a module there would shadow a library
    # (one the entry module does not import itself: what it imports is loaded before the path is set).
    (tmp_path / "csv.py").write_text("raise SystemExit('the working directory shadowed csv')\n")
    code = (
        "import sys; from async_local_executor.adapter.workload import entry; "
        "args = entry.parse(sys.argv[1:]); entry.prepare(args); print(sys.path[0]); "
        "sys.modules.pop('csv', None); import csv; print(csv.__name__)"
    )
    flags = entry.argv_flags(0, "normal", path0="/the/scheduler/first")
    done = subprocess.run(
        [sys.executable, "-c", code, *flags], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["/the/scheduler/first", "csv"]
    assert entry.parse(flags).path0 == "/the/scheduler/first"
    assert entry.parse(entry.argv_flags(0, "normal")).path0 is None


def test_the_flags_the_executor_writes_are_read_back_whatever_surrounds_them() -> None:
    flags = entry.argv_flags(
        41, "idle", "/learn/here", "/first", handover_timeout=12.5, custody_dir="/state/custody"
    )
    argv = ["-m", "async_local_executor.adapter.workload.airflow3", "--unknown", "x", *flags]
    assert entry.parse(argv) == entry.EntryArgs(41, "idle", "/learn/here", "/first", 12.5, "/state/custody")
    # Written with "=" too, as a hand-written command line may have them; no flag at all: the defaults.
    assert entry.parse(["--parent-pid=7", "--path0=/p"]) == entry.EntryArgs(7, "normal", path0="/p")
    assert entry.parse([]) == entry.EntryArgs(0, "normal")
    # A value is the next word, whatever it starts with; `--` is a word like any other.
    assert entry.parse(["--", "--path0", "-odd", "--custody-dir", "--"]).path0 == "-odd"
    assert entry.parse(["--path0", "-odd", "--custody-dir", "--"]).custody_dir == "--"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--parent-pid", "seven"], "--parent-pid must be a number, got 'seven'"),
        (["--handover-timeout=soon"], "--handover-timeout must be a number, got 'soon'"),
        (["--custody-dir"], "--custody-dir needs a value"),
    ],
)
def test_a_flag_without_a_value_or_with_a_bad_number_is_bad_input_said_on_stderr(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        entry.parse(argv)
    assert exited.value.code == entry.EXIT_BAD_INPUT
    assert said in capsys.readouterr().err
