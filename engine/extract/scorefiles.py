"""Per-sample fidelity scores on disk beside the extracted samples, committed with them.

Layout: ``OUT/fidelity/<host>@<pid>@<run>-<seq>.jsonl`` (``run``: random per :class:`ScoreFiles`, so a
restart in a process of the same id never overwrites a file), one file per committed batch, one JSON object per
sample (:func:`score_row`): ``{"id", "dataset", "provider", "temperature", "top_p", "tokens",
"outside", "surprisal", "entropy", "variance", "top1", "top1_expected", "top1_variance", "loglik",
"pit"}``.

Commit protocol (the shard writer): the batch's score file is written to a temp name, fsynced and
renamed BEFORE the batch's shard is committed, and each of the batch's manifest lines names it
(``"fidelity": "fidelity/<name>.jsonl"``). A sample's score therefore counts exactly when its
manifest line does: a worker killed before the commit leaves a score file no manifest line names
(ignored by :func:`read_scores`, removed by :func:`recover` once its writer is gone), and the
resumed extraction scores the sample again, into another file, listed once. A sample listed twice
(its first file lost and extracted again) counts with its last listed line, as the samples do.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from engine.extract.shards import FOREIGN_TMP_MAX_AGE_S, MANIFEST, OutDir, fsync_path
from engine.fidelity.score import RecordScore
from engine.proc.pids import pid_alive

SCORES_DIR = "fidelity"
#: The manifest key naming a sample's score file.
MANIFEST_KEY = "fidelity"
_FIELDS = ("tokens", "outside", "surprisal", "entropy", "variance", "top1", "top1_expected", "top1_variance", "loglik")


def score_row(sid: str, dataset: str, provider: str, temperature: float | None, top_p: float | None,
              s: RecordScore) -> dict[str, Any]:
    """One sample's line (module doc). temperature / top_p: what it was scored at (None: 1.0)."""
    return {"id": sid, "dataset": dataset, "provider": provider,
            "temperature": 1.0 if temperature is None else float(temperature),
            "top_p": 1.0 if top_p is None else float(top_p),
            **{f: getattr(s, f) for f in _FIELDS}, "pit": list(s.pit)}


def row_score(row: dict[str, Any]) -> RecordScore:
    """The :class:`RecordScore` of a line written by :func:`score_row`."""
    return RecordScore(int(row["tokens"]), int(row["outside"]), float(row["surprisal"]), float(row["entropy"]),
                       float(row["variance"]), int(row["top1"]), float(row["top1_expected"]),
                       float(row["top1_variance"]), float(row["loglik"]), tuple(int(x) for x in row["pit"]))


