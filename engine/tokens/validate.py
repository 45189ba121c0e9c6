"""Per-record checks on a reconstruction (pure: data in, verdict out).

A record is valid when no check fails; invalid records stay in the store with their reasons and
are left out of exports unless asked. The checks (docs/eagle3-data.md, "checks that proved their worth"):

| reason | fails when |
|---|---|
| ``render_error`` | the chat template failed on the prompt or the full conversation |
| ``truncated`` | ``finish_reason == "length"`` (cut by ``max_tokens``) |
| ``unknown_finish`` | ``finish_reason`` not in ``stop``, ``length``, ``tool_calls``, ``content_filter``, ``function_call`` |
| ``empty`` | no content and no tool calls |
| ``think_end_count`` | not exactly one ``think_end`` id (thinking mode) / any (thinking off) |
| ``think_start`` | a ``think_start`` id in the completion |
| ``end_of_turn`` | the completion does not end with ``end_of_turn``, or has it before the end |
| ``roundtrip`` | ``decode(encode(piece)) != piece`` for a piece (reasoning, content, call id, arguments) |
| ``reasoning_leak`` | a think marker's TEXT inside reasoning or content (provider failed to split) |
| ``reasoning_missing`` | thinking mode, no reasoning text, but reasoning tokens were billed |
| ``reasoning_unexpected`` | thinking off, but reasoning text came back or reasoning tokens were billed (a thinking-mode reply) |
| ``instant_reply`` | thinking mode, but no reasoning text and no reasoning tokens billed: instant mode served (docs/token-ids.md) |
| ``special_text`` | another special token's text inside a generated piece |
| ``bad_tool_args`` | a tool call's ``arguments`` is not valid JSON |
| ``unknown_tool`` | a tool call names a function not among the request's ``tools`` (e.g. two calls glued into one) |
| ``tool_layout`` | tool calls, but the tool-call markers are not configured/resolved |
| ``prefix_unstable`` | the rendered prompt is not a prefix of the rendered full conversation |
| ``method_disagree`` | method A ids != method B ids |
| ``billing_diff`` | abs(rebuilt completion length - ``usage.completion_tokens``) > tolerance |
| ``zero_supervised`` | no completion tokens at all |
| ``replacement_char`` | U+FFFD in the generated text that the prompt does not contain (wire flag) |
| ``reasoning_after_content`` | reasoning resumed after the answer started (wire flag) |
| ``tool_call_ambiguous`` | tool-call fragments that cannot be assembled with certainty (wire flag) |
| ``tool_args_object`` | tool-call arguments sent as a JSON object, not the model's string (wire flag) |
| ``token_ids_disagree`` | the server returned its generated ids (vLLM ``return_token_ids``) and they differ from method A's |
| ``content_filtered`` | ``finish_reason`` ``content_filter``: the provider's filter cut or altered the reply (wire flag) |
| ``tool_calls_missing`` | ``finish_reason`` ``tool_calls`` but no tool call arrived (wire flag) |
| ``model_mismatch`` | the response names another model than the one asked for (wire flag; rule: ``same_model``) |
| ``spliced_generation`` | chunk ``id``, ``model`` or ``provider`` changed mid-stream: two generations (wire flag) |

The wire flags are raised by the client (:mod:`engine.client.conformance`, docs/wire-conformance.md;
``model_mismatch`` and ``spliced_generation``: :mod:`engine.client.attribution`, where the same-model rule
and its sources are) and stored with the result; they fail the record here whatever the tokens say.

Notes (kept, not failures): ``tool_id_rebuilt`` (the provider returned non-native call ids),
``no_usage`` (no billed completion tokens to compare with), ``history_rerendered`` (the prompt's
trailing tool-call chain renders with its reasoning, the full conversation without it: the prefix and
method B were checked on the pair rendered without the history's reasoning; the training ids keep the
prompt as served, see ``engine.tokens.reconstruct.Reconstruction``).

Checks the cut explains (``think_end_count``, ``end_of_turn``, ``method_disagree``, ``billing_diff``)
are skipped on truncated records. Every reason but ``truncated``, ``unknown_finish``, ``empty``, ``instant_reply``,
``billing_diff`` and the wire flags of what the provider sent is a "structural error"
(:data:`NON_STRUCTURAL`, :func:`structural`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.client.conformance import FAILING, failing
from engine.client.types import KNOWN_FINISH_REASONS
from engine.tokens.reconstruct import Reconstruction, Record

#: Every failure reason, in report order.
REASONS: tuple[str, ...] = (
    "render_error", "truncated", "unknown_finish", "empty", "think_end_count", "think_start", "end_of_turn",
    "roundtrip", "reasoning_leak", "reasoning_missing", "reasoning_unexpected", "instant_reply", "special_text", "bad_tool_args",
    "unknown_tool", "tool_layout", "prefix_unstable", "method_disagree", "billing_diff", "zero_supervised",
    *(f for f in FAILING if f != "unknown_finish"),
)
#: Reasons that are not about the token structure (the rest are "structural errors"): a cut or empty
#: completion, and a rebuilt length that disagrees with the provider's billed count (``billing_diff``:
#: the ids can be perfectly formed while the vocabulary or the provider's count differs), and the wire
#: flags of what the provider sent (all but ``token_ids_disagree``, which is about the ids).
NON_STRUCTURAL: frozenset[str] = frozenset({"truncated", "unknown_finish", "empty", "billing_diff", "instant_reply",
                                            *(f for f in FAILING if f != "token_ids_disagree")})
_THINK_MARKERS = ("think_start", "think_end")


@dataclass
class Verdict:
    """Outcome of the checks on one record.

    Attributes:
        ok: no reason.
        reasons: failed checks (names from :data:`REASONS`, in that order).
        notes: non-failing observations (``tool_id_rebuilt``, ``no_usage``).
        prompt_len / completion_len: tokens of the rebuilt prompt / completion.
        billing_diff: completion_len - billed completion tokens (None when none were billed).
        prompt_diff: prompt_len - billed prompt tokens (None when none were billed).
    """

    ok: bool
    reasons: list[str]
    notes: list[str] = field(default_factory=list)
    prompt_len: int = 0
    completion_len: int = 0
    billing_diff: int | None = None
    prompt_diff: int | None = None


def declared_tool_names(tools: list) -> set[str]:
    """Function names declared by OpenAI-shape ``tools`` (``{"type": "function", "function": {"name"}}``; a bare
    ``{"name": ...}`` schema counts too)."""
    names: set[str] = set()
    for t in tools or ():
        if not isinstance(t, dict):
            continue
        fn = _obj if isinstance(_obj := t.get("function"), dict) else t
        name = fn.get("name")
        if isinstance(name, str) and name:
            names.add(name)
    return names


def unknown_tool_calls(tool_calls: list, tools: list) -> list[int]:
    """Indexes of the OpenAI-shape ``tool_calls`` whose function name is not declared in ``tools``."""
    declared = declared_tool_names(tools)
    bad: list[int] = []
    for i, tc in enumerate(tool_calls or ()):
        fn = _obj if isinstance(tc, dict) and isinstance(_obj := tc.get("function"), dict) else {}
        if fn.get("name") not in declared:
            bad.append(i)
    return bad


def billing_tolerance(completion_len: int, tokens: int, pct: float) -> float:
    """Allowed abs(billing difference): ``max(tokens, pct% of completion_len)`` (tokens)."""
    return max(float(tokens), completion_len * pct / 100.0)


def check(rec: Reconstruction, r: Record, *, thinking: bool, ids: dict[str, int],
          tolerance_tokens: int = 2, tolerance_pct: float = 0.5) -> Verdict:
    """Run every check of the module table on one record.

    Args:
        rec: the reconstruction of ``r``.
        r: the record (texts, finish reason, billed usage).
        thinking: the configured generation mode.
        ids: resolved marker ids (``think_start``, ``think_end``, ``end_of_turn``, ...).
        tolerance_tokens / tolerance_pct: billing tolerance (see :func:`billing_tolerance`).

    Returns:
        the :class:`Verdict`.
    """
    failed: set[str] = set()
    c = rec.completion_ids
    if any(e.startswith("render_error") for e in rec.errors):
        failed.add("render_error")
    if any(e.startswith("tool_layout") for e in rec.errors):
        failed.add("tool_layout")
    if rec.truncated:
        failed.add("truncated")
    if r.finish_reason not in KNOWN_FINISH_REASONS:
        failed.add("unknown_finish")
    if not r.content.strip() and not r.tool_calls:
        failed.add("empty")
    te, ts, eot = ids.get("think_end"), ids.get("think_start"), ids.get("end_of_turn")
    if not rec.truncated and te is not None and c.count(te) != (1 if thinking else 0):
        failed.add("think_end_count")
    if ts is not None and ts in c:
        failed.add("think_start")
    if not rec.truncated and eot is not None and (not c or c[-1] != eot or c.count(eot) != 1):
        failed.add("end_of_turn")
    if rec.roundtrip_bad:
        failed.add("roundtrip")
    for label, name in rec.special_text:
        if name in _THINK_MARKERS and label in ("reasoning", "content"):
            failed.add("reasoning_leak")
        else:
            failed.add("special_text")
    if thinking and not r.reasoning and r.reasoning_tokens > 0:
        failed.add("reasoning_missing")
    if thinking and not r.reasoning and r.reasoning_tokens <= 0 and (r.content or r.tool_calls):
        failed.add("instant_reply")  # never a thinking sample whose first generated token is think_end
    if not thinking and (r.reasoning or r.reasoning_tokens > 0):
        failed.add("reasoning_unexpected")
    if rec.bad_args:
        failed.add("bad_tool_args")
    if unknown_tool_calls(r.tool_calls, r.tools):
        failed.add("unknown_tool")
    if rec.prefix_stable is False:
        failed.add("prefix_unstable")
    if rec.agree is False and not rec.truncated:
        failed.add("method_disagree")
    notes: list[str] = []
    if rec.ids_rebuilt:
        notes.append("tool_id_rebuilt")
    if rec.history_rerendered:
        notes.append("history_rerendered")
    billing = None
    if r.completion_tokens > 0:
        billing = len(c) - r.completion_tokens
        if not rec.truncated and abs(billing) > billing_tolerance(len(c), tolerance_tokens, tolerance_pct):
            failed.add("billing_diff")
    else:
        notes.append("no_usage")
    if not c:
        failed.add("zero_supervised")
    failed.update(failing(r.wire_flags))
    if r.token_ids is not None and list(r.token_ids) != list(c):
        failed.add("token_ids_disagree")
    prompt_diff = len(rec.prompt_ids) - r.prompt_tokens if r.prompt_tokens > 0 and rec.prompt_ids else None
    reasons = [x for x in REASONS if x in failed]
    return Verdict(ok=not reasons, reasons=reasons, notes=notes, prompt_len=len(rec.prompt_ids),
                   completion_len=len(c), billing_diff=billing, prompt_diff=prompt_diff)


def structural(reasons: list[str]) -> list[str]:
    """The reasons of ``reasons`` that are structural errors (all but :data:`NON_STRUCTURAL`)."""
    return [x for x in reasons if x not in NON_STRUCTURAL]
