"""``[fidelity]``: is each provider selling the target's own distribution? (docs/fidelity.md)"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from engine.config.base import _Strict


class ProbesSection(_Strict):
    """``[fidelity.probes]``: a small probe set sent pinned to each provider, compared with a reference provider."""

    enabled: bool = Field(False, description=(
        "send the probes once at the start of `datagen run` (`datagen probe CONFIG` sends them alone, either "
        "way); their cost is shown before the first one ([fidelity.md](fidelity.md#probes))"))
    path: Path | None = Field(None, description=(
        "JSONL probe set, one `{\"id\", \"messages\", \"tools\", \"temperature\", \"expect\"}` per line"),
        json_schema_extra={"doc_default": "the bundled 24 probes (engine/samples/probes/fidelity_probes.jsonl)"})
    reference: str | None = Field(None, description=(
        "the provider the others are compared with (e.g. `moonshotai`, the model's own API); required when "
        "`enabled`"))
    providers: list[str] | None = Field(None, description=(
        "provider slugs to probe"),
        json_schema_extra={"doc_default": "every provider of the model's endpoints listing, kept to "
                                          "`[provider.routing]` `only` and without its `ignore`"})
    max_tokens: int = Field(1024, ge=16, le=65536, description=(
        "completion cap per probe (tokens); an answer cut by it is left out of the trigger F1"))
    repeats: int = Field(1, ge=1, le=50, description="times each probe is sent to each provider")
    concurrency: int = Field(8, ge=1, le=256, description="probes in flight at once")
    min_f1: float = Field(0.73, ge=0, le=1, description=(
        "tool-call trigger F1 against the reference below which a provider reads `below` (K2VV: 0.80 for "
        "kimi-k2-0905, 0.73 for kimi-k2-thinking)"))
    min_schema_accuracy: float = Field(0.95, ge=0, le=1, description=(
        "share of a provider's tool calls whose arguments fit the tool's JSON schema, below which it reads `below`"))
    min_pairs: int = Field(8, ge=1, description=(
        "comparable (reference, provider) answers below which a provider is `insufficient`"))

    @model_validator(mode="after")
    def _reference_when_enabled(self) -> "ProbesSection":
        if self.enabled and not self.reference:
            raise ValueError("reference: required when enabled (the provider the others are compared with)")
        return self


class FidelitySection(_Strict):
    """How provider verdicts are reached and what a ``drifting`` verdict does."""

    false_alarm: float = Field(0.001, gt=0, lt=0.5, description=(
        "the chance that an honest provider is judged `drifting` over a whole run (all looks together); "
        "measured rates in [fidelity.md](fidelity.md#thresholds-and-why)"))
    min_records: int = Field(20, ge=1, description="below this many scored records a provider is `insufficient`")
    min_tokens: int = Field(2000, ge=1, description=(
        "below this many scored completion tokens a provider is `insufficient` in phase two (cheap signals need "
        "`min_records` only)"))
    outside_tolerance: float = Field(0.002, ge=0, lt=1, description=(
        "share of completion tokens outside the target's top-p nucleus an honest provider may show (numerical "
        "ties at the nucleus boundary); half of it is the margin a provider may show over the other providers' share"))
    looks: int = Field(20, ge=1, description=(
        "how many times a run may re-judge a provider as records arrive; each look tests at `false_alarm / looks`"))
    on_drift: Literal["exclude", "flag", "report"] = Field("exclude", description=(
        "what a `drifting` verdict does: `exclude` (stop buying from the provider, as `x` does, and flag its "
        "records `provider_drift`), `flag` (flag its records only) or `report` (show the verdict only)"))
    cheap_signals: bool = Field(True, description=(
        "judge providers without a local target too, from what the run already has (lengths, finish mix, wire flags, "
        "billed prompt tokens against our count, tool-call validity, reconstruction mismatches)"))
    probes: ProbesSection = Field(default_factory=ProbesSection)
