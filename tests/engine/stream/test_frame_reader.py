"""The stream worker's reader of the run's frames counts what it holds unread through public methods only
(the gate asks whether a ``hold`` waits before it lets a request go; it read asyncio's private buffer before)."""

from __future__ import annotations

import asyncio
import socket

from engine.stream.wire import encode, open_frames, read_frame


async def test_unread_counts_the_bytes_received_and_not_yet_read_as_frames():
    ours, theirs = socket.socketpair()
    try:
        reader, writer = await open_frames(ours, 2 ** 16)
        assert reader.unread == 0
        first, second = encode(("hold", "x")), encode(("req", 1, 0, "y" * 100))
        theirs.sendall(first + second)
        for _ in range(200):  # the loop reads the socket into the reader
            if reader.unread == len(first) + len(second):
                break
            await asyncio.sleep(0.01)
        assert reader.unread == len(first) + len(second)
        assert await read_frame(reader) == ("hold", "x")
        assert reader.unread == len(second)
        assert await read_frame(reader) == ("req", 1, 0, "y" * 100)
        assert reader.unread == 0
        writer.close()
    finally:
        theirs.close()
