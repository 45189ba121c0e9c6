"""The ``shards`` layout: this project's ``shard-NNNNN.safetensors`` (see :mod:`engine.extract.shards`)."""

from __future__ import annotations

import os
from typing import Any

from engine.extract.layouts.base import Layout


class ShardsLayout(Layout):
    """Several samples per safetensors shard, keys ``{id}/<tensor>`` (read by ``ExtractedDataset``)."""

    name = "shards"

    def write(self, out: Any, tensors: dict[str, Any], entries: list[dict[str, Any]]) -> int:
        from safetensors.torch import save_file

        tmp = out.tmp_path()
        try:
            save_file(tensors, tmp)
            name = out.commit(tmp, entries)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return os.path.getsize(out.path / name)
