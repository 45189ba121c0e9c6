"""What the client accepts from the wire, and the named flags for everything else (pure: data in, data out).

The contract is written down in ``docs/wire-conformance.md``; this module holds its rules that are not
about framing: which finish reasons mean a natural stop, which usage and cost figures are the billed
ones, and the invariants of a completion that billing exactness cannot see. A shape outside the
contract is never normalised silently: it raises a **flag** on the completion
(:attr:`engine.client.types.Completion.flags`), stored with the result (``results.wire_flags``) and
counted per provider (dashboard providers pane, ``status --json``, the report).

Two kinds of flags:

- :data:`FAILING`: the text, the tool calls or the ids may not be the model's own: the record stays in
  the store with the flag as its reason and is kept out of every training export;
- :data:`NOTES`: a documented alias or extension was applied (the record is exact): counted only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from engine.finishes import DEFAULT_FINISH_ALIASES, STANDARD_FINISHES, finish_aliases  # noqa: F401 - re-exported

from .attribution import FAILING as ATTRIBUTION_FAILING
from .attribution import attribute
from .types import ChatRequest, Completion, Usage

#: Flags whose record is kept out of training (the text or ids may not be the model's), with the reason
#: shown to the user.
FAILING: dict[str, str] = {
    "replacement_char": "U+FFFD in the generated text that the prompt does not contain (a provider's "
                        "per-token detokenisation destroyed a multi-byte character)",
    "reasoning_after_content": "reasoning resumed after the answer started: it cannot be laid out as one "
                               "think block, and regrouping it would not be the model's order",
    "tool_call_ambiguous": "tool-call fragments that cannot be assembled into calls with certainty",
    "tool_args_object": "tool-call arguments sent as a JSON object instead of the model's string "
                        "(re-serialising may change the tokens)",
    "token_ids_disagree": "the server's generated token ids differ from the reconstruction",
    "unknown_finish": "a finish reason that is neither standard nor a known alias: whether the text is "
                      "complete is unknown",
    "content_filtered": "finish_reason content_filter: the provider's filter cut or altered the reply",
    "tool_calls_missing": "finish_reason tool_calls (or function_call) but no tool call arrived",
    **ATTRIBUTION_FAILING,  # model_mismatch, spliced_generation: not one generation of the target
}
#: Flags that are counted but leave the record valid.
NOTES: dict[str, str] = {
    "finish_alias": "a provider's alias of a finish reason was read as the standard one (e.g. eos -> stop)",
    "stop_at_max_tokens": "finish_reason stop, but the billed completion reached max_tokens: read as a cut",
    "finish_at_max_tokens": "a finish other than stop or length (tool_calls, ...), but the billed completion reached "
                            "max_tokens: read as a cut (vLLM #58228, #53269)",
    "native_finish_cut": "native_finish_reason says the generation was cut (length, max_tokens, abort, ...) while "
                         "finish_reason does not: read as a cut",
    "tool_id_changed": "a tool call's id changed after its first fragment (the first id is kept)",
    "usage_reasoning_outside": "completion_tokens left out the reasoning tokens (reasoning_tokens > "
                               "completion_tokens): both counted",
    "byok_upstream_cost": "BYOK: the spend is usage.cost_details.upstream_inference_cost (plus usage.cost)",
    "usage_preview": "a usage that arrived before any text was not taken as the generation's usage",
    "usage_in_choice": "usage came inside choices[0]",
    "usage_extension": "usage came in a provider extension object (x_*)",
    "usage_after_done": "usage came after [DONE]",
    "usage_invalid": "a usage figure was negative, not finite or not a number (read as 0 tokens / no cost); "
                     "the result is accounted at our estimate (usage_source implausible)",
}
ALL_FLAGS: tuple[str, ...] = (*FAILING, *NOTES)
_REPLACEMENT = "\ufffd"

def resolve_finish(raw: str, aliases: Mapping[str, str]) -> tuple[str, bool]:
    """``(finish reason, aliased)``: a standard value as is; a known alias (case-insensitive) mapped;
    anything else verbatim (validation fails it as ``unknown_finish``)."""
    if raw in STANDARD_FINISHES:
        return raw, False
    low = raw.lower()
    if low in STANDARD_FINISHES:
        return low, True
    mapped = aliases.get(low)
    return (mapped, True) if mapped else (raw, False)


def _num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) and f >= 0 else None


def _int(v: Any) -> int:
    f = _num(v)
    return int(f) if f is not None else 0


def read_usage(u: Any) -> tuple[Usage, tuple[str, ...]]:
    """The billed :class:`Usage` of a ``usage`` object, and the flags its shape raised.

    - tokens: ``prompt_tokens``; ``completion_tokens`` includes the reasoning (OpenAI, OpenRouter); a
      usage whose ``completion_tokens_details.reasoning_tokens`` EXCEEDS ``completion_tokens`` left the
      reasoning out (xAI, Gemini through gateways): both are added (flag ``usage_reasoning_outside``);
    - cost (USD): ``cost``; with ``is_byok`` true (OpenRouter bring-your-own-key) the provider billed the
      user's own key ``cost_details.upstream_inference_cost`` on top of OpenRouter's fee ``cost``: the spend
      is their sum (flag ``byok_upstream_cost``); the same when ``cost`` is 0 and an upstream cost is given.

    Missing fields count 0; numeric strings are read; a non-object gives zeros and no flags. A figure
    that is negative, NaN, infinite or not a number is read as 0 (no cost) and flags ``usage_invalid``
    (:func:`raw_usage_figures` keeps what was sent).
    Source: docs/wire-conformance.md ("Usage and cost").
    """
    if not isinstance(u, dict):
        return Usage(), ()
    flags: list[str] = []
    if any(_invalid(v) for v in _figures(u).values()):
        flags.append("usage_invalid")
    details = u.get("completion_tokens_details")
    reasoning = _int(details.get("reasoning_tokens")) if isinstance(details, dict) else 0
    completion = _int(u.get("completion_tokens"))
    if reasoning > completion:
        completion += reasoning
        flags.append("usage_reasoning_outside")
    cost = _num(u.get("cost"))
    cd = u.get("cost_details")
    upstream = _num(cd.get("upstream_inference_cost")) if isinstance(cd, dict) else None
    if upstream and (u.get("is_byok") is True or not cost):
        cost = (cost or 0.0) + upstream
        flags.append("byok_upstream_cost")
    return Usage(prompt_tokens=_int(u.get("prompt_tokens")), completion_tokens=completion,
                 reasoning_tokens=reasoning, cost_usd=cost), tuple(flags)


def _figures(u: dict) -> dict[str, Any]:
    """The numeric figures of a usage object as sent (absent ones left out)."""
    details = u.get("completion_tokens_details")
    cd = u.get("cost_details")
    out = {k: u.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens", "cost")}
    out["reasoning_tokens"] = details.get("reasoning_tokens") if isinstance(details, dict) else None
    out["upstream_inference_cost"] = cd.get("upstream_inference_cost") if isinstance(cd, dict) else None
    return {k: v for k, v in out.items() if v is not None}


def _invalid(v: Any) -> bool:
    """A figure that is present but no finite number >= 0 (booleans and unparseable strings included)."""
    return v is not None and _num(v) is None


def raw_usage_figures(u: Any) -> str | None:
    """The numeric figures of a usage object exactly as sent, as JSON text (NaN and infinities as
    strings), for the record's audit (``results.usage_claimed``); None for a non-object."""
    if not isinstance(u, dict):
        return None
    figs = {k: (v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else
                v if isinstance(v, str) else repr(v)) for k, v in _figures(u).items()}
    return json.dumps(figs, separators=(",", ":"), sort_keys=True)


