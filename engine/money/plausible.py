"""Is a provider's usage believable? (pure: figures in, reasons out)

A provider's ``usage`` becomes dollars in the caps, the budgets and ``status``. One that reports a
prompt of 10^12 tokens or a negative cost must not: before, such a result read ``$1600000.0000
spent``. :func:`check` compares a result's reported figures with what the request could have used;
any reason it returns means the figures are not believed: the result (its text may be fine) is kept
and accounted at our own estimate instead (:func:`engine.money.usage.account`, ``usage_source``
``implausible``).

The bounds are generous on purpose: what they must catch is absurd, and a false alarm has a price.
On tokens it costs accuracy (our estimate replaces a true figure). On the cost it can cost money: a
bill that was real but not believed is under-counted in the caps (the credits drift,
``credits_drift_usd``, then shows it), so the cost bound is the widest.

- **Prompt**: at most ``PROMPT_FACTOR x`` our estimate + ``PROMPT_SLACK`` tokens. Our estimate is
  characters / 4 (+ 4 per message) or the ``[tokenizer]``'s count; a byte-level BPE tokenizer never
  makes more tokens than UTF-8 bytes, and a character is at most 4 bytes, so 16x characters / 4 is a
  hard ceiling on the text; the slack covers the chat template and a system prompt a provider adds.
- **Completion**: at most ``COMPLETION_FACTOR x (max_tokens + reasoning max_tokens)`` +
  ``COMPLETION_SLACK`` tokens. ``max_tokens`` is always sent and providers honour it; 4x leaves room
  for one that counts reasoning outside it or ignores it.
- **Cost**: at most ``COST_FACTOR x`` the price list's cost of the tokens (the reported prompt or our
  estimate, whichever is larger, and the reported completion, each at most its limit above) +
  ``COST_SLACK_USD``. A provider's own
  price differs from the list: Kimi K2.5's providers on OpenRouter ranged about 1-1.6x the headline
  price in 2026 (docs/openrouter.md, "Models and prices"), faster endpoints a few times it, a BYOK
  generation adds a fee; 10x is above all of them. The slack, $0.05 a request, covers per-request
  fees, a BYOK provider's charge at the user's own price and rounding on small requests: below it a
  cost is always believed. Without a price, the cost is not checked.
- **Numbers**: a figure that is negative, NaN, infinite or not a number (``invalid``: the client's
  ``usage_invalid`` flag) is never believed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from engine.money.prices import Prices

#: Prompt tokens over our estimate (times) and above it (tokens) before a reported prompt is implausible.
PROMPT_FACTOR = 16
PROMPT_SLACK = 4096
#: Completion tokens over ``max_tokens`` + the reasoning budget (times) and above it (tokens).
COMPLETION_FACTOR = 4
COMPLETION_SLACK = 1024
#: Cost over the price list's (times) and above it (USD).
COST_FACTOR = 10.0
COST_SLACK_USD = 0.05


@dataclass(frozen=True, slots=True)
class Bounds:
    """What one request could have used.

    Attributes:
        est_prompt_tokens: our estimate of the prompt (tokens).
        max_completion_tokens: ``max_tokens`` + the reasoning budget (tokens); None: unknown (not checked).
        prices: the price list (USD per token; ``[pricing]``, ``/models``, else learned); None: the cost
            is not checked.
    """

    est_prompt_tokens: int
    max_completion_tokens: int | None = None
    prices: Prices | None = None

    def prompt_limit(self) -> int:
        """Most prompt tokens believed (tokens)."""
        return PROMPT_FACTOR * max(0, self.est_prompt_tokens) + PROMPT_SLACK

    def completion_limit(self) -> int | None:
        """Most completion tokens believed (tokens); None when ``max_tokens`` is unknown."""
        if self.max_completion_tokens is None:
            return None
        return COMPLETION_FACTOR * max(0, self.max_completion_tokens) + COMPLETION_SLACK

    def cost_limit(self, prompt_tokens: float, completion_tokens: float) -> float | None:
        """Most USD believed for these tokens (each clamped to its own limit first); None without a price."""
        if self.prices is None:
            return None
        prompt = min(max(prompt_tokens, self.est_prompt_tokens), self.prompt_limit())
        completion = max(0.0, completion_tokens)
        lim = self.completion_limit()
        if lim is not None:
            completion = min(completion, lim)
        return COST_FACTOR * self.prices.cost(prompt, completion) + COST_SLACK_USD


def completion_budget(max_tokens: int, body: dict[str, Any] | None = None) -> int:
    """``max_tokens`` plus the reasoning budget the request body sets (``reasoning.max_tokens``,
    tokens; 0 when none or not a number)."""
    r = (body or {}).get("reasoning")
    extra = r.get("max_tokens") if isinstance(r, dict) else None
    if isinstance(extra, (int, float)) and not isinstance(extra, bool) and math.isfinite(extra) and extra > 0:
        return int(max_tokens) + int(extra)
    return int(max_tokens)


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if math.isfinite(v) else repr(v)


def check(prompt_tokens: float, completion_tokens: float, cost_usd: float | None, bounds: Bounds, *,
          invalid: bool = False, raw: str | None = None) -> tuple[str, ...]:
    """Why a reported usage is not believable; ``()`` when it is.

    Args:
        prompt_tokens / completion_tokens: the reported tokens (completion includes reasoning).
        cost_usd: the reported cost (USD), None when none was reported (then not checked).
        bounds: what the request could have used.
        invalid: a figure was negative, NaN, infinite or not a number (read as 0 by the client).
        raw: the figures as sent (JSON text), quoted in the reason of ``invalid``.

    Returns:
        One short reason per implausible figure, e.g. ``"prompt_tokens 1,000,000,000,000 > 16 x our
        estimate 12 + 4,096"``.
    """
    out: list[str] = []
    figures = [("prompt_tokens", prompt_tokens), ("completion_tokens", completion_tokens)]
    if cost_usd is not None:
        figures.append(("cost", cost_usd))
    bad = [n for n, v in figures if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0)]
    if invalid or bad:
        what = ", ".join(bad) if bad else "a figure"
        out.append(f"{what} negative, NaN, infinite or not a number" + (f" ({raw})" if raw else ""))
    if "prompt_tokens" not in bad and prompt_tokens > bounds.prompt_limit():
        out.append(f"prompt_tokens {_fmt(prompt_tokens)} > {PROMPT_FACTOR} x our estimate "
                   f"{_fmt(bounds.est_prompt_tokens)} + {PROMPT_SLACK:,}")
    lim = bounds.completion_limit()
    if lim is not None and "completion_tokens" not in bad and completion_tokens > lim:
        out.append(f"completion_tokens {_fmt(completion_tokens)} > {COMPLETION_FACTOR} x (max_tokens + reasoning) "
                   f"{_fmt(bounds.max_completion_tokens or 0)} + {COMPLETION_SLACK:,}")
    if cost_usd is not None and "cost" not in bad and not bad:
        cap = bounds.cost_limit(prompt_tokens, completion_tokens)
        if cap is not None and cost_usd > cap:
            out.append(f"cost ${cost_usd:,.4f} > {COST_FACTOR:g} x the price list's ${(cap - COST_SLACK_USD) / COST_FACTOR:,.4f}"
                       f" + ${COST_SLACK_USD:g}")
    return tuple(out)


__all__ = ["COMPLETION_FACTOR", "COMPLETION_SLACK", "COST_FACTOR", "COST_SLACK_USD", "PROMPT_FACTOR",
           "PROMPT_SLACK", "Bounds", "check", "completion_budget"]
