"""The ``speculators`` layout: what vllm-project/speculators 0.9.0's offline EAGLE-3 training reads.

Sources (the speculators 0.9.0 wheel and its dependency hs-connectors 0.9.0):

- ``speculators/train/data.py`` (``ArrowDataset``): ``datasets.load_from_disk(datapath)`` -- the
  preprocessed dataset with columns ``input_ids`` ``[T]`` int64, ``loss_mask`` ``[T]`` int64 and
  ``seq_len`` int64, torch format (``speculators/data_generation/preprocessing.py``:
  ``_append_row``, ``set_format(type="torch")``; ``cli/prepare_data.py``: ``save_to_disk``) -- and
  ``hs_connectors.FileTransfer(datapath / "hidden_states").get_cached(i)``:
  ``load_file(hidden_states/hs_{i}.safetensors)`` for dataset row ``i``;
- each ``hs_{i}.safetensors`` holds ``token_ids`` ``[T]`` int64 (must equal row ``i``'s
  ``input_ids``) and ``hidden_states`` ``[T, n_aux + 1, H]`` in the model dtype
  (``hs_connectors/fp8_hidden_states_connector.py`` documents vLLM's file): the aux layers in
  order, then the final state; ``ArrowDataset`` takes ``[:, :-1].flatten(1)`` as ``hidden_states``
  and ``[:, -1]`` as ``verifier_last_hidden_states``;
- the final state is the last decoder layer's output BEFORE the final norm (vLLM's layer id ``L``):
  ``speculators/models/eagle3/core.py`` computes the targets as
  ``verifier_lm_head(verifier_norm(verifier_last_hidden_states))``;
- layer ids: speculators' ``target_layer_ids`` count hidden states (id ``k`` = output of 0-based
  layer ``k - 1``), default ``[2, L // 2, L - 3]`` (``models/utils.py``), i.e. this project's
  ``aux_layers`` + 1 (default ``[1, L//2 - 1, L - 4]``): train with ``--target-layer-ids`` set
  to ``aux_layers + 1`` (``aux_layers`` is in ``job.json`` beside the data);
- ``token_freq.pt`` beside the dataset: ``torch.save({token_id: count})`` over the loss-masked
  tokens (``train/vocab_mapping.py``: ``save_token_frequency_distribution``), for the draft vocabulary.
- ``save_dtype = "fp8"``: ``hidden_states`` ``[T, n_aux + 1, H]`` ``float8_e4m3fn`` plus
  ``hidden_states_scales`` ``[T, 1, 1]`` float32 (one scale per token), what hs-connectors 0.9.0's
  fp8 backend writes (``fp8_hidden_states_connector.py`` ``FP8HiddenStatesConnector._write_tensors``,
  vllm-project/speculators PR 1028) and its ``FP8Transfer`` dequantizes on read: train with
  ``--hidden-states-backend fp8`` (or pass ``transfer=FP8Transfer(out_dir / "hidden_states")``).

Row ``i`` of the dataset is the sample of ``hs_{i}``; rows are written once every sample is saved
(:meth:`SpeculatorsLayout.finish`), so the dataset never lists a sample without its file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from engine.extract.job import ExtractError
from engine.extract.layouts.base import SCALES_KEY, Lookup, PerSampleLayout, fp8_states

HS_DIR = "hidden_states"
_FILE_RE = re.compile(r"^hs_(\d+)\.safetensors$")
#: Written last by :meth:`SpeculatorsLayout.finish`: how many rows the dataset holds.
DONE_FILE = "speculators_dataset.json"


def final_norm(model: Any) -> Any:
    """The decoder's final norm module (``model.model.norm`` for Llama/DeepSeek-style models).

    Raises:
        ExtractError: the model has none where expected.
    """
    dec = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    norm = getattr(dec, "norm", None) if dec is not None else None
    if norm is None:
        raise ExtractError(f"layout 'speculators' saves the final state BEFORE the final norm, but "
                           f"{type(model).__name__} has no decoder `.norm` module to hook")
    return norm


class PreNormLast:
    """Wraps :class:`engine.extract.model.HiddenStates`: ``forward`` returns ``(aux, last)`` with
    ``last`` ``[B, T, H]`` = the input of the final norm (the last decoder layer's output), captured
    by a forward pre-hook, instead of the normed state."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.model = inner.model
        self.device = inner.device
        self.norm = final_norm(self.model)
        self._seen: list[Any] = []

    def _hook(self, _module: Any, args: tuple[Any, ...]) -> None:
        self._seen.append(args[0])

    def collate(self, samples: list[Any]) -> Any:
        """As :meth:`engine.extract.model.HiddenStates.collate`."""
        return self.inner.collate(samples)

    def forward(self, input_ids: Any, attention_mask: Any) -> tuple[Any, Any]:
        """``(aux [B, T, n_aux*H], pre-norm last [B, T, H])``; raises ExtractError when the final
        norm did not run exactly once or its input's shape differs from the final state's."""
        self._seen.clear()
        handle = self.norm.register_forward_pre_hook(self._hook)  # only for this call: the model may be shared
        try:
            aux, last = self.inner.forward(input_ids, attention_mask)
        finally:
            handle.remove()
        if len(self._seen) != 1:
            raise ExtractError(f"the final norm ran {len(self._seen)} times in one forward pass (expected 1)")
        pre = self._seen.pop()
        if pre.shape != last.shape:
            raise ExtractError(f"final norm input {tuple(pre.shape)} != final state {tuple(last.shape)}")
        return aux, pre.to(last.device)


class SpeculatorsLayout(PerSampleLayout):
    """``hidden_states/hs_{i}.safetensors`` per sample + the preprocessed dataset (module doc)."""

    name = "speculators"
    prenorm_last = True
    fp8_ok = True

    def __init__(self, hidden_size: int, n_aux: int, save_dtype: str = "model", **opts: Any) -> None:
        import importlib.util

        if importlib.util.find_spec("datasets") is None:
            raise ExtractError("[extract] layout = 'speculators' writes the dataset speculators loads with the "
                               "`datasets` library, which is not installed (pip install datasets)")
        super().__init__(hidden_size, n_aux, save_dtype, **opts)

    def wrap(self, hidden_states: Any) -> Any:
        return PreNormLast(hidden_states)

    def file_name(self, index: int) -> str:
        return f"{HS_DIR}/hs_{index}.safetensors"

    def record(self, tensors: dict[str, Any], sid: str) -> dict[str, Any]:
        import torch

        if self.save_dtype == "fp8":
            q, sc = fp8_states(tensors, sid, self.hidden_size)
            return {"hidden_states": q.contiguous(), SCALES_KEY: sc.contiguous(),
                    "token_ids": tensors[f"{sid}/input_ids"].to(torch.int64)}
        aux = tensors[f"{sid}/aux_hidden_states"]
        last = tensors[f"{sid}/last_hidden_state"]
        t = aux.shape[0]
        hs = torch.cat([aux.reshape(t, self.n_aux, self.hidden_size), last.reshape(t, 1, self.hidden_size)], dim=1)
        return {"hidden_states": hs.contiguous(), "token_ids": tensors[f"{sid}/input_ids"].to(torch.int64)}

    def save(self, record: dict[str, Any], path: Path) -> None:
        from safetensors.torch import save_file

        save_file(record, path)

    def entry_extra(self, tensors: dict[str, Any], sid: str) -> dict[str, Any]:
        """``"mask"``: the loss mask as ``[start, end)`` runs of 1s, so the dataset can be written
        from the output alone (conversion with ``--delete-source``)."""
        return {"mask": mask_runs(tensors[f"{sid}/loss_mask"].numpy())}

    def scan(self, path: Path) -> set[str]:
        try:
            with os.scandir(path / HS_DIR) as it:
                return {f"{HS_DIR}/{e.name}" for e in it if _FILE_RE.match(e.name)}
        except FileNotFoundError:
            return set()

    def finish(self, out: Any, ids: list[str], lookup: Lookup | None) -> bool:
        """Once every id in ``ids`` has its ``hs_{i}``: write the dataset (row ``i`` = the sample of
        ``hs_{i}``: ``input_ids``, ``loss_mask``, ``seq_len``) and ``token_freq.pt`` into ``out_dir``
        (idempotent; under the job lock). Returns False while samples are missing.

        Raises:
            ExtractError: indices with a gap (see :meth:`PerSampleLayout.listed`).
        """
        with out.locked():
            entries = self.listed(out)
            if not set(ids) <= {e["id"] for e in entries}:
                return False
            done = out.path / DONE_FILE
            try:
                if json.loads(done.read_text()).get("rows") == len(entries):
                    return True
            except (OSError, ValueError, AttributeError):
                pass
            by = {e["id"]: e for e in entries}
            get = lookup or (lambda sid: _from_files(out.path, by[sid]))
            write_dataset(out.path, [get(e["id"]) for e in entries])
            tmp = done.with_name(done.name + ".tmp")
            tmp.write_text(json.dumps({"rows": len(entries), "layout": "speculators"}))
            os.replace(tmp, done)
        return True


def mask_runs(mask: Any) -> list[list[int]]:
    """``[T]`` 0/1 mask -> ``[[start, end), ...]`` runs of 1s."""
    import numpy as np

    m = np.concatenate([[0], np.asarray(mask, dtype=np.int8) != 0, [0]]).astype(np.int8)
    d = np.diff(m)
    return [[int(a), int(b)] for a, b in zip(np.flatnonzero(d == 1), np.flatnonzero(d == -1), strict=True)]


def _from_files(path: Path, entry: dict[str, Any]) -> tuple[Any, Any]:
    """``(input_ids, loss_mask)`` of a listed sample: ``token_ids`` of its ``hs_i`` + the manifest's mask runs."""
    import numpy as np
    from safetensors import safe_open

    with safe_open(path / entry["file"], framework="np") as st:
        ids = st.get_tensor("token_ids")
    mask = np.zeros(len(ids), dtype=np.int64)
    for a, b in entry["mask"]:
        mask[a:b] = 1
    return ids, mask


def write_dataset(path: Path, rows: list[tuple[Any, Any]], chunk: int = 8192) -> None:
    """``save_to_disk`` the preprocessed dataset of ``rows`` (``(input_ids, loss_mask)``) into
    ``path`` (files moved in, ``state.json`` last) and write ``token_freq.pt`` beside it.

    Built column-wise with pyarrow (``chunk`` rows per Arrow chunk), never as Python lists: 240 M
    tokens take about 4 GB here, not tens of GB.
    """
    import numpy as np
    import pyarrow as pa
    import torch
    from datasets import Dataset, DatasetInfo, Features, Sequence, Value
    from datasets.table import InMemoryTable

    feats = Features({"input_ids": Sequence(Value("int64")), "loss_mask": Sequence(Value("int64")),
                      "seq_len": Value("int64")})
    ids_chunks: list[Any] = []
    mask_chunks: list[Any] = []
    freq: Counter[int] = Counter()
    for s in range(0, len(rows), chunk):
        part = rows[s:s + chunk]
        lens = np.array([len(r[0]) for r in part], dtype=np.int64)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32), pa.int32())
        flat_ids = np.concatenate([np.asarray(r[0], dtype=np.int64) for r in part]) if part else np.zeros(0, np.int64)
        flat_mask = np.concatenate([np.asarray(r[1], dtype=np.int64) for r in part]) if part else np.zeros(0, np.int64)
        ids_chunks.append(pa.ListArray.from_arrays(offsets, pa.array(flat_ids, pa.int64())))
        mask_chunks.append(pa.ListArray.from_arrays(offsets, pa.array(flat_mask, pa.int64())))
        u, c = np.unique(flat_ids[flat_mask != 0], return_counts=True)
        freq.update(dict(zip(u.tolist(), c.tolist(), strict=True)))
    seq_len = pa.array(np.array([len(r[0]) for r in rows], dtype=np.int64), pa.int64())
    table = pa.table({"input_ids": pa.chunked_array(ids_chunks, pa.list_(pa.int64())),
                      "loss_mask": pa.chunked_array(mask_chunks, pa.list_(pa.int64())), "seq_len": seq_len})
    ds = Dataset(InMemoryTable(table), info=DatasetInfo(features=feats))
    ds.set_format(type="torch")
    tmp = path / f".tmp-dataset-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    ds.save_to_disk(str(tmp))
    names = sorted(os.listdir(tmp), key=lambda n: n == "state.json")  # state.json last
    for n in names:
        os.replace(tmp / n, path / n)
    keep = set(names)
    for old in path.glob("data-*-of-*.arrow"):
        if old.name not in keep:
            old.unlink()
    shutil.rmtree(tmp, ignore_errors=True)
    ftmp = path / f".token_freq.pt.{os.getpid()}.tmp"
    torch.save(dict(freq), ftmp)
    os.replace(ftmp, path / "token_freq.pt")
