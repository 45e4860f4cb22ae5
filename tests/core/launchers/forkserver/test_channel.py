"""The fork-server channel's limit (``channel.py``): what the kernel granted, and a datagram it refuses is
too large, not a broken channel."""

from __future__ import annotations

import socket

import anyio
import pytest

from async_local_executor.core.launchers.forkserver.channel import Channel, ChannelClosed, MessageTooLarge
from async_local_executor.core.launchers.forkserver.protocol import MAX_MESSAGE, Spawn

pytestmark = pytest.mark.asyncio

# Far below the 1 MiB the channel asks for, and below what any host grants: the limit the tests meet.
SMALL_BUFFER = 64 * 1024


async def test_the_channel_limit_is_what_the_kernel_granted() -> None:
    channel, theirs = Channel.pair(buffer=SMALL_BUFFER)
    try:
        granted = channel._sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        assert channel.limit < MAX_MESSAGE
        assert channel.limit == granted - 32
        # Exactly the limit goes through; the kernel says nothing about it being too large.
        await channel.send(b"x" * channel.limit, [], unless=anyio.Event())
        assert len(theirs.recv(MAX_MESSAGE)) == channel.limit
        with pytest.raises(
            MessageTooLarge, match=f"exceeds the fork-server channel's limit \\({channel.limit} bytes"
        ):
            channel.frame(Spawn(id=0, argv=("a" * channel.limit,)))
    finally:
        channel.close()
        theirs.close()


async def test_a_datagram_the_kernel_refuses_is_too_large_not_a_broken_channel() -> None:
    # EMSGSIZE, should the limit read back ever be wrong: the channel and the helper behind it are fine.
    channel, theirs = Channel.pair(buffer=SMALL_BUFFER)
    try:
        too_long = b"x" * (2 * SMALL_BUFFER)
        channel.limit = MAX_MESSAGE  # as if the read-back limit were wrong: the kernel must be asked
        with pytest.raises(MessageTooLarge) as refused:
            await channel.send(too_long, [], unless=anyio.Event())
        assert not isinstance(refused.value, ChannelClosed)
        assert channel.limit < len(too_long)  # learned: the same request is not tried again
        await channel.send(b"small", [], unless=anyio.Event())
        assert theirs.recv(MAX_MESSAGE) == b"small"
    finally:
        channel.close()
        theirs.close()
