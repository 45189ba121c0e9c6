"""The whole ``config.toml`` (:class:`Config`): the sections and the rules that span them."""

from __future__ import annotations

from pydantic import Field, model_validator

from engine.config.base import _Strict
from engine.config.datasets import DatasetSection
from engine.config.extract import ExtractSection
from engine.config.fidelity import FidelitySection
from engine.config.provider import ProviderSection
from engine.config.run import ClassSection, GenerationSection, RunSection
from engine.config.spend import PricingSection, SpendSection
from engine.config.tokenizer import TokenizerSection


def _default_classes() -> dict[str, ClassSection]:
    return {
        "short": ClassSection(max_tokens=10_240, concurrency=2_000, min_prompt_tokens=0),
        "long": ClassSection(max_tokens=16_384, concurrency=500, min_prompt_tokens=8_000),
    }


class Config(_Strict):
    """The whole ``config.toml``."""

    run: RunSection = Field(default_factory=RunSection)
    provider: ProviderSection = Field(default_factory=ProviderSection)
    generation: GenerationSection = Field(default_factory=GenerationSection)
    pricing: PricingSection = Field(default_factory=PricingSection)
    spend: SpendSection = Field(default_factory=SpendSection)
    classes: dict[str, ClassSection] = Field(default_factory=_default_classes, min_length=1)
    datasets: list[DatasetSection] = Field(min_length=1)
    tokenizer: TokenizerSection | None = None
    extract: ExtractSection = Field(default_factory=ExtractSection)
    fidelity: FidelitySection = Field(default_factory=FidelitySection)

    @model_validator(mode="after")
    def _cross(self) -> "Config":
        names = [d.name for d in self.datasets]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"dataset names must be unique; repeated: {', '.join(dup)}")
        for cname, c in self.classes.items():
            unknown = [d for d in c.datasets if d not in names]
            if unknown:
                raise ValueError(f"classes.{cname}.datasets names unknown dataset(s): {', '.join(unknown)}")
        if not any(c.min_prompt_tokens == 0 for c in self.classes.values()):
            raise ValueError("one class must have min_prompt_tokens = 0 so every prompt has a class")
        if self.extract.after_run != "never":
            need = [what for what, ok in (("extract.model (the target model)", self.extract.model),
                                          ("a [tokenizer] section (extraction reads validated token records)",
                                           self.tokenizer)) if not ok]
            if need:
                raise ValueError(f'extract.after_run = "{self.extract.after_run}" needs ' + " and ".join(need))
        return self

    def class_for(self, dataset: str, est_prompt_tokens: int) -> str:
        """Return the class name for a prompt of ``dataset`` with ``est_prompt_tokens`` tokens."""
        for name, c in self.classes.items():
            if dataset in c.datasets:
                return name
        best, best_min = "", -1
        for name, c in self.classes.items():
            if best_min < c.min_prompt_tokens <= est_prompt_tokens:
                best, best_min = name, c.min_prompt_tokens
        return best

    def dataset(self, name: str) -> DatasetSection:
        """Return the dataset section called ``name`` (KeyError if none)."""
        for d in self.datasets:
            if d.name == name:
                return d
        raise KeyError(name)
