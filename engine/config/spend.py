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

    prompt_usd_per_m: float | None = Field(None, ge=0, description="the model's prompt price, USD per million tokens")
    completion_usd_per_m: float | None = Field(None, ge=0, description=(
        "the model's completion price, USD per million tokens"))


class SpendSection(_Strict):
    """``[spend]``: run-wide money controls (:mod:`engine.money`, the credits floor in
    :mod:`engine.money.creditsfloor`, the anomaly guard in :mod:`engine.run.anomaly`). Each field's
    ``description`` says what it does (docs/configuration.md is generated from them: ``make docs``)."""

    max_cost_usd: float | None = Field(None, gt=0, description="run-wide dollar cap (USD), reserved at dispatch")
    on_budget: Literal["drain", "abort"] = Field("drain", description=(
        "when a budget is met: `drain` (in-flight requests finish and are kept) or `abort` them (cancelled now)"))
    credits_floor_usd: float = Field(0.0, ge=0, description=(
        "checked before each dispatch: a request is sent only while credits left minus dollars in flight minus its "
        "expected cost stay at or above this (USD); else it waits for requests in flight, or the run pauses"))
    credits_poll_s: float = Field(60.0, gt=0, description="seconds between credits reads (`/key`, fallback `/credits`)")
    calibrate_after: int = Field(50, ge=1, description=(
        "completions of a dataset+class before reservations use the observed percentile instead of `max_tokens`"))
    reserve_percentile: float = Field(0.90, ge=0.5, le=1.0, description="that percentile")
    anomaly_error_rate: float = Field(0.20, ge=0, lt=1, description=(
        "error rate that pauses a dataset (0 disables)"))
    anomaly_window: int = Field(200, ge=10, description=(
        "attempts (in dispatch order, all resolved) the error rate is measured over"))
    reservation: Literal["expected", "none"] = Field("expected", description=(
        "`expected`: reserve the observed percentile; `none` = reserve nothing (the naive baseline, for benchmarks "
        "only)"))
    hard_cap: bool = Field(False, description=(
        "never exceed a token budget or dollar cap: each request reserves its class's `max_tokens` (and 4x its prompt "
        "estimate where prompts count), so fewer requests are in flight as a budget nears its end; false: reserve the "
        "observed percentile (overshoot within about 2%); needs `reservation = \"expected\"`"))

    @model_validator(mode="after")
    def _hard_cap_reserves(self) -> "SpendSection":
        if self.hard_cap and self.reservation == "none":
            raise ValueError('hard_cap = true needs reservation = "expected" ("none" reserves nothing)')
        return self
