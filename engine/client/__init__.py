"""OpenAI-compatible chat-completions client (OpenRouter dialect): types, SSE parsing, errors, retries.

Public names are importable from here lazily (``from engine.client import ChatClient``), so importing
``engine.client.types`` alone does not pull in httpx or tenacity.
"""

from __future__ import annotations

from engine.lazy import lazy_exports

_EXPORTS = {
    "ChatClient": "chat",
    "is_loopback_host": "chat",
    "StreamProgress": "progress",
    "StreamAccumulator": "accumulate",
    "parse_completion_body": "accumulate",
    "estimate_tokens": "progress",
    "classify_http_error": "errors",
    "classify_error_object": "errors",
    "parse_retry_after": "responses",
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


__getattr__ = lazy_exports(__name__, _EXPORTS)
