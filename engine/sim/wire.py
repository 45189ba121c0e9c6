"""JSON shapes of the OpenRouter wire protocol (bodies, SSE chunks, error objects).

Every shape here follows ``docs/openrouter.md`` (late 2026): response ``id`` ``gen-...``,
dated ``model``, display-name ``provider``, ``message.reasoning`` + ``reasoning_details``,
``finish_reason`` + ``native_finish_reason``, ``usage`` with ``cost`` (USD) and the token details,
SSE comments ``: OPENROUTER PROCESSING``, the two usage placements at the end of a stream, both
mid-stream error placements, and the ``{"error": {code, message, metadata}, "user_id"}`` body.
"""

from __future__ import annotations

import json
from typing import Any

from .generator import Plan, ToolCallPlan

#: SSE keep-alive comment (clients must skip lines starting with ``:``).
COMMENT = b": OPENROUTER PROCESSING\n\n"
#: End-of-stream sentinel.
DONE = b"data: [DONE]\n\n"
#: Context window of the simulated model (tokens), as listed for Kimi K2.5.
CONTEXT_LENGTH = 262144
USER_ID = "user_sim"
#: Marker for "take it from the plan" in :func:`completion_object`.
FROM_PLAN: Any = object()


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def dumps(obj: Any) -> str:
    """Compact JSON (one shared encoder: this runs once per SSE chunk)."""
    return _ENCODER.encode(obj)


def error_object(code: int | str, message: str, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"code", "message", "metadata"?}``."""
    err: dict[str, Any] = {"code": code, "message": message}
    if metadata is not None:
        err["metadata"] = metadata
    return err


def error_body(code: int | str, message: str, metadata: dict[str, Any] | None = None) -> bytes:
    """The body of an HTTP error answer: ``{"error": {...}, "user_id": "..."}``."""
    return dumps({"error": error_object(code, message, metadata), "user_id": USER_ID}).encode()


def usage_object(
    prompt_tokens: int, completion_tokens: int, reasoning_tokens: int, price_in: float, price_out: float
) -> dict[str, Any]:
    """``usage`` with ``cost`` = prompt*price_in/1e6 + completion*price_out/1e6 (USD)."""
    p_cost = prompt_tokens * price_in / 1e6
    c_cost = completion_tokens * price_out / 1e6
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "cost": p_cost + c_cost,
        "is_byok": False,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "cost_details": {
            "upstream_inference_cost": None,
            "upstream_inference_prompt_cost": p_cost,
            "upstream_inference_completions_cost": c_cost,
        },
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens, "image_tokens": 0},
    }


def reasoning_details(text: str) -> list[dict[str, Any]]:
    return [{"type": "reasoning.text", "text": text, "format": "unknown", "index": 0}]


def completion_object(
    *,
    gid: str,
    created: int,
    model: str,
    provider: str,
    plan: Plan,
    usage: dict[str, Any] | None,
    content: Any = FROM_PLAN,
    reasoning: str | None = None,
    finish_reason: str | None = None,
    choice_error: dict[str, Any] | None = None,
    top_error: dict[str, Any] | None = None,
    with_tool: bool = True,
) -> dict[str, Any]:
    """A non-stream ``chat.completion`` object (defaults taken from ``plan``)."""
    if content is FROM_PLAN:
        content = plan.content
    if reasoning is None:
        reasoning = plan.reasoning if plan.reasoning_visible else ""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "reasoning": reasoning or None,
    }
    if reasoning:
        message["reasoning_details"] = reasoning_details(reasoning)
    if with_tool and plan.tool_call is not None:
        message["tool_calls"] = [plan.tool_call.to_openai()]
    fr = finish_reason or plan.finish_reason
    choice: dict[str, Any] = {
        "logprobs": None,
        "finish_reason": fr,
        "native_finish_reason": fr,
        "index": 0,
        "message": message,
    }
    if choice_error is not None:
        choice["error"] = choice_error
    out: dict[str, Any] = {
        "id": gid,
        "provider": provider,
        "model": model,
        "object": "chat.completion",
        "created": created,
        "choices": [choice],
    }
    if top_error is not None:
        out["error"] = top_error
    if usage is not None:
        out["usage"] = usage
    return out


class ChunkBuilder:
    """Builds ``data: {chunk}\\n\\n`` SSE events for one generation (header part precomputed)."""

    def __init__(self, gid: str, created: int, model: str, provider: str) -> None:
        head = {"id": gid, "provider": provider, "model": model, "object": "chat.completion.chunk", "created": created}
        self._head = dumps(head)[:-1]  # without the closing brace

    def _event(self, tail: str) -> bytes:
        return f"data: {self._head},{tail}}}\n\n".encode()

    def delta(self, delta: str, finish: str | None = None, extra: str = "") -> bytes:
        """A chunk with ``choices[0].delta`` = the JSON text ``delta``."""
        fr = "null" if finish is None else dumps(finish)
        return self._event(
            f'"choices":[{{"index":0,"delta":{delta},"finish_reason":{fr},'
            f'"native_finish_reason":{fr},"logprobs":null}}]{extra}'
        )

    def reasoning(self, text: str) -> bytes:
        t = dumps(text)
        return self.delta(
            '{"role":"assistant","content":"","reasoning":%s,"reasoning_details":'
            '[{"type":"reasoning.text","text":%s,"format":"unknown","index":0}]}' % (t, t)
        )

    def content(self, text: str) -> bytes:
        return self.delta('{"role":"assistant","content":%s}' % dumps(text))

    def tool_first(self, tool: ToolCallPlan) -> bytes:
        frag = {"index": 0, "id": tool.id, "type": "function", "function": {"name": tool.name, "arguments": ""}}
        return self.delta('{"role":"assistant","content":null,"tool_calls":[%s]}' % dumps(frag))

    def tool_args(self, piece: str) -> bytes:
        return self.delta('{"role":"assistant","tool_calls":[{"index":0,"function":{"arguments":%s}}]}' % dumps(piece))

    def finish(self, reason: str, usage: dict[str, Any] | None = None) -> bytes:
        extra = "" if usage is None else ',"usage":' + dumps(usage)
        return self.delta('{"role":"assistant","content":""}', finish=reason, extra=extra)

    def usage_only(self, usage: dict[str, Any]) -> bytes:
        return self._event('"choices":[],"usage":' + dumps(usage))

    def error_top(self, err: dict[str, Any]) -> bytes:
        """Current mid-stream error form: top-level ``error`` + ``finish_reason: "error"``."""
        return self.delta('{"role":"assistant","content":""}', finish="error", extra=',"error":' + dumps(err))

    def error_in_choice(self, err: dict[str, Any]) -> bytes:
        """Older mid-stream error form: ``error`` inside ``choices[0]``."""
        return self._event(
            '"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"error",'
            '"native_finish_reason":"error","error":%s}]' % dumps(err)
        )
