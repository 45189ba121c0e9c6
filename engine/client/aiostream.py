"""The chat-completions POST over aiohttp: the HTTP/1.1 streaming part of :class:`~engine.client.chat.ChatClient`
when it is built with ``http_backend="aiohttp"`` (the stream workers by default; ``DATAGEN_STREAM_HTTP=httpx`` goes
back: :func:`~engine.client.aiochoice.stream_backend`).

Why: per streamed request aiohttp (its C HTTP parser, no anyio/httpcore layers) spends about half the CPU
of httpx with :class:`~engine.client.pool.ShardedTransport` (docs/benchmarks.md, B1). Everything above the bytes
stays the same code: :class:`AioStream.post` returns an :class:`AioResponse` with the few members of
``httpx.Response`` that :class:`~engine.client.chat.ChatClient` reads (``status_code``, ``headers``,
``aiter_bytes``, ``aread``, ``aclose``), and every aiohttp exception is raised as the httpx exception the httpx path
raises for the same failure (:func:`as_httpx`), so the SSE parsing, accumulation and the mapping to
:class:`~engine.client.types.ErrorClass` are the httpx path's own.

The gate (awaited right before the request's first byte is written) runs in :class:`_GatedConnector.connect`,
after a pooled connection was taken or a new one connected and before aiohttp writes the request; whatever it
raises ends the request with nothing sent and the connection back in the pool. aiohttp's own trace hooks at that
point (``on_connection_create_end`` / ``on_connection_reuseconn``) abort the request too, but drop the connection
without closing it (an open socket left to the garbage collector), hence the connector.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import aiohttp
import httpx
from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["AioResponse", "AioStream", "as_httpx"]

_GATE: ContextVar[Callable[[], Awaitable[None]] | None] = ContextVar("aiostream_gate", default=None)
"""The gate of the request the current task is sending (:meth:`AioStream.post`)."""


def as_httpx(exc: BaseException) -> BaseException:
    """The httpx exception the httpx path raises for the failure ``exc`` (an aiohttp / OS exception) stands for;
    any other exception is returned as is. Connect failures: ``ConnectError``/``ConnectTimeout``; no byte within
    the read timeout: ``ReadTimeout``; a connection closed or reset, a malformed or incomplete response:
    ``RemoteProtocolError``/``ReadError``; an undecodable content-encoding: ``DecodingError``."""
    name = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(name)
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return httpx.ReadTimeout(name)
    if isinstance(exc, aiohttp.ClientConnectorError):  # refused, DNS, TLS handshake/verify, proxy
        return httpx.ConnectError(name)
    if isinstance(exc, aiohttp.ClientPayloadError) and "content-encoding" in str(exc).lower():
        return httpx.DecodingError(name)
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientResponseError,
                        HttpProcessingError)):
        return httpx.RemoteProtocolError(name)
    if isinstance(exc, (aiohttp.ClientConnectionError, OSError)):
        return httpx.ReadError(name)
    if isinstance(exc, aiohttp.ClientError):
        return httpx.RemoteProtocolError(name)
    return exc


_FAILURES = (aiohttp.ClientError, HttpProcessingError, OSError)
"""What :func:`as_httpx` translates (``ServerTimeoutError`` is an ``OSError`` via ``TimeoutError``)."""


class _GatedConnector(aiohttp.TCPConnector):
    """A TCP connector awaiting the current task's gate (:data:`_GATE`) on the connection it hands out."""

    async def connect(self, req: Any, traces: Any, timeout: Any) -> aiohttp.connector.Connection:
        conn = await super().connect(req, traces, timeout)
        gate = _GATE.get()
        if gate is not None:
            try:
                await gate()
            except BaseException:
                conn.release()  # nothing was written: the connection stays good for the next request
                raise
        return conn


