"""The loop's end of the channel to one fork-server helper: messages in and out, never blocking the loop.

What travels on it is :mod:`~async_local_executor.core.launchers.forkserver.protocol`; when to send what,
and what an answer (or silence) means, is :mod:`~async_local_executor.core.launchers.forkserver.process`'s
business.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Iterator, Sequence

import anyio

from async_local_executor.core.launchers.forkserver.protocol import (
    BUFFER,
    MAX_MESSAGE,
    Message,
    ToHelper,
    decode,
    encode,
    size_buffers,
)

# Linux refuses (EMSGSIZE) a datagram longer than the sender's SO_SNDBUF less this (af_unix.c).
_KERNEL_RESERVE = 32


class ChannelClosed(Exception):
    """The channel broke, or sending was given up: the message did not reach the helper."""


class MessageTooLarge(OverflowError):
    """The message can never go through this channel; the channel and the helper are fine."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"{size} bytes exceeds the fork-server channel's limit ({limit} bytes)")
        self.size = size
        self.limit = limit


class Channel:
    """A non-blocking ``SOCK_SEQPACKET`` socket with buffers sized for the largest message.

    :param buffer: the socket buffer size asked of the kernel (tests ask for less than the default)
    """

    def __init__(self, sock: socket.socket, *, buffer: int = BUFFER) -> None:
        size_buffers(sock, buffer)
        sock.setblocking(False)
        self._sock = sock
        # What the kernel granted, not what was asked: net.core.wmem_max caps it (its default allows
        # about 416 KB), and a datagram it cannot hold would fail every time it is sent.
        granted = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        self.limit = min(MAX_MESSAGE, granted - _KERNEL_RESERVE)

    @classmethod
    def pair(cls, *, buffer: int = BUFFER) -> tuple[Channel, socket.socket]:
        """Our end, and the helper's end (to be passed to it, then closed here)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        return cls(ours, buffer=buffer), theirs

    def frame(self, message: ToHelper) -> bytes:
        """``message`` as one datagram; :class:`MessageTooLarge` when it cannot go through this channel."""
        data = encode(message)
        if len(data) > self.limit:
            raise MessageTooLarge(len(data), self.limit)
        return data

    async def send(self, data: bytes, fds: Sequence[int], *, unless: anyio.Event) -> None:
        """Send one datagram with ``fds``, waiting while the channel is full.

        :param unless: once set, stop trying
        :raises ChannelClosed: the channel broke, or ``unless`` was set before the datagram went
        :raises MessageTooLarge: the kernel will never take a datagram this long on this socket
        """
        while True:
            if unless.is_set():
                raise ChannelClosed
            try:
                socket.send_fds(self._sock, [data], fds)
                return
            except BlockingIOError:
                await anyio.wait_writable(self._sock)
            except OSError as exc:
                if exc.errno == errno.EMSGSIZE:
                    # Not a broken channel: the helper is fine and the next, smaller message goes.
                    self.limit = min(self.limit, len(data) - 1)
                    raise MessageTooLarge(len(data), self.limit) from exc
                raise ChannelClosed from exc

    def offer(self, message: ToHelper) -> None:
        """Send ``message`` if the channel takes it at once; never waited on, and a failure is dropped."""
        with contextlib.suppress(BlockingIOError, OSError):
            self._sock.send(encode(message))

    async def receive(self) -> Message | None:
        """The next message; ``None`` once the channel is closed or broken."""
        while True:
            try:
                data = self._sock.recv(MAX_MESSAGE)
            except BlockingIOError:
                await anyio.wait_readable(self._sock)
                continue
            except OSError:
                return None
            return decode(data) if data else None

    def received(self) -> Iterator[Message]:
        """The messages the channel holds now, without waiting for more."""
        while True:
            try:
                data = self._sock.recv(MAX_MESSAGE)
            except (BlockingIOError, OSError):
                return
            if not data:
                return
            yield decode(data)

    def shutdown(self) -> None:
        """End the conversation both ways; the helper exits when it sees that."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._sock.close()
