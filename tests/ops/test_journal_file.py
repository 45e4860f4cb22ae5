"""The launch journal's lines: each record the writer encodes is the record the reader decodes."""

from __future__ import annotations

import json
import logging

import pytest

from async_local_executor.ops.journal_file import (
    Companion,
    Ended,
    HandoverLine,
    Header,
    HeldFrom,
    Launch,
    Line,
    SeenLine,
    decode,
    encode_line,
)

HELD = HeldFrom({"ti": 1}, "/sys/fs/cgroup/ale/w1", 1.5e9, 12.5, "dead")
RECORDS: list[Line] = [
    Launch(10, 99, "dag.task try 1"),
    Launch(10, 99, "dag.task try 1", handover_timeout=300.0, info={"ti": 1}),
    Launch(10, 99, "dag.task try 1", handover_timeout=300.0),
    Launch(10, 99, "dag.task try 1", handover_timeout=300.0, held=HELD),
    Ended(10),
    SeenLine(11, 100, of=10),
    HandoverLine(10, 99, info={"ti": 1}, cgroup=None, at=1.5e9, boot=12.5, timeout=300.0),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_reads_back_as_written(record: Line) -> None:
    assert decode(json.loads(encode_line(record))) == (record, True)


def test_the_header_reads_back_as_written_and_a_field_of_the_wrong_kind_as_missing() -> None:
    header = Header("abc", "scheduler 7", "deployment", 7, 1234, 1.5e9, (Companion(8, 1240, "log server"),))
    assert Header.decode(json.loads(header.encode())) == header
    odd = Header.decode(
        {
            "instance": "abc",
            "pid": "7",
            "pid_start_ticks": True,
            "companions": [{"pid": 1}],
            "opened": 10**400,
        }
    )
    assert (odd.pid, odd.pid_start, odd.owner_key, odd.opened, odd.companions) == (None, None, None, None, ())
    # A key of another kind is another deployment's, never this one's (whose keys are strings).
    assert Header.decode({"owner_key": 5}).owner_key == "5"


def test_data_json_cannot_hold_is_written_empty_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "async_local_executor.ops.journal")
    launch = Launch(10, 99, "k", handover_timeout=300.0, info={"ti": object()})
    held = Launch(10, 99, "k", handover_timeout=300.0, held=HeldFrom({"ti": {1, 2}}, None, 1.0, 2.0, "d"))
    handover = HandoverLine(10, 99, info={"ti": b"bytes"}, cgroup=None, at=1.0, boot=2.0, timeout=300.0)

    read = [decode(json.loads(encode_line(each)))[0] for each in (launch, held, handover)]

    assert read == [
        Launch(10, 99, "k", handover_timeout=300.0, info={}),
        Launch(10, 99, "k", handover_timeout=300.0, held=HeldFrom({}, None, 1.0, 2.0, "d")),
        HandoverLine(10, 99, info={}, cgroup=None, at=1.0, boot=2.0, timeout=300.0),
    ]
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "the launch journal cannot hold the data given for pid 10"
    ] * 3


def test_a_launch_with_handover_fields_not_in_the_format_is_a_launch_without_them() -> None:
    line = {"+": 10, "start_ticks": 99, "key": "k", "handover_timeout": "300", "info": {"ti": 1}}
    assert decode(line) == (Launch(10, 99, "k"), False)
    with pytest.raises(ValueError, match="not a pid"):
        decode({"+": 0, "start_ticks": 99, "key": "k"})
    with pytest.raises(KeyError):
        decode({"what": 1})


def test_a_held_line_needs_only_what_the_handover_uses() -> None:
    # Where it was held and when inform a reader; the timeout on the launch line wins over the held one's.
    line = {"+": 10, "start_ticks": 99, "key": "k", "handover_timeout": 60, "held": {"info": {}, "cgroup": None,
            "timeout": "x", "from": "abc"}}  # fmt: skip
    assert decode(line) == (Launch(10, 99, "k", 60.0, held=HeldFrom({}, None, None, None, "abc")), True)


def test_a_number_beyond_any_float_is_no_number_of_seconds() -> None:
    line = {
        "handover": 10,
        "start_ticks": 99,
        "info": {},
        "cgroup": None,
        "at": 10**400,
        "boot": 1,
        "timeout": 1,
    }
    with pytest.raises(ValueError, match="not a number of seconds"):
        decode(line)
