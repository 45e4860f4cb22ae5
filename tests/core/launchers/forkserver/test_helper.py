"""The fork server's far side, driven directly: its channel never blocks it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from async_local_executor.core.launchers.forkserver.helper.server import Helper
from async_local_executor.core.launchers.forkserver.protocol import (
    MAX_MESSAGE,
    Pong,
    Unfit,
    decode,
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


def test_the_helper_names_the_preload_that_started_a_thread_and_does_not_serve() -> None:
    # In place of "ready": forking with a second thread running could copy a held lock into every
    # workload. Only the module that started it is blamed, not the preloads around it.
    loop_end, helper_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    preloads = ["decimal", "tests.core.launchers.forkserver.threaded", "fractions"]
    argv = [sys.executable, "-m", "async_local_executor.core.launchers.forkserver.helper"]
    argv += ["--fd", str(helper_end.fileno()), "--parent-pid", str(os.getpid())]
    argv += ["--target", "tests.core.launchers.forkserver.targets:python_c"]
    for module in preloads:
        argv += ["--preload", module]
    helper = subprocess.Popen(argv, pass_fds=[helper_end.fileno()])
    helper_end.close()
    try:
        loop_end.settimeout(GUARD)
        message = decode(loop_end.recv(MAX_MESSAGE))
    finally:
        loop_end.close()  # a helper that went on serving exits on this EOF
        returncode = helper.wait(GUARD)
    assert returncode == 1
    assert isinstance(message, Unfit)
    error = message.error
    assert error.startswith(
        "preloading tests.core.launchers.forkserver.threaded started 1 thread (sdk-exporter); "
    )
    assert "decimal" not in error
    assert "fractions" not in error
