"""HTTP/1.1 server plumbing on asyncio streams with ``h11`` parsing.

Owning the socket (rather than using a framework) lets the simulator drop connections, stall and
pad responses exactly as described in docs/openrouter.md. One :class:`HttpConnection` serves a keep-alive
connection: a background task reads the socket all the time, so a client that goes away while a
response is being streamed is noticed at once (``gone``), even when no write fails yet.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass
from typing import Awaitable, Callable
from urllib.parse import parse_qsl, urlsplit

import h11

from engine.errors import DatagenError

#: Largest request body accepted (bytes); larger ones get 413.
MAX_BODY = 64 * 1024 * 1024
_READ_SIZE = 65536


class ClientGone(DatagenError):
    """The client closed the connection (or it broke) while a response was being written."""


@dataclass
class Request:
    """A fully received HTTP request.

    Attributes:
        method: upper-case method, e.g. ``POST``.
        path: target path without the query string.
        query: query parameters (last value wins).
        headers: header name (lower case) -> value (last value wins).
        body: raw body bytes.
    """

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


class HttpConnection:
    """One server-side HTTP/1.1 connection (keep-alive aware).

    Use :meth:`next_request`, then answer with :meth:`respond` (whole body, ``Content-Length``) or
    :meth:`start` + :meth:`send` ... + :meth:`end` (chunked), or :meth:`abort`.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        #: Set when the peer closed its side or the transport failed.
        self.gone = asyncio.Event()
        self.aborted = False
        self._eof = False
        self._data_ready = asyncio.Event()
        self._reader_task = asyncio.get_running_loop().create_task(self._read_loop())

    # -- reading -------------------------------------------------------------------------------
    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self.reader.read(_READ_SIZE)
                if not data:
                    break
                try:
                    self.h11.receive_data(data)
                except RuntimeError:
                    break
                self._data_ready.set()
        except (ConnectionError, OSError):
            pass
        finally:
            self._eof = True
            try:
                self.h11.receive_data(b"")
            except RuntimeError:
                pass
            self.gone.set()
            self._data_ready.set()

    async def next_request(self) -> Request | None:
        """Wait for the next complete request; None when the client closed or sent garbage."""
        req: h11.Request | None = None
        body = bytearray()
        while True:
            try:
                ev = self.h11.next_event()
            except h11.RemoteProtocolError as e:
                await self._bad_request(e.error_status_hint, str(e))
                return None
            if ev is h11.NEED_DATA:
                if self._eof:
                    return None
                if self.h11.client_is_waiting_for_100_continue:  # e.g. curl with a large body
                    try:
                        self._emit(h11.InformationalResponse(status_code=100, headers=[]))
                    except ClientGone:
                        return None
                self._data_ready.clear()
                await self._data_ready.wait()
                continue
            if isinstance(ev, h11.Request):
                req = ev
            elif isinstance(ev, h11.Data):
                body += ev.data
                if len(body) > MAX_BODY:
                    await self._bad_request(413, "request body too large")
                    return None
            elif isinstance(ev, h11.EndOfMessage):
                assert req is not None
                target = req.target.decode("latin-1")
                parts = urlsplit(target)
                headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in req.headers}
                return Request(
                    method=req.method.decode("ascii", "replace").upper(),
                    path=parts.path,
                    query=dict(parse_qsl(parts.query)),
                    headers=headers,
                    body=bytes(body),
                )
            else:  # ConnectionClosed, PAUSED
                return None

    async def _bad_request(self, status: int, msg: str) -> None:
        if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            body = ('{"error":{"code":%d,"message":"bad HTTP request"}}' % status).encode()
            try:
                await self.respond(status, [("content-type", "application/json"), ("connection", "close")], body)
            except (ClientGone, h11.LocalProtocolError):
                pass

    # -- writing -------------------------------------------------------------------------------
    def _emit(self, event: h11.Event) -> None:
        if self.aborted or self.writer.transport.is_closing():
            raise ClientGone("connection closed")
        data = self.h11.send(event)
        if data:
            self.writer.write(data)

    async def drain(self) -> None:
        """Wait until the socket buffer is below the high-water mark; ClientGone if it broke."""
        try:
            await self.writer.drain()
        except (ConnectionError, OSError, RuntimeError) as e:
            raise ClientGone(str(e)) from None

    async def respond(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        """Send a complete response with ``Content-Length``."""
        headers = [*headers, ("content-length", str(len(body)))]
        self._emit(h11.Response(status_code=status, headers=_with_server(headers)))
        if body:
            self._emit(h11.Data(data=body))
        self._emit(h11.EndOfMessage())
        await self.drain()

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        """Send the status line and headers of a body of unknown length (chunked)."""
        self._emit(h11.Response(status_code=status, headers=_with_server(headers)))
        await self.drain()

    def write(self, data: bytes) -> None:
        """Queue body bytes (one chunk frame); call :meth:`drain` to apply backpressure."""
        if data:
            self._emit(h11.Data(data=data))

    async def send(self, data: bytes) -> None:
        """Write body bytes and drain."""
        self.write(data)
        await self.drain()

    async def end(self) -> None:
        """Finish the body (last chunk)."""
        self._emit(h11.EndOfMessage())
        await self.drain()

    def abort(self, reset: bool = False) -> None:
        """Drop the TCP connection now, without finishing the response.

        ``reset=True`` sets ``SO_LINGER`` 0 so the peer gets an RST (a "connection reset" error);
        otherwise the peer sees a plain close (an incomplete chunked body).
        """
        self.aborted = True
        if reset:
            sock = self.writer.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
        self.writer.transport.abort()

    async def wait_gone(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the client to go away; True if it did."""
        try:
            await asyncio.wait_for(self.gone.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    def next_cycle(self) -> bool:
        """Prepare for the next request on this connection; False when it must be closed."""
        if self.aborted or self._eof:
            return False
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            return True
        return False

    def close(self) -> None:
        """Close the connection (flushing what was written) and stop the reader task."""
        self._reader_task.cancel()
        if not self.writer.transport.is_closing():
            self.writer.close()


def _with_server(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``headers`` with a ``server`` header (the simulator's, unless the caller names its own)."""
    if any(k.lower() == "server" for k, _ in headers):
        return headers
    return [("server", "eagle-datagen-sim"), *headers]


Handler = Callable[[HttpConnection, Request], Awaitable[None]]


async def serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler) -> None:
    """Serve requests on one connection until the client leaves or a response closes it."""
    conn = HttpConnection(reader, writer)
    try:
        while True:
            req = await conn.next_request()
            if req is None:
                break
            try:
                await handler(conn, req)
            except ClientGone:
                break
            except Exception:  # a handler bug: answer 500 if nothing was sent yet, then close
                if conn.h11.our_state is h11.SEND_RESPONSE and not conn.aborted:
                    body = b'{"error":{"code":500,"message":"simulator internal error"}}'
                    try:
                        await conn.respond(500, [("content-type", "application/json")], body)
                    except (ClientGone, h11.LocalProtocolError):
                        pass
                raise
            if not conn.next_cycle():
                break
    finally:
        conn.close()