def usage_location(chunk: Mapping[str, Any]) -> tuple[Any, str | None]:
    """Where a chunk carries its usage: ``(usage object, flag)``; the flag names a non-standard place
    (``usage_in_choice``, ``usage_extension``); ``(None, None)`` when the chunk has none.

    Places, in order: top-level ``usage``; ``choices[0].usage``; ``usage`` inside a top-level extension
    object whose key starts with ``x_`` (Groq's ``x_groq``)."""
    u = chunk.get("usage")
    if u:
        return u, None
    choices = chunk.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict) and choices[0].get("usage"):
        return choices[0]["usage"], "usage_in_choice"
    for k, v in chunk.items():
        if k.startswith("x_") and isinstance(v, dict) and v.get("usage"):
            return v["usage"], "usage_extension"
    return None, None


def generated_texts(c: Completion) -> Iterable[str]:
    """Every generated piece of text: reasoning, content, each tool call's name, id and arguments."""
    yield c.reasoning
    yield c.content
    for t in c.tool_calls:
        yield t.name
        yield t.arguments


def _prompt_text(req: ChatRequest) -> str:
    return json.dumps(req.messages, ensure_ascii=False)


#: ``native_finish_reason`` values (lower-cased) that say the generation did not end by itself.
NATIVE_CUT = frozenset({"length", "max_tokens", "max_output_tokens", "max_completion_tokens", "model_length",
                        "abort", "aborted", "cancelled", "canceled", "timeout", "error"})


