"""Output layouts of the hidden states: which files a job writes, so a trainer reads them as written.

- ``shards`` (:mod:`.shards`): this project's ``shard-NNNNN.safetensors`` (many samples per file),
  read by :class:`engine.extract.loader.ExtractedDataset`.
- ``speculators`` (:mod:`.speculators`): vLLM speculators' offline EAGLE-3 data (its
  ``hidden_states/hs_{i}.safetensors`` and the preprocessed dataset beside them).
- ``specforge`` (:mod:`.specforge`): SpecForge's offline EAGLE-3 feature files
  (``rows_{g}-{g+2000}/data_{i}.ckpt[.gz]``) and its ``vocab_mapping/vocab_mapping.pt``.
- ``modelopt`` (:mod:`.modelopt`): NVIDIA Model-Optimizer's offline EAGLE-3 dumps (``{id}.pt``).

``save_dtype = "fp8"`` (``shards``, ``speculators``) stores the states as ``float8_e4m3fn`` with one
float32 scale per token (:mod:`.base`).

Every layout shares the job's crash-safety machinery (:mod:`engine.extract.shards`): temp file ->
fsync -> rename under the lock -> one manifest append, recovery of what a ``kill -9`` left, resume
from the manifest. docs/eagle3-data.md section 5 gives each trainer's exact format and sources.
"""

from __future__ import annotations

from typing import Any

from engine.extract.job import ExtractError, ExtractJob
from engine.extract.layouts.base import Layout
from engine.extract.layouts.shards import ShardsLayout

LAYOUT_NAMES = ("shards", "speculators", "specforge", "modelopt")


def make_layout(name: str, hidden_size: int, n_aux: int, **opts: Any) -> Layout:
    """The layout called ``name`` for hidden size ``hidden_size`` and ``n_aux`` aux layers.

    Args:
        opts: ``save_dtype`` and the layout's options (:meth:`ExtractJob.layout_options`).

    Raises:
        ExtractError: unknown name, ``fp8`` for a layout that stores the model dtype, or a library
            the layout writes with is missing.
    """
    if name == "shards":
        return ShardsLayout(hidden_size, n_aux, **opts)
    if name == "speculators":
        from engine.extract.layouts.speculators import SpeculatorsLayout

        return SpeculatorsLayout(hidden_size, n_aux, **opts)
    if name == "specforge":
        from engine.extract.layouts.specforge import SpecForgeLayout

        return SpecForgeLayout(hidden_size, n_aux, **opts)
    if name == "modelopt":
        from engine.extract.layouts.modelopt import ModelOptLayout

        return ModelOptLayout(hidden_size, n_aux, **opts)
    raise ExtractError(f"[extract] layout = {name!r}: expected one of {', '.join(LAYOUT_NAMES)}")


def layout_for(job: ExtractJob) -> Layout:
    """The layout of ``job`` (``job.layout``, its save dtype and options); see :func:`make_layout`."""
    return make_layout(job.layout, job.hidden_size, len(job.aux_layers), **job.layout_options())


def finish_layout(out: Any, table: Any, skipped: Any = frozenset()) -> bool:
    """Let ``out.layout`` write its job-level files once every sample of ``table`` is saved (the
    speculators dataset); a no-op for the other layouts. Samples of the ``skipped`` datasets (names;
    skipped by the user) are not waited for. Returns True when the output is complete."""
    index = {sid: i for i, sid in enumerate(table.ids)}
    ids = [sid for sid, ds in zip(table.ids, table.datasets, strict=True) if ds not in skipped]
    return out.layout.finish(out, ids, lambda sid: table.tokens(index[sid]))


__all__ = ["LAYOUT_NAMES", "Layout", "finish_layout", "layout_for", "make_layout"]
