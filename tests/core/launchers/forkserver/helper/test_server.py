"""The helper's server loop (``helper/server.py``), driven directly: its channel never blocks it."""

from __future__ import annotations

import os
import socket

from async_local_executor.core.launchers.forkserver.helper.server import Helper
from async_local_executor.core.launchers.forkserver.protocol import Pong, decode, size_buffers


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
