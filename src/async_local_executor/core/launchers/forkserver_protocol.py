"""The fork server's wire protocol, shared by the loop's side and the helper's side.

One ``SOCK_SEQPACKET`` socket joins them, one JSON object per message, so message boundaries hold:

    loop -> helper   {"op": "spawn", "id", "argv"}  + [write end of the child's output pipe, child's control socket]
                     {"op": "ping", "id"}
    helper -> loop   {"op": "ready", "pid"}     or, in its place, {"op": "unfit", "error"}: it must not
                                                fork (a preload started threads) and exits
                     {"op": "spawn_failed", "id", "error"}   with "unfit": true when a thread has
                                                started since: it forks nothing more
                     {"op": "pong", "id"}

A forked child says its pid on its own control socket (``"<pid>\\n"``); the loop then sends it
:data:`GO` and its payload there, and closes the socket. EOF before :data:`GO`: the child exits and runs
nothing.

Only the standard library is imported: the helper imports this module and must start fast.
"""

from __future__ import annotations

import json
import socket
from typing import Any

# SEQPACKET messages are bounded by the socket buffers; both ends ask for buffers that fit this, and a
# larger spawn request goes through the plain launcher instead. The kernel may grant less
# (net.core.wmem_max): the loop's end reads back what it got (see forkserver_channel).
MAX_MESSAGE = 1024 * 1024
BUFFER = MAX_MESSAGE + 4096
# The first byte the loop sends on a child's control socket: run. EOF before it: exit, run nothing.
GO = b"1"


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def decode(data: bytes) -> dict[str, Any]:
    message = json.loads(data)
    if not isinstance(message, dict) or "op" not in message:
        raise ValueError(f"not a fork-server message: {data[:80]!r}")
    return message


def size_buffers(sock: socket.socket, size: int = BUFFER) -> None:
    """Ask for ``size``-byte buffers; Linux grants twice that, capped at twice net.core.[rw]mem_max."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
