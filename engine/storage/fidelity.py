"""The ``fidelity_scores`` table: phase-two per-sample fidelity scores in the run's store.

One row per scored sample (``sample_id`` = the record id ``"<dataset>:<key>"``), written by the
extraction (:func:`engine.extract.scorefiles.import_scores`, from the score files beside the
extracted samples) and read per provider / per dataset by the verdicts. Re-importing is idempotent
(``INSERT OR REPLACE`` by sample id): a resumed or repeated extraction neither loses nor duplicates
rows. The table is created by :func:`open_scores` (a store without it reads as no scores).

Columns: the :class:`engine.fidelity.score.RecordScore` fields (sums over the record's scored
completion tokens: nats, nats^2, token counts), ``temperature`` / ``top_p`` the record was scored
at, ``pit`` the PIT histogram as a JSON list, ``scored_at`` (unix seconds).
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from engine.storage.handle import Handle, columns, connect_rw, transaction

if TYPE_CHECKING:
    from engine.fidelity.score import RecordScore

FIDELITY_DDL = """
CREATE TABLE IF NOT EXISTS fidelity_scores(
  sample_id TEXT PRIMARY KEY,
  dataset TEXT NOT NULL,
  provider TEXT NOT NULL,
  temperature REAL,
  top_p REAL,
  tokens INTEGER NOT NULL,
  outside INTEGER NOT NULL,
  surprisal REAL NOT NULL,
  entropy REAL NOT NULL,
  variance REAL NOT NULL,
  top1 INTEGER NOT NULL,
  top1_expected REAL NOT NULL,
  top1_variance REAL NOT NULL,
  loglik REAL NOT NULL,
  pit TEXT NOT NULL,
  scored_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS fidelity_scores_provider ON fidelity_scores(provider, dataset);
"""

_SCORE_COLS = ("tokens", "outside", "surprisal", "entropy", "variance", "top1", "top1_expected", "top1_variance",
               "loglik")
_COLS = ("sample_id", "dataset", "provider", "temperature", "top_p", *_SCORE_COLS, "pit", "scored_at")
_UPSERT = f"INSERT OR REPLACE INTO fidelity_scores({', '.join(_COLS)}) VALUES({','.join('?' * len(_COLS))})"
_SELECT = f"SELECT provider, dataset, {', '.join(_SCORE_COLS)}, pit FROM fidelity_scores"


class ScoreRow(NamedTuple):
    """One sample's scores as stored. temperature / top_p: what it was scored at."""

    sample_id: str
    dataset: str
    provider: str
    temperature: float | None
    top_p: float | None
    score: "RecordScore"


def open_scores(run_dir: Path) -> Handle:
    """Open the run's store read-write (usable from one other thread at a time) and make sure
    ``fidelity_scores`` exists.

    Raises:
        engine.storage.handle.NoStoreError: no store in ``run_dir``.
    """
    h = connect_rw(run_dir, timeout_s=30.0, any_thread=True,
                   missing=f"{run_dir}: no store.sqlite (not a run directory)")
    h._db.executescript(FIDELITY_DDL)
    return h


def save_scores(h: Handle, rows: list[ScoreRow], *, now: float | None = None) -> int:
    """Insert or replace ``rows`` in one transaction (``now``: ``scored_at``, default the time).
    Returns how many rows were written."""
    if not rows:
        return 0
    t = time.time() if now is None else now
    data = [(r.sample_id, r.dataset, r.provider, r.temperature, r.top_p,
             *(getattr(r.score, c) for c in _SCORE_COLS), json.dumps(list(r.score.pit)), t) for r in rows]
    with transaction(h):
        h._db.executemany(_UPSERT, data)
    return len(data)


def has_scores_table(h: Handle) -> bool:
    """Whether the store has the ``fidelity_scores`` table (a read-only handle on an older store has not)."""
    return bool(columns(h, "fidelity_scores"))


def _rows(h: Handle, dataset: str | None) -> list[tuple]:
    if not has_scores_table(h):
        return []
    try:
        if dataset is None:
            return h._db.execute(_SELECT + " ORDER BY rowid").fetchall()
        return h._db.execute(_SELECT + " WHERE dataset=? ORDER BY rowid", (dataset,)).fetchall()
    except sqlite3.OperationalError:  # the table is being created by another process
        return []


def _score(r: tuple) -> "RecordScore":
    from engine.fidelity.score import RecordScore

    return RecordScore(int(r[2]), int(r[3]), float(r[4]), float(r[5]), float(r[6]), int(r[7]), float(r[8]),
                       float(r[9]), float(r[10]), tuple(int(x) for x in json.loads(r[11])))


def load_scores(h: Handle, dataset: str | None = None) -> dict[str, list["RecordScore"]]:
    """Provider -> its samples' scores (of ``dataset`` only, when given), in import order."""
    out: dict[str, list[RecordScore]] = {}
    for r in _rows(h, dataset):
        out.setdefault(r[0], []).append(_score(r))
    return out


def load_scores_by_dataset(h: Handle) -> dict[str, dict[str, list["RecordScore"]]]:
    """Dataset -> provider -> its samples' scores."""
    out: dict[str, dict[str, list[RecordScore]]] = {}
    for r in _rows(h, None):
        out.setdefault(r[1], {}).setdefault(r[0], []).append(_score(r))
    return out


def score_count(h: Handle) -> int:
    """Rows in ``fidelity_scores`` (0 without the table)."""
    if not has_scores_table(h):
        return 0
    return int(h._db.execute("SELECT COUNT(*) FROM fidelity_scores").fetchone()[0])


def provider_score_counts(h: Handle) -> dict[str, int]:
    """``{provider: scored samples}`` (empty without the table): whether a phase-two look is due, unread."""
    if not has_scores_table(h):
        return {}
    return {p: n for p, n in h._db.execute("SELECT provider, COUNT(*) FROM fidelity_scores GROUP BY provider")}


def score_rows(h: Handle, provider: str) -> list[dict]:
    """``provider``'s scored samples for a drift's evidence file: one dict per sample (``sample_id``,
    ``dataset``, ``temperature``, ``top_p``, the score's sums, ``pit``), in import order ([] without the table)."""
    if not has_scores_table(h):
        return []
    cols = ("sample_id", "dataset", "temperature", "top_p", *_SCORE_COLS, "pit")
    rows = h._db.execute(f"SELECT {', '.join(cols)} FROM fidelity_scores WHERE provider=? ORDER BY rowid", (provider,))
    return [dict(zip(cols, r, strict=True), pit=json.loads(r[-1])) for r in rows]
