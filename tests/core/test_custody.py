"""A workload in custody, with real processes: it outlives its owner, waits for a successor, then kills itself.

A stand-in for the executor (the "owner") starts a workload process in a session of its own, reads its
output pipe and passes each line on to the test. The workload takes custody with the owner's pid, forks a
grandchild into its process group, and then does what the test writes on its stdin (which it inherited
from the owner, so the test can still tell it what to do once the owner is dead).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from uuid import uuid4

import pytest

from async_local_executor.core import custody, custody_files
from async_local_executor.core.cgroups.names import PREFIX
from async_local_executor.core.custody_files import WRITING
from async_local_executor.core.proc_identity import start_ticks
from tests.core.cgroups import helpers as cgroup_helpers
from tests.core.cgroups.helpers import read_line, scratch
from tests.core.handing import OWNER_GONE, TIMEOUT, WORKLOAD, Handed
from tests.core.helpers import GUARD
from tests.processes import exits
from tests.waits import poll

pytestmark = pytest.mark.skipif(not custody.supported(), reason="custody is Linux's")


@pytest.fixture
def handed(tmp_path: Path) -> Iterator[Callable[..., Handed]]:
    started: list[Handed] = []

    def start(directory: Path | None = None, **kwargs: object) -> Handed:
        if directory is None:
            directory = tmp_path / "custody"
            directory.mkdir(mode=0o700, exist_ok=True)
        made = Handed(directory, **kwargs)  # type: ignore[arg-type]
        started.append(made)
        return made

    yield start
    for made in started:
        made.cleanup()


def test_a_workload_in_custody_shows_its_watchdog_and_nothing_it_forks_or_its_owner_does(
    handed: Callable[..., Handed],
) -> None:
    # What another deployment's reclaim reads to leave a handed-over workload to its watchdog.
    workload = handed()
    assert custody.watched(workload.pid)
    assert not custody.watched(workload.grandchild)  # a fork has the forking thread only
    assert not custody.watched(workload.owner.pid)
    workload.kill_owner()
    assert custody.watched(workload.pid)  # waiting for a successor: the watchdog is what bounds it
    assert not custody.watched(os.getpid())


def test_while_its_owner_lives_the_output_goes_to_the_owner_and_nothing_is_written(
    handed: Callable[..., Handed],
) -> None:
    workload = handed()
    workload.tell("say hello through the relay")
    assert workload.expect("relayed hello") == "relayed hello through the relay"
    workload.tell("burst 100")  # more than a pipe holds: the relay keeps up with the owner
    workload.expect("relayed burst done")
    assert sorted(p.name for p in workload.directory.iterdir()) == []


def test_a_workload_outlives_its_killed_owner_then_kills_itself_and_its_group_after_the_timeout(
    handed: Callable[..., Handed], tmp_path: Path
) -> None:
    workload = handed(tmp_path / "made" / "custody")  # missing: the workload makes it
    killed = time.monotonic()
    workload.kill_owner()
    workload.tell("say still here")
    poll("the workload's output in its .out", lambda: "still here\n" in workload.out(), GUARD)
    assert stat.S_IMODE(workload.directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(workload.file(".out").stat().st_mode) == 0o600
    assert exits(workload.pid, TIMEOUT + GUARD), "the workload outlived its timeout"
    assert time.monotonic() - killed >= TIMEOUT, "the workload did not wait for a successor"
    assert exits(workload.grandchild, GUARD), "the workload's process group outlived it"
    said = f"workload process {workload.pid} kills itself and its tree: no scheduler adopted it within 2 s"
    assert said in workload.out()
    assert not workload.file(".exit").exists()  # killed: no exit code of its own


def test_a_claim_by_a_live_successor_keeps_the_workload_until_that_one_dies_too(
    handed: Callable[..., Handed],
) -> None:
    workload = handed()
    successor = workload.successor()
    workload.kill_owner()
    assert not exits(workload.pid, TIMEOUT + 1.5), "the workload died although a successor claimed it"
    workload.tell("say adopted")
    poll("the adopted workload's output in its .out", lambda: "adopted\n" in workload.out(), GUARD)
    successor.kill()
    died = time.monotonic()
    successor.wait(GUARD)
    assert exits(workload.pid, TIMEOUT + GUARD), (
        "the workload outlived its successor by more than the timeout"
    )
    assert time.monotonic() - died >= TIMEOUT, "the countdown did not start again at the successor's death"
    assert exits(workload.grandchild, GUARD)


def test_a_claim_naming_a_pid_that_does_not_run_as_its_recorded_start_is_ignored(
    handed: Callable[..., Handed], tmp_path: Path
) -> None:
    workload = handed()
    elsewhere = tmp_path / "claim.json"
    successor = workload.successor(claim_for=elsewhere)
    claim = json.loads(elsewhere.read_text())
    # The successor's pid, but not its start: the process a pid once was, reused since.
    workload.file(".json").write_text(json.dumps({**claim, "owner_start": claim["owner_start"] - 1}))
    killed = time.monotonic()
    workload.kill_owner()
    assert exits(workload.pid, TIMEOUT + GUARD), "a claim by a pid that is another process kept it"
    assert time.monotonic() - killed >= TIMEOUT
    assert successor.poll() is None  # the pid named was running all along


def test_the_exit_code_of_a_workload_handed_over_is_recorded_0600(handed: Callable[..., Handed]) -> None:
    workload = handed()
    workload.kill_owner()
    workload.tell("say before the end")
    workload.tell("exit 5")
    assert exits(workload.pid, GUARD)
    assert json.loads(workload.file(".exit").read_text()) == {"status": 5}
    assert stat.S_IMODE(workload.file(".exit").stat().st_mode) == 0o600
    assert "before the end\n" in workload.out()  # copied before the code was recorded
    assert [p.name for p in workload.directory.iterdir() if WRITING in p.name] == []


@pytest.mark.parametrize("claimed", [False, True], ids=["owner-kept-it", "owner-handed-it-over"])
def test_while_its_owner_lives_the_exit_code_is_recorded_only_once_the_workload_is_claimed(
    handed: Callable[..., Handed], claimed: bool
) -> None:
    workload = handed()
    if claimed:  # as the owner does when it hands the workload over: naming itself until it exits
        assert workload.owner.pid is not None
        owner = {"owner_pid": workload.owner.pid, "owner_start": start_ticks(workload.owner.pid)}
        workload.file(".json").write_text(json.dumps(owner))
    workload.tell("exit 7")
    assert workload.expect("exited") == "exited 7"  # the owner reads it as its child's, as ever
    if claimed:
        assert json.loads(workload.file(".exit").read_text()) == {"status": 7}
    else:
        assert not workload.file(".exit").exists()


def test_output_after_the_owner_s_death_never_blocks_nor_raises(handed: Callable[..., Handed]) -> None:
    workload = handed()
    workload.kill_owner()
    workload.tell("burst 300")  # far more than a pipe holds
    poll("the end of the burst in the .out", lambda: "burst done\n" in workload.out(), GUARD)
    out = workload.out()
    assert out.count("x" * 1023 + "\n") == 300
    assert "straight to fd 2\n" in out
    assert not (workload.directory / "raised").exists()


def test_a_reader_of_the_dead_owner_s_pipe_left_behind_does_not_block_the_workload(
    handed: Callable[..., Handed],
) -> None:
    workload = handed(leak=True)  # the pipe keeps a reader that never reads once the owner is gone
    workload.kill_owner()
    workload.tell("burst 300")
    poll("the end of the burst in the .out", lambda: "burst done\n" in workload.out(), GUARD)
    assert not (workload.directory / "raised").exists()


def test_the_out_file_stops_at_its_cap(handed: Callable[..., Handed]) -> None:
    workload = handed()
    workload.kill_owner()
    workload.tell(f"burst {custody.OUT_CAP // 1024 + 512}")
    workload.tell("exit 0")  # after the burst: the .exit says it is over
    poll("the workload's .exit", lambda: workload.file(".exit").exists(), GUARD)
    size = workload.file(".out").stat().st_size
    note = "\n[async_local_executor: output past 8 MiB dropped]\n"
    assert size == custody.OUT_CAP + len(note)
    assert workload.out().endswith(note)


def test_custody_is_refused_when_the_parent_named_is_not_the_parent(tmp_path: Path) -> None:
    code = "import sys; from async_local_executor.core.custody import Custody; print(Custody.start(1, 1.0, sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert done.stdout == "None\n"


def test_a_fifo_or_a_link_under_the_claim_s_name_neither_stops_the_countdown_nor_keeps_the_workload(
    handed: Callable[..., Handed], tmp_path: Path
) -> None:
    workload = handed()
    elsewhere = tmp_path / "claim.json"
    workload.successor(claim_for=elsewhere)  # a claim naming a live process, outside the directory
    workload.file(".json").symlink_to(elsewhere)
    other = handed()
    os.mkfifo(other.file(".json"), 0o600)  # an open() for reading would wait for a writer for ever
    killed = time.monotonic()
    workload.kill_owner()
    other.kill_owner()
    assert exits(other.pid, TIMEOUT + GUARD), "a FIFO under the claim's name stopped the countdown"
    assert exits(workload.pid, TIMEOUT + GUARD), "a link under the claim's name kept the workload"
    assert time.monotonic() - killed >= TIMEOUT


def test_a_fifo_under_the_output_s_name_neither_blocks_the_workload_nor_its_exit(
    handed: Callable[..., Handed],
) -> None:
    workload = handed(timeout=GUARD)  # would it block, its countdown would not end it before the guard
    os.mkfifo(workload.file(".out"), 0o600)  # an open() for writing would wait for a reader for ever
    workload.kill_owner()
    workload.tell("burst 300")  # far more than its pipe holds: only a relay that goes on lets it finish
    workload.tell("exit 4")
    poll("the exit code of the workload", lambda: workload.file(".exit").exists(), GUARD)
    assert json.loads(workload.file(".exit").read_text()) == {"status": 4}


def _holds_pidfd_of(pid: int, target: int) -> bool:
    """Whether process ``pid`` holds a pidfd of ``target``: how its watchdog follows an owner."""
    try:
        fds = os.listdir(f"/proc/{pid}/fdinfo")
    except OSError:
        return False
    for fd in fds:
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                if f"Pid:\t{target}\n" in info.read():
                    return True
        except OSError:  # closed meanwhile
            continue
    return False


def test_successors_that_each_exit_soon_after_their_claim_renew_nothing_but_one_that_stayed_does(
    handed: Callable[..., Handed],
) -> None:
    # A scheduler that crash-loops claims the workload on each start: without a bound over all of them,
    # each claim would give it its whole countdown again, and it would outlive its owners for ever.
    workload = handed()
    workload.kill_owner()
    assert not exits(workload.pid, TIMEOUT * 0.75)  # most of its countdown spent without an owner
    stayed = workload.successor()
    poll("the watchdog to follow the successor", lambda: _holds_pidfd_of(workload.pid, stayed.pid), GUARD)
    assert not exits(workload.pid, TIMEOUT + 0.5)  # it stays for longer than the timeout: it ran
    # Read before the kill: the watchdog sees the death no earlier, and counts its countdown from there
    # (read after the wait, a busy host's late return would shorten the interval this test measures).
    left = time.monotonic()
    stayed.kill()
    stayed.wait(GUARD)
    claims = 0
    # Each one killed as soon as the watchdog follows it: owned for next to nothing each time.
    while not exits(workload.pid, 0):
        assert claims < 100, "successors that each exited at once kept the workload"
        brief = workload.successor()
        while not _holds_pidfd_of(workload.pid, brief.pid) and not exits(workload.pid, 0.01):
            pass
        brief.kill()
        brief.wait(GUARD)
        claims += 1
    # The whole countdown again after the one that stayed (the time spent before it was forgiven),
    # then no more than that without a live owner, over every claim.
    assert time.monotonic() - left >= TIMEOUT, "the successor that stayed did not renew the countdown"
    assert claims >= 2
    said = "kills itself and its tree: 2 s without a live owner in all, over "
    assert said in workload.out()


def test_a_workload_whose_owner_exited_before_it_took_custody_waits_for_a_successor(
    tmp_path: Path,
) -> None:
    # As a stopping scheduler does when it releases a workload that is still starting: it exits first.
    directory = tmp_path / "custody"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER_GONE, WORKLOAD, str(TIMEOUT), str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    pid = 0
    try:
        pid = int(read_line(owner, GUARD).split()[1])
        name = custody_files.name(pid, start_ticks(pid) or 0)
        out = directory / f"{name}.out"
        poll("the workload in custody", lambda: out.exists() and "ready" in out.read_text(), GUARD)
        me = {"owner_pid": os.getpid(), "owner_start": start_ticks(os.getpid())}  # this test adopts it
        (directory / f"{name}.json").write_text(json.dumps(me))
        assert not exits(pid, TIMEOUT + 1.0), "the workload did not wait for its successor's claim"
        assert owner.stdin is not None
        owner.stdin.write("say adopted\nexit 6\n")
        owner.stdin.flush()
        poll("the workload's exit code", lambda: (directory / f"{name}.exit").exists(), GUARD)
        assert json.loads((directory / f"{name}.exit").read_text()) == {"status": 6}
        assert "adopted\n" in out.read_text()
    finally:
        with contextlib.suppress(OSError):
            if pid:
                os.killpg(pid, signal.SIGKILL)
        owner.wait(GUARD)
        for pipe in (owner.stdin, owner.stdout):
            if pipe is not None:
                pipe.close()


def test_only_a_workload_that_fails_after_its_owner_s_exit_tells_its_last_lines_before_its_code(
    handed: Callable[..., Handed],
) -> None:
    failed, fine, kept = handed(), handed(), handed()
    failed.tell("say while the owner lives")  # not told: its owner's pipe had it
    failed.expect("relayed while the owner lives")
    failed.kill_owner()
    failed.tell("say Traceback (most recent call last):")
    failed.tell("say ValueError: boom")
    failed.tell("exit 1")
    fine.kill_owner()
    fine.tell("say fine")
    fine.tell("exit 0")
    kept.tell("exit 1")  # its owner lives and relays its output: the scheduler log has its tail
    assert kept.expect("exited") == "exited 1"
    poll("both exit codes", lambda: failed.file(".exit").exists() and fine.file(".exit").exists(), GUARD)
    # Told before its code was recorded: an adopter that reads the code finds the lines in the task's log.
    header = (
        f"async_local_executor: workload process {failed.pid} exited with code 1; its last 2 output "
        "line(s) since its owner's exit:"
    )
    assert failed.told() == [[header, "Traceback (most recent call last):", "ValueError: boom"]]
    assert fine.told() == kept.told() == []


def test_a_workload_that_kills_itself_tells_why_with_its_last_lines(handed: Callable[..., Handed]) -> None:
    workload = handed()
    workload.kill_owner()
    workload.tell("say still here")
    assert exits(workload.pid, TIMEOUT + GUARD)
    [told] = workload.told()
    assert told[0] == (
        f"async_local_executor: workload process {workload.pid} killed itself; its last 2 output line(s) "
        "since its owner's exit:"
    )
    said = (
        f"async_local_executor: workload process {workload.pid} kills itself and its tree: no scheduler "
        "adopted it within 2 s of its owner's exit"
    )
    assert told[1:] == ["still here", said]


# The workload's own cgroup.


def _files(tmp_path: Path, cgroup: str, root: str = "/") -> tuple[str, str]:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"41 31 0:38 {root} /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
    proc_cgroup = tmp_path / "cgroup"
    proc_cgroup.write_text(f"4:memory:/elsewhere\n0::{cgroup}\n")
    return str(mountinfo), str(proc_cgroup)


INSTANCE = f"{PREFIX}1234-t5678-0123456789ab"


@pytest.mark.parametrize(
    ("cgroup", "root", "found"),
    [
        (f"/ale-root/{INSTANCE}/w12", "/", f"/sys/fs/cgroup/unified/ale-root/{INSTANCE}/w12"),
        (f"/ale-root/{INSTANCE}/w12", "/ale-root", f"/sys/fs/cgroup/unified/{INSTANCE}/w12"),
        ("/ale-root/1234-t5678-0123456789ab/w1", "/", None),  # no prefix: not an instance's directory
        (f"/ale-root/{PREFIX}1234-5678-0123456789ab/w1", "/", None),  # not an executor's instance name
        (f"/ale-root/{INSTANCE}", "/", None),  # the instance's own cgroup: the executor's
        ("/system.slice/airflow-scheduler.service/w1", "/", None),  # a w1 that is not ours
        (f"/ale-root/{INSTANCE}/w12x", "/", None),
        ("/", "/", None),
    ],
)
def test_only_a_workload_cgroup_named_by_the_contained_launcher_is_the_workload_s(
    tmp_path: Path, cgroup: str, root: str, found: str | None
) -> None:
    mountinfo, proc_cgroup = _files(tmp_path, cgroup, root)
    got = custody.workload_cgroup(mountinfo, proc_cgroup)
    assert (str(got) if got is not None else None) == found


def test_the_cgroup_without_cgroup_kill_is_killed_pid_by_pid_but_the_one_spared(tmp_path: Path) -> None:
    sleepers = [subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"]) for _ in range(2)]
    try:
        (tmp_path / "cgroup.procs").write_text("".join(f"{p.pid}\n" for p in sleepers) + f"{os.getpid()}\n")
        custody.kill_cgroup(tmp_path, spare=os.getpid())
        assert [p.wait(GUARD) for p in sleepers] == [-signal.SIGKILL, -signal.SIGKILL]
    finally:
        for proc in sleepers:
            proc.kill()
            proc.wait(GUARD)


@pytest.mark.skipif(bool(cgroup_helpers.unusable()), reason=cgroup_helpers.unusable())
def test_an_expired_workload_kills_its_whole_cgroup(handed: Callable[..., Handed]) -> None:
    with scratch() as made:
        ticks = start_ticks(os.getpid())
        w1 = made.directory / f"{PREFIX}{os.getpid()}-t{ticks}-{uuid4().hex[:12]}" / "w1"
        w1.mkdir(parents=True)
        workload = handed()
        (w1 / "cgroup.procs").write_text(str(workload.pid))
        workload.tell("escape")  # forked inside the cgroup, out of the process group
        escaped = int(workload.expect("relayed escaped").split()[2])
        workload.kill_owner()
        assert exits(workload.pid, TIMEOUT + GUARD)
        assert exits(escaped, GUARD), "a process in the workload's cgroup outlived it"
        assert exits(workload.grandchild, GUARD), "the workload's process group outlived it"
        poll("the killed cgroup to empty", lambda: not (w1 / "cgroup.procs").read_text().strip(), GUARD)
