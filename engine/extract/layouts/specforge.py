"""The ``specforge`` layout: SpecForge's offline EAGLE-3 feature files, as its own capture writes them.

Source: sgl-project/SpecForge at commit a6b6b0230009d15ec2a97a57384e6f53f0f96946 (the gzip option
since commit 7c7ef547, the vocabulary mapping since commit ca949555):

- ``scripts/prepare_hidden_states.py`` (``HiddenStatesGenerator``): one file per sample,
  ``<output>/rows_{g}-{g + 2000}/data_{i}.ckpt`` with ``g = i // 2000 * 2000`` (``_get_file_path``,
  ``file_group_size = 2000``), written with ``torch.save(record, path)``; with ``--compress``
  (``compress = true`` here) ``data_{i}.ckpt.gz``, ``torch.save`` into ``gzip.open(path, "wb",
  compresslevel=--compression-level)`` (default 6; ``_save_tensor_sync``);
- ``specforge/algorithms/common/providers.py`` (``OfflineCaptureLayout.materialize``) and the EAGLE-3
  layout in that script: ``record = {"input_ids": [T] int64, "loss_mask": [T] int64,
  "aux_hidden_state": [1, T, n_aux*H], "hidden_state": [1, T, H]}`` (model dtype), ``hidden_state``
  being the final hidden state AFTER the final norm (SGLang's logits-processor input; SpecForge's
  ``TargetHead.forward`` applies only the LM head to it);
- ``specforge/runtime/data_plane/offline_reader.py`` (``list_feature_files``: every ``*.ckpt`` and
  ``*.ckpt.gz`` under the directory, sorted) and ``feature_store.py`` (``load_feature_file``:
  ``torch.load(path, weights_only=False, mmap=True)``, a ``.gz`` through ``gzip.open``), then
  ``specforge/algorithms/eagle3/data.py`` (``normalize_offline_sample``: ``squeeze(0)``,
  ``[:max_len]``, ``loss_mask[0, -1] = 0``);
- ``vocab_mapping/vocab_mapping.pt`` beside the features (``scripts/prepare_hidden_states.py``
  ``_generate_shared_vocab_mapping``): ``torch.save({"d2t": [draft_vocab] int64, "t2d": [vocab]
  bool})`` from ``specforge/data/preprocessing.py`` ``process_token_dict_to_mappings`` (the
  ``draft_vocab_size`` most frequent loss-masked tokens, ascending; ``d2t[i] = used[i] - i``,
  ``t2d[t] = t in used``), loaded by ``modeling/draft/base.py`` ``load_vocab_mapping``. Its
  disaggregated runs require ``model.vocab_mapping_path`` (``application/planning.py``
  ``_validate_vocab_mapping``). The token counts are those its trainer's local-offline derivation
  takes from the feature files (``training/vocab_mapping.py`` ``count_effective_feature_tokens``:
  files in ``list_feature_files`` order, each file's unique loss-masked ids ascending), so the
  mapping equals the one a local offline run derives itself (``data.max_length`` at least the
  longest sample).

``loss_mask`` is 1 exactly on the completion tokens, position for position with ``input_ids`` (not
shifted): SpecForge's own preprocessing (``specforge/data/preprocessing.py``) builds it that way.
Unlike SpecForge's capture with ``--batch-size`` > 1, no padding is stored: ``T`` is the sample's length.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter
from pathlib import Path
from typing import IO, Any, cast

from engine.extract.layouts.base import Lookup, PerSampleLayout, states

log = logging.getLogger(__name__)

#: SpecForge's default ``--file-group-size`` (files per ``rows_*`` directory).
FILE_GROUP_SIZE = 2000
SPECFORGE_COMMIT = "a6b6b0230009d15ec2a97a57384e6f53f0f96946"
#: Where SpecForge's capture writes the vocabulary mapping (relative to the output).
VOCAB_MAPPING = "vocab_mapping/vocab_mapping.pt"
#: Written beside it: what the mapping was computed from (so it is recomputed when that changes).
VOCAB_MAPPING_INFO = "vocab_mapping/datagen.json"
_DIR_RE = re.compile(r"^rows_(\d+)-(\d+)$")
_FILE_RE = re.compile(r"^data_(\d+)\.ckpt(\.gz)?$")


def process_token_dict_to_mappings(token_dict: Counter, draft_vocab_size: int,
                                   target_vocab_size: int) -> tuple[Any, Any]:
    """The draft vocabulary's mappings, as SpecForge's ``process_token_dict_to_mappings``
    (``specforge/data/preprocessing.py``) selects them: the ``draft_vocab_size`` most frequent
    target ids (ties in first-counted order, :meth:`Counter.most_common`); when fewer ids were
    counted, the smallest ids not among them fill the rest. ``token_dict`` is left as it is.

    Returns:
        ``(d2t, t2d)``: ``d2t`` int64 ``[draft_vocab_size]``, draft id ``i`` -> target id
        ``i + d2t[i]`` (the chosen ids in ascending order); ``t2d`` bool ``[target_vocab_size]``,
        True at the chosen ids.
    """
    import torch

    chosen = [tok for tok, _n in token_dict.most_common(draft_vocab_size)]
    if len(chosen) < draft_vocab_size:
        have = set(chosen)
        fill = (t for t in range(draft_vocab_size) if t not in have)
        chosen.extend(next(fill) for _ in range(draft_vocab_size - len(chosen)))
    ids = torch.tensor(sorted(chosen), dtype=torch.int64)
    d2t = ids - torch.arange(ids.numel(), dtype=torch.int64)
    t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return d2t, t2d


def _read_tokens(path: Path) -> tuple[Any, Any]:
    import gzip
    import io

    import torch

    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            raw = torch.load(io.BytesIO(f.read()), weights_only=True)
    else:
        raw = torch.load(path, weights_only=True, mmap=True)
    return raw["input_ids"].numpy(), raw["loss_mask"].numpy()


class SpecForgeLayout(PerSampleLayout):
    """``rows_{g}-{g+2000}/data_{i}.ckpt[.gz]`` per sample + ``vocab_mapping/vocab_mapping.pt`` (module doc)."""

    name = "specforge"

    @property
    def suffix(self) -> str:
        return ".ckpt.gz" if self.opts.get("compress") else ".ckpt"

    def file_name(self, index: int) -> str:
        g = index // FILE_GROUP_SIZE * FILE_GROUP_SIZE
        return f"rows_{g}-{g + FILE_GROUP_SIZE}/data_{index}{self.suffix}"

    def record(self, tensors: dict[str, Any], sid: str) -> dict[str, Any]:
        import torch

        aux, last = states(tensors, sid, self.hidden_size, self.opts.get("dtype"))
        # clone: torch.save would otherwise store the whole batch tensor a slice is a view of
        return {
            "input_ids": tensors[f"{sid}/input_ids"].to(torch.int64).clone(),
            "loss_mask": tensors[f"{sid}/loss_mask"].to(torch.int64).clone(),
            "aux_hidden_state": aux.clone().unsqueeze(0),
            "hidden_state": last.clone().unsqueeze(0),
        }

    def save(self, record: dict[str, Any], path: Path) -> None:
        import torch

        if self.opts.get("compress"):
            import gzip

            with gzip.open(path, "wb", compresslevel=int(self.opts.get("compression_level") or 6)) as f:
                torch.save(record, cast(IO[bytes], f))  # a GzipFile is a binary file; typeshed's is no IO[bytes]
        else:
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

    def finish(self, out: Any, ids: list[str], lookup: Lookup | None) -> bool:
        """Once every id in ``ids`` is saved: write ``vocab_mapping/vocab_mapping.pt`` over every
        feature file present (module doc; idempotent, under the job lock; skipped with a warning
        when the target's vocabulary size is unknown). Returns False while samples are missing."""
        with out.locked():
            present = self.scan(out.path)
            by_id: dict[str, dict[str, Any]] = {}
            for e in out.read_manifest():
                if e.get("file") in present:
                    by_id[e["id"]] = e
            if not set(ids) <= by_id.keys():
                return False
            vocab, draft = self.opts.get("vocab_size"), self.opts.get("draft_vocab_size")
            if not vocab:
                log.warning("%s: no vocab_mapping written: the target's vocab_size is unknown (convert with --model DIR)",
                            out.path)
                return True
            draft = min(int(draft or 32_000), int(vocab))
            files = sorted(e["file"] for e in by_id.values())
            info = {"files": len(files), "draft_vocab_size": draft, "vocab_size": int(vocab)}
            try:
                if json.loads((out.path / VOCAB_MAPPING_INFO).read_text()) == info and (out.path / VOCAB_MAPPING).is_file():
                    return True
            except (OSError, ValueError):
                pass
            by_file = {e["file"]: e for e in by_id.values()}
            write_vocab_mapping(out.path, [_tokens_of(out.path, by_file[f], lookup) for f in files], draft, int(vocab))
            tmp = out.path / f"{VOCAB_MAPPING_INFO}.tmp"
            tmp.write_text(json.dumps(info))
            os.replace(tmp, out.path / VOCAB_MAPPING_INFO)
        return True


def _tokens_of(path: Path, entry: dict[str, Any], lookup: Lookup | None) -> tuple[Any, Any]:
    if lookup is not None:
        try:
            return lookup(entry["id"])
        except KeyError:  # a sample of an earlier input
            pass
    return _read_tokens(path / entry["file"])


def count_tokens(samples: list[tuple[Any, Any]], vocab: int) -> Counter:
    """SpecForge's ``count_effective_feature_tokens`` over ``(input_ids, loss_mask)`` in file order:
    each sample's loss-masked ids, unique ascending, added to one Counter (its insertion order is
    the order of first appearance, which breaks frequency ties in :func:`process_token_dict_to_mappings`).

    Raises:
        ValueError: an id outside ``0 .. vocab - 1`` (SpecForge refuses it too).
    """
    import numpy as np

    total = np.zeros(vocab, dtype=np.int64)
    seen = np.zeros(vocab, dtype=bool)
    order: list[Any] = []
    for ids, mask in samples:
        sel = np.asarray(ids, dtype=np.int64)[np.asarray(mask) != 0]
        if not sel.size:
            continue
        if sel.min() < 0 or sel.max() >= vocab:
            raise ValueError(f"token id {int(sel.min() if sel.min() < 0 else sel.max())} outside the target vocab {vocab}")
        u, c = np.unique(sel, return_counts=True)
        total[u] += c
        new = u[~seen[u]]
        seen[new] = True
        order.append(new)
    counts: Counter = Counter()
    for tok in (np.concatenate(order).tolist() if order else []):
        counts[tok] = int(total[tok])
    return counts


def write_vocab_mapping(path: Path, samples: list[tuple[Any, Any]], draft: int, vocab: int) -> Path:
    """Write ``path / VOCAB_MAPPING`` (temp file + rename) from the samples' tokens in file order."""
    import torch

    d2t, t2d = process_token_dict_to_mappings(count_tokens(samples, vocab), draft, vocab)
    dest = path / VOCAB_MAPPING
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    torch.save({"d2t": d2t, "t2d": t2d}, tmp)
    os.replace(tmp, dest)
    return dest
