"""The ``provider_verdicts`` table: each provider's fidelity verdict, what it did, and whether the user cleared it.

One row per ``(provider, source)``; ``source`` is ``target`` (phase two: the records scored under the
target model, :mod:`engine.fidelity.verdict`) or ``cheap`` (signals the run has without a target,
:mod:`engine.fidelity.cheap`). Columns: ``verdict`` (``ok`` | ``drifting`` | ``insufficient``),
``records`` / ``tokens`` judged, ``reason`` (one line), ``doc`` (the verdict's JSON: tests and
figures), ``looks`` (how many times this provider was judged from this source: each look spends
``false_alarm / looks`` of the false-alarm rate, docs/fidelity.md), ``judged_at``, ``drifting_since``
(when it first read ``drifting``), ``acted`` (what the drift did: ``exclude`` | ``flag`` | ``report``,
NULL before), ``evidence`` (the evidence file's path), ``cleared_at`` (the user cleared the verdict:
its records count as the provider's again and it is never acted on again).

A provider whose verdict is ``drifting``, acted on with ``exclude`` or ``flag`` and not cleared, has
its records flagged ``provider_drift``: the training exports leave them out by default
(:func:`drifting_providers`). Created on first use (:data:`DDL`), so older run directories gain it.
"""

from __future__ import annotations

import json
from typing import Any

from engine.fidelity.looks import combined
from engine.storage.handle import Handle

DDL = """
CREATE TABLE IF NOT EXISTS provider_verdicts(
  provider TEXT NOT NULL, source TEXT NOT NULL, verdict TEXT NOT NULL, records INTEGER NOT NULL,
  tokens INTEGER NOT NULL DEFAULT 0, reason TEXT NOT NULL DEFAULT '', doc TEXT NOT NULL DEFAULT '{}',
  looks INTEGER NOT NULL DEFAULT 0, judged_at REAL NOT NULL, drifting_since REAL, acted TEXT, evidence TEXT,
  cleared_at REAL, PRIMARY KEY(provider, source));
"""

_COLS = ("provider", "source", "verdict", "records", "tokens", "reason", "doc", "looks", "judged_at",
         "drifting_since", "acted", "evidence", "cleared_at")


def ensure(h: Handle) -> None:
    """Create the table when missing (a read-write handle)."""
    h._db.execute(DDL)


def _exists(h: Handle) -> bool:
    return h._db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='provider_verdicts'").fetchone() is not None


def load(h: Handle) -> list[dict[str, Any]]:
    """Every verdict row as a dict (``doc`` decoded), sorted by provider then source; [] when the table
    does not exist yet (read-only handles too)."""
    if not _exists(h):
        return []
    rows = h._db.execute(f"SELECT {', '.join(_COLS)} FROM provider_verdicts ORDER BY provider, source").fetchall()
    out = []
    for r in rows:
        d = dict(zip(_COLS, r, strict=True))
        try:
            d["doc"] = json.loads(d["doc"] or "{}")
        except ValueError:
            d["doc"] = {}
        out.append(d)
    return out


def save(h: Handle, provider: str, source: str, verdict: str, records: int, tokens: int, reason: str,
         doc: dict[str, Any], now: float, *, look: bool = True) -> dict[str, Any] | None:
    """Record a new look at ``(provider, source)``: its verdict replaces the last one, ``looks`` grows by
    one (not when ``look`` is False: an ``insufficient`` verdict ran no test), ``drifting_since`` is set
    on the first ``drifting`` and kept after it; ``acted``, ``evidence`` and ``cleared_at`` are kept.
    Returns the row as it was before (None for the first look)."""
    ensure(h)
    before = h._db.execute(f"SELECT {', '.join(_COLS)} FROM provider_verdicts WHERE provider=? AND source=?",
                           (provider, source)).fetchone()
    prev = dict(zip(_COLS, before, strict=True)) if before else None
    since = prev["drifting_since"] if prev and prev["drifting_since"] is not None else (now if verdict == "drifting" else None)
    h._db.execute(
        "INSERT INTO provider_verdicts(provider, source, verdict, records, tokens, reason, doc, looks, judged_at, "
        "drifting_since) VALUES(?,?,?,?,?,?,?,?,?,?) ON CONFLICT(provider, source) DO UPDATE SET "
        "verdict=excluded.verdict, records=excluded.records, tokens=excluded.tokens, reason=excluded.reason, "
        "doc=excluded.doc, looks=provider_verdicts.looks + excluded.looks, judged_at=excluded.judged_at, "
        "drifting_since=excluded.drifting_since",
        (provider, source, verdict, int(records), int(tokens), reason, json.dumps(doc, sort_keys=True), int(look),
         now, since))
    return prev


def set_acted(h: Handle, provider: str, source: str, acted: str, evidence: str | None) -> None:
    """Record what the drift of ``(provider, source)`` did and where its evidence file is."""
    h._db.execute("UPDATE provider_verdicts SET acted=?, evidence=? WHERE provider=? AND source=?",
                  (acted, evidence, provider, source))


def clear(h: Handle, provider: str, now: float) -> int:
    """The user clears ``provider``'s drifting verdicts (every source): returns how many rows were
    drifting and not cleared yet (0: nothing to clear)."""
    ensure(h)
    return h._db.execute("UPDATE provider_verdicts SET cleared_at=? WHERE provider=? AND verdict='drifting' "
                         "AND cleared_at IS NULL", (now, provider)).rowcount


def clear_provider(h: Handle, provider: str, now: float) -> tuple[int, bool]:
    """:func:`clear` plus whether a drift had excluded ``provider`` (``acted = 'exclude'``), so the caller
    routes to it again. Returns ``(rows cleared, was excluded by a drift)``."""
    ensure(h)
    excluded = h._db.execute("SELECT 1 FROM provider_verdicts WHERE provider=? AND verdict='drifting' AND "
                             "acted='exclude' AND cleared_at IS NULL", (provider,)).fetchone() is not None
    return clear(h, provider, now), excluded


def drifting_names(h: Handle) -> list[str]:
    """The providers with a ``drifting`` verdict not cleared (any action), sorted."""
    return sorted({r["provider"] for r in load(h) if r["verdict"] == "drifting" and r["cleared_at"] is None})


def drifting_providers(h: Handle) -> dict[str, str]:
    """``{provider: reason}`` of the providers whose records carry the ``provider_drift`` flag: a
    ``drifting`` verdict acted on with ``exclude`` or ``flag``, not cleared (the first source's reason,
    ``target`` before ``cheap``)."""
    out: dict[str, str] = {}
    for r in load(h):
        if r["verdict"] == "drifting" and r["acted"] in ("exclude", "flag") and r["cleared_at"] is None:
            out.setdefault(r["provider"], f"{r['source']}: {r['reason']}")
    return out


def by_provider(h: Handle) -> dict[str, dict[str, Any]]:
    """``{provider: fidelity object}`` (:func:`engine.fidelity.looks.combined`) from the saved verdicts."""
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for r in load(h):
        by.setdefault(r["provider"], {})[r["source"]] = r
    return {p: combined(rows) for p, rows in by.items()}
