"""The status file's one definition is what the writer writes and what the reader checks: a file the
executor's own writer wrote, with every kind of record in it, holds exactly the fields the format defines
and reads back whole, without a problem."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typing_extensions

from async_local_executor.ops.status_format import StatusFile
from async_local_executor.ops.status_read import read_all
from tests.states import write_full


def defined(record: type) -> set[str]:
    return set(typing_extensions.get_type_hints(record))


def test_a_written_file_holds_the_format_s_fields_and_reads_back_whole(tmp_path: Path) -> None:
    path = write_full(tmp_path, "scheduler-host")
    data: dict[str, Any] = json.loads(path.read_text())
    hints = typing_extensions.get_type_hints(StatusFile)

    assert set(data) == defined(StatusFile)
    for name in ("memory", "descriptors", "containment", "health"):
        [record] = [a for a in typing_extensions.get_args(hints[name]) if a is not type(None)] or [
            hints[name]
        ]
        assert set(data[name]) == defined(record), name
    [row_type] = typing_extensions.get_args(hints["running"])
    assert [set(row) for row in data["running"]] == [defined(row_type)]
    [finished_type] = typing_extensions.get_args(hints["recent_finished"])
    assert {frozenset(row) for row in data["recent_finished"]} == {frozenset(defined(finished_type))}

    [found] = read_all(tmp_path)
    assert found.problems == ()
    assert found.data == data
