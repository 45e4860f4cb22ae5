"""The custody directory's records: what a workload writes is what an executor reads, and nothing else is."""

from __future__ import annotations

from pathlib import Path

import pytest

from async_local_executor.core import custody_files
from async_local_executor.core.custody_files import EXIT, OUT, OWNER, WORKLOAD_FILE, WRITING, Owner
from async_local_executor.core.files import fresh_name
from async_local_executor.ops import custody_dir


def test_a_workload_s_files_are_named_after_its_pid_and_start() -> None:
    assert custody_files.name(123, 4567) == "123-4567"
    assert custody_files.file(Path("/c"), 123, 4567, OWNER) == Path("/c/123-4567.json")
    assert custody_files.file(Path("/c"), 123, 4567, EXIT) == Path("/c/123-4567.exit")
    assert custody_files.file(Path("/c"), 123, 4567, OUT) == Path("/c/123-4567.out")


def test_every_file_of_a_workload_matches_even_one_being_written() -> None:
    final = custody_files.file(Path("/c"), 123, 4567, EXIT)
    for each in (final, fresh_name(final, WRITING)):
        match = WORKLOAD_FILE.match(each.name)
        assert match is not None, each
        assert match.groups() == ("123", "4567"), each
    assert WORKLOAD_FILE.match("status-abc.json") is None
    assert WORKLOAD_FILE.match("123-4567") is None


def test_an_owner_and_an_exit_code_read_back_as_written() -> None:
    assert custody_files.decode_owner(custody_files.encode_owner(Owner(42, 9000))) == Owner(42, 9000)
    assert custody_files.decode_exit(custody_files.encode_exit(-9)) == -9
    # The bytes on disk: across an upgrade, the workloads handed over run the old code and their adopter
    # the new one, so these are a contract between versions.
    assert custody_files.encode_owner(Owner(42, 9000)) == b'{"owner_pid": 42, "owner_start": 9000}'
    assert custody_files.encode_exit(3) == b'{"status": 3}'


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b'{"owner_pid": 42',  # cut short
        b"[42, 9000]",
        b'{"owner_pid": "42", "owner_start": 9000}',
        b'{"owner_pid": true, "owner_start": 9000}',
        b'{"owner_pid": 42}',
        b"[" * 100_000,  # deeper than json recurses
        b'{"owner_pid": 42, "owner_start": 9000, "pad": "' + b"x" * 5000 + b'"}',  # larger than any record
    ],
)
def test_what_is_not_an_owner_record_reads_as_none(raw: bytes) -> None:
    assert custody_files.decode_owner(raw) is None


@pytest.mark.parametrize("raw", [b"", b'{"status": 1.0}', b'{"status": "1"}', b'{"status": null}', b"1"])
def test_what_is_not_an_exit_record_reads_as_none(raw: bytes) -> None:
    assert custody_files.decode_exit(raw) is None


def test_the_executor_reads_what_the_workload_side_wrote(tmp_path: Path) -> None:
    custody_dir.name_owner(tmp_path, 123, 4567, 42, 9000)
    custody_files.file(tmp_path, 123, 4567, EXIT).write_bytes(custody_files.encode_exit(7))

    assert custody_dir.read_owner(tmp_path, 123, 4567) == Owner(42, 9000)
    assert custody_dir.read_exit(tmp_path, 123, 4567) == 7
    assert (tmp_path / "123-4567.json").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["123-4567.exit", "123-4567.json"]
