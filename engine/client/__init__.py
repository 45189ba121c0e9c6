"""OpenAI-compatible chat-completions client (OpenRouter dialect): types, SSE parsing, errors, retries.

Public names are importable from here lazily (``from engine.client import ChatClient``), so importing
``engine.client.types`` alone does not pull in httpx or tenacity.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ChatClient": "chat",
    "is_loopback_host": "chat",
    "StreamProgress": "accumulate",
    "StreamAccumulator": "accumulate",
    "parse_completion_body": "accumulate",
    "estimate_tokens": "accumulate",
    "classify_http_error": "errors",
    "classify_error_object": "errors",
    "parse_retry_after": "errors",
    "RetryPolicy": "retry",
    "call_with_retries": "retry",
    "SSEParser": "sse",
    "ToolCallAssembler": "toolcalls",
    "DONE": "sse",
    "ChatRequest": "types",
    "Completion": "types",
    "ErrorClass": "types",
    "RequestError": "types",
    "ToolCall": "types",
    "Usage": "types",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{mod}"), name)
