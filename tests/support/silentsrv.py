"""A server on 127.0.0.1 that accepts TCP connections, reads what is sent and never answers (stdlib only).

What a hung server or proxy looks like from the client: the connection succeeds, the request is
read, and no status line ever comes back. Connections stay open until the server is closed.

    with SilentServer() as srv:
        ... [provider] base_url = srv.base_url ...
        assert srv.connections >= 1
"""

from __future__ import annotations

import socket
import threading
from typing import Any


class SilentServer:
    """Accepts and reads, never writes.

    Args:
        port: the port to listen on (0: any free one).

    Attributes:
        base_url: ``http://127.0.0.1:PORT/v1``.
        port: the port it listens on.
        connections: connections accepted so far.
        received: bytes read so far (every request's head and body).
    """

    def __init__(self, port: int = 0) -> None:
        self._sock = socket.create_server(("127.0.0.1", port))
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.connections = 0
        self.received = 0
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> "SilentServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting and close every connection (the clients then see a reset or an end)."""
        self._closed.set()
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            for c in self._conns:
                try:
                    c.close()
                except OSError:
                    pass
            self._conns.clear()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._conns.append(conn)
            threading.Thread(target=self._drain, args=(conn,), daemon=True).start()

    def _drain(self, conn: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            with self._lock:
                self.received += len(data)
