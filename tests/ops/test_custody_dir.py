"""The custody directory (``custody_dir.py``): a workload's files read and removed, and stale ones gone unless
a live executor answers for them."""

from __future__ import annotations

import os
from pathlib import Path

from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops import custody_dir


def test_custody_files_are_read_and_removed(tmp_path: Path) -> None:
    custody = tmp_path / "custody"
    custody.mkdir()
    assert custody_dir.read_exit(custody, 12, 34) is None
    for content, status in [('{"status": 3}', 3), ('{"status": true}', None), ("{", None), ("[]", None)]:
        (custody / "12-34.exit").write_text(content)
        assert custody_dir.read_exit(custody, 12, 34) == status
    custody_dir.name_owner(custody, 12, 34, 56, 78)
    assert custody_dir.read_owner(custody, 12, 34) == (56, 78)
    custody_dir.out_path(custody, 12, 34).write_text("output")
    (custody / "123-4.json").write_text("{}")  # another workload's

    custody_dir.remove(custody, 12, 34)

    assert [p.name for p in custody.iterdir()] == ["123-4.json"]


def test_stale_custody_files_go_unless_a_live_executor_answers_for_them(tmp_path: Path) -> None:
    custody = tmp_path / "custody"
    custody.mkdir()
    me, mine = os.getpid(), start_ticks(os.getpid())
    assert mine is not None
    running = f"{me}-{mine}"  # still runs: kept
    ended_adopted = f"{me}-{mine + 1}"  # ended, its owner (this process) lives and has yet to read it: kept
    ended = f"{me}-{mine + 2}"  # ended, its owner is gone: removed
    for name in (running, ended_adopted, ended):
        (custody / f"{name}.exit").write_text('{"status": 0}')
        (custody / f"{name}.out").write_text("")
    custody_dir.name_owner(custody, me, mine + 1)
    custody_dir.name_owner(custody, me, mine + 2, me, mine + 3)
    (custody / f"{ended}.json.tmp-0123").write_text("")  # a write cut short
    (custody / "notes.txt").write_text("")  # not a workload's

    assert custody_dir.remove_stale(custody) == [ended]

    assert not any(p.name.startswith(f"{ended}.") for p in custody.iterdir())
    assert {p.name for p in custody.iterdir()} == {
        f"{running}.exit",
        f"{running}.out",
        f"{ended_adopted}.exit",
        f"{ended_adopted}.out",
        f"{ended_adopted}.json",
        "notes.txt",
    }
