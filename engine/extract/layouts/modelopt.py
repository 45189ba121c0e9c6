"""The ``modelopt`` layout: NVIDIA Model-Optimizer's offline EAGLE-3 data, as its own dump writes it.

Source: NVIDIA/Model-Optimizer at commit a2fbac7bad8ab446d3f8783dadb0c3366eb0ad73 (``examples/speculative_decoding``):

- ``collect_hidden_states/compute_hidden_states_hf.py`` (``dump_hidden_states``): one file per
  conversation, ``<output_dir>/{conversation_id}.pt``, ``torch.save({"input_ids": [T] int64,
  "hidden_states": [T, H], "aux_hidden_states": [T, n_aux*H], "loss_mask": [T] int64,
  "conversation_id": ...})`` in the model dtype; ``hidden_states`` is Hugging Face's
  ``outputs.hidden_states[-1]``, the final state AFTER the final norm, and ``aux_hidden_states`` the
  outputs of the 0-based layers ``--aux-layers`` (``hidden_states[lid + 1]``) concatenated;
- ``eagle_utils.py`` (``make_speculative_data_module``): ``Path(offline_data_path).rglob("*.pt")``;
- ``modelopt/torch/speculative/eagle/utils.py`` (``OfflineSupervisedDataset.__getitem__``):
  ``torch.load(file, weights_only=True)``; ``input_ids``, ``hidden_states`` (as
  ``base_model_hidden_states``), ``aux_hidden_states``; ``loss_mask`` with ``answer_only_loss``
  (1 on the assistant tokens, not shifted, as its ``tokenize_with_loss_mask`` makes it); an absent
  ``hidden_states_prenorm`` means post-norm;
- layer ids: its ``eagle_aux_hidden_state_layer_ids`` are 0-based layer ids (``hf_eagle.py``
  ``default_eagle_aux_layer_ids``: ``{1, L//2 - 1, L - 4}``), this project's ``aux_layers``.

File names: the sample id, percent-encoded where a character is not a letter, digit or one of
``:-_.@+=,`` (``/`` becomes ``%2F``; a leading ``.`` ``%2E``), a SHA-1 for ids over 200 bytes;
``conversation_id`` holds the id itself.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

from engine.extract.layouts.base import PerSampleLayout, states

MODELOPT_COMMIT = "a2fbac7bad8ab446d3f8783dadb0c3366eb0ad73"
_FILE_RE = re.compile(r"^[^.].*\.pt$")


def sample_file_name(sid: str) -> str:
    """``{id}.pt`` for sample ``sid`` (module doc)."""
    name = quote(sid, safe=":-_.@+=,")
    if name.startswith("."):
        name = "%2E" + name[1:]
    if len(name.encode()) > 200:
        name = "sha1-" + hashlib.sha1(sid.encode()).hexdigest()
    return f"{name}.pt"


class ModelOptLayout(PerSampleLayout):
    """``{id}.pt`` per sample in ``out_dir`` (module doc)."""

    name = "modelopt"
    indexed = False

    def file_name(self, index: int) -> str:  # files are named by id: see sample_file
        raise NotImplementedError

    def sample_file(self, index: int, sid: str) -> str:
        return sample_file_name(sid)

    def record(self, tensors: dict[str, Any], sid: str) -> dict[str, Any]:
        import torch

        aux, last = states(tensors, sid, self.hidden_size, self.opts.get("dtype"))
        # clone: torch.save would otherwise store the whole batch tensor a slice is a view of
        return {
            "input_ids": tensors[f"{sid}/input_ids"].to(torch.int64).clone(),
            "hidden_states": last.clone(),
            "aux_hidden_states": aux.clone(),
            "loss_mask": tensors[f"{sid}/loss_mask"].to(torch.int64).clone(),
            "conversation_id": sid,
        }

    def save(self, record: dict[str, Any], path: Path) -> None:
        import torch

        torch.save(record, path)

    def scan(self, path: Path) -> set[str]:
        try:
            with os.scandir(path) as it:
                return {e.name for e in it if _FILE_RE.match(e.name) and e.is_file()}
        except FileNotFoundError:
            return set()
