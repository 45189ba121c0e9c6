"""The layout interface, and the commit of one-file-per-sample layouts.

A batch reaches :meth:`Layout.write` as the worker builds it: ``tensors`` with per-sample keys
``{id}/input_ids`` ``[T]`` int64, ``{id}/loss_mask`` ``[T]`` int8 and the states, either
``{id}/aux_hidden_states`` ``[T, n_aux*H]`` and ``{id}/last_hidden_state`` ``[T, H]`` (model dtype),
or, with ``save_dtype = "fp8"``, ``{id}/hidden_states`` ``[T, n_aux + 1, H]`` ``float8_e4m3fn`` (the
aux layers in order, then the final state) and ``{id}/hidden_states_scales`` ``[T, 1, 1]`` float32;
and one manifest entry per sample (``id``, ``length``, ``dataset``...). :func:`states` and
:func:`fp8_states` give a layout either form.

fp8 (speculators' convention, vllm-project/speculators PR 1028, ``hs_connectors/fp8_utils.py``
``quantize_tensor_to_fp8`` / ``dequantize_fp8_tensor``, in hs-connectors 0.9.0): per token, over all
its layers together, ``scale = max(amax / 448, 1e-12)`` (float32) and ``q = (x.float() / scale)``
cast to ``float8_e4m3fn``; ``x ~ q.float() * scale``. :func:`quantize_fp8` is that computation, bit
for bit (tests/engine/extract/test_fp8_states.py checks it against hs-connectors' own function where installed).

Per-sample layouts number their files ``0, 1, 2...`` in commit order: each file is written to a
temp name in ``out_dir`` and fsynced; then, holding the job lock, the batch's files are renamed to
the next free indices, their directories fsynced, and ONE manifest append lists them
(``"file"``: the path relative to ``out_dir``, ``"index"``). A ``kill -9`` leaves at most temp
files and renamed-but-unlisted files, which :meth:`engine.extract.shards.OutDir.recover` removes
(:meth:`Layout.scan` tells it which files look committed), so listed indices stay ``0..N-1``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np

from engine.extract.job import ExtractError
from engine.extract.shards import fsync_path

#: ``lookup(id) -> (input_ids [T], loss_mask [T])`` of a sample (numpy, any integer dtype).
Lookup = Callable[[str], tuple[np.ndarray, np.ndarray]]

#: speculators' name of the per-token scales beside fp8 ``hidden_states`` (hs_connectors ``SCALES_KEY``).
SCALES_KEY = "hidden_states_scales"
#: ``torch.finfo(torch.float8_e4m3fn).max``.
FP8_MAX = 448.0


def quantize_fp8(x: Any) -> tuple[Any, Any]:
    """``x`` ``[T, ...]`` -> ``(q, scale)``: ``q`` ``float8_e4m3fn`` of ``x``'s shape and ``scale``
    float32 ``[T, 1, ...]`` (one per token, over every other dimension), exactly as speculators'
    ``quantize_tensor_to_fp8`` computes them (module doc)."""
    import torch

    fp32 = x.float()
    amax = fp32.abs().amax(dim=tuple(range(1, fp32.dim())), keepdim=True)
    scale = (amax / torch.finfo(torch.float8_e4m3fn).max).clamp(min=1e-12)
    return (fp32 / scale).to(torch.float8_e4m3fn), scale


def dequantize_fp8(q: Any, scale: Any, dtype: Any = None) -> Any:
    """``q.to(dtype) * scale.to(dtype)`` (speculators' ``dequantize_fp8_tensor``; default float32)."""
    import torch

    dtype = dtype or torch.float32
    return q.to(dtype) * scale.to(dtype)


def quantize_rows(aux: Any, last: Any, chunk: int = 4096) -> tuple[Any, Any]:
    """A batch's states ``aux`` ``[B, T, n*H]`` and ``last`` ``[B, T, H]`` (any device) ->
    ``(q [B, T, n + 1, H] float8_e4m3fn, scale [B, T, 1, 1] float32)`` on the same device,
    :func:`quantize_fp8` of each token's ``[n + 1, H]`` states, ``chunk`` tokens at a time (bounded
    temporary memory on the GPU)."""
    import torch

    b, t, h = last.shape
    layers = aux.shape[-1] // h + 1
    a2, l2 = aux.reshape(b * t, -1), last.reshape(b * t, h)
    q = torch.empty(b * t, layers * h, dtype=torch.float8_e4m3fn, device=last.device)
    sc = torch.empty(b * t, 1, dtype=torch.float32, device=last.device)
    for s in range(0, b * t, chunk):
        q[s:s + chunk], sc[s:s + chunk] = quantize_fp8(torch.cat([a2[s:s + chunk], l2[s:s + chunk]], dim=-1))
    return q.reshape(b, t, layers, h), sc.reshape(b, t, 1, 1)


def states(tensors: dict[str, Any], sid: str, hidden: int, dtype: Any = None) -> tuple[Any, Any]:
    """``(aux [T, n*H], last [T, H])`` of sample ``sid`` in ``tensors``: as given, or dequantized
    from fp8 (:func:`dequantize_fp8`, into ``dtype``, default float32)."""
    if f"{sid}/{SCALES_KEY}" in tensors:
        hs = dequantize_fp8(tensors[f"{sid}/hidden_states"], tensors[f"{sid}/{SCALES_KEY}"], dtype)
        t = hs.shape[0]
        return hs[:, :-1].reshape(t, -1), hs[:, -1]
    aux, last = tensors[f"{sid}/aux_hidden_states"], tensors[f"{sid}/last_hidden_state"]
    return (aux, last) if dtype is None else (aux.to(dtype), last.to(dtype))


def fp8_states(tensors: dict[str, Any], sid: str, hidden: int) -> tuple[Any, Any]:
    """``(q [T, n + 1, H] float8_e4m3fn, scale [T, 1, 1] float32)`` of sample ``sid``: as given, or
    :func:`quantize_fp8` of its model-dtype states (a conversion)."""
    import torch

    if f"{sid}/{SCALES_KEY}" in tensors:
        return tensors[f"{sid}/hidden_states"], tensors[f"{sid}/{SCALES_KEY}"]
    aux, last = tensors[f"{sid}/aux_hidden_states"], tensors[f"{sid}/last_hidden_state"]
    t = aux.shape[0]
    return quantize_fp8(torch.cat([aux.reshape(t, -1, hidden), last.reshape(t, 1, hidden)], dim=1))


class Layout:
    """An output layout. Subclasses set ``name``, ``per_sample`` and the byte figures.

    Args:
        hidden_size: H of the target; n_aux: number of aux layers.
        save_dtype: ``model`` or ``fp8`` (module doc; only layouts with ``fp8_ok``).
        opts: the other ``[extract]`` options a layout may use (``vocab_size``, ``draft_vocab_size``,
            ``compress``, ``compression_level``, ``num_layers``; :meth:`ExtractJob.layout_options`).

    Its bytes on disk are projected by :func:`engine.extract.plan.project` (``layout=name``).
    """

    name = "base"
    per_sample = False
    #: whether the layout's trainer reads ``save_dtype = "fp8"`` files
    fp8_ok = False

    def __init__(self, hidden_size: int, n_aux: int, save_dtype: str = "model", **opts: Any) -> None:
        if save_dtype not in ("model", "fp8"):
            raise ExtractError(f"save_dtype {save_dtype!r}: expected 'model' or 'fp8'")
        if save_dtype == "fp8" and not self.fp8_ok:
            raise ExtractError(f'layout {self.name!r} stores the model dtype: save_dtype = "fp8" is for the shards '
                               "and speculators layouts")
        self.hidden_size = hidden_size
        self.n_aux = n_aux
        self.save_dtype = save_dtype
        self.opts = opts

    #: the layout stores the last layer's output BEFORE the final norm (the vLLM engine reads this;
    #: the transformers engine gets it through :meth:`wrap`)
    prenorm_last = False

    def wrap(self, hidden_states: Any) -> Any:
        """The forward-pass object the worker should use (default: ``hidden_states`` itself,
        whose ``last`` is the final hidden state after the final norm)."""
        return hidden_states

    def write(self, out: Any, tensors: dict[str, Any], entries: list[dict[str, Any]]) -> int:
        """Write and commit one batch; returns bytes written.

        Raises:
            OSError: writing failed (nothing of the batch is listed; ENOSPC is retried by the caller).
        """
        raise NotImplementedError

    def scan(self, path: Path) -> set[str]:
        """Committed-looking per-sample files under ``path`` (relative names)."""
        return set()

    def finish(self, out: Any, ids: list[str], lookup: Lookup | None) -> bool:
        """Write job-level files once all ``ids`` are saved. Returns True when the output is complete.

        Args:
            lookup: the samples' tokens (faster); None reads them back from the output."""
        return set(ids) <= out.done_ids()


class PerSampleLayout(Layout):
    """A layout with one file per sample (see module doc for the commit protocol)."""

    per_sample = True
    #: subclasses: regex of a committed file name in its directory, and its directory pattern
    file_re = re.compile(r"$^")
    #: files are named by index (``0..N-1``); False: by sample id (:meth:`sample_file`)
    indexed = True

    def __init__(self, hidden_size: int, n_aux: int, save_dtype: str = "model", **opts: Any) -> None:
        super().__init__(hidden_size, n_aux, save_dtype, **opts)
        self._next = -1
        self._man_off = 0

    def file_name(self, index: int) -> str:
        """Path (relative to ``out_dir``) of sample ``index``."""
        raise NotImplementedError

    def sample_file(self, index: int, sid: str) -> str:
        """Path (relative to ``out_dir``) of sample ``sid`` committed as ``index`` (default :meth:`file_name`)."""
        return self.file_name(index)

    def record(self, tensors: dict[str, Any], sid: str) -> dict[str, Any]:
        """The tensors of one sample's file, as the trainer reads them."""
        raise NotImplementedError

    def save(self, record: dict[str, Any], path: Path) -> None:
        """Write ``record`` to ``path`` (not yet fsynced)."""
        raise NotImplementedError

    def entry_extra(self, tensors: dict[str, Any], sid: str) -> dict[str, Any]:
        """Extra manifest fields of one sample (default none)."""
        return {}

    def _next_index(self, out: Any) -> int:
        """Next free index (caller holds the lock): one past the largest listed index, reading only
        the manifest bytes appended since this process last looked (other workers' commits)."""
        try:
            with open(out.manifest, "rb") as f:
                f.seek(self._man_off)
                data = f.read()
        except FileNotFoundError:
            data = b""
        end = data.rfind(b"\n") + 1
        nxt = max(self._next, 0)
        for line in data[:end].split(b"\n"):
            if line.strip():
                try:
                    nxt = max(nxt, int(json.loads(line).get("index", -1)) + 1)
                except (ValueError, TypeError, AttributeError):
                    pass
        self._man_off += end
        while self.indexed and (out.path / self.file_name(nxt)).exists():  # never overwrite (recovery has not seen it)
            nxt += 1
        return nxt

    def write(self, out: Any, tensors: dict[str, Any], entries: list[dict[str, Any]]) -> int:
        tmps: list[Path] = []
        moved: list[Path] = []
        try:
            for e in entries:
                tmp = out.tmp_path().with_suffix(".tmp")
                tmps.append(tmp)
                self.save(self.record(tensors, e["id"]), tmp)
                fsync_path(tmp)
            with out.locked():
                base = self._next_index(out)
                lines = []
                dirs = set()
                for k, (tmp, e) in enumerate(zip(tmps, entries, strict=True)):
                    name = self.sample_file(base + k, e["id"])
                    dest = out.path / name
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    os.rename(tmp, dest)
                    moved.append(dest)
                    dirs.add(dest.parent)
                    line = {**e, **self.entry_extra(tensors, e["id"]), "file": name, "index": base + k}
                    lines.append(json.dumps(line, ensure_ascii=False) + "\n")
                for d in dirs:
                    fsync_path(d, directory=True)
                size = sum(p.stat().st_size for p in moved)
                out.append_locked("".join(lines).encode())
                self._next = base + len(entries)
                tmps, moved = [], []  # listed: never removed from here on
        except BaseException:
            for p in tmps + moved:
                p.unlink(missing_ok=True)
            raise
        return size

    def listed(self, out: Any) -> list[dict[str, Any]]:
        """Manifest entries whose file exists, the last one per id, ordered by index.

        Raises:
            ExtractError: the indices are not ``0..N-1`` (a listed file was deleted by hand).
        """
        present = self.scan(out.path)
        by_id: dict[str, dict[str, Any]] = {}
        for e in out.read_manifest():
            if e.get("file") in present:
                by_id[e["id"]] = e
        entries = sorted(by_id.values(), key=lambda e: e["index"])
        gaps = [k for k, e in enumerate(entries) if e["index"] != k]
        if gaps:
            k = gaps[0]
            raise ExtractError(
                f"{out.path}: sample file index {k} is missing ({self.file_name(k)}): the {self.name} layout needs "
                "indices 0..N-1; restore the file or extract into a new directory")
        return entries
