"""The store ingests the stream workers' journals exactly once by prompt key.

- :func:`recover` runs at start, before the run's counters are loaded from the store: every journaled
  completion whose prompt is still ``pending`` was paid and never committed (the run was killed
  between the worker's fsync and the store's commit): it is stored now, with an ``ok`` attempt. Every
  stream in the in-flight ledgers whose prompt is still pending was cut by the kill: it is recorded
  as an ``aborted`` attempt with the tokens it had received and their estimated cost, so the lost
  spend counts in ``status``, the report, the caps and the credits drift.
- :func:`prune` deletes the journal segments whose every prompt is no longer pending (its result or
  failure is committed): periodically while running, and at the end.

The results table is unique on (dataset, key) and written with ``INSERT OR IGNORE``: ingesting a
journal twice stores nothing twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from engine.money.usage import account
from engine.storage.store import Store
from engine.storage.writer import StoreWriter
from engine.stream import journal

log = logging.getLogger(__name__)

#: Message of the attempt row of a stream cut by a kill of the whole run.
KILLED_MESSAGE = "stream cut when the run ended without a drain (kill); billed for what was generated"


@dataclass(frozen=True)
class Recovery:
    """What :func:`recover` did: completions stored from the journals, streams counted as lost (and
    their estimated USD), journal segments and ledgers read."""

    stored: int = 0
    lost_streams: int = 0
    lost_usd: float = 0.0
    segments: int = 0

    def line(self) -> str | None:
        """The start-up line, or None when there was nothing to recover."""
        if not self.stored and not self.lost_streams:
            return None
        parts = []
        if self.stored:
            parts.append(f"{self.stored} completion(s) paid before the last run ended were stored from the "
                         f"stream workers' journals")
        if self.lost_streams:
            parts.append(f"{self.lost_streams} stream(s) cut by its end counted as lost spend "
                         f"(est. ${self.lost_usd:.4f})")
        return "recovered: " + "; ".join(parts)


def _read_all(jdir: Path) -> tuple[list[Path], list[dict[str, Any]], list[list[Any]]]:
    segs = journal.segments(jdir)
    recs = [r for s in segs for r in journal.read_records(s)]
    return segs, recs, journal.read_ledgers(jdir)


async def recover(run_dir: Path, store: Store, price: Callable[[int, int], "float | None"]) -> Recovery:
    """Ingest the journals and in-flight ledgers of ``run_dir`` into ``store`` (see the module
    docstring), then delete them. ``price(prompt_tokens, completion_tokens)`` prices a completion
    without a reported cost and a cut stream (USD; None when no price is known).

    Raises:
        sqlite3.Error / OSError: the store could not commit (the journals are kept for the next start).
    """
    jdir = journal.journal_dir(run_dir)
    segs, recs, streams = await asyncio.to_thread(_read_all, jdir)
    if not segs and not streams:
        return Recovery()
    refs = {(r["d"], r["k"]) for r in recs} | {(s[1], s[2]) for s in streams}
    states = await store.prompt_states(refs)
    writer = StoreWriter(store)
    stored: set[tuple[str, str]] = set()
    for r in recs:
        ref = (r["d"], r["k"])
        st = states.get(ref)
        if st is None or st[1] != "pending" or ref in stored:
            continue
        try:
            c = journal.completion_from_dict(r["c"])
        except (KeyError, TypeError, ValueError):
            log.warning("journal line for %s/%s unreadable; the prompt stays pending", *ref)
            continue
        acc = account(c, est_prompt_tokens=st[2], price=price)
        c = _with_usage(c, acc.usage)
        t0, t1 = float(r.get("t0") or time.time()), float(r.get("t1") or time.time())
        writer.add_attempt(st[0], ref[0], 1, t0, t1, "ok", provider=c.provider or None,
                           generation_id=c.generation_id or None, cost_usd=acc.usage.cost_usd)
        writer.add_result(st[0], ref[0], ref[1], c, 1, now=t1, usage_source=acc.source)
        stored.add(ref)
    lost = 0
    lost_usd = 0.0
    for pid_, ds, key, tokens, gid, provider, started, *_ in streams:
        st = states.get((ds, key))
        if st is None or st[1] != "pending" or (ds, key) in stored:
            continue
        usd = price(st[2], int(tokens or 0))
        lost += 1
        lost_usd += usd or 0.0
        writer.add_attempt(st[0], ds, 0, float(started or time.time()), time.time(), "aborted",
                           message=KILLED_MESSAGE, provider=provider or None, generation_id=gid or None,
                           tokens_received=int(tokens or 0), cost_usd=usd)
    if stored or lost:
        writer.add_event("warning", "recovered", None, Recovery(len(stored), lost, lost_usd).line() or "")
    await writer.flush()
    await asyncio.to_thread(_delete, segs)
    journal.remove_ledgers(jdir)
    return Recovery(len(stored), lost, lost_usd, len(segs))


def _with_usage(c, usage):
    import dataclasses

    return dataclasses.replace(c, usage=usage)


def _delete(paths: list[Path]) -> None:
    for p in paths:
        p.unlink(missing_ok=True)


async def prune(run_dir: Path, store: Store, keep: Callable[[Path], bool] = lambda p: False) -> int:
    """Delete the journal segments of ``run_dir`` whose every prompt is no longer pending in ``store``
    (its result or failure is committed), except those ``keep(path)`` protects (a live worker's
    open segment). Returns how many were deleted."""
    jdir = journal.journal_dir(run_dir)
    removed = 0
    for seg in await asyncio.to_thread(journal.segments, jdir):
        if keep(seg):
            continue
        recs = await asyncio.to_thread(lambda s=seg: [(r["d"], r["k"]) for r in journal.read_records(s)])
        states = await store.prompt_states(recs)
        if all(states.get(ref, (0, "gone", 0))[1] != "pending" for ref in recs):
            seg.unlink(missing_ok=True)
            removed += 1
    return removed


__all__ = ["KILLED_MESSAGE", "Recovery", "prune", "recover"]
