"""Which HTTP library the stream workers stream with: aiohttp when installed (it is a dependency), httpx on
request (``DATAGEN_STREAM_HTTP=httpx``).

Read by :mod:`engine.stream.worker` for every :class:`~engine.client.chat.ChatClient` it builds
(``http_backend``); :mod:`engine.client.aiostream` is the aiohttp side. Nothing here imports aiohttp.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping

__all__ = ["STREAM_HTTP_ENV", "stream_backend"]

STREAM_HTTP_ENV = "DATAGEN_STREAM_HTTP"
"""Environment variable naming the stream workers' HTTP library: ``aiohttp`` (the default when installed) or
``httpx``.

aiohttp is the default by the numbers (docs/benchmarks.md, B1, same session, 2,000 streams, 2 cores): the engine
with its aiohttp worker spent 3.8-5.7 CPU-s per 1,000 requests at 158-193 requests/s against 9.2-9.5 at 104-115
with the httpx worker, the bare sharded httpx loop 7.5-7.9; with a busy-looping process on one core beside the
run, 64-83 requests/s against httpx's 42-47."""


def stream_backend(env: Mapping[str, str] | None = None) -> str:
    """The stream workers' HTTP library, ``"httpx"`` or ``"aiohttp"``: ``DATAGEN_STREAM_HTTP`` from ``env``
    (default: ``os.environ``) when set, else ``"aiohttp"`` when it is installed, else ``"httpx"``.

    Raises:
        ValueError: ``DATAGEN_STREAM_HTTP`` set to anything else, or to ``aiohttp`` when it is not installed.
    """
    value = (os.environ if env is None else env).get(STREAM_HTTP_ENV, "").strip().lower()
    installed = importlib.util.find_spec("aiohttp") is not None
    if not value:
        return "aiohttp" if installed else "httpx"
    if value not in ("aiohttp", "httpx"):
        raise ValueError(f"{STREAM_HTTP_ENV} must be 'aiohttp' or 'httpx', got {value!r}")
    if value == "aiohttp" and not installed:
        raise ValueError(f"{STREAM_HTTP_ENV}=aiohttp but aiohttp is not installed (pip install aiohttp)")
    return value
