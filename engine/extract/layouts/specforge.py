"""The ``specforge`` layout: SpecForge's offline EAGLE-3 feature files, as its own capture writes them.

Source: sgl-project/SpecForge at commit a6b6b0230009d15ec2a97a57384e6f53f0f96946:

- ``scripts/prepare_hidden_states.py`` (``HiddenStatesGenerator``): one file per sample,
  ``<output>/rows_{g}-{g + 2000}/data_{i}.ckpt`` with ``g = i // 2000 * 2000`` (``_get_file_path``,
  ``file_group_size = 2000``), written with ``torch.save(record, path)``;
- ``specforge/algorithms/common/providers.py`` (``OfflineCaptureLayout.materialize``) and the EAGLE-3
  layout in that script: ``record = {"input_ids": [T] int64, "loss_mask": [T] int64,
  "aux_hidden_state": [1, T, n_aux*H], "hidden_state": [1, T, H]}`` (model dtype), ``hidden_state``
  being the final hidden state AFTER the final norm (SGLang's logits-processor input; SpecForge's
  ``TargetHead.forward`` applies only the LM head to it);
- ``specforge/runtime/data_plane/offline_reader.py`` (``list_feature_files``: every ``*.ckpt`` under
  the directory, sorted) and ``feature_store.py`` (``load_feature_file``: ``torch.load(path,
  weights_only=False, mmap=True)``), then ``specforge/algorithms/eagle3/data.py``
  (``normalize_offline_sample``: ``squeeze(0)``, ``[:max_len]``, ``loss_mask[0, -1] = 0``).

``loss_mask`` is 1 exactly on the completion tokens, position for position with ``input_ids`` (not
shifted): SpecForge's own preprocessing (``specforge/data/preprocessing.py``) builds it that way.
Unlike SpecForge's capture with ``--batch-size`` > 1, no padding is stored: ``T`` is the sample's length.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from engine.extract.layouts.base import PerSampleLayout

#: SpecForge's default ``--file-group-size`` (files per ``rows_*`` directory).
FILE_GROUP_SIZE = 2000
SPECFORGE_COMMIT = "a6b6b0230009d15ec2a97a57384e6f53f0f96946"
_DIR_RE = re.compile(r"^rows_(\d+)-(\d+)$")
_FILE_RE = re.compile(r"^data_(\d+)\.ckpt$")


class SpecForgeLayout(PerSampleLayout):
    """``rows_{g}-{g+2000}/data_{i}.ckpt`` per sample (module doc)."""

    name = "specforge"

    def file_name(self, index: int) -> str:
        g = index // FILE_GROUP_SIZE * FILE_GROUP_SIZE
        return f"rows_{g}-{g + FILE_GROUP_SIZE}/data_{index}.ckpt"

    def record(self, tensors: dict[str, Any], sid: str) -> dict[str, Any]:
        import torch

        # clone: torch.save would otherwise store the whole batch tensor a slice is a view of
        return {
            "input_ids": tensors[f"{sid}/input_ids"].to(torch.int64).clone(),
            "loss_mask": tensors[f"{sid}/loss_mask"].to(torch.int64).clone(),
            "aux_hidden_state": tensors[f"{sid}/aux_hidden_states"].clone().unsqueeze(0),
            "hidden_state": tensors[f"{sid}/last_hidden_state"].clone().unsqueeze(0),
        }

    def save(self, record: dict[str, Any], path: Path) -> None:
        import torch

        torch.save(record, path)

    def scan(self, path: Path) -> set[str]:
        out: set[str] = set()
        try:
            with os.scandir(path) as it:
                dirs = [e for e in it if e.is_dir() and _DIR_RE.match(e.name)]
        except FileNotFoundError:
            return out
        for d in dirs:
            with os.scandir(d.path) as it:
                out.update(f"{d.name}/{e.name}" for e in it if _FILE_RE.match(e.name))
        return out
