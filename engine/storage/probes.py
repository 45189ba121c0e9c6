"""The ``probe_batches`` and ``probe_results`` tables: fidelity probes sent pinned to each provider.

Each time the probes run (``datagen probe``, or ``datagen run`` with ``[fidelity.probes] enabled``) one
``probe_batches`` row keeps when (``taken_at``, epoch seconds), the reference provider, the projected cost
(``requests``, ``est_usd``, ``max_usd``, USD), what was billed (``spent_usd``, USD) and every provider's
verdict (``verdicts``: JSON ``{provider: ProbeVerdict.to_dict()}``, :mod:`engine.fidelity.probes`);
``probe_results`` keeps one row per request sent: the probe, the provider pinned (``provider``, ``slug``)
and who served it (``served``), the finish, whether it called a tool and whether the call fit the schema
(``called``, ``schema_ok``: 0/1, NULL without a call), the text compared for greedy probes, the token ids
(JSON, NULL when the server sent none), billed tokens and cost, or the error. Created on first use.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from engine.fidelity.probes import ProbeOutcome, ProbeVerdict
from engine.storage.handle import Handle, transaction

DDL = """
CREATE TABLE IF NOT EXISTS probe_batches(
  id INTEGER PRIMARY KEY, taken_at REAL NOT NULL, reference TEXT NOT NULL, requests INTEGER NOT NULL,
  est_usd REAL NOT NULL, max_usd REAL NOT NULL, spent_usd REAL NOT NULL, verdicts TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS probe_results(
  id INTEGER PRIMARY KEY, batch INTEGER NOT NULL, probe_id TEXT NOT NULL, provider TEXT NOT NULL,
  slug TEXT NOT NULL, repeat INTEGER NOT NULL, greedy INTEGER NOT NULL, served TEXT NOT NULL,
  finish_reason TEXT, called INTEGER NOT NULL, schema_ok INTEGER, text TEXT NOT NULL, token_ids TEXT,
  prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, cost_usd REAL,
  generation_id TEXT NOT NULL, error TEXT);
CREATE INDEX IF NOT EXISTS probe_results_batch ON probe_results(batch, provider);
"""


def _exists(h: Handle) -> bool:
    return h._db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='probe_batches'").fetchone() is not None


def save_batch(h: Handle, *, taken_at: float, reference: str, requests: int, est_usd: float, max_usd: float,
               spent_usd: float, verdicts: dict[str, ProbeVerdict], outcomes: Sequence[ProbeOutcome],
               slugs: dict[str, str]) -> int:
    """Keep one probe run (a read-write handle), in one transaction; returns its batch id.

    Args:
        slugs: provider name -> the slug it was pinned with (``provider.only``).
    """
    h._db.executescript(DDL)
    with transaction(h):
        cur = h._db.execute(
            "INSERT INTO probe_batches(taken_at, reference, requests, est_usd, max_usd, spent_usd, verdicts) "
            "VALUES(?, ?, ?, ?, ?, ?, ?)",
            (taken_at, reference, requests, est_usd, max_usd, spent_usd,
             json.dumps({p: v.to_dict() for p, v in verdicts.items()}, sort_keys=True)))
        batch = int(cur.lastrowid or 0)
        h._db.executemany(
            "INSERT INTO probe_results(batch, probe_id, provider, slug, repeat, greedy, served, finish_reason, called, "
            "schema_ok, text, token_ids, prompt_tokens, completion_tokens, cost_usd, generation_id, error) "
            "VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(batch, o.probe_id, o.provider, slugs.get(o.provider, o.provider), o.repeat, int(o.greedy), o.served,
              o.finish_reason, int(o.called), None if o.schema_ok is None else int(o.schema_ok), o.text,
              None if o.token_ids is None else json.dumps(list(o.token_ids)), o.prompt_tokens, o.completion_tokens,
              o.cost_usd, o.generation_id, o.error) for o in outcomes])
    return batch


def latest_batch(h: Handle) -> dict[str, Any] | None:
    """The latest probe run: ``{"id", "taken_at", "reference", "requests", "est_usd", "max_usd", "spent_usd",
    "verdicts": {provider: dict}}``; None when the probes never ran."""
    if not _exists(h):
        return None
    row = h._db.execute("SELECT id, taken_at, reference, requests, est_usd, max_usd, spent_usd, verdicts "
                        "FROM probe_batches ORDER BY id DESC LIMIT 1").fetchone()
    if row is None:
        return None
    keys = ("id", "taken_at", "reference", "requests", "est_usd", "max_usd", "spent_usd")
    return {**dict(zip(keys, row[:7], strict=True)), "verdicts": json.loads(row[7])}


def batch_results(h: Handle, batch: int) -> list[dict[str, Any]]:
    """The rows of one probe run, in the order they were kept (``token_ids`` decoded; 0/1 columns as bool)."""
    if not _exists(h):
        return []
    cur = h._db.execute("SELECT * FROM probe_results WHERE batch=? ORDER BY id", (batch,))
    cols = [d[0] for d in cur.description]
    out = []
    for r in cur.fetchall():
        d = dict(zip(cols, r, strict=True))
        d["token_ids"] = None if d["token_ids"] is None else json.loads(d["token_ids"])
        d["greedy"], d["called"] = bool(d["greedy"]), bool(d["called"])
        d["schema_ok"] = None if d["schema_ok"] is None else bool(d["schema_ok"])
        out.append(d)
    return out
