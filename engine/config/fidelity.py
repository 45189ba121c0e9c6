"""``[fidelity]``: is each provider selling the target's own distribution? (docs/fidelity.md)"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from engine.config.base import _Strict


class FidelitySection(_Strict):
    """How provider verdicts are reached and what a ``drifting`` verdict does."""

    false_alarm: float = Field(0.001, gt=0, lt=0.5, description=(
        "the chance that an honest provider is judged `drifting` over a whole run (all looks together); "
        "measured rates in [fidelity.md](fidelity.md#thresholds-and-why)"))
    min_records: int = Field(20, ge=1, description="below this many scored records a provider is `insufficient`")
    min_tokens: int = Field(2000, ge=1, description="below this many scored completion tokens a provider is `insufficient`")
    outside_tolerance: float = Field(0.002, ge=0, lt=1, description=(
        "share of completion tokens outside the target's top-p nucleus an honest provider may show (numerical "
        "ties at the nucleus boundary)"))
    looks: int = Field(20, ge=1, description=(
        "how many times a run may re-judge a provider as records arrive; each look tests at `false_alarm / looks`"))
    on_drift: Literal["exclude", "flag", "report"] = Field("exclude", description=(
        "what a `drifting` verdict does: `exclude` (stop buying from the provider, as `x` does, and flag its "
        "records `provider_drift`), `flag` (flag its records only) or `report` (show the verdict only)"))
    cheap_signals: bool = Field(True, description=(
        "judge providers without a local target too, from what the run already has (lengths, finish mix, wire flags, "
        "billed prompt tokens against our count, tool-call validity, reconstruction mismatches)"))
