"""The per-record cheap fidelity signals of a run's store (:class:`engine.fidelity.cheap.CheapRecord`), read from
``results`` joined with ``prompts`` and, where validated, ``validations``.

Per result (one row per bought prompt):

- ``completion_tokens``: ``results.completion_tokens`` (billed, or ours where the provider billed none);
- ``reasoning_tokens``: ``completion_tokens`` times the reasoning text's share of the generated characters
  (reasoning, content and tool-call arguments): what the model wrote, whether or not the provider reports
  ``reasoning_tokens`` (many do not; a provider that reports none would otherwise look like one that does not
  think);
- ``finish_reason``: as stored; ``wire_flagged``: a failing wire flag (:data:`engine.client.conformance.FAILING`;
  notes such as ``usage_in_choice`` are a provider's wire dialect, not drift);
- ``tool_calls_declared`` / ``tool_call_valid``: the prompt's ``tools``, and each call against them
  (:func:`engine.fidelity.toolschema.tool_calls_valid`: declared name, arguments fitting the schema);
- ``prompt_diff``: billed prompt tokens minus our count (``-validations.prompt_diff``; None when not validated
  or not billed);
- ``reconstruct_ok``: None when not validated; else no :data:`RECONSTRUCTION` reason;
- ``stratum``: ``dataset/request class`` (what routing over a run may correlate with).
"""

from __future__ import annotations

import json
from typing import Any

from engine.client.conformance import FAILING, decode_flags
from engine.fidelity.cheap import CheapRecord
from engine.fidelity.toolschema import tool_calls_valid
from engine.storage.handle import Handle, columns

#: Validation reasons (:mod:`engine.tokens.validate`) that say the provider's output did not reconstruct into
#: what it streamed and billed: the ids, the markers, the counts.
RECONSTRUCTION: frozenset[str] = frozenset({
    "think_end_count", "think_start", "end_of_turn", "roundtrip", "reasoning_leak", "special_text",
    "method_disagree", "billing_diff", "token_ids_disagree"})


def _json_list(text: str | None) -> list[Any]:
    try:
        v = json.loads(text) if text else []
    except ValueError:
        return []
    return v if isinstance(v, list) else []


def _args_chars(calls: list[Any]) -> int:
    n = 0
    for tc in calls:
        fn = tc.get("function") if isinstance(tc, dict) else None
        if isinstance(fn, dict):
            a = fn.get("arguments")
            n += len(a) if isinstance(a, str) else len(json.dumps(a))
    return n


def cheap_records(handle: Handle, since_id: int = 0) -> dict[str, list[CheapRecord]]:
    """``{provider: [CheapRecord]}`` of the results with ``prompt_id > since_id``, in prompt-id order (provider as
    stored; a store without ``validations`` or older than ``wire_flags`` reads as not validated / no flags)."""
    has_v = handle._db.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='validations'").fetchone() is not None
    flags = "r.wire_flags" if "wire_flags" in columns(handle, "results") else "''"
    v_cols, v_join = ("v.prompt_id, v.reasons, v.prompt_diff",
                      " LEFT JOIN validations v ON v.prompt_id = r.prompt_id") if has_v else ("NULL, NULL, NULL", "")
    # text lengths in SQL: 80,000 results carry hundreds of MB of reasoning and content
    sql = ("SELECT r.prompt_id, r.dataset, p.class, r.provider, r.completion_tokens, length(r.reasoning), "
           "length(r.content), r.tool_calls, "
           f"r.finish_reason, {flags}, p.tools, {v_cols} FROM results r JOIN prompts p "
           f"ON p.id = r.prompt_id{v_join} WHERE r.prompt_id > ? ORDER BY r.prompt_id")
    out: dict[str, list[CheapRecord]] = {}
    for (_pid, dataset, cls, provider, completion, r_len, c_len, calls_text, finish, wire, tools_text,
         validated, reasons, prompt_diff) in handle._db.execute(sql, (since_id,)):
        calls, tools = _json_list(calls_text), _json_list(tools_text)
        r_chars = int(r_len or 0)
        total = r_chars + int(c_len or 0) + _args_chars(calls)
        completion = int(completion or 0)
        reason_set = set(_json_list(reasons)) if validated is not None else set()
        out.setdefault(provider, []).append(CheapRecord(
            provider=provider, completion_tokens=completion,
            reasoning_tokens=round(completion * r_chars / total) if total else 0,
            finish_reason=finish, wire_flagged=any(f in FAILING for f in decode_flags(wire)),
            tool_calls_declared=bool(tools), tool_call_valid=tool_calls_valid(calls, tools),
            prompt_diff=None if prompt_diff is None else -int(prompt_diff),
            reconstruct_ok=None if validated is None else not (reason_set & RECONSTRUCTION),
            stratum=f"{dataset}/{cls}"))
    return out


def record_counts(handle: Handle) -> dict[str, int]:
    """``{provider: stored results}``: what decides whether a cheap look is due, without reading the records."""
    return {p: n for p, n in handle._db.execute("SELECT provider, COUNT(*) FROM results GROUP BY provider")}
