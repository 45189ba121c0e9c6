"""Probes sent pinned to each provider and compared with a reference provider, K2VV-style (pure).

Moonshot's K2 Vendor Verifier (github.com/MoonshotAI/K2-Vendor-Verifier, docs/fidelity.md "Probes") sends
the same requests to a vendor and to the official API and compares, per request:

- **tool-call trigger** (``tool_call_f1``): did the provider call a tool where the reference did? Per pair
  (reference response, provider response) to the same probe and repeat: TP both called, FP only the provider,
  FN only the reference, TN neither; ``F1 = 2 TP / (2 TP + FP + FN)`` (the harmonic mean of
  ``TP / (TP + FP)`` and ``TP / (TP + FN)``). "Called" is ``finish_reason == "tool_calls"`` (K2VV's test)
  or a response carrying tool calls under another finish. Unlike K2VV, a pair where either side was cut by
  ``max_tokens`` (``length``), failed, or was served by another provider than the one pinned is left out
  (counted apart): a cap or a fallback is not the model's decision.
- **schema accuracy**: among the provider's responses that called, the share whose calls each name a declared
  tool with arguments that fit its JSON schema (:func:`engine.fidelity.toolschema.tool_calls_valid`).
- **first divergence** (greedy probes, temperature 0): the first position where the provider's output differs
  from the reference's (token ids when both sides sent them, else whitespace-separated words); informational
  (greedy decoding is not bitwise reproducible across batch shapes and hardware, even on one provider).

K2VV's thresholds come from the official API's own run-to-run noise: ``tool_call_f1 >= 0.80`` for
kimi-k2-0905 (lowest of repeated official runs 82.71%), ``>= 0.73`` for kimi-k2-thinking (lowest 75.81%);
Fireworks via OpenRouter measured 67.38% on K2-thinking. No schema threshold is published (the official API
scores 100%).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from engine.fidelity.toolschema import tool_calls_valid

__all__ = ["ProbeOutcome", "ProbeThresholds", "ProbeVerdict", "TriggerCounts", "first_divergence", "judge_probes",
           "response_called", "response_schema_ok", "schema_accuracy", "trigger_counts", "trigger_f1"]


# -- the metrics --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProbeOutcome:
    """One probe's answer from one provider (or its failure).

    Attributes:
        probe_id / provider (the target's name) / repeat (0-based) / greedy.
        finish_reason: the response's, None when the request failed (``error`` says why).
        called: the response called a tool (:func:`response_called`).
        schema_ok: its calls fit the declared tools (None when it did not call).
        text: reasoning, content and calls (``name(arguments)``) joined, for the greedy comparison.
        token_ids: the generated ids when the server sent them, else None.
        served: the response's ``provider`` field ("" when none).
        pinned_ok: ``served`` is the target (:func:`same_provider`).
        prompt_tokens / completion_tokens: billed (tokens); cost_usd: billed (USD, None when not reported).
    """

    probe_id: str
    provider: str
    repeat: int
    greedy: bool
    finish_reason: str | None
    called: bool = False
    schema_ok: bool | None = None
    text: str = ""
    token_ids: tuple[int, ...] | None = None
    served: str = ""
    pinned_ok: bool = True
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    generation_id: str = ""


def response_called(finish_reason: str | None, tool_calls: Sequence[Any]) -> bool:
    """K2VV's trigger: ``finish_reason == "tool_calls"``, or tool calls present under another finish."""
    return finish_reason == "tool_calls" or bool(tool_calls)


def response_schema_ok(tool_calls: Sequence[Any], tools: Sequence[Any], called: bool) -> bool | None:
    """Whether a response's calls fit ``tools`` (None when it did not call; False when it finished with
    ``tool_calls`` but sent none)."""
    if not called:
        return None
    ok = tool_calls_valid(tool_calls, tools)
    return bool(ok) if ok is not None else False


@dataclass(frozen=True)
class TriggerCounts:
    """Pairs (reference, provider): ``tp`` both called, ``fp`` only the provider, ``fn`` only the reference,
    ``tn`` neither."""

    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0

    @property
    def pairs(self) -> int:
        return self.tp + self.fp + self.fn + self.tn


def trigger_counts(pairs: Iterable[tuple[bool, bool]]) -> TriggerCounts:
    """Count ``(reference called, provider called)`` pairs."""
    tp = fp = fn = tn = 0
    for ref, got in pairs:
        tp += ref and got
        fp += got and not ref
        fn += ref and not got
        tn += not ref and not got
    return TriggerCounts(tp, fp, fn, tn)


def trigger_f1(c: TriggerCounts) -> float | None:
    """``2 TP / (2 TP + FP + FN)`` (0..1); None when neither side called a tool in any pair."""
    d = 2 * c.tp + c.fp + c.fn
    return None if d == 0 else 2 * c.tp / d


def schema_accuracy(oks: Iterable[bool | None]) -> tuple[float | None, int]:
    """``(share of True among the responses that called, how many called)``; ``None`` values (no call) are
    skipped; ``(None, 0)`` without a call."""
    called = [o for o in oks if o is not None]
    return (sum(called) / len(called) if called else None), len(called)


def first_divergence(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (``len`` of the shorter when one is a strict
    prefix of the other); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# -- the verdict --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProbeThresholds:
    """When a provider's probes read ``below``.

    Attributes:
        min_f1: trigger F1 against the reference (K2VV: 0.80 for kimi-k2-0905, 0.73 for kimi-k2-thinking).
        min_schema: schema accuracy of its tool calls (0..1).
        min_pairs: comparable pairs below which a provider is ``insufficient``.
    """

    min_f1: float = 0.73
    min_schema: float = 0.95
    min_pairs: int = 8


@dataclass(frozen=True)
class ProbeVerdict:
    """A provider's probes against the reference.

    Attributes:
        provider: the target's name; verdict: ``reference`` (the provider compared with), ``ok``, ``below``
            (under a threshold: ``reasons``), ``insufficient`` (fewer than ``min_pairs`` comparable pairs, or no
            tool call on either side) or ``failed`` (every request failed).
        sent / errors / truncated / misrouted: its requests, failed ones, comparable pairs lost to a
            ``length`` finish on either side, answers served by another provider than pinned.
        tp / fp / fn / tn: trigger pairs; f1: :func:`trigger_f1` (None: no call on either side).
        schema_accuracy: :func:`schema_accuracy` of its own tool-calling answers; tool_calls: how many called.
        greedy_pairs / greedy_identical: greedy probes compared / identical to the reference's output;
        first_divergence: per differing greedy pair, the first differing position (``divergence_unit``).
    """

    provider: str
    verdict: str
    sent: int = 0
    errors: int = 0
    truncated: int = 0
    misrouted: int = 0
    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0
    f1: float | None = None
    schema_accuracy: float | None = None
    tool_calls: int = 0
    greedy_pairs: int = 0
    greedy_identical: int = 0
    first_divergence: tuple[int, ...] = ()
    divergence_unit: str = "words"
    reasons: tuple[str, ...] = ()

    @property
    def pairs(self) -> int:
        """Comparable pairs that entered the F1."""
        return self.tp + self.fp + self.fn + self.tn

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``pairs`` included)."""
        d = asdict(self)
        d["first_divergence"] = list(self.first_divergence)
        d["reasons"] = list(self.reasons)
        d["pairs"] = self.pairs
        return d


def _seq(a: ProbeOutcome, b: ProbeOutcome) -> tuple[Sequence[Any], Sequence[Any], str]:
    if a.token_ids is not None and b.token_ids is not None:
        return a.token_ids, b.token_ids, "tokens"
    return a.text.split(), b.text.split(), "words"


def judge_probes(outcomes: Sequence[ProbeOutcome], reference: str,
                 thresholds: ProbeThresholds = ProbeThresholds()) -> dict[str, ProbeVerdict]:
    """Each provider's :class:`ProbeVerdict` against ``reference`` (a provider name of ``outcomes``), in the
    order providers first appear. A provider reads ``below`` when its F1 (over at least ``min_pairs`` pairs) is
    under ``min_f1`` or its schema accuracy is under ``min_schema``."""
    by: dict[str, dict[tuple[str, int], ProbeOutcome]] = {}
    for o in outcomes:
        by.setdefault(o.provider, {})[(o.probe_id, o.repeat)] = o
    ref = by.get(reference, {})
    usable_ref = {k: o for k, o in ref.items() if o.finish_reason is not None and o.pinned_ok}
    out: dict[str, ProbeVerdict] = {}
    for prov, mine in by.items():
        sent = len(mine)
        errors = sum(o.finish_reason is None for o in mine.values())
        misrouted = sum(o.finish_reason is not None and not o.pinned_ok for o in mine.values())
        acc, n_calls = schema_accuracy(o.schema_ok for o in mine.values() if o.finish_reason is not None and o.pinned_ok)
        base = dict(provider=prov, sent=sent, errors=errors, misrouted=misrouted, schema_accuracy=acc, tool_calls=n_calls)
        if prov == reference:
            reasons = () if usable_ref else (f"reference answered none of {sent} probes",)
            out[prov] = ProbeVerdict(verdict="reference", reasons=reasons, **base)  # type: ignore[arg-type]
            continue
        pairs: list[tuple[bool, bool]] = []
        truncated = 0
        gp = gi = 0
        divs: list[int] = []
        unit = "words"
        for k, o in mine.items():
            r = usable_ref.get(k)
            if r is None or o.finish_reason is None or not o.pinned_ok:
                continue
            if o.greedy and r.greedy:
                a, b, unit = _seq(r, o)
                if "length" in (r.finish_reason, o.finish_reason):
                    m = min(len(a), len(b))
                    a, b = a[:m], b[:m]
                d = first_divergence(a, b)
                gp += 1
                gi += d is None
                if d is not None:
                    divs.append(d)
            if "length" in (r.finish_reason, o.finish_reason):
                truncated += 1
                continue
            pairs.append((r.called, o.called))
        c = trigger_counts(pairs)
        f1 = trigger_f1(c)
        reasons_l: list[str] = []
        if errors == sent:
            verdict = "failed"
            reasons_l.append(f"all {sent} requests failed")
        elif not usable_ref:
            verdict = "insufficient"
            reasons_l.append(f"the reference {reference} answered no probe")
        elif c.pairs < thresholds.min_pairs:
            verdict = "insufficient"
            reasons_l.append(f"{c.pairs} comparable pairs (< {thresholds.min_pairs})")
        elif f1 is None:
            verdict = "insufficient"
            reasons_l.append("no tool call on either side")
        else:
            verdict = "ok"
        if verdict == "ok" and f1 is not None and f1 < thresholds.min_f1:
            verdict = "below"
            reasons_l.append(f"tool-call trigger F1 {f1:.1%} < {thresholds.min_f1:.0%}")
        if verdict != "failed" and acc is not None and acc < thresholds.min_schema:
            verdict = "below"
            reasons_l.append(f"schema accuracy {acc:.1%} < {thresholds.min_schema:.0%} ({n_calls} tool calls)")
        if misrouted:
            reasons_l.append(f"{misrouted} answers served by another provider than pinned")
        out[prov] = ProbeVerdict(verdict=verdict, truncated=truncated, tp=c.tp, fp=c.fp, fn=c.fn, tn=c.tn, f1=f1,
                                 greedy_pairs=gp, greedy_identical=gi, first_divergence=tuple(divs),
                                 divergence_unit=unit, reasons=tuple(reasons_l), **base)  # type: ignore[arg-type]
    return out