def native_says_cut(native: str | None) -> bool:
    """Whether a provider's own finish reason says the generation was cut (:data:`NATIVE_CUT`)."""
    return bool(native) and str(native).strip().lower() in NATIVE_CUT


def finalize(req: ChatRequest, c: Completion) -> Completion:
    """The completion with the invariants that need its request checked: its flags extended.

    - any finish but ``length`` whose billed completion tokens reached ``req.max_tokens`` was cut by the
      limit: its finish becomes ``length`` (never closed with an end-of-turn token or tool-call markers;
      flag ``stop_at_max_tokens`` for ``stop``, ``finish_at_max_tokens`` for the others, e.g. ``tool_calls``:
      vLLM #58228); a ``native_finish_reason`` that says cut or aborted (:data:`NATIVE_CUT`) likewise
      (flag ``native_finish_cut``);
    - U+FFFD in any generated text while the prompt has none: flag ``replacement_char`` (the model does
      not write U+FFFD unprompted; a provider that detokenises token by token does);
    - ``content_filter``: flag ``content_filtered``; ``tool_calls``/``function_call`` with no call:
      flag ``tool_calls_missing``; any finish outside the standard set: flag ``unknown_finish``;
    - the response's model and the request's sampling settings: :func:`engine.client.attribution.attribute`
      (flag ``model_mismatch``).
    """
    c = attribute(req, c)
    flags = list(c.flags)
    fin = c.finish_reason
    if fin == "content_filter":
        flags.append("content_filtered")
    elif fin in ("tool_calls", "function_call") and not c.tool_calls:
        flags.append("tool_calls_missing")
    elif fin not in STANDARD_FINISHES:
        flags.append("unknown_finish")
    if fin != "length" and c.usage_reported and req.max_tokens and c.usage.completion_tokens >= req.max_tokens:
        flags.append("stop_at_max_tokens" if fin == "stop" else "finish_at_max_tokens")
        fin = "length"
    elif fin != "length" and native_says_cut(c.native_finish_reason):
        flags.append("native_finish_cut")
        fin = "length"
    if any(_REPLACEMENT in t for t in generated_texts(c)) and _REPLACEMENT not in _prompt_text(req):
        flags.append("replacement_char")
    if fin == c.finish_reason and len(flags) == len(c.flags):
        return c
    return replace(c, finish_reason=fin, flags=tuple(dict.fromkeys(flags)))


def failing(flags: Iterable[str]) -> list[str]:
    """The flags of ``flags`` that keep a record out of training, in :data:`FAILING` order."""
    s = set(flags)
    return [f for f in FAILING if f in s]


def encode_flags(flags: Iterable[str]) -> str:
    """The ``results.wire_flags`` text of ``flags``: comma-separated, "" for none."""
    return ",".join(flags)


def decode_flags(text: str | None) -> tuple[str, ...]:
    """Flags from a ``results.wire_flags`` text."""
    return tuple(f for f in (text or "").split(",") if f)
