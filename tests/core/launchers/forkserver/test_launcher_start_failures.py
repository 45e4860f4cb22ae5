"""A fork server that cannot start costs the launches made meanwhile at most, never the executor.

Out of descriptors (EMFILE) while a helper is replaced: a real process with a lowered RLIMIT_NOFILE
(tests/core/launchers/forkserver/emfile_driver.py), a real helper killed, real workloads. Nothing is mocked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.core.helpers import GUARD

ROOT = Path(__file__).resolve().parents[4]


def test_out_of_descriptors_while_the_helper_is_replaced_costs_no_more_than_that_launch() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.core.launchers.forkserver.emfile_driver"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3 * GUARD,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    down, back, served = (json.loads(line) for line in done.stdout.splitlines())
    assert "Too many open files" in down["down"]
    assert "could not start" in down["problem"]  # health names it while it is down
    # The workload submitted meanwhile got its one final event (here a failed launch: no descriptor was
    # left for the fallback's pipes either), and the executor went on serving.
    assert not down["during_ok"]
    assert "Too many open files" in down["during_reason"]
    assert "Too many open files" in back["back"]
    assert back["problem"] is None  # healthy again once the helper is back
    assert back["after_ok"]
    assert back["after_ran"] == ["forked"]  # through the new helper, not the fallback
    assert served == {"served": True}