class AioResponse:
    """One response of :meth:`AioStream.post`, read like an ``httpx.Response`` opened with ``stream=True``.

    Attributes:
        status_code: the HTTP status.
        headers: the response headers (case-insensitive mapping).
    """

    __slots__ = ("_resp", "status_code", "headers")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status_code = resp.status
        self.headers = resp.headers

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body's bytes (content-encoding decoded) as they arrive, one HTTP chunk (or the part of one that
        came) at a time, as httpx yields them: the SSE parser sees the same pieces on both paths.

        Raises:
            httpx.HTTPError: the httpx exception of the failure (:func:`as_httpx`).
        """
        read = self._resp.content.readchunk
        try:
            while True:
                data, chunk_end = await read()
                if data:
                    yield data
                elif not chunk_end:  # (b"", True): a chunk's end found after its bytes were read
                    return
        except _FAILURES as e:
            raise as_httpx(e) from None

    async def aread(self) -> bytes:
        """The whole body. Raises ``httpx.HTTPError`` (:func:`as_httpx`)."""
        try:
            return await self._resp.read()
        except _FAILURES as e:
            raise as_httpx(e) from None

    async def aclose(self) -> None:
        """Give the connection back to the pool when the body was read to its end, else close it (the server
        sees the disconnect)."""
        if self._resp.content.at_eof():
            self._resp.release()
        else:
            self._resp.close()


class AioStream:
    """A pooled aiohttp session POSTing request bodies to one URL (the chat-completions endpoint).

    Args:
        url: the endpoint's full URL.
        headers: headers of every request (``Content-Type``, ``Authorization``, ...).
        connect_timeout_s: TCP+TLS connect limit (s).
        stall_timeout_s: longest silence while waiting for the status line or reading the body (s).
        max_connections: pool size (the endpoint's concurrency); requests over it wait for a connection.
        keepalive_s: how long an idle connection is kept for reuse (s).
        ssl_context: TLS settings (verify, CA files) of ``https://`` URLs.
        proxy: an ``http(s)://`` proxy URL, or None (:func:`~engine.client.pool.env_proxy_for`).

    Raises:
        ValueError: a proxy that is not ``http://`` or ``https://`` (aiohttp has no SOCKS support).
    """

    def __init__(self, url: str, headers: dict[str, str], *, connect_timeout_s: float, stall_timeout_s: float,
                 max_connections: int, keepalive_s: float, ssl_context: ssl.SSLContext,
                 proxy: str | None = None) -> None:
        if proxy is not None and not proxy.lower().startswith(("http://", "https://")):
            raise ValueError(f"aiohttp supports http(s) proxies only, not {proxy.split(':', 1)[0]!r}")
        self._url = url
        self._headers = headers
        self._timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=connect_timeout_s,
                                              sock_read=stall_timeout_s)
        self._limit = max_connections
        self._keepalive = keepalive_s
        self._ssl = ssl_context
        self._proxy = proxy
        self._session: aiohttp.ClientSession | None = None  # made on first use, inside the running loop

    def _open(self) -> aiohttp.ClientSession:
        connector = _GatedConnector(limit=self._limit, limit_per_host=0, keepalive_timeout=self._keepalive,
                                    ssl=self._ssl)
        self._session = aiohttp.ClientSession(
            connector=connector, headers=self._headers, timeout=self._timeout, trust_env=False,
            cookie_jar=aiohttp.DummyCookieJar(), raise_for_status=False)
        return self._session

    async def post(self, body: bytes, gate: Callable[[], Awaitable[None]] | None = None) -> AioResponse:
        """POST ``body`` and return the response once its status line and headers came (the body unread).

        Args:
            body: the request body (JSON bytes).
            gate: awaited on the connection right before the request is written; what it raises is raised
                as is, with nothing sent.

        Raises:
            httpx.HTTPError: the httpx exception of a connect / read failure (:func:`as_httpx`).
        """
        session = self._session or self._open()
        token = _GATE.set(gate)
        try:
            resp = await session.post(self._url, data=body, allow_redirects=False, proxy=self._proxy)
        except _FAILURES as e:
            raise as_httpx(e) from None
        finally:
            _GATE.reset(token)
        return AioResponse(resp)

    async def aclose(self) -> None:
        """Close the pool's connections."""
        if self._session is not None:
            await self._session.close()
