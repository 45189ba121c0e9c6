"""Shards and the manifest: crash-safe output shared by every worker (and host) of a job.

Layout of ``out_dir``:

- ``shard-NNNNN.safetensors``: several samples, keys ``{id}/input_ids`` ``[T]`` int64,
  ``{id}/loss_mask`` ``[T]`` int8, ``{id}/aux_hidden_states`` ``[T, n_aux*H]`` and
  ``{id}/last_hidden_state`` ``[T, H]`` in the model dtype; with ``save_dtype = "fp8"``,
  ``{id}/hidden_states`` ``[T, n_aux + 1, H]`` ``float8_e4m3fn`` and ``{id}/hidden_states_scales``
  ``[T, 1, 1]`` float32 instead of the last two (:func:`read_sample` dequantizes).
- ``manifest.jsonl``: one line per saved sample, ``{"id", "shard", "length", "dataset"}`` (plus
  ``"truncated_from"`` when ``max_seq_len`` truncated it).
- ``.lock``: ``flock`` serialising commits and recovery (works across processes; across hosts on
  file systems with working ``flock``, e.g. NFSv4, Lustre, GPFS).

Commit protocol: a shard is written to ``.tmp-shard@HOST@PID@SEQ`` and fsynced; then, holding the
lock, it is renamed to the next free ``shard-NNNNN.safetensors``, the directory is fsynced, and its
manifest lines are appended in ONE write and fsynced. A ``kill -9`` can therefore leave only (a) a
temp file, (b) a renamed shard with no manifest line, or (c) a torn last manifest line.
:meth:`OutDir.recover` (run by every worker at start, under the lock, when no commit can be half
done) removes (a) when its process is gone, removes (b) and truncates (c): no partial shard is ever
listed and every listed sample is readable.

The other output layouts (:mod:`engine.extract.layouts`: one file per sample for speculators or
SpecForge) use the same directory, lock, manifest and recovery: their manifest lines name the file
(``"file"``, relative to ``out_dir``) instead of a ``"shard"``, and the layout lists which files on
disk look committed (:meth:`OutDir.committed`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from engine.proc.pids import pid_alive

log = logging.getLogger(__name__)

MANIFEST = "manifest.jsonl"
LOCK = ".lock"
TMP_PREFIX = ".tmp-shard@"
SHARD_RE = re.compile(r"^shard-(\d+)\.safetensors$")
#: Temp files of another host are removed at recovery once older than this (seconds).
FOREIGN_TMP_MAX_AGE_S = 3600.0


#: A sample's tensors as :func:`read_sample` returns them.
SAMPLE_KEYS = ("input_ids", "loss_mask", "aux_hidden_states", "last_hidden_state")


def read_sample(handle: Any, sid: str, dtype: Any = None) -> dict[str, Any]:
    """The four :data:`SAMPLE_KEYS` tensors of sample ``sid`` from an open shard (``safe_open``,
    framework ``pt``): fp8 states (``{id}/hidden_states_scales`` present) are dequantized
    (``q * scale``, speculators' convention) into ``dtype`` (default float32, exact); model-dtype
    states are returned as stored.

    Raises:
        KeyError / safetensors errors: the sample is not in the shard.
    """
    import torch

    out = {k: handle.get_tensor(f"{sid}/{k}") for k in SAMPLE_KEYS[:2]}
    try:
        scales = handle.get_tensor(f"{sid}/hidden_states_scales")
    except Exception:  # safetensors' missing-key error: a model-dtype sample
        scales = None
    if scales is not None:
        dtype = dtype or torch.float32
        hs = handle.get_tensor(f"{sid}/hidden_states").to(dtype) * scales.to(dtype)
        out["aux_hidden_states"] = hs[:, :-1].reshape(hs.shape[0], -1)
        out["last_hidden_state"] = hs[:, -1]
    else:
        for k in SAMPLE_KEYS[2:]:
            out[k] = handle.get_tensor(f"{sid}/{k}")
    return out


def shard_name(n: int) -> str:
    """``shard-00042.safetensors`` (at least 5 digits)."""
    return f"shard-{n:05d}.safetensors"


def fsync_path(path: Path, directory: bool = False) -> None:
    """fsync a file (or, ``directory=True``, a directory entry list)."""
    _fsync_path(path, directory)


def _fsync_path(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class OutDir:
    """The output directory of a job (created if missing).

    Args:
        layout: the output layout (:class:`engine.extract.layouts.Layout`); None = shards.
    """

    def __init__(self, path: str | Path, layout: Any = None) -> None:
        self.path = Path(path)
        self.layout = layout
        self.path.mkdir(parents=True, exist_ok=True)
        self.manifest = self.path / MANIFEST
        self.host = socket.gethostname().replace("@", "_")
        self._seq = 0
        self._next = -1

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the job's exclusive lock (blocking)."""
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def read_manifest(self) -> list[dict[str, Any]]:
        """Manifest entries in commit order; a torn (unterminated) last line is ignored."""
        try:
            data = self.manifest.read_bytes()
        except FileNotFoundError:
            return []
        out = []
        lines = data.split(b"\n")
        for n, line in enumerate(lines[:-1], 1):  # the part after the last "\n" is torn or empty
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                log.warning("%s: line %d is not JSON; ignored", self.manifest, n)
        return out

    def shards(self) -> dict[int, str]:
        """Committed-looking shard files on disk, by number."""
        out = {}
        for e in os.scandir(self.path):
            m = SHARD_RE.match(e.name)
            if m:
                out[int(m.group(1))] = e.name
        return out

    def committed(self) -> set[str]:
        """Committed-looking output files on disk (names relative to the directory): the shards,
        or the layout's per-sample files."""
        if self.layout is not None and self.layout.per_sample:
            return self.layout.scan(self.path)
        return set(self.shards().values())

    def done_ids(self) -> set[str]:
        """Ids of samples in the manifest whose file exists (a missing file is logged, its samples redone)."""
        present = self.committed()
        done, missing = set(), set()
        for e in self.read_manifest():
            f = e.get("file", e.get("shard"))
            if f in present or (self.layout is None and "file" in e and (self.path / e["file"]).is_file()):
                done.add(e["id"])
            else:
                missing.add(f)
        if missing:
            log.warning("%s: %d listed shard(s) missing (%s...): their samples are extracted again",
                        self.path, len(missing), sorted(map(str, missing))[0])
        return done

    def recover(self) -> dict[str, int]:
        """Undo what a killed worker may have left (see module doc). Safe while other workers run.

        Returns:
            ``{"torn_lines": n, "orphan_shards": n, "temp_files": n}`` removed.
        """
        rep = {"torn_lines": 0, "orphan_shards": 0, "temp_files": 0}
        with self.locked():
            try:
                data = self.manifest.read_bytes()
            except FileNotFoundError:
                data = b""
            if data and not data.endswith(b"\n"):
                keep = data.rfind(b"\n") + 1
                with open(self.manifest, "r+b") as f:
                    f.truncate(keep)
                    os.fsync(f.fileno())
                rep["torn_lines"] = 1
                log.warning("%s: removed a torn last line (%d bytes)", self.manifest, len(data) - keep)
            listed = {e.get("file", e.get("shard")) for e in self.read_manifest()}
            for name in self.committed():
                if name not in listed:
                    (self.path / name).unlink(missing_ok=True)
                    rep["orphan_shards"] += 1
                    log.warning("%s: removed shard %s that a killed worker renamed but never listed", self.path, name)
            now = time.time()
            for e in os.scandir(self.path):
                if not e.name.startswith(TMP_PREFIX):
                    continue
                parts = e.name.split("@")
                try:
                    host, pid = parts[1], int(parts[2])
                except (IndexError, ValueError):
                    host, pid = "", -1
                if host == self.host:
                    stale = pid != os.getpid() and not pid_alive(pid)
                else:
                    stale = now - e.stat().st_mtime > FOREIGN_TMP_MAX_AGE_S
                if stale:
                    Path(e.path).unlink(missing_ok=True)
                    rep["temp_files"] += 1
            if rep["temp_files"]:
                log.warning("%s: removed %d temp file(s) of dead workers", self.path, rep["temp_files"])
        return rep

    def tmp_path(self) -> Path:
        """A fresh temp name for a shard being written by this process."""
        self._seq += 1
        return self.path / f"{TMP_PREFIX}{self.host}@{os.getpid()}@{self._seq}.safetensors"

    def commit(self, tmp: Path, entries: list[dict[str, Any]]) -> str:
        """Publish a fully written (not yet fsynced) temp shard: fsync, rename to the next free
        ``shard-NNNNN.safetensors``, then append ``entries`` (each gets ``"shard"``) to the manifest.

        Returns:
            the shard's file name.
        """
        _fsync_path(tmp)
        with self.locked():
            n = self._next
            if n < 0:
                n = max(self.shards(), default=-1) + 1
            while (self.path / shard_name(n)).exists():
                n += 1
            name = shard_name(n)
            os.rename(tmp, self.path / name)
            _fsync_path(self.path, directory=True)
            payload = "".join(json.dumps({**e, "shard": name}, ensure_ascii=False) + "\n" for e in entries).encode()
            try:
                self.append_locked(payload)
            except OSError:
                (self.path / name).unlink(missing_ok=True)
                raise
            self._next = n + 1
        return name

    def append_locked(self, payload: bytes) -> None:
        """Append manifest lines in ONE write and fsync (caller holds :meth:`locked`).

        Raises:
            OSError: the write failed (ENOSPC...); no partial line is left behind.
        """
        fd = os.open(self.manifest, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                view = memoryview(payload)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError:
                os.ftruncate(fd, size)  # ENOSPC mid-append: leave no partial line behind
                raise
        finally:
            os.close(fd)
