"""Hidden-state extraction for EAGLE-3 drafters (``datagen extract``).

The target model runs over every token record; per sample the output holds ``input_ids`` ``[T]``,
``loss_mask`` ``[T]``, ``aux_hidden_states`` ``[T, 3H]`` (outputs of the 0-based layers
``aux_layers``, default ``[1, L//2 - 1, L - 4]``, concatenated low to high) and
``last_hidden_state`` ``[T, H]`` (after the final norm: what the LM head reads), in safetensors
shards listed by ``out_dir/manifest.jsonl``.

Modules: :mod:`.job` (settings), :mod:`.source` (input), :mod:`.plan` (batches, split, projection),
:mod:`.model` (forward), :mod:`.shards` (output, recovery), :mod:`.disk`, :mod:`.status`,
:mod:`.worker`, :mod:`.launch` (``datagen extract``), :mod:`.loader` (read back), :mod:`.tiny`
(a tiny random DeepSeek-V3 model for tests and benchmarks).

Public API (imported lazily, so ``import engine.extract`` does not import torch):
``ExtractedDataset``, ``collect`` (job status of an out_dir), ``run_extract``, ``ExtractError``.
"""

from __future__ import annotations

from engine.lazy import lazy_exports

_EXPORTS = {
    "ExtractedDataset": "engine.extract.loader",
    "load_sample": "engine.extract.loader",
    "collect": "engine.extract.status",
    "gpus_json": "engine.extract.status",
    "run_extract": "engine.extract.launch",
    "ExtractError": "engine.extract.job",
    "ExtractJob": "engine.extract.job",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
