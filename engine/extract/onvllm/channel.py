"""The hand-off from datagen's KV connector (inside vLLM's worker) to the extraction worker.

vLLM builds the connector itself, in whichever process holds tensor-parallel rank 0 (the worker's
own process when vLLM runs in-process, a child process with ``tp x pp > 1``). So the connector
sends each request's capture over a Unix socket that the extraction worker serves
(:class:`CaptureServer`); the worker's writer then commits it like any other batch (atomic files,
manifest after fsync + rename, disk guard, status). Nothing is written to disk on this path.

Wire format, one message per request: an 8-byte big-endian header length, a JSON header
``{"key": str, "shape": [T, n, H], "dtype": "bfloat16", "token_ids": [T ints]}`` (dtype: the torch
dtype's name) and the raw C-order bytes of the hidden states ``[T, n, H]``.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.errors import DatagenError

_LEN = struct.Struct(">Q")


class ChannelError(DatagenError):
    """The connector's hand-off failed (a capture that never came, or came malformed)."""


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = conn.recv_into(view[got:], n - got)
        if k == 0:
            return None
        got += k
    return bytes(buf)


class CaptureServer:
    """Receives captures on a Unix socket (a private temp directory, mode 0700).

    Each capture is ``(token_ids [T] int64 numpy, hidden [T, n, H] torch CPU tensor)``, stored by key until
    :meth:`take` removes it. Thread-safe; :meth:`close` stops the listener and removes the socket.
    """

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="datagen-vllm-"))
        os.chmod(self._dir, 0o700)
        self.path = str(self._dir / "capture.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        self._sock.listen(16)
        self._got: dict[str, tuple[np.ndarray, Any]] = {}
        self._cond = threading.Condition()
        self._closed = False
        self.error: str | None = None
        self._thread = threading.Thread(target=self._accept, name="datagen-vllm-capture", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="datagen-vllm-capture-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                head = _recv_exact(conn, _LEN.size)
                if head is None:
                    return
                try:
                    (n,) = _LEN.unpack(head)
                    meta = json.loads(_recv_exact(conn, n) or b"null")
                    shape = tuple(int(x) for x in meta["shape"])
                    dtype = getattr(torch, str(meta["dtype"]), None)
                    if not isinstance(dtype, torch.dtype):
                        raise ValueError(f"dtype {meta['dtype']!r}")
                    size = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
                    body = _recv_exact(conn, size) if size else b""
                    if body is None:
                        raise ChannelError(f"capture {meta.get('key')!r}: connection closed mid-message")
                    hidden = torch.frombuffer(bytearray(body), dtype=dtype).reshape(shape) if size else \
                        torch.empty(shape, dtype=dtype)
                    ids = np.asarray(meta["token_ids"], dtype=np.int64)
                except (ChannelError, KeyError, TypeError, ValueError) as e:
                    with self._cond:
                        self.error = f"malformed capture from the KV connector: {e}"
                        self._cond.notify_all()
                    return
                with self._cond:
                    self._got[str(meta["key"])] = (ids, hidden)
                    self._cond.notify_all()

    def has(self, keys: list[str]) -> bool:
        """True when every key has arrived."""
        with self._cond:
            return all(k in self._got for k in keys)

    def wait(self, keys: list[str], timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for every key; True when all arrived.

        Raises:
            ChannelError: a malformed message arrived.
        """
        end = time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self.error:
                    raise ChannelError(self.error)
                if all(k in self._got for k in keys):
                    return True
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)

    def take(self, key: str) -> tuple[np.ndarray, Any]:
        """Remove and return ``(token_ids [T], hidden [T, n, H])`` of ``key`` (KeyError if absent)."""
        with self._cond:
            return self._got.pop(key)

    def close(self) -> None:
        """Stop listening and remove the socket and its directory."""
        self._closed = True
        try:
            self._sock.close()
        finally:
            for p in (Path(self.path), self._dir):
                try:
                    p.unlink() if p.is_file() or p.is_socket() else p.rmdir()
                except OSError:
                    pass


class CaptureClient:
    """The connector's end: sends one capture per request (connects lazily, once)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def send(self, key: str, token_ids: list[int], hidden: Any) -> None:
        """Send ``hidden`` (a CPU torch tensor ``[T, n, H]``) for ``key``.

        Raises:
            OSError: the worker's socket is gone.
        """
        t = hidden.contiguous()
        raw = t.view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8)
        meta = json.dumps({"key": key, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                           "token_ids": [int(x) for x in token_ids]}).encode()
        with self._lock:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._sock.connect(self.path)
            self._sock.sendall(_LEN.pack(len(meta)) + meta)
            self._sock.sendall(np.ascontiguousarray(raw).data.cast("B"))

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
