"""Running the simulator: :class:`SimServer` (async), :class:`SimThread` (own loop in a daemon
thread) and :func:`serve_forever` (``datagen sim``)."""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import threading
from typing import Any

from engine.errors import DatagenError

from .app import PREFIX, SimApp
from .config import SimConfig
from .generator import TokenCounter
from .http import serve_connection
from .ledger import Ledger

log = logging.getLogger(__name__)


class SimBindError(DatagenError, OSError):
    """The simulator cannot listen on its host and port (in use, not allowed, not an address of this
    machine). ``datagen sim`` prints it as one ``error:`` line and exits 1."""


def bind_error(host: str, port: int, e: OSError) -> SimBindError:
    """The one-line :class:`SimBindError` for a failed bind of ``host:port``."""
    shown = host or "0.0.0.0"
    if e.errno == errno.EADDRINUSE:
        why = f"port {port} on {shown} is in use (another process listens there)"
    elif e.errno == errno.EACCES:
        why = f"port {port} on {shown}: permission denied" + (" (ports below 1024 need privileges)"
                                                               if 0 < port < 1024 else "")
    else:
        why = f"cannot listen on {shown} port {port} ({e.strerror or e})"
    err = SimBindError(f"{why}; pick another --port, or --port 0 for any free port")
    err.errno = e.errno  # one line: no "[Errno N]" in the message
    return err


class SimServer:
    """OpenRouter-compatible HTTP/1.1 server on the running event loop (wire: docs/openrouter.md).

    Usage::

        server = SimServer(SimConfig(seed=1))
        await server.start()
        ... httpx.AsyncClient(base_url=server.base_url) ...
        await server.stop()

    Attributes:
        cfg: the :class:`SimConfig`.
        ledger: billing and statistics (:class:`engine.sim.ledger.Ledger`): ``requests``,
            ``completed``, ``billed_usd`` (USD), ``prompt_tokens_billed`` /
            ``completion_tokens_billed`` (tokens), ``outcomes``, ``faults``; ``stats()`` snapshots.
    """

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.ledger = Ledger(
            price_in=cfg.price_in, price_out=cfg.price_out, credits_usd=cfg.credits_usd, log_path=cfg.log_path
        )
        self._server: asyncio.AbstractServer | None = None
        self._app: SimApp | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._port = 0
        #: TCP connections accepted so far (keep-alive reuse keeps this low).
        self.connections = 0
        #: the model-backed sampler (``cfg.target``), set by :meth:`start`; None for the word generator.
        self.backend: Any = None

    async def start(self) -> None:
        """Load the tokenizer (if any) and, for a model-backed simulator (``cfg.target``), the target
        and its quantized copies (:class:`engine.sim.backend.ModelBackend`); start listening on
        ``cfg.host:cfg.port``.

        Raises:
            SimBindError: the port is in use, or the host/port cannot be bound.
            engine.sim.backend.BackendError: the target or tokenizer cannot serve model-backed completions.
        """
        counter = TokenCounter(self.cfg.tokenizer)
        backend = None
        target = self.cfg.target
        if target:  # model-backed: load the target and tune its quantized copies off the loop
            assert counter._tok is not None  # SimConfig requires a tokenizer with a target
            from .backend import ModelBackend
            from .behaviours import parse_behaviour

            cfg = self.cfg
            behaviours = {k: parse_behaviour(v) for k, v in cfg.behaviours.items()}
            backend = await asyncio.to_thread(ModelBackend.load, target, counter._tok, behaviours, seed=cfg.seed,
                                              threads=cfg.model_threads)
        self.backend = backend
        self._app = SimApp(self.cfg, self.ledger, counter, backend)
        try:
            self._server = await asyncio.start_server(
                self._on_connection, self.cfg.host, self.cfg.port, backlog=4096, limit=1 << 20
            )
        except OSError as e:
            raise bind_error(self.cfg.host, self.cfg.port, e) from None
        self._port = self._server.sockets[0].getsockname()[1]

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None and self._app is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            await serve_connection(reader, writer, self._app.handle)
        except asyncio.CancelledError:
            writer.transport.abort()
        except Exception:
            log.exception("simulator connection failed")
            writer.transport.abort()
        finally:
            self._tasks.discard(task)

    @property
    def port(self) -> int:
        """The TCP port listened on (after :meth:`start`)."""
        return self._port

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/api/v1`` (a wildcard host is shown as 127.0.0.1)."""
        host = self.cfg.host if self.cfg.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self._port}{PREFIX}"

    async def stop(self) -> None:
        """Stop listening, drop every open connection (stalled streams included), close the log."""
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 5)
            except asyncio.TimeoutError:
                pass
            self._server = None
        if self.backend is not None:
            self.backend.close()
        self.ledger.close()

    async def __aenter__(self) -> "SimServer":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class SimThread:
    """A :class:`SimServer` on its own event loop in a daemon thread, for synchronous callers.

    ``start()`` blocks until the server listens and returns its ``base_url``; ``stop()`` stops it
    and joins the thread. Also a context manager (``with SimThread(cfg) as base_url: ...``).
    """

    def __init__(self, cfg: SimConfig) -> None:
        self.server = SimServer(cfg)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def ledger(self) -> Ledger:
        return self.server.ledger

    def start(self) -> str:
        """Start the thread; block until listening; return ``base_url`` (raises a start failure)."""
        if self._thread is not None:
            return self.base_url
        self._thread = threading.Thread(target=self._run, name="sim-server", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            self._thread = None
            raise self._error
        return self.base_url

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            try:
                loop.run_until_complete(self.server.start())
                self._stop = asyncio.Event()
            except BaseException as e:  # handed to the starting thread
                self._error = e
                return
            finally:
                self._ready.set()
            loop.run_until_complete(self._stop.wait())
            loop.run_until_complete(self.server.stop())
        finally:
            loop.close()

    def stop(self) -> None:
        """Stop the server and join the thread (idempotent)."""
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None:
            return
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass
        thread.join(timeout=30)
        self._thread = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_forever(cfg: SimConfig) -> None:
    """Run the simulator in the foreground (``datagen sim``) until SIGINT/SIGTERM.

    Prints ``simulator listening on http://127.0.0.1:PORT/api/v1`` (flushed) once listening.
    """

    async def main() -> None:
        server = SimServer(cfg)
        await server.start()
        if server.backend is not None:
            for line in server.backend.describe():
                print(f"model-backed: {line}", flush=True)
        print(f"simulator listening on {server.base_url}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        try:
            await stop.wait()
        finally:
            await server.stop()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
