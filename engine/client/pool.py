"""A sharded HTTP/1.1 transport: many small httpcore pools instead of one big one.

Why: httpcore 1.0's ``AsyncConnectionPool._assign_requests_to_connections`` runs on every request start and end
and costs O(idle_connections x connections) (it rebuilds a list of all connections for every idle one) plus a
``select()`` per idle connection. With one pool of 2,000+ connections that is millions of calls per request event:
at the end of a burst, 200 streams already spend ~2 s of CPU there (measured). Splitting the connections over
shards of ``shard_size`` keeps each event O(shard_size^2) in the worst case.

Each request goes to the shard with the fewest requests in flight (ties: the lowest index, so light traffic keeps
reusing the same warm keep-alive connections); the count drops when the response stream is closed.
"""

from __future__ import annotations

import ssl
import sys
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import httpcore
import httpx

try:
    import sniffio  # noqa: F401 - only whether it can be imported
except ImportError:
    # httpcore 1.0 runs ``import sniffio`` on every lock and event it sets up (several per request); without
    # sniffio installed (anyio >= 4.5 no longer needs it) each try searches every sys.path entry (~9% of a
    # stream's CPU, measured). A None entry fails that import at once; httpcore then assumes asyncio (the
    # same answer: trio is not used here).
    sys.modules.setdefault("sniffio", None)  # type: ignore[arg-type]

__all__ = ["ShardedTransport", "env_proxy_for"]


def env_proxy_for(url: httpx.URL) -> str | None:
    """The proxy the environment (``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``ALL_PROXY``, ``NO_PROXY``) names for
    ``url``, or None."""
    proxies = urllib.request.getproxies()
    proxy = proxies.get(url.scheme) or proxies.get("all")
    if not proxy:
        return None
    try:
        if urllib.request.proxy_bypass(url.host):
            return None
    except OSError:  # pragma: no cover - platform lookups
        pass
    return proxy


class _CountedStream(httpx.AsyncByteStream):
    """Wraps a shard's response stream; releases the shard's in-flight slot once, on close."""

    __slots__ = ("_inner", "_owner", "_shard", "_open")

    def __init__(self, inner: httpx.AsyncByteStream, owner: ShardedTransport, shard: int) -> None:
        self._inner = inner
        self._owner = owner
        self._shard = shard
        self._open = True

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._inner:
            yield part

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            if self._open:
                self._open = False
                self._owner._in_flight[self._shard] -= 1


class _LeanPool(httpcore.AsyncConnectionPool):
    """httpcore 1.0's connection pool with its bookkeeping pass (run at every request start and end) in
    linear time: the same decisions in the same order as
    ``AsyncConnectionPool._assign_requests_to_connections``, without its quadratic part (for every idle
    connection it builds a list of all connections only to take its length) and without lists built per
    queued request that are not used. Installed by :class:`ShardedTransport` on httpcore 1.0.x only."""

    def _assign_requests_to_connections(self) -> list[Any]:
        closing: list[Any] = []
        conns = self._connections
        keep = self._max_keepalive_connections
        for connection in list(conns):
            if connection.is_closed():
                conns.remove(connection)
            elif connection.has_expired():
                conns.remove(connection)
                closing.append(connection)
            elif connection.is_idle() and len(conns) > keep:
                conns.remove(connection)
                closing.append(connection)
        for pool_request in [r for r in self._requests if r.is_queued()]:
            origin = pool_request.request.url.origin
            available = next((c for c in conns if c.can_handle_request(origin) and c.is_available()), None)
            if available is not None:
                pool_request.assign_to_connection(available)
            elif len(conns) < self._max_connections:
                connection = self.create_connection(origin)
                conns.append(connection)
                pool_request.assign_to_connection(connection)
            else:
                idle = next((c for c in conns if c.is_idle()), None)
                if idle is not None:
                    conns.remove(idle)
                    closing.append(idle)
                    connection = self.create_connection(origin)
                    conns.append(connection)
                    pool_request.assign_to_connection(connection)
        return closing


def _lean(transport: httpx.AsyncHTTPTransport) -> httpx.AsyncHTTPTransport:
    """``transport`` with its pool made a :class:`_LeanPool` when it is httpcore 1.0's plain pool (not a
    proxy's; another httpcore version keeps its own)."""
    pool = getattr(transport, "_pool", None)
    if type(pool) is httpcore.AsyncConnectionPool and httpcore.__version__.startswith("1.0."):
        pool.__class__ = _LeanPool
    return transport


class ShardedTransport(httpx.AsyncBaseTransport):
    """``httpx.AsyncBaseTransport`` over ``ceil(max_connections / shard_size)`` HTTP/1.1 connection pools.

    Args:
        max_connections: total connection limit (each shard gets ``shard_size``, the last one the remainder).
        shard_size: connections per shard.
        keepalive_expiry: idle keep-alive lifetime (s).
        ssl_context: one shared TLS context (building one per shard would load the CA bundle N times).
        proxy: proxy URL for all shards, or None.
    """

    def __init__(
        self,
        *,
        max_connections: int,
        shard_size: int = 32,
        keepalive_expiry: float = 20.0,
        ssl_context: ssl.SSLContext | None = None,
        proxy: str | None = None,
    ) -> None:
        if max_connections < 1 or shard_size < 1:
            raise ValueError("max_connections and shard_size must be >= 1")
        ctx = ssl_context if ssl_context is not None else httpx.create_ssl_context()
        sizes = [shard_size] * (max_connections // shard_size)
        if max_connections % shard_size:
            sizes.append(max_connections % shard_size)
        self._shards = [
            _lean(httpx.AsyncHTTPTransport(
                verify=ctx,
                http1=True,
                http2=False,
                limits=httpx.Limits(
                    max_connections=n, max_keepalive_connections=n, keepalive_expiry=keepalive_expiry
                ),
                proxy=proxy,
                retries=0,
            ))
            for n in sizes
        ]
        self._in_flight = [0] * len(self._shards)
        self._capacity = sizes

    @property
    def shards(self) -> int:
        """Number of shards."""
        return len(self._shards)

    @property
    def in_flight(self) -> int:
        """Requests currently holding a shard slot (headers pending or body open)."""
        return sum(self._in_flight)

    def _pick(self) -> int:
        counts = self._in_flight
        best = 0
        best_free = self._capacity[0] - counts[0]
        if counts[0] == 0:
            return 0
        for i in range(1, len(counts)):
            free = self._capacity[i] - counts[i]
            if free > best_free:
                best, best_free = i, free
                if counts[i] == 0:
                    break
        return best

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        i = self._pick()
        self._in_flight[i] += 1
        try:
            response = await self._shards[i].handle_async_request(request)
        except BaseException:
            self._in_flight[i] -= 1
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _CountedStream(response.stream, self, i)
        return response

    async def aclose(self) -> None:
        for s in self._shards:
            await s.aclose()
