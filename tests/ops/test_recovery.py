"""An executor's start after a predecessor handed workloads over (``recovery.reclaim_then_open``): each one
held is recorded in the new journal as a launch of its own and named in its custody file, so a crash of
the new executor hands it on again.

Real processes throughout (tests/ops/handed_over.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops import custody_dir, journal_file, recovery
from async_local_executor.ops.journal import reclaim
from async_local_executor.ops.journal_file import Handover
from tests.core.helpers import alive
from tests.ops.handed_over import TIMEOUT, dead_owner
from tests.processes import read_line

# A new executor that takes over what a dead one handed over, then crashes.
SUCCESSOR = """
import json, sys, time
from pathlib import Path
from async_local_executor.ops import recovery
recovered = recovery.reclaim_then_open(Path(sys.argv[1]), owner="successor")
print(json.dumps({"held": [h.pid for h in recovered.held], "instance": recovered.journal.instance}), flush=True)
time.sleep(600)
"""


def test_a_held_workload_is_recorded_in_the_new_journal_and_named_in_its_custody_file(
    tmp_path: Path, spawned: list[int]
) -> None:
    pids = dead_owner(tmp_path, "handover", spawned)
    held_pid, orphan = int(pids["held"]), int(pids["orphan"])
    start = start_ticks(held_pid)
    assert start is not None
    custody = custody_dir.path(tmp_path)
    stale = custody_dir.name(held_pid, start + 1)  # a workload of the same pid that no longer runs

    recovered = recovery.reclaim_then_open(tmp_path, owner="first successor")
    try:
        assert [each.pid for each in recovered.held] == [held_pid]
        assert recovered.custody == custody
        assert (custody.stat().st_mode & 0o777) == 0o700
        fd = os.open(recovered.journal.path, os.O_RDONLY)
        try:
            _, live, seen, handovers = journal_file.read_all(fd)
        finally:
            os.close(fd)
        assert live == {held_pid: (start, "dag.held try 1")}
        assert seen == {held_pid: {orphan: start_ticks(orphan)}}
        held = recovered.held[0]
        assert handovers == {
            held_pid: Handover(start, TIMEOUT, info=held.info, cgroup=None, held_from=str(pids["instance"]))
        }
        me = (os.getpid(), start_ticks(os.getpid()))
        assert custody_dir.read_owner(custody, held_pid, start) == me
        owner_file = custody / f"{held_pid}-{start}.json"
        assert json.loads(owner_file.read_text()) == {"owner_pid": me[0], "owner_start": me[1]}
        assert (owner_file.stat().st_mode & 0o777) == 0o600
        (custody / f"{stale}.exit").write_text('{"status": 0}')
        # Its supervision starts here: the launch its adopter reports keeps the line that holds it (what
        # was recorded at its real launch), which a crash of this executor leaves to the next one.
        recovered.journal.started(held_pid, "dag.held try 1", handover_timeout=TIMEOUT, info={"adopted": 1})
        fd = os.open(recovered.journal.path, os.O_RDONLY)
        try:
            assert journal_file.read_all(fd)[3] == handovers
        finally:
            os.close(fd)
    finally:
        # As if this executor died: the journal stays, unlocked, without a handover line.
        recovered.journal.hand_on()

    # The next executor holds it as one a crash handed over, and crashes too: the one after it holds it.
    successor = subprocess.Popen(
        [sys.executable, "-c", SUCCESSOR, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    spawned.append(successor.pid)
    taken = json.loads(read_line(successor))
    assert taken["held"] == [held_pid]
    assert not (custody / f"{stale}.exit").exists()  # the start removed what no longer runs
    assert custody_dir.read_owner(custody, held_pid, start) == (successor.pid, start_ticks(successor.pid))
    successor.kill()
    assert successor.wait(60) == -signal.SIGKILL
    if successor.stdout is not None:
        successor.stdout.close()

    result = reclaim(tmp_path)

    assert result.killed == []
    [again] = result.held
    assert (again.pid, again.start, again.instance, again.owner) == (
        held_pid,
        start,
        taken["instance"],
        "successor",
    )
    assert again.crashed
    assert again.info == held.info
    assert again.descendants == ((orphan, start_ticks(orphan)),)
    assert all(alive(int(pids[name])) for name in ("held", "member", "escaped", "orphan", "straggler"))
