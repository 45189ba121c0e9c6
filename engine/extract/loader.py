"""Read extracted samples back: a lazy torch ``Dataset`` over ``manifest.jsonl`` + shards.

Only the manifest is read up front; each ``dataset[i]`` opens (memory-maps) its shard with
``safetensors.safe_open`` and reads that sample's four tensors. Open shards are cached per process
(LRU, ``max_open`` of them), so it works with ``DataLoader(num_workers=N)``.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from engine.extract.shards import OutDir, read_sample

KEYS = ("input_ids", "loss_mask", "aux_hidden_states", "last_hidden_state")


class ExtractedDataset(Dataset):
    """Samples of an extraction output directory, in manifest order (first entry per id).

    Args:
        out_dir: the job's ``out_dir``.
        max_open: shards kept open per process.

    ``ds[i]`` is ``{"id", "dataset", "input_ids" [T] int64, "loss_mask" [T] int8,
    "aux_hidden_states" [T, n_aux*H], "last_hidden_state" [T, H]}`` (fp8 shards, ``save_dtype = "fp8"``:
    dequantized into float32, :func:`engine.extract.shards.read_sample`); ``ds.index(sample_id)`` finds a
    sample's position. Entries whose shard is missing raise ``FileNotFoundError`` when read.
    """

    def __init__(self, out_dir: str | Path, max_open: int = 8) -> None:
        if not Path(out_dir).is_dir():
            raise FileNotFoundError(f"{out_dir}: no such extraction output directory")
        self.out = OutDir(out_dir)
        self.entries: list[dict[str, Any]] = []
        self._pos: dict[str, int] = {}
        for e in self.out.read_manifest():
            if e["id"] not in self._pos:
                self._pos[e["id"]] = len(self.entries)
                self.entries.append(e)
        self.max_open = max_open
        self._open: collections.OrderedDict[str, Any] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self.entries)

    def index(self, sample_id: str) -> int:
        """Position of ``sample_id`` (KeyError if it was not extracted)."""
        return self._pos[sample_id]

    def _handle(self, shard: str) -> Any:
        from safetensors import safe_open

        h = self._open.get(shard)
        if h is None:
            h = safe_open(str(self.out.path / shard), framework="pt")
            self._open[shard] = h
            while len(self._open) > self.max_open:
                self._open.popitem(last=False)
        else:
            self._open.move_to_end(shard)
        return h

    def __getitem__(self, i: int) -> dict[str, Any]:
        e = self.entries[i]
        h = self._handle(e["shard"])
        out: dict[str, Any] = {"id": e["id"], "dataset": e.get("dataset", "")}
        out.update(read_sample(h, e["id"]))  # fp8 shards (save_dtype = "fp8"): dequantized to float32
        return out

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers: reopen shards in each process
        d = dict(self.__dict__)
        d["_open"] = collections.OrderedDict()
        return d


def load_sample(out_dir: str | Path, sample_id: str) -> dict[str, torch.Tensor]:
    """One sample by id (convenience; builds a dataset, so prefer :class:`ExtractedDataset` in loops)."""
    ds = ExtractedDataset(out_dir)
    return ds[ds.index(sample_id)]
