"""Accounting a finished result whose response carried no usage (pure: data in, figures out).

A provider may finish a generation without telling its tokens: vLLM/SGLang send a streamed
``usage`` only when the request asks for it (``stream_options.include_usage``), and a connection
closed right after the finish chunk loses the usage chunk. Such a result was paid for all the same,
so its tokens and cost are never left at zero. Each stored result carries where its figures come
from (``results.usage_source``, ``datagen status --json``, the raw export):

| source | figures |
|---|---|
| ``reported`` | the response's own ``usage`` object (its ``cost`` when given, else priced) |
| ``generation`` | the provider's ``/generation?id=`` stats (native token counts, ``total_cost``), a late true-up |
| ``counted`` | counted with the configured ``[tokenizer]`` as reconstruction lays the completion out |
| ``estimated`` | estimated from characters (:func:`engine.client.accumulate.estimate_tokens`) |
| ``implausible`` | counted or estimated as above: the response's usage was not believable (:mod:`engine.money.plausible`) |

An ``implausible`` result's own figures are priced from the price list; the provider's are kept in
``results.usage_claimed`` for the audit, and no ``/generation`` answer replaces ours.

Order: a result without usage is accounted at once (``counted`` when a tokenizer is configured, else
``estimated``) so budgets see its tokens when it settles; when the provider has ``/generation``, its
answer later replaces those figures (:func:`correction` gives the difference to add, never a second
count).

Costs: when the provider reported none, the cost is priced from the best known prices (a callable
``price(prompt_tokens, completion_tokens) -> USD | None``); ``cost_billed`` says whether the USD came
from the provider (only billed costs may teach the price observer).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable

from engine.client.accumulate import estimate_tokens
from engine.client.types import Completion, Usage
from engine.money.plausible import Bounds, check

REPORTED = "reported"
GENERATION = "generation"
COUNTED = "counted"
ESTIMATED = "estimated"
IMPLAUSIBLE = "implausible"
#: Every ``usage_source``, from the most to the least exact.
SOURCES: tuple[str, ...] = (REPORTED, GENERATION, COUNTED, ESTIMATED, IMPLAUSIBLE)
#: Sources whose token figures are the provider's own (a billing check may compare against them).
BILLED_SOURCES: frozenset[str] = frozenset({REPORTED, GENERATION})

#: ``price(prompt_tokens, completion_tokens)`` -> USD, or None when no price is known.
PriceFn = Callable[[int, int], "float | None"]


@dataclass(frozen=True, slots=True)
class Accounted:
    """A result's tokens and cost and where they come from.

    Attributes:
        usage: tokens (prompt, completion incl. reasoning, reasoning) and cost (USD; None when
            neither the provider nor a price knows it).
        source: one of :data:`SOURCES`.
        cost_billed: True when ``usage.cost_usd`` is the provider's own figure, False when priced here.
        implausible: why the response's usage was not believed (:func:`engine.money.plausible.check`);
            ``()`` when it was, or none came.
        claimed: with ``implausible``, the provider's figures as JSON text for the audit
            (``results.usage_claimed``); else None.
    """

    usage: Usage
    source: str
    cost_billed: bool
    implausible: tuple[str, ...] = ()
    claimed: str | None = None

    @property
    def provisional(self) -> bool:
        """True when the figures are ours (counted/estimated) and a ``/generation`` answer may replace
        them: never for ``implausible`` (the provider's figures were not believed, and OpenRouter's
        ``/generation`` comes from the same accounting as the stream's usage)."""
        return self.source not in BILLED_SOURCES and self.source != IMPLAUSIBLE


def generated_chars(c: Completion) -> tuple[int, int]:
    """``(reasoning characters, all generated characters)`` of a completion: reasoning + content +
    each tool call's name and arguments (characters)."""
    calls = sum(len(t.name) + len(t.arguments) for t in c.tool_calls)
    return len(c.reasoning), len(c.reasoning) + len(c.content) + calls


def estimate_usage(c: Completion, est_prompt_tokens: int) -> tuple[int, int, int]:
    """``(prompt, completion, reasoning)`` tokens estimated from characters: the prompt's own estimate
    (``est_prompt_tokens``, tokens) and ``ceil(chars / 4)`` of what was generated, plus one end-of-turn
    token when the reply finished (not cut by ``max_tokens``) and one reasoning-end token when there
    was reasoning. A rough figure, marked ``estimated``."""
    r_chars, all_chars = generated_chars(c)
    reasoning = estimate_tokens(r_chars)
    completion = estimate_tokens(all_chars - r_chars) + reasoning
    completion += (1 if c.reasoning else 0) + (0 if c.finish_reason == "length" else 1)
    return max(0, int(est_prompt_tokens)), completion, reasoning


def count_with_tokenizer(tok: Any, c: Completion, messages: list[dict[str, Any]],
                         tools: list[dict[str, Any]] | None) -> tuple[int | None, int, int]:
    """``(prompt | None, completion, reasoning)`` tokens counted with a loaded
    :class:`engine.tokens.tokenizer.Tokenizer`, laid out as reconstruction lays them out
    (:func:`engine.tokens.reconstruct.completion_ids`: reasoning, ``think_end``, content, native
    tool-call markup, ``end_of_turn`` unless cut by ``max_tokens``). Reasoning that came back while
    the tokenizer's mode is thinking-off is still counted (it was generated, so billed). The prompt
    is the rendered chat template with the generation prompt; None when the template fails on it.

    CPU only (no I/O); raises whatever the tokenizer raises on text it cannot encode.
    """
    from engine.tokens.reconstruct import completion_ids, count_tool_calls, native_tool_calls, prompt_ids
    from engine.tokens.template import TemplateError

    calls, _ = native_tool_calls([t.to_openai() for t in c.tool_calls], count_tool_calls(messages),
                                 tok.section.tool_id_format)
    finished = c.finish_reason != "length"
    pieces: dict[str, list[int]] = {}
    ids = completion_ids(tok, c.reasoning, c.content, calls, finished=finished, pieces=pieces)
    if tok.thinking:
        reasoning, completion = len(pieces.get("reasoning", [])), len(ids)
    else:
        reasoning = len(tok.encode(c.reasoning)) if c.reasoning else 0
        completion = len(ids) + reasoning
    try:
        prompt: int | None = len(prompt_ids(tok, messages, tools)[1])
    except TemplateError:
        prompt = None
    return prompt, completion, reasoning


def usage_usable(c: Completion) -> bool:
    """True when the response's own usage can be stored: a usage object arrived and it does not
    claim zero completion tokens for a reply that generated text (a gateway's empty or zeroed usage
    is as good as none)."""
    return c.usage_reported and (c.usage.completion_tokens > 0 or generated_chars(c)[1] == 0)


def claimed_figures(c: Completion) -> str:
    """The response's usage as the provider claimed it, as JSON text for the audit: the figures as
    sent when one was invalid (:attr:`Completion.usage_raw`), else as read."""
    if c.usage_raw:
        return c.usage_raw
    u = c.usage
    return json.dumps({"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                       "reasoning_tokens": u.reasoning_tokens, "cost": u.cost_usd}, separators=(",", ":"), sort_keys=True)


def implausible(c: Completion, bounds: Bounds) -> tuple[str, ...]:
    """Why ``c``'s reported usage is not believable (:func:`engine.money.plausible.check`); ``()``
    when it is, or when the response carried none."""
    invalid = "usage_invalid" in c.flags
    if not (c.usage_reported and (invalid or usage_usable(c))):
        return ()
    u = c.usage
    return check(u.prompt_tokens, u.completion_tokens, u.cost_usd, bounds, invalid=invalid, raw=c.usage_raw)


def account(c: Completion, *, est_prompt_tokens: int, price: PriceFn,
            count: Callable[[], "tuple[int | None, int, int]"] | None = None,
            bounds: Bounds | None = None) -> Accounted:
    """The tokens and cost to store, settle and project for a finished result.

    Args:
        c: the completion; its ``usage`` is used as is when :func:`usage_usable` and believable.
        est_prompt_tokens: the prompt's estimated length (tokens), for a prompt nothing else counts.
        price: prices tokens (USD), None when no price is known.
        count: counts ``(prompt | None, completion, reasoning)`` tokens with the tokenizer (None: no
            tokenizer configured). An exception from it falls back to the estimate.
        bounds: what the request could have used (:class:`engine.money.plausible.Bounds`); None: the
            usage is checked against our prompt estimate only (negative or non-finite figures, the prompt).

    Returns:
        :class:`Accounted`: ``reported`` (the response's usage; cost priced when it had none),
        else ``counted``, else ``estimated``; ``implausible`` (counted or estimated, priced, with the
        reasons and the provider's figures) when the usage is not believable.
    """
    why = implausible(c, bounds if bounds is not None else Bounds(est_prompt_tokens))
    if why:
        est = _ours(c, est_prompt_tokens, price, count)
        return Accounted(est.usage, IMPLAUSIBLE, False, why, claimed_figures(c))
    if usage_usable(c):
        u = c.usage
        if u.cost_usd is not None:
            return Accounted(u, REPORTED, True)
        return Accounted(Usage(u.prompt_tokens, u.completion_tokens, u.reasoning_tokens,
                               price(u.prompt_tokens, u.completion_tokens)), REPORTED, False)
    return _ours(c, est_prompt_tokens, price, count)


def _ours(c: Completion, est_prompt_tokens: int, price: PriceFn,
          count: Callable[[], "tuple[int | None, int, int]"] | None) -> Accounted:
    """Our own figures: counted with the tokenizer, else estimated; priced."""
    p_est, comp, reas = estimate_usage(c, est_prompt_tokens)
    prompt, source = p_est, ESTIMATED
    if count is not None:
        try:
            p_cnt, c_cnt, r_cnt = count()
        except Exception:  # text the tokenizer refuses: the estimate stands
            pass
        else:
            prompt, comp, reas, source = (p_cnt if p_cnt is not None else p_est), c_cnt, r_cnt, COUNTED
    return Accounted(Usage(prompt, comp, reas, price(prompt, comp)), source, False)


def _int(v: Any) -> int | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if math.isfinite(f) and f >= 0 else None


def _usd(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) and f >= 0 else None


def from_generation(data: Any, price: PriceFn | None = None) -> Accounted | None:
    """The figures of a ``/generation?id=`` answer's ``data`` object, or None when it names no
    completion tokens (or only zero: a finished result generated at least its end of turn).

    Token counts: ``native_tokens_*`` (the model's own tokenizer: what is billed), else ``tokens_*``
    (OpenRouter's normalised count). Cost: ``total_cost`` (USD), else priced with ``price``.
    """
    if not isinstance(data, dict):
        return None

    def pick(*names: str) -> int | None:
        for n in names:
            v = _int(data.get(n))
            if v is not None:
                return v
        return None

    completion = pick("native_tokens_completion") or pick("tokens_completion")
    if not completion:  # none, or zero for a finished result: no figure to replace ours with
        return None
    prompt = pick("native_tokens_prompt", "tokens_prompt") or 0
    reasoning = pick("native_tokens_reasoning") or 0
    cost = _usd(data.get("total_cost"))
    billed = cost is not None
    if cost is None and price is not None:
        cost = price(prompt, completion)
    return Accounted(Usage(prompt, completion, reasoning, cost), GENERATION, billed)


def correction(before: Usage, after: Usage) -> tuple[int, int, int, float]:
    """What to add to counters that hold ``before`` so they hold ``after`` instead:
    ``(prompt, completion, reasoning)`` tokens and USD (each may be negative; an unknown cost counts 0)."""
    return (after.prompt_tokens - before.prompt_tokens, after.completion_tokens - before.completion_tokens,
            after.reasoning_tokens - before.reasoning_tokens, (after.cost_usd or 0.0) - (before.cost_usd or 0.0))
