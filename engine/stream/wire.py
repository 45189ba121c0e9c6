"""Frames between the run (:mod:`engine.stream.pool`) and a stream worker (:mod:`engine.stream.worker`).

One connected ``AF_UNIX`` socket pair per worker; each frame is a 4-byte big-endian length and a
pickle of one message tuple (both ends are this program, started from the same interpreter; nothing
else can reach the socket). Messages, first element the verb:

run -> worker:
    ``("init", WorkerInit)``, ``("req", rid, endpoint_index, ChatRequest)``, ``("cancel", rid)``,
    ``("hold", Hold)`` (the whole hold state, :class:`engine.stream.hold.Hold`; ``Hold()`` releases),
    ``("close",)`` (cancel everything, exit).
worker -> run:
    ``("ready", pid)``; ``("prog", [(rid, chars, status, generation_id, provider, cost_usd), ...])``
    every ``progress_s`` for the streams that changed; ``("done", rid, Completion)`` once the
    completion is in the journal; ``("err", rid, error_fields)``; ``("gone", rid)`` after a cancel;
    ``("unsent", rid)``: the request was held (``hold``) before its first byte left, nothing reached
    the provider;
    ``("hb", frozen_s, unsent)`` every second and at once after the worker's loop was found stopped
    (``frozen_s``: seconds in all it did not run, :mod:`engine.stream.liveness`; ``unsent``: its
    requests not sent yet, a count).

Errors cross as plain fields (:func:`error_fields` / :func:`error_from_fields`), never as pickled
exception objects, so an exception class with another constructor cannot break the frame.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

from engine.client.types import ErrorClass, RequestError
from engine.errors import DatagenError

_HEADER = struct.Struct(">I")
#: Largest frame accepted (bytes): a completion of 262,144 tokens is well under it.
MAX_FRAME = 256 * 1024 * 1024


@dataclass(frozen=True)
class WorkerInit:
    """What a worker needs to start: sent once, as the first frame (the API key travels here, never
    on the command line or in the environment of the child).

    Attributes:
        slot: the worker's number in the pool (0-based), in file names and messages.
        endpoints: the API roots the worker sends to, by index (one, or ``[provider] base_urls``).
        api_key: the key sent as ``Authorization: Bearer`` (None: none).
        client: keyword arguments of :class:`engine.client.chat.ChatClient` (timeouts, pool sizes).
        journal_dir: where the worker appends its journal and in-flight ledger (:mod:`engine.stream.journal`).
        progress_s: seconds between batched progress messages.
        ledger_s: seconds between rewrites of the in-flight ledger.
        fsync_s: longest wait (s) before a finished completion is written and fsynced (group commit).
    """

    slot: int
    endpoints: tuple[str, ...]
    api_key: str | None
    client: dict[str, Any] = field(default_factory=dict)
    journal_dir: str = ""
    progress_s: float = 0.1
    ledger_s: float = 1.0
    fsync_s: float = 0.05

    def __repr__(self) -> str:  # never show the key
        return f"WorkerInit(slot={self.slot}, endpoints={self.endpoints!r}, api_key={'<set>' if self.api_key else None})"


class StreamWorkerLost(RequestError):
    """The stream worker holding a request died (``kill -9``, out of memory) or could not be reached.

    Not the prompt's fault: the run returns the prompt to pending with the spend streamed so far
    counted (:func:`engine.run.attempt.run_request`), and never counts it as a failed attempt.
    Its class is ``disconnect``; ``tokens_received`` is the last progress the worker reported.
    """


class StreamHeld(DatagenError):
    """A request held back unsent: the run or its dataset was paused, skipped or is stopping
    (:meth:`engine.stream.pool.StreamWorkerPool.hold`) before its first byte left the worker.

    Not a :class:`RequestError`: nothing reached the provider, nothing was spent, no attempt is
    counted and no endpoint is judged; the run returns the prompt to pending
    (:func:`engine.run.attempt.run_request`)."""


def encode(msg: tuple) -> bytes:
    """One frame: length header and the pickled message."""
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


class FrameReader(asyncio.StreamReader):
    """An :class:`asyncio.StreamReader` that counts the bytes it holds unread (received off the socket,
    not yet taken by :meth:`readexactly`), through the public methods only: the stream worker's gate asks
    whether a frame of the run (a ``hold``) waits before it lets a request go.

    Attributes:
        unread: bytes fed and not read yet (>= 0).
    """

    def __init__(self, limit: int) -> None:
        super().__init__(limit=limit)
        self.unread = 0

    def feed_data(self, data: Any) -> None:  # bytes off the socket (typeshed: Iterable[SupportsIndex])
        super().feed_data(data)
        self.unread += len(data)

    async def readexactly(self, n: int) -> bytes:
        data = await super().readexactly(n)
        self.unread -= len(data)
        return data


async def open_frames(sock: socket.socket, limit: int) -> tuple[FrameReader, asyncio.StreamWriter]:
    """``asyncio.open_connection(sock=sock)`` with a :class:`FrameReader` (``limit``: its buffer's bytes)."""
    loop = asyncio.get_running_loop()
    reader = FrameReader(limit)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport, _ = await loop.create_connection(lambda: protocol, sock=sock)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def read_frame(reader: asyncio.StreamReader) -> tuple:
    """Read one message.

    Raises:
        asyncio.IncompleteReadError: the other end closed (a worker that died, a run that ended).
        ValueError: a frame over :data:`MAX_FRAME`.
    """
    (n,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    if n > MAX_FRAME:
        raise ValueError(f"stream worker frame of {n} bytes is over the {MAX_FRAME} limit")
    return pickle.loads(await reader.readexactly(n))


def error_fields(e: RequestError) -> dict[str, Any]:
    """The fields of a :class:`RequestError` that cross the socket."""
    return {"cls": e.error_class.value, "message": e.message, "status": e.status, "retry_after_s": e.retry_after_s,
            "provider": e.provider, "generation_id": e.generation_id, "tokens_received": e.tokens_received,
            "partial_cost_usd": e.partial_cost_usd, "no_answer": e.no_answer}


def error_from_fields(f: dict[str, Any]) -> RequestError:
    """Rebuild the :class:`RequestError` of :func:`error_fields`."""
    e = RequestError(ErrorClass(f["cls"]), f["message"], status=f["status"], retry_after_s=f["retry_after_s"],
                     provider=f["provider"], generation_id=f["generation_id"],
                     tokens_received=f["tokens_received"], partial_cost_usd=f["partial_cost_usd"])
    e.no_answer = bool(f.get("no_answer", False))
    return e


__all__ = ["MAX_FRAME", "StreamHeld", "StreamWorkerLost", "WorkerInit", "encode", "error_fields", "error_from_fields", "read_frame"]
