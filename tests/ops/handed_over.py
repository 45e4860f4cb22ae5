"""An executor stand-in that launches a workload tree to outlive it and hands it over (or crashes), for the
tests of what the next executor makes of it: its reclaim (test_reclaim_handover.py) and its start
(test_recovery.py).

The dead executor is a child process that wrote its journal and exited (or was killed); the workload is
a real process tree.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from async_local_executor.ops.journal import INSTANCE_ENV
from tests.processes import SLEEP, read_line

TIMEOUT = 300.0  # the handover_timeout the stand-in launches its workload with

# A handed-over workload's tree: a process left in its group; a marked one that left the group (setsid);
# one whose parent exited at once, so that nothing but the journal's "seen" line ties it to the workload
# (it left the group too, and its parent chain ends at init); and one whose parent exited too, that
# stayed in the group but dropped the mark.
MIDDLE = """
import os, subprocess, sys
clean = {k: v for k, v in os.environ.items() if k != sys.argv[1]}
orphan = subprocess.Popen(sys.argv[2:], start_new_session=True)
straggler = subprocess.Popen(sys.argv[2:], env=clean)
print(orphan.pid, straggler.pid, flush=True)
"""


WORKLOAD = f"""
import json, subprocess, sys
sleep = {SLEEP!r}
member = subprocess.Popen(sleep)
escaped = subprocess.Popen(sleep, start_new_session=True)
middle = subprocess.Popen(
    [sys.executable, "-c", {MIDDLE!r}, {INSTANCE_ENV!r}, *sleep], stdout=subprocess.PIPE, text=True
)
orphan, straggler = map(int, middle.stdout.readline().split())
middle.wait()
found = {{"member": member.pid, "escaped": escaped.pid, "orphan": orphan, "straggler": straggler}}
print(json.dumps(found), flush=True)
member.wait()
"""


# An executor stand-in: launches a workload started to outlive it and another that is not, journals
# what the status walk would have seen, then either hands the first over and closes its journal as a
# stopping scheduler does ("handover"), or waits to be killed ("crash").
OWNER = f"""
import json, os, subprocess, sys, time
from pathlib import Path
from async_local_executor.core.outcome import Outcome
from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops.journal import LaunchJournal
journal = LaunchJournal.open(Path(sys.argv[1]), owner="test owner")
env = journal.child_env(os.environ)
held = subprocess.Popen(
    [sys.executable, "-c", {WORKLOAD!r}], env=env, start_new_session=True, stdout=subprocess.PIPE, text=True
)
journal.started(held.pid, "dag.held try 1", handover_timeout={TIMEOUT}, info={{"ti": "dag.held"}})
pids = json.loads(held.stdout.readline())
journal.seen({{held.pid: [(pids["orphan"], start_ticks(pids["orphan"]))]}})
other = subprocess.Popen({SLEEP!r}, env=env, start_new_session=True)
journal.started(other.pid, "dag.other try 1")
print(json.dumps({{"held": held.pid, "other": other.pid, **pids, "instance": journal.instance}}), flush=True)
if sys.argv[2] == "handover":
    journal.handed_over(held.pid, {{"ti": "dag.held", "ti_id": "abc"}}, None, {TIMEOUT})
    journal.close()  # a launch handed over: the journal stays, unlocked, for the next executor
else:
    time.sleep(600)
"""


def dead_owner(directory: Path, how: str, spawned: list[int]) -> dict[str, int | str]:
    """Run an executor stand-in that hands over (then exits) or crashes (killed); what it left running."""
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(directory), how], stdout=subprocess.PIPE, text=True
    )
    spawned.append(owner.pid)
    found: dict[str, int | str] = json.loads(read_line(owner))
    spawned.extend(pid for name, pid in found.items() if isinstance(pid, int))
    if how == "crash":
        owner.kill()
    assert owner.wait(60) == (0 if how == "handover" else -signal.SIGKILL)
    if owner.stdout is not None:
        owner.stdout.close()
    return found
