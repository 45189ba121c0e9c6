"""``[[datasets]]``: one prompt dataset (a file, a shard set or a Hugging Face Hub dataset)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from engine.config.base import _Strict

if TYPE_CHECKING:
    from engine.datasets.hub import HubRef


class HubPath(_Strict):
    """A ``[[datasets]] path`` of the form ``hf://datasets/ORG/NAME``: a Hugging Face Hub dataset
    (:mod:`engine.datasets.hub`); ``str()`` gives the path back."""

    repo: str

    def __str__(self) -> str:
        return f"hf://datasets/{self.repo}"


class DatasetSection(_Strict):
    """``[[datasets]]``: one prompt dataset (a path may be an ``hf://`` Hub dataset, :class:`HubPath`).
    Each field's ``description`` says what it does (docs/configuration.md is generated from them:
    ``make docs``)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$", max_length=64,
                      description="unique name (letters, digits, `_ - .`)")
    path: Path | HubPath = Field(json_schema_extra={"doc_type": "path or `hf://` URL"}, description=(
        "a JSONL, JSON array (also a truncated one: complete elements are kept) or Parquet file; a JSON one may be "
        "gzip- or zstd-compressed (`.jsonl.gz`, `.jsonl.zst`, `.json.gz`, ...: by suffix, decompressed as it is read); "
        "a directory (every such file below it) or a glob (`data/train-*.parquet`, `**` spans directories) of "
        "shards, read in sorted order; or `hf://datasets/ORG/NAME`, a Hugging Face Hub dataset "
        "([datasets.md](datasets.md#where-the-rows-come-from))"))
    revision: str | None = Field(None, min_length=1, json_schema_extra={"doc_default": '`"main"`'}, description=(
        "`hf://` only: branch, tag or commit sha; resolved to a commit sha at ingest and stored with the run (a "
        "moved revision is re-read like a changed file)"))
    split: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-]+$", json_schema_extra={"doc_default": '`"train"`'},
                              description=(
        "`hf://` only: the split whose files are read, by the Hub's conventional layouts (`data/train-*`, "
        "`train.jsonl`, `train/*`, `*/train/*`, `*/train-*`); not with `files`"))
    files: str | None = Field(None, min_length=1, description=(
        "`hf://` only: a glob over the repository's file paths that picks the files instead of `split` (`*` also "
        "matches `/`, as huggingface_hub's `allow_patterns`)"))
    format: str = Field("auto", description=(
        "`auto` (per row) or one of `openai`, `sharegpt`, `instruction`, `oss_instruct`, `opencodeinstruct`, "
        "`glaive`, `swe_agent`, `ultrachat`, `text` ([datasets.md](datasets.md#rows-into-prompts))"))
    max_prompts: int | None = Field(None, ge=1, description="take at most this many valid prompts, in file order")
    token_budget: int | None = Field(None, ge=1, description=(
        "token budget (completion tokens; with `budget_counts = \"total\"`, prompt + completion), reserved at "
        "dispatch ([spend-control.md](spend-control.md))"))
    budget_counts: Literal["completion", "total"] = Field("completion", description="what `token_budget` counts")
    max_cost_usd: float | None = Field(None, gt=0, description="dollar cap of this dataset (USD)")
    fields: dict[str, str] = Field(default_factory=dict, description=(
        "column renames, e.g. `fields = { prompt = \"question\" }` (keys: `messages`, `conversations`, `system`, "
        "`prompt`, `instruction`, `input`, `tools`)"))

    @field_validator("path", mode="before")
    @classmethod
    def _hub_path(cls, v: Any) -> Any:
        if isinstance(v, str) and v.startswith("hf:"):
            from engine.datasets.hub import parse_url

            return HubPath(repo=parse_url(v))
        return v

    @field_validator("format")
    @classmethod
    def _format(cls, v: str) -> str:
        from engine.datasets import FORMATS

        if v not in FORMATS:
            raise ValueError(f"expected one of {', '.join(FORMATS)}, got {v!r}")
        return v

    @model_validator(mode="after")
    def _hub_keys(self) -> "DatasetSection":
        given = [k for k in ("revision", "split", "files") if getattr(self, k) is not None]
        if given and not isinstance(self.path, HubPath):
            raise ValueError(f"{', '.join(given)}: only for a path = \"hf://datasets/ORG/NAME\" (a local path names "
                             f"its files itself: a file, a directory or a glob)")
        if self.split is not None and self.files is not None:
            raise ValueError("split and files: give one (files picks the files by a glob instead of the split's layout)")
        return self

    def hub(self) -> HubRef | None:
        """The Hub dataset of an ``hf://`` path, None for a local path."""
        if not isinstance(self.path, HubPath):
            return None
        from engine.datasets.hub import DEFAULT_REVISION, DEFAULT_SPLIT, HubRef

        return HubRef(self.path.repo, self.revision or DEFAULT_REVISION, self.split or DEFAULT_SPLIT, self.files)
