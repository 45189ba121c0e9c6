"""``[[datasets]]``: one prompt dataset (a file, a shard set or a Hugging Face Hub dataset)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from engine.config.base import _Strict


class HubPath(_Strict):
    """A ``[[datasets]] path`` of the form ``hf://datasets/ORG/NAME``: a Hugging Face Hub dataset
    (:mod:`engine.datasets.hub`); ``str()`` gives the path back."""

    repo: str

    def __str__(self) -> str:
        return f"hf://datasets/{self.repo}"


class DatasetSection(_Strict):
    """``[[datasets]]``: one prompt dataset.

    Attributes:
        name: unique name (letters, digits, ``_ - .``).
        path: a JSONL, JSON array or Parquet file (JSON ones optionally ``.gz``/``.zst``-compressed);
            a directory or glob of such files (read in sorted order); or ``hf://datasets/ORG/NAME``,
            a Hub dataset (:class:`HubPath`).
        revision: (``hf://`` only) branch, tag or commit sha; default ``main``. Resolved to a commit
            sha at ingest and stored with the run: a moved revision is re-read like a changed file.
        split: (``hf://`` only) the split whose files are read by the Hub's conventional layouts
            (``data/train-*``, ``train.jsonl``, ``*/train/*``, ...); default ``train``.
        files: (``hf://`` only) a glob over the repository's file paths, instead of ``split``.
        format: row format (``auto`` or one of ``engine.datasets.FORMATS``).
        max_prompts: take at most this many valid prompts, in file order.
        token_budget: token budget (tokens): completion tokens, or prompt + completion tokens
            when ``budget_counts = "total"``; never overshot by more than the in-flight tail.
        max_cost_usd: dollar cap of this dataset (USD).
        fields: optional column renames, e.g. ``{messages = "dialog"}``.
    """

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$", max_length=64)
    path: Path | HubPath
    revision: str | None = Field(None, min_length=1)
    split: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-]+$")
    files: str | None = Field(None, min_length=1)
    format: str = "auto"
    max_prompts: int | None = Field(None, ge=1)
    token_budget: int | None = Field(None, ge=1)
    budget_counts: Literal["completion", "total"] = "completion"
    max_cost_usd: float | None = Field(None, gt=0)
    fields: dict[str, str] = Field(default_factory=dict)

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

    def hub(self) -> "HubRef | None":
        """The Hub dataset of an ``hf://`` path, None for a local path."""
        if not isinstance(self.path, HubPath):
            return None
        from engine.datasets.hub import DEFAULT_REVISION, DEFAULT_SPLIT, HubRef

        return HubRef(self.path.repo, self.revision or DEFAULT_REVISION, self.split or DEFAULT_SPLIT, self.files)