class ScoreFiles:
    """Writes one worker's score files (names unique per host, process and batch)."""

    def __init__(self, out_dir: str | Path) -> None:
        self.dir = Path(out_dir) / SCORES_DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        self.host = socket.gethostname().replace("@", "_")
        self._seq = 0
        self._run = uuid.uuid4().hex[:8]

    def write(self, rows: list[dict[str, Any]]) -> str:
        """Write ``rows`` durably (temp file, fsync, rename, directory fsync) as a new file.

        Returns:
            its name relative to the output directory (the manifest lines' :data:`MANIFEST_KEY`).

        Raises:
            OSError: writing failed (no file left behind).
        """
        self._seq += 1
        name = f"{self.host}@{os.getpid()}@{self._run}-{self._seq}.jsonl"
        tmp = self.dir / f".tmp-{name}"
        payload = "".join(json.dumps(r, ensure_ascii=False, allow_nan=True) + "\n" for r in rows).encode()
        try:
            with open(tmp, "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.dir / name)
            fsync_path(self.dir, directory=True)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return f"{SCORES_DIR}/{name}"

    def discard(self, name: str) -> None:
        """Remove a file :meth:`write` wrote whose batch was not committed."""
        (self.dir.parent / name).unlink(missing_ok=True)


def _listed_refs(out_dir: Path) -> dict[str, str]:
    """Sample id -> score file of its last manifest line whose sample file exists."""
    out = OutDir(out_dir)
    exists: dict[str, bool] = {}
    refs: dict[str, str] = {}
    for e in out.read_manifest():
        f = e.get("file", e.get("shard"))
        if not isinstance(f, str):
            continue
        if f not in exists:
            exists[f] = (out_dir / f).is_file()
        if not exists[f]:
            continue
        ref = e.get(MANIFEST_KEY)
        if isinstance(ref, str):
            refs[e["id"]] = ref
        else:
            refs.pop(e["id"], None)  # extracted again without scores: the earlier score is not its
    return refs


def read_rows(out_dir: str | Path) -> list[dict[str, Any]]:
    """The score lines (module doc) of every listed sample, once each, in manifest order of first listing.

    Raises:
        OSError: a listed score file cannot be read (other than missing: its samples are left out).
    """
    out_dir = Path(out_dir)
    if not (out_dir / MANIFEST).exists():
        return []
    refs = _listed_refs(out_dir)
    by_file: dict[str, set[str]] = {}
    for sid, ref in refs.items():
        by_file.setdefault(ref, set()).add(sid)
    found: dict[str, dict[str, Any]] = {}
    for ref, ids in by_file.items():
        try:
            lines = (out_dir / ref).read_bytes().split(b"\n")
        except FileNotFoundError:
            continue
        for line in lines:
            if not line.strip():
                continue
            row = json.loads(line)
            if row.get("id") in ids:
                found[row["id"]] = row
    return [found[s] for s in refs if s in found]


def read_scores(out_dir: str | Path) -> list[tuple[str, str, str, RecordScore]]:
    """``(id, dataset, provider, score)`` of every listed sample that was scored, once each."""
    return [(r["id"], r["dataset"], r["provider"], row_score(r)) for r in read_rows(out_dir)]


def recover(out_dir: str | Path) -> int:
    """Remove score files no manifest line names whose writer is gone (this host: its process is not
    alive; another host: older than :data:`~engine.extract.shards.FOREIGN_TMP_MAX_AGE_S`). Holds the
    output's lock (no commit can be half done). Returns how many were removed."""
    out_dir = Path(out_dir)
    d = out_dir / SCORES_DIR
    if not d.is_dir():
        return 0
    out = OutDir(out_dir)
    host = socket.gethostname().replace("@", "_")
    removed = 0
    with out.locked():
        named = {e.get(MANIFEST_KEY) for e in out.read_manifest()}
        now = time.time()
        for e in os.scandir(d):
            name = e.name[len(".tmp-"):] if e.name.startswith(".tmp-") else e.name
            if f"{SCORES_DIR}/{e.name}" in named:
                continue
            parts = name.split("@")
            try:
                h, pid = parts[0], int(parts[1])
            except (IndexError, ValueError):
                h, pid = "", -1
            if h == host:
                stale = pid != os.getpid() and not pid_alive(pid)
            else:
                stale = now - e.stat().st_mtime > FOREIGN_TMP_MAX_AGE_S
            if stale:
                Path(e.path).unlink(missing_ok=True)
                removed += 1
    return removed



def import_scores(out_dir: str | Path, run_dir: str | Path) -> int:
    """Save the scores of every listed sample of ``out_dir`` into ``run_dir``'s store
    (:mod:`engine.storage.fidelity`; idempotent: by sample id). Returns how many rows were written.

    Raises:
        engine.storage.handle.NoStoreError: ``run_dir`` has no store.
        OSError: a listed score file cannot be read.
    """
    rows = read_rows(out_dir)
    if not rows:
        return 0
    from engine.storage.fidelity import ScoreRow, open_scores, save_scores

    with open_scores(Path(run_dir)) as h:
        return save_scores(h, [ScoreRow(r["id"], r["dataset"], r["provider"], r["temperature"], r["top_p"], row_score(r))
                               for r in rows])
