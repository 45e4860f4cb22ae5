"""The helper's server loop (``helper/server.py``), driven directly: its channel never blocks it, and a
check is answered without running module code."""

from __future__ import annotations

import importlib
import os
import socket
import sys
import types
from pathlib import Path

import pytest

from async_local_executor.core.launchers.forkserver.helper.server import Helper
from async_local_executor.core.launchers.forkserver.protocol import (
    Check,
    Checked,
    Pong,
    decode,
    encode,
    size_buffers,
)


def test_the_helper_never_blocks_on_a_full_channel() -> None:
    # A loop that is slow to read must not stall the helper: what cannot be sent waits in its outbox
    # while it goes on serving, and leaves in order once the loop reads again.
    loop_end, helper_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    size_buffers(helper_end)
    helper_end.setblocking(False)
    helper = Helper(helper_end, target=lambda argv, stdin: 0, parent_pid=os.getpid())
    filler = 0
    for size in (65536, 4096, 256, 16, 1):  # down to the last byte, so not even a pong fits
        while True:
            try:
                helper_end.send(b"x" * size)
            except BlockingIOError:
                break
            filler += 1
    helper._send(Pong(id=1))  # returns at once: the channel is full
    helper._send(Pong(id=2))
    assert len(helper._outbox) == 2
    for _ in range(filler):
        loop_end.recv(1 << 20)
    assert helper._flush()
    assert not helper._outbox
    assert [decode(loop_end.recv(1 << 20)) for _ in range(2)] == [Pong(id=1), Pong(id=2)]
    loop_end.close()
    helper_end.close()


def test_a_check_names_what_the_helper_has_and_imports_nothing_to_answer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The task SDK exports ``dag`` and ``task`` lazily: its __getattr__ imports where they are defined.
    # Where that is imported already, the name is here; where it is not, the import is refused and
    # the name counts as missing: a serving helper imports nothing.
    (tmp_path / "lazy_target.py").write_text(
        f"open({str(tmp_path / 'imported')!r}, 'w').close()\nTHING = 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    package = types.ModuleType("lazy_pkg")
    package.defined = lambda: None  # type: ignore[attr-defined]
    lazy = {"cheap": ("json", "dumps"), "costly": ("lazy_target", "THING")}

    def export(name: str) -> object:
        module, attr = lazy[name]
        return getattr(importlib.import_module(module), attr)

    package.__getattr__ = export  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "lazy_pkg", package)
    loop_end, helper_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    helper_end.setblocking(False)
    helper = Helper(helper_end, target=lambda argv, stdin: 0, parent_pid=os.getpid())
    names = ("lazy_pkg", "lazy_pkg.defined", "lazy_pkg.cheap", "lazy_pkg.costly", "no_such_pkg.thing")
    loop_end.send(encode(Check(id=5, modules=names)))
    assert helper._receive()
    covered = ("lazy_pkg", "lazy_pkg.defined", "lazy_pkg.cheap")
    assert decode(loop_end.recv(1 << 20)) == Checked(id=5, covered=covered)
    assert "lazy_target" not in sys.modules
    assert not (tmp_path / "imported").exists()
    assert importlib.import_module("lazy_target").THING == 1  # importable: refused only while checking
    monkeypatch.delitem(sys.modules, "lazy_target")
    loop_end.close()
    helper_end.close()
