"""``[run] metrics_port``: the Prometheus endpoint, served on the engine's own event loop.

:class:`MetricsServer` binds its socket when it is built (so a port in use refuses the start before
anything is sent or written, like any config error), serves ``GET /metrics`` once :meth:`start`
is awaited on the running loop, and stops with :meth:`close`: the listening socket and every open
connection are closed, nothing outlives the command. HTTP parsing is the simulator's ``h11``
plumbing (:mod:`engine.sim.http`); each scrape renders :class:`engine.report.metrics.SnapshotCollector`
(plus the process collector: ``process_cpu_seconds_total``, ``process_resident_memory_bytes``,
open fds) with ``prometheus_client``'s own encoders, text format 0.0.4, or OpenMetrics when the
scraper asks for it. A scrape runs on the loop like a dashboard refresh: it builds the snapshots
(O(datasets + classes + providers)) and encodes a few hundred lines, with no await in between and
no lock shared with the engine.

:func:`open_metrics` builds one from the ``[run]`` section (None when ``metrics_port`` is unset);
:func:`serving` is the ``async with`` that starts it, says where (``metrics: http://HOST:PORT/metrics``)
and closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import AsyncIterator, Callable, Protocol

from prometheus_client import ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from engine.errors import DatagenError
from engine.extract.snapshot import ExtractSnapshot
from engine.report.metrics import SnapshotCollector
from engine.report.snapshot import RunSnapshot
from engine.sim.http import HttpConnection, Request, serve_connection

log = logging.getLogger("engine")

#: Paths that answer with the metrics (Prometheus scrapes ``/metrics`` by default).
METRICS_PATHS = ("/metrics", "/")
#: The ``server`` header of every answer.
SERVER = [("server", "eagle-datagen")]


class MetricsError(DatagenError):
    """The metrics endpoint cannot listen where ``[run] metrics_host`` / ``metrics_port`` say."""


class MetricsServer:
    """The Prometheus endpoint of one command (``datagen run`` or ``datagen extract``).

    Args:
        host: address to listen on (``[run] metrics_host``, default ``127.0.0.1``).
        port: TCP port (``[run] metrics_port``; 0: an ephemeral one, read it from :attr:`port`).
        collector: what a scrape renders (a :class:`~engine.report.metrics.SnapshotCollector`).

    Raises:
        MetricsError: the address cannot be bound (in use, not a local address, no permission),
            naming the config keys.
    """

    def __init__(self, host: str, port: int, collector: SnapshotCollector) -> None:
        self.host = host
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.registry.register(ProcessCollector(registry=None))
        self._sock = _bind(host, port)
        self.port: int = self._sock.getsockname()[1]
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.Task] = set()
        self.scrapes = 0

    @property
    def url(self) -> str:
        """``http://HOST:PORT/metrics`` (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    async def start(self) -> None:
        """Serve on the running loop (idempotent). The socket is already listening: a scrape that
        came before this waits in the backlog."""
        if self._server is None and self._sock.fileno() != -1:
            self._server = await asyncio.start_server(self._connection, sock=self._sock)

    async def close(self) -> None:
        """Stop listening and close every connection (also before :meth:`start`; idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        else:
            self._sock.close()
        conns = list(self._conns)
        for t in conns:
            t.cancel()
        await asyncio.gather(*conns, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """One scrape's body and content type (OpenMetrics when ``accept`` asks for it)."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            await serve_connection(reader, writer, self._handle)
        except asyncio.CancelledError:
            pass  # close(): the connection goes with the server
        except Exception:  # a scrape must never take the run down
            log.exception("metrics endpoint: a scrape failed")
        finally:
            self._conns.discard(task)

    async def _handle(self, conn: HttpConnection, req: Request) -> None:
        if req.method not in ("GET", "HEAD"):
            await conn.respond(405, [*SERVER, ("allow", "GET, HEAD"), ("content-type", "text/plain")],
                               b"method not allowed\n")
        elif req.path not in METRICS_PATHS:
            await conn.respond(404, [*SERVER, ("content-type", "text/plain")], b"not found: the metrics are at /metrics\n")
        else:
            try:
                body, content_type = self.render(req.headers.get("accept", ""))
            except Exception as e:  # a snapshot source failed: say so, keep serving
                log.exception("metrics endpoint: rendering a scrape failed")
                await conn.respond(500, [*SERVER, ("content-type", "text/plain")], f"metrics unavailable: {e}\n".encode())
                return
            self.scrapes += 1
            # HEAD: the headers of a GET, no body (h11 sends no Data for it)
            await conn.respond(200, [*SERVER, ("content-type", content_type)], b"" if req.method == "HEAD" else body)


def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv4 or IPv6, from the address)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        return socket.create_server((host, port), family=family, backlog=64)
    except OSError as e:
        raise MetricsError(
            f"run.metrics_port: cannot listen on {host}:{port} for the metrics endpoint ({e.strerror or e}); "
            f"choose another [run] metrics_port (another datagen run or extract may serve there), "
            f"or check [run] metrics_host") from None


def open_metrics(run_section, *, run: Callable[[], RunSnapshot | None] | None = None,
                 extract: Callable[[], ExtractSnapshot | None] | None = None) -> MetricsServer | None:
    """The endpoint ``[run]`` asks for, bound but not serving yet; None when ``metrics_port`` is unset.

    Args:
        run_section: the config's :class:`engine.config.RunSection`.
        run / extract: the snapshot sources (see :class:`~engine.report.metrics.SnapshotCollector`).

    Raises:
        MetricsError: the port cannot be bound.
    """
    if run_section.metrics_port is None:
        return None
    return MetricsServer(run_section.metrics_host, run_section.metrics_port, SnapshotCollector(run, extract))


@contextlib.asynccontextmanager
async def serving(server: MetricsServer | None, say: Callable[[str], None] | None = None) -> AsyncIterator[None]:
    """Serve ``server`` (nothing when None) for the block: start it on the running loop, tell
    ``say`` (and the log) where, and close it when the block ends, however it ends."""
    if server is None:
        yield
        return
    try:
        await start_metrics(server, say)
        yield
    finally:
        await server.close()


async def start_metrics(server: MetricsServer, say: Callable[[str], None] | None = None) -> None:
    """Start serving ``server`` on the running loop and tell ``say`` and the log where
    (``metrics: http://127.0.0.1:9100/metrics (Prometheus)``)."""
    await server.start()
    line = f"metrics: {server.url} (Prometheus)"
    log.info("%s", line)
    if say is not None:
        say(line)


class _Out(Protocol):
    """A text stream (the shape of :class:`engine.run.seams.TextOut`, which this layer does not import)."""

    def write(self, s: str, /) -> int: ...
    def flush(self) -> None: ...


def printer(out: _Out) -> Callable[[str], None]:
    """A ``say`` for :func:`serving` that prints to ``out`` and ignores a closed stream."""

    def say(line: str) -> None:
        try:
            print(line, file=out, flush=True)
        except (OSError, ValueError):
            pass

    return say


__all__ = ["METRICS_PATHS", "MetricsError", "MetricsServer", "open_metrics", "printer", "serving", "start_metrics"]
