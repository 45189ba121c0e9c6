"""The ``endpoint_snapshots`` table: OpenRouter's list of the model's endpoints, as read while the run buys.

``GET /api/v1/models/{author}/{slug}/endpoints`` (docs/fidelity.md, "Attribution") names each provider
serving the model with its declared ``quantization`` and ``tag``. The run reads it at start and every
few minutes (:class:`engine.run.fidelity.FidelityWatch`); each read that differs from the last is kept
(``taken_at``, the endpoints as JSON), so a provider that changed precision mid-run shows in the
evidence of a drift. Created on first use.
"""

from __future__ import annotations

import json
from typing import Any

from engine.storage.handle import Handle

DDL = """
CREATE TABLE IF NOT EXISTS endpoint_snapshots(id INTEGER PRIMARY KEY, taken_at REAL NOT NULL, endpoints TEXT NOT NULL);
"""


def _exists(h: Handle) -> bool:
    return h._db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='endpoint_snapshots'").fetchone() is not None


def save_snapshot(h: Handle, endpoints: list[dict[str, Any]], now: float) -> bool:
    """Keep ``endpoints`` (a list of plain dicts) when it differs from the latest snapshot; returns
    whether it was kept."""
    h._db.execute(DDL)
    body = json.dumps(endpoints, sort_keys=True)
    row = h._db.execute("SELECT endpoints FROM endpoint_snapshots ORDER BY id DESC LIMIT 1").fetchone()
    if row is not None and row[0] == body:
        return False
    h._db.execute("INSERT INTO endpoint_snapshots(taken_at, endpoints) VALUES(?, ?)", (now, body))
    return True


def latest_snapshot(h: Handle) -> list[dict[str, Any]]:
    """The latest endpoints read ([] when none was)."""
    if not _exists(h):
        return []
    row = h._db.execute("SELECT endpoints FROM endpoint_snapshots ORDER BY id DESC LIMIT 1").fetchone()
    return json.loads(row[0]) if row else []


def snapshots(h: Handle) -> list[tuple[float, list[dict[str, Any]]]]:
    """Every kept snapshot, oldest first: ``(taken_at, endpoints)``."""
    if not _exists(h):
        return []
    return [(t, json.loads(e)) for t, e in h._db.execute("SELECT taken_at, endpoints FROM endpoint_snapshots ORDER BY id")]
