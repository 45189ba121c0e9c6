"""``[pricing]`` and ``[spend]``: the model's prices and the run-wide money controls."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from engine.config.base import _Strict


class PricingSection(_Strict):
    """``[pricing]``: the model's prices in USD per MILLION tokens, when you know them.

    Price sources in order: prices learned from billed ``usage.cost`` (after 20 results), these,
    then the provider's ``/models`` endpoint. A dollar cap with no known price refuses to run.
    """

    prompt_usd_per_m: float | None = Field(None, ge=0)
    completion_usd_per_m: float | None = Field(None, ge=0)


class SpendSection(_Strict):
    """``[spend]``: run-wide money controls.

    Attributes:
        max_cost_usd: run-wide dollar cap (USD), reserved at dispatch like token budgets.
        on_budget: ``drain`` (in-flight requests finish and are kept) or ``abort`` (cancelled now)
            when a dataset's budget is met.
        credits_floor_usd: checked before each dispatch: a request is sent only while provider credits
            left minus the dollars reserved in flight minus its own expected cost stay >= this (USD);
            else it waits for in-flight requests, or the run pauses (:mod:`engine.money.creditsfloor`).
        credits_poll_s: seconds between reads of ``/key`` (fallback ``/credits``).
        calibrate_after: completions of a dataset+class before reservations use the observed
            percentile instead of ``max_tokens``; reserve_percentile: that percentile (0.5-1).
        anomaly_error_rate / anomaly_window: pause a dataset when more than this fraction of its
            last ``anomaly_window`` attempts failed, counted in dispatch order once resolved (0 disables;
            see :mod:`engine.run.anomaly`).
        reservation: ``expected`` (default) or ``none`` (naive: reserve nothing; for benchmarks).
        hard_cap: never exceed a token budget or dollar cap: each request reserves its class's
            ``max_tokens`` (and 4x its prompt estimate where prompts count), so fewer requests are
            in flight as a budget nears its end. Default false: reserve the observed percentile
            (overshoot within about 2%).
    """

    max_cost_usd: float | None = Field(None, gt=0)
    on_budget: Literal["drain", "abort"] = "drain"
    credits_floor_usd: float = Field(0.0, ge=0)
    credits_poll_s: float = Field(60.0, gt=0)
    calibrate_after: int = Field(50, ge=1)
    reserve_percentile: float = Field(0.90, ge=0.5, le=1.0)
    anomaly_error_rate: float = Field(0.20, ge=0, lt=1)
    anomaly_window: int = Field(200, ge=10)
    reservation: Literal["expected", "none"] = "expected"
    hard_cap: bool = False

    @model_validator(mode="after")
    def _hard_cap_reserves(self) -> "SpendSection":
        if self.hard_cap and self.reservation == "none":
            raise ValueError('hard_cap = true needs reservation = "expected" ("none" reserves nothing)')
        return self
