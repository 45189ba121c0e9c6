"""The layout interface, and the commit of one-file-per-sample layouts.

A batch reaches :meth:`Layout.write` as the worker builds it: ``tensors`` with per-sample keys
``{id}/input_ids`` ``[T]`` int64, ``{id}/loss_mask`` ``[T]`` int8, ``{id}/aux_hidden_states``
``[T, n_aux*H]`` and ``{id}/last_hidden_state`` ``[T, H]`` (model dtype), and one manifest entry
per sample (``id``, ``length``, ``dataset``...).

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


class Layout:
    """An output layout. Subclasses set ``name``, ``per_sample`` and the byte figures.

    Args:
        hidden_size: H of the target; n_aux: number of aux layers.

    Its bytes on disk are projected by :func:`engine.extract.plan.project` (``layout=name``).
    """

    name = "base"
    per_sample = False

    def __init__(self, hidden_size: int, n_aux: int) -> None:
        self.hidden_size = hidden_size
        self.n_aux = n_aux

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

    def __init__(self, hidden_size: int, n_aux: int) -> None:
        super().__init__(hidden_size, n_aux)
        self._next = -1
        self._man_off = 0

    def file_name(self, index: int) -> str:
        """Path (relative to ``out_dir``) of sample ``index``."""
        raise NotImplementedError

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
        while (out.path / self.file_name(nxt)).exists():  # never overwrite (a file recovery has not seen yet)
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
                for k, (tmp, e) in enumerate(zip(tmps, entries)):
                    name = self.file_name(base + k)
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
