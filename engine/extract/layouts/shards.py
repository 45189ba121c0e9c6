"""The ``shards`` layout: this project's ``shard-NNNNN.safetensors`` (see :mod:`engine.extract.shards`).

With ``save_dtype = "fp8"`` a sample's states are ``{id}/hidden_states`` ``[T, n_aux + 1, H]``
``float8_e4m3fn`` (aux layers, then the final state after the norm) and ``{id}/hidden_states_scales``
``[T, 1, 1]`` float32 instead of ``aux_hidden_states`` / ``last_hidden_state``: speculators' fp8
tensors (:mod:`engine.extract.layouts.base`); :class:`engine.extract.loader.ExtractedDataset` and
``datagen extract --convert`` dequantize them (:func:`engine.extract.shards.read_sample`).
"""

from __future__ import annotations

import os
from typing import Any

from engine.extract.layouts.base import SCALES_KEY, Layout, fp8_states


class ShardsLayout(Layout):
    """Several samples per safetensors shard, keys ``{id}/<tensor>`` (read by ``ExtractedDataset``)."""

    name = "shards"
    fp8_ok = True

    def write(self, out: Any, tensors: dict[str, Any], entries: list[dict[str, Any]]) -> int:
        from safetensors.torch import save_file

        if self.save_dtype == "fp8":
            t: dict[str, Any] = {}
            for e in entries:
                sid = e["id"]
                q, sc = fp8_states(tensors, sid, self.hidden_size)
                t.update({f"{sid}/input_ids": tensors[f"{sid}/input_ids"], f"{sid}/loss_mask": tensors[f"{sid}/loss_mask"],
                          f"{sid}/hidden_states": q, f"{sid}/{SCALES_KEY}": sc})
            tensors = t
        tmp = out.tmp_path()
        try:
            save_file(tensors, tmp)
            name = out.commit(tmp, entries)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return os.path.getsize(out.path / name)
