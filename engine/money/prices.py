"""Model prices: from config, from OpenRouter's ``/models`` endpoint, or learned from billed usage.

Pure logic. OpenRouter lists prices as USD-PER-TOKEN strings (docs/openrouter.md,
"Models and prices"). An unknown price is ``None``, never ``$0``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

PRICE_SOURCES = ("observed", "config", "models_endpoint")


@dataclass(frozen=True)
class Prices:
    """Per-token prices of one model (USD per token).

    Attributes:
        prompt_usd_per_token / completion_usd_per_token: >= 0.
        source: ``"observed"``, ``"config"`` or ``"models_endpoint"``.

    Raises:
        ValueError: a negative/non-finite price or an unknown source.
    """

    prompt_usd_per_token: float
    completion_usd_per_token: float
    source: str

    def __post_init__(self) -> None:
        for p in (self.prompt_usd_per_token, self.completion_usd_per_token):
            if not (math.isfinite(p) and p >= 0):
                raise ValueError(f"price must be finite and >= 0, got {p!r}")
        if self.source not in PRICE_SOURCES:
            raise ValueError(f"source must be one of {PRICE_SOURCES}, got {self.source!r}")

    def cost(self, prompt_tokens: float, completion_tokens: float) -> float:
        """Cost in USD of ``prompt_tokens`` + ``completion_tokens``."""
        return prompt_tokens * self.prompt_usd_per_token + completion_tokens * self.completion_usd_per_token


def _parse_price(v: object) -> float | None:
    if not isinstance(v, (int, float, str)):
        return None
    try:
        p = float(v)
    except ValueError:
        return None
    return p if math.isfinite(p) and p >= 0 else None


# "-20250101", "-2025-01-01", "@2025...", ":0905": a separator then digits/separators only, so
# "openai/gpt-4o" never prices "openai/gpt-4o-mini".
_DATED_SUFFIX = re.compile(r"[-_@:.]\d[\d\-_.:]*")


def prices_from_models_endpoint(doc: dict, model: str) -> Prices | None:
    """Prices of ``model`` from OpenRouter's ``GET /api/v1/models`` document.

    ``doc`` is ``{"data": [{"id": ..., "pricing": {"prompt": "0.0000004", "completion": ...}}]}``
    with USD-per-token prices as strings. ``model`` matches an entry whose id equals it; otherwise
    the longest listed id that ``model`` starts with followed by a dated/numeric suffix only
    (``"vendor/m-20250101"`` -> ``"vendor/m"``). Other pricing keys (``request``, ``image``...) are
    ignored.

    Returns:
        ``Prices(source="models_endpoint")``; None when the model is not listed, the document is
        malformed, or a price is missing, negative (OpenRouter's ``"-1"`` for variable pricing) or
        unparseable. Never invents a zero price for a missing model.
    """
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return None
    entries = [e for e in data if isinstance(e, dict) and isinstance(e.get("id"), str)]
    match = next((e for e in entries if e["id"] == model), None)
    if match is None:
        prefixed = [e for e in entries if model.startswith(e["id"])
                    and _DATED_SUFFIX.fullmatch(model[len(e["id"]):])]
        if not prefixed:
            return None
        match = max(prefixed, key=lambda e: len(e["id"]))
    pricing = match.get("pricing")
    if not isinstance(pricing, dict):
        return None
    pp, cp = _parse_price(pricing.get("prompt")), _parse_price(pricing.get("completion"))
    if pp is None or cp is None:
        return None
    return Prices(pp, cp, "models_endpoint")


class PriceObserver:
    """Learns effective per-token prices from results that carried a reported cost.

    Fits ``cost = a * prompt_tokens + b * completion_tokens`` by least squares (2x2 normal
    equations over running sums, O(1) per result). When the system is degenerate (all results
    have the same prompt:completion ratio, or only one kind of token) or the fit gives a negative
    price, it falls back to one blended price ``sum(cost) / sum(prompt + completion)`` for both.

    Args:
        min_results: results with a cost needed before observed prices are returned.
    """

    def __init__(self, min_results: int = 20) -> None:
        self.min_results = min_results
        self.n = 0
        self._spp = self._spc = self._scc = self._spy = self._scy = 0.0
        self._sy = self._st = 0.0

    def observe(self, prompt_tokens: int, completion_tokens: int, cost_usd: float | None) -> None:
        """Record one result (tokens, USD); results with ``cost_usd`` None are ignored.

        Raises:
            ValueError: negative tokens or a negative/non-finite cost.
        """
        if cost_usd is None:
            return
        if prompt_tokens < 0 or completion_tokens < 0 or not (math.isfinite(cost_usd) and cost_usd >= 0):
            raise ValueError("tokens and cost must be >= 0")
        p, c, y = float(prompt_tokens), float(completion_tokens), float(cost_usd)
        self.n += 1
        self._spp += p * p
        self._spc += p * c
        self._scc += c * c
        self._spy += p * y
        self._scy += c * y
        self._sy += y
        self._st += p + c

    def fitted(self) -> Prices | None:
        """Observed prices from whatever was seen (ignores ``min_results``); None before any
        result with tokens."""
        if self._st <= 0:
            return None
        det = self._spp * self._scc - self._spc * self._spc
        if det > 1e-9 * self._spp * self._scc:
            a = (self._spy * self._scc - self._scy * self._spc) / det
            b = (self._scy * self._spp - self._spy * self._spc) / det
            if a >= 0 and b >= 0:
                return Prices(a, b, "observed")
        blended = self._sy / self._st
        return Prices(blended, blended, "observed")

    def prices(self, fallback: Prices | None) -> Prices | None:
        """Observed prices once ``min_results`` results with a cost were seen, else ``fallback``
        (None when no price is known at all: callers must refuse a dollar cap then)."""
        if self.n >= self.min_results:
            fit = self.fitted()
            if fit is not None:
                return fit
        return fallback
