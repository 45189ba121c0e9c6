"""Which HTTP library the stream workers stream with: httpx by default, aiohttp on request (``DATAGEN_STREAM_HTTP``).

Read by :mod:`engine.stream.worker` for every :class:`~engine.client.chat.ChatClient` it builds
(``http_backend``); :mod:`engine.client.aiostream` is the aiohttp side. Nothing here imports aiohttp.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping

__all__ = ["STREAM_HTTP_ENV", "stream_backend"]

STREAM_HTTP_ENV = "DATAGEN_STREAM_HTTP"
"""Environment variable naming the stream workers' HTTP library: ``httpx`` (the default) or ``aiohttp``.

httpx is the default by the numbers (docs/benchmarks.md, B1): at 300 streams the engine with aiohttp workers
spent 4.3-4.5 CPU-s per 1,000 requests against 8.0-8.7 with httpx, but at 2,000 streams three of five aiohttp
runs fell to 34-47 requests/s at 9.5-10.6 CPU-s/1k (httpx: 6.4-7.6 in every run), not yet explained."""


def stream_backend(env: Mapping[str, str] | None = None) -> str:
    """The stream workers' HTTP library, ``"httpx"`` or ``"aiohttp"``: ``DATAGEN_STREAM_HTTP`` from ``env``
    (default: ``os.environ``) when set, else ``"httpx"``.

    Raises:
        ValueError: ``DATAGEN_STREAM_HTTP`` set to anything else, or to ``aiohttp`` when it is not installed.
    """
    value = (os.environ if env is None else env).get(STREAM_HTTP_ENV, "").strip().lower()
    if not value:
        return "httpx"
    if value not in ("aiohttp", "httpx"):
        raise ValueError(f"{STREAM_HTTP_ENV} must be 'aiohttp' or 'httpx', got {value!r}")
    if value == "aiohttp" and importlib.util.find_spec("aiohttp") is None:
        raise ValueError(f"{STREAM_HTTP_ENV}=aiohttp but aiohttp is not installed (pip install aiohttp)")
    return value
