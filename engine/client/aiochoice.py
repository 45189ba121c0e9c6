"""Which HTTP library the stream workers stream with: aiohttp by default, httpx on request or without aiohttp.

Read by :mod:`engine.stream.worker` for every :class:`~engine.client.chat.ChatClient` it builds
(``http_backend``); :mod:`engine.client.aiostream` is the aiohttp side. Nothing here imports aiohttp.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping

__all__ = ["STREAM_HTTP_ENV", "stream_backend"]

STREAM_HTTP_ENV = "DATAGEN_STREAM_HTTP"
"""Environment variable naming the stream workers' HTTP library: ``aiohttp`` (the default) or ``httpx``."""


def stream_backend(env: Mapping[str, str] | None = None) -> str:
    """The stream workers' HTTP library, ``"aiohttp"`` or ``"httpx"``: ``DATAGEN_STREAM_HTTP`` from ``env``
    (default: ``os.environ``) when set, else ``"aiohttp"`` when it can be imported, else ``"httpx"``.

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
