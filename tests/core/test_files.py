"""``core/files.py``: a file replaced atomically is never written through a name that is already taken."""

from __future__ import annotations

from pathlib import Path

import pytest

from async_local_executor.core import files


def test_a_write_refuses_a_name_that_is_already_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    taken = tmp_path / "taken"
    taken.symlink_to(victim)
    monkeypatch.setattr(files, "fresh_name", lambda final, infix: taken)

    with pytest.raises(FileExistsError):
        files.replace_atomically(tmp_path / "final", b"new", ".tmp-")

    assert victim.read_text() == "precious"
    assert not (tmp_path / "final").exists()
