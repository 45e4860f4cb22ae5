"""The helper's server loop (``helper/server.py``), driven directly: its channel never blocks it, and a
check is answered by a child of its own, importing nothing."""

from __future__ import annotations

import importlib
import os
import signal
import socket
import sys
import threading
import types
from pathlib import Path

import pytest

from async_local_executor.core.launchers.forkserver.helper.server import Helper
from async_local_executor.core.launchers.forkserver.protocol import (
    Check,
    Checked,
    Ping,
    Pong,
    Ready,
    decode,
    encode,
    size_buffers,
)
from tests.core.helpers import GUARD


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


def test_a_check_is_answered_by_a_child_that_imports_nothing_and_leaves_the_helper_as_it_was(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The task SDK exports ``dag`` and ``task`` lazily: its __getattr__ imports where they are defined
    # and caches them. Where that is imported already, the name is had; where it is not, the import
    # is refused and the name is not. Either way the lookup runs in a child: the helper's own module
    # is as it was. What is neither had nor of an installed distribution is refused for good.
    (tmp_path / "lazy_target.py").write_text(
        f"open({str(tmp_path / 'imported')!r}, 'w').close()\nTHING = 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    package = types.ModuleType("lazy_pkg")
    package.defined = lambda: None  # type: ignore[attr-defined]
    lazy = {"cheap": ("json", "dumps"), "costly": ("lazy_target", "THING")}

    def export(name: str) -> object:
        module, attr = lazy[name]
        value = getattr(importlib.import_module(module), attr)
        setattr(package, name, value)  # as the task SDK caches what it looked up
        return value

    package.__getattr__ = export  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "lazy_pkg", package)
    base = frozenset(sys.modules)
    # Imported after the helper's start, as a learned module's own imports are: watched as preloaded,
    # so never counted as had.
    monkeypatch.setitem(sys.modules, "late_mod", types.ModuleType("late_mod"))
    assert "pip" not in sys.modules  # installed, not imported: a helper may preload it
    loop_end, helper_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    loop_end.settimeout(GUARD)
    helper = Helper(helper_end, target=lambda argv, stdin: 0, parent_pid=os.getpid(), base=base)
    serving = threading.Thread(target=helper.serve, daemon=True)
    serving.start()
    assert isinstance(decode(loop_end.recv(1 << 20)), Ready)
    names = (
        "lazy_pkg",
        "lazy_pkg.defined",
        "lazy_pkg.cheap",
        "lazy_pkg.costly",
        "late_mod",
        "no_such_pkg.thing",
        "pip",
    )
    loop_end.send(encode(Check(id=5, modules=names)))
    answer = decode(loop_end.recv(1 << 20))
    loop_end.close()
    serving.join(GUARD)
    helper_end.close()
    assert isinstance(answer, Checked)
    assert (answer.id, answer.covered) == (5, ("lazy_pkg", "lazy_pkg.defined", "lazy_pkg.cheap"))
    assert {r.module for r in answer.refused} == {"lazy_pkg.costly", "late_mod", "no_such_pkg.thing"}
    assert all(r.reason.startswith("not a module of an installed distribution") for r in answer.refused)
    assert "cheap" not in vars(package)  # looked up in the child only
    assert "lazy_target" not in sys.modules
    assert not (tmp_path / "imported").exists()  # refused, not imported, even in the child
    assert not serving.is_alive()


def test_an_answer_too_large_for_the_channel_loses_its_reasons_and_the_helper_serves_on() -> None:
    # Thousands of DAGs-folder modules, each refused with a reason longer than its name: an answer
    # larger than the channel's buffer would end the helper (and the next, asked the same).
    loop_end, helper_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    helper_end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
    loop_end.settimeout(GUARD)
    helper = Helper(helper_end, target=lambda argv, stdin: 0, parent_pid=os.getpid(), base=frozenset({"sys"}))
    serving = threading.Thread(target=helper.serve, daemon=True)
    serving.start()
    assert isinstance(decode(loop_end.recv(1 << 20)), Ready)
    names = ("sys", *(f"dag_folder_module_{i}" for i in range(300)))
    loop_end.send(encode(Check(id=1, modules=names)))
    assert decode(loop_end.recv(1 << 20)) == Checked(id=1, covered=("sys",))
    loop_end.send(encode(Ping(id=2)))
    assert decode(loop_end.recv(1 << 20)) == Pong(id=2)
    loop_end.close()
    serving.join(GUARD)
    helper_end.close()


def test_a_check_is_answered_where_sigchld_is_ignored() -> None:
    # Ignored SIGCHLD (inherited across exec, or set by a preloaded module) reaps the check's child
    # by itself: waiting for it then fails, which must not end the helper.
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    loop_end, helper_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    loop_end.settimeout(GUARD)
    try:
        helper = Helper(
            helper_end, target=lambda argv, stdin: 0, parent_pid=os.getpid(), base=frozenset({"sys"})
        )
        serving = threading.Thread(target=helper.serve, daemon=True)
        serving.start()
        assert isinstance(decode(loop_end.recv(1 << 20)), Ready)
        loop_end.send(encode(Check(id=1, modules=("sys",))))
        assert decode(loop_end.recv(1 << 20)) == Checked(id=1, covered=("sys",))
        loop_end.send(encode(Ping(id=2)))
        assert decode(loop_end.recv(1 << 20)) == Pong(id=2)
    finally:
        loop_end.close()
        serving.join(GUARD)
        helper_end.close()
        signal.signal(signal.SIGCHLD, previous)
