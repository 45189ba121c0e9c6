"""The live engine answers ``datagen status`` itself, and keeps its elapsed time on disk every second.

While ``datagen run`` runs, its engine holds the run directory's lock and serves its own figures on
a Unix socket in the run directory (``RUN_DIR/engine.sock``, mode 0600), like the metrics endpoint
serves Prometheus: :class:`StatusServer` answers each connection with one JSON document built on
the engine's loop from a snapshot taken then (:func:`engine.run.observe.engine_status`), so
``datagen status`` and the dashboard read the same counters at the same moment instead of the
committed rows (which trail the engine by the writer's queue). :func:`ask_engine` is the client;
``datagen status`` reads the store only when no engine answers (it is gone, or predates this).

The same server rewrites ``RUN_DIR/runtime.json`` every :data:`ELAPSED_EVERY_S` seconds with the
run's elapsed seconds (atomically: temp + rename), so a killed engine's elapsed is known to within
that, even when its last store commit is older (a commit under load can take seconds):
:func:`persisted_elapsed` reads it back for ``datagen status`` and for the next start of the run.

Paths longer than a Unix socket address allows (~107 bytes) are reached through
``/proc/self/fd/N/engine.sock`` (Linux); where that fails too, nothing is served and ``status``
reads the store as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("engine")

#: The socket's name in the run directory.
SOCKET_NAME = "engine.sock"
#: The elapsed-time file's name in the run directory.
RUNTIME_FILE = "runtime.json"
#: Seconds between rewrites of :data:`RUNTIME_FILE` (the dashboard redraws about every second).
ELAPSED_EVERY_S = 0.5
#: Seconds ``datagen status`` waits for the engine's answer before reading the store instead.
ASK_TIMEOUT_S = 3.0
#: Longest socket path bound or connected to directly (``sun_path`` is 108 bytes with its NUL).
MAX_SUN_PATH = 100


@contextlib.contextmanager
def _reachable(path: Path):
    """A path to ``path`` short enough for a Unix socket address: itself, or
    ``/proc/self/fd/N/NAME`` through a descriptor of its directory, closed afterwards."""
    if len(os.fsencode(str(path))) <= MAX_SUN_PATH:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


#: The servers of this process by run directory: ``(loop, document)``. A caller on the engine's own
#: loop (a test, a dashboard in the same process) gets the document directly: asking the socket from
#: the thread that must answer it would wait for itself.
_LOCAL: dict[str, tuple[asyncio.AbstractEventLoop, Callable[[], dict[str, Any]]]] = {}


def _key(run_dir: str | Path) -> str:
    return os.path.realpath(run_dir)


class StatusServer:
    """Serves the engine's status document on ``RUN_DIR/engine.sock`` and keeps ``RUN_DIR/runtime.json``.

    Args:
        run_dir: the run directory (the engine holds its lock).
        document: builds the answer (a JSON-able dict); called on the loop, once per connection.
        runtime: the elapsed-file fields now: ``{"pid", "started_at" (epoch s), "elapsed_s" (s)}``.
    """

    def __init__(self, run_dir: str | Path, document: Callable[[], dict[str, Any]],
                 runtime: Callable[[], dict[str, Any]]) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / SOCKET_NAME
        self._document = document
        self._runtime = runtime
        self._server: asyncio.base_events.Server | None = None
        self._ticker: asyncio.Task | None = None
        self.answers = 0

    async def start(self) -> bool:
        """Listen and start the elapsed file's ticker; False (logged) when the socket cannot be
        bound: ``status`` then reads the store. Never raises for that."""
        loop = asyncio.get_running_loop()
        self._ticker = loop.create_task(self._tick(), name="status-runtime")
        _LOCAL[_key(self.run_dir)] = (loop, self._document)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()  # a killed engine's socket: this process holds the run's lock now
            with _reachable(self.path) as p:
                sock.bind(p)
            os.chmod(self.path, 0o600)
            sock.listen(16)
            sock.setblocking(False)
            self._server = await asyncio.start_unix_server(self._answer, sock=sock)
        except OSError as e:
            sock.close()
            log.info("status socket not served (%s): datagen status reads the store", e)
            return False
        return True

    async def close(self) -> None:
        """Write the elapsed file a last time (``final``), then stop serving and remove the socket
        (idempotent). In that order: a ``status`` that finds no socket finds the final figure."""
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
            self.write_runtime(final=True)
        if _LOCAL.get(_key(self.run_dir), (None, None))[1] is self._document:
            del _LOCAL[_key(self.run_dir)]
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()
            with contextlib.suppress(OSError):
                self.path.unlink()
            if ticker is not None:
                self.write_runtime(final=True)  # not below an answer given while the socket closed

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                body = json.dumps(self._document()).encode()
            except Exception as e:  # a status request must never take the run down
                log.exception("status socket: building the answer failed")
                body = json.dumps({"error": str(e)}).encode()
            writer.write(body + b"\n")
            await writer.drain()
            self.answers += 1
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _tick(self) -> None:
        while True:
            self.write_runtime()
            await asyncio.sleep(ELAPSED_EVERY_S)

    def write_runtime(self, final: bool = False) -> None:
        """Rewrite ``RUN_DIR/runtime.json`` now: the runtime fields, ``at`` (epoch s) and ``final``
        (True once the run's loop ended: its elapsed is the run's own, nothing is added to it)."""
        try:
            doc = dict(self._runtime(), at=time.time(), final=final)
            tmp = self.run_dir / f".{RUNTIME_FILE}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, self.run_dir / RUNTIME_FILE)
        except Exception:  # the store's runtime row still has the elapsed of the last commit
            log.debug("runtime file not written", exc_info=True)


def ask_engine(run_dir: str | Path, timeout_s: float = ASK_TIMEOUT_S) -> dict[str, Any] | None:
    """The live engine's status document (what :class:`StatusServer` answers), or None when no
    engine answers on ``RUN_DIR/engine.sock`` within ``timeout_s`` seconds (gone, stale socket,
    another user's, or an engine that predates the socket)."""
    local = _LOCAL.get(_key(run_dir))
    if local is not None:
        try:
            on_loop = asyncio.get_running_loop() is local[0]
        except RuntimeError:
            on_loop = False
        if on_loop:
            try:
                return json.loads(json.dumps(local[1]()))  # what the socket would carry
            except Exception:  # the store then
                return None
    path = Path(run_dir) / SOCKET_NAME
    if not path.exists():
        return None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            with _reachable(path) as p:
                s.connect(p)
            chunks = []
            deadline = time.monotonic() + timeout_s
            while True:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                b = s.recv(1 << 16)
                if not b:
                    break
                chunks.append(b)
        doc = json.loads(b"".join(chunks))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and "live" in doc else None


def read_runtime(run_dir: str | Path) -> dict[str, Any] | None:
    """``RUN_DIR/runtime.json`` as written by :meth:`StatusServer.write_runtime`, or None."""
    try:
        doc = json.loads((Path(run_dir) / RUNTIME_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def persisted_elapsed(run_dir: str | Path, started_at: float | None, heartbeat_at: float | None,
                      stored_s: float) -> float:
    """The run's elapsed seconds as last persisted: the store's runtime row's ``stored_s``, or the
    elapsed file's when it is later and belongs to this store's run (written by the process that
    wrote the runtime row, ``started_at`` epoch s, or by one started after that row's last commit,
    ``heartbeat_at``, and killed before its own first commit). Never less than ``stored_s``.

    A file not marked ``final`` was left by an engine that died (killed): it lived up to
    :data:`ELAPSED_EVERY_S` past its last write (it would have written again), and its dashboard
    may have shown that much more, so that is added: the elapsed time never goes back below what
    the screen last showed, at ``datagen status`` or at the run's next start."""
    doc = read_runtime(run_dir)
    if doc is None or started_at is None:
        return stored_s
    try:
        file_s, file_start = float(doc["elapsed_s"]), float(doc["started_at"])
    except (KeyError, TypeError, ValueError):
        return stored_s
    if not doc.get("final") and doc.get("state") not in ("completed", "stopped"):
        file_s += ELAPSED_EVERY_S
    same = abs(file_start - started_at) < 1e-6
    later = heartbeat_at is not None and file_start >= heartbeat_at
    return max(stored_s, file_s) if same or later else stored_s


__all__ = ["ASK_TIMEOUT_S", "ELAPSED_EVERY_S", "RUNTIME_FILE", "SOCKET_NAME", "StatusServer", "ask_engine",
           "persisted_elapsed", "read_runtime"]
