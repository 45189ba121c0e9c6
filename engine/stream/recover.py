"""The store ingests the stream workers' journals exactly once by prompt key.

- :func:`recover_results` runs at start, before the run's counters are loaded from the store: every
  journaled completion whose prompt is still ``pending`` was paid and never committed (the run was
  killed between the worker's fsync and the store's commit): it is stored now, with an ``ok`` attempt.
- :func:`recover_cut_streams` runs once prices are known: every stream in the in-flight ledgers whose
  prompt is still pending was cut by the kill: it is recorded as an ``aborted`` attempt with the
  tokens it had received and its estimated bill (a provider that keeps generating after a
  disconnect bills the whole completion), and added to the run's spend, so the lost spend counts in
  ``status``, the report, the caps and the credits drift (a stream whose generation id already has
  an attempt row, one that failed after the ledger's last rewrite, is counted there); the run then
  trues each estimate up from ``/generation`` (:meth:`engine.run.accounting.Accounting.trueup_stored`).
- :func:`prune` deletes the journal segments whose every prompt is no longer pending (its result or
  failure is committed): periodically while running, and at the end.

The results table is unique on (dataset, key) and written with ``INSERT OR IGNORE``: ingesting a
journal twice stores nothing twice.

Recovery at start reads and deletes only the files of earlier processes: ``live(path)`` names the
files of the workers this run has already started (:meth:`engine.stream.pool.StreamWorkerPool.owns`),
which are never read, deleted or counted as cut (deleting a live worker's open segment lost every
completion it journaled after that: a kill then had nothing to recover).
"""

from __future__ import annotations

import asyncio
import dataclasses
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
KILLED_MESSAGE = "stream cut when the run ended without a drain (kill); bill estimated, trued up from /generation when known"

#: ``estimate(dataset, [(class, provider, prompt tokens, tokens received)])`` -> the cut streams' cost
#: figures (:class:`engine.money.inflight.InFlightCost`), as :meth:`engine.run.ending.RunEnding.cut_costs`.
CutEstimate = Callable[[str, list[tuple[str, str, int, int]]], list[Any]]


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


#: ``live(path)``: whether a journal file belongs to a worker of the running process (left alone).
Live = Callable[[Path], bool]


def _never(_path: Path) -> bool:
    return False


async def recover_results(run_dir: Path, store: Store, price: Callable[[int, int], "float | None"],
                          live: Live = _never) -> Recovery:
    """Store every journaled completion of ``run_dir`` whose prompt is still pending (see the module
    docstring), then delete the journal segments it read. Run it before the run's counters are loaded
    from the store: they then include what it stored. ``price(prompt_tokens, completion_tokens)``
    prices a completion without a reported cost (USD; None when no price is known). Segments for
    which ``live(path)`` is true (this run's own workers') are neither read nor deleted.

    Raises:
        sqlite3.Error / OSError: the store could not commit (the journals are kept for the next start).
    """
    jdir = journal.journal_dir(run_dir)
    segs = [p for p in await asyncio.to_thread(journal.segments, jdir) if not live(p)]
    if not segs:
        return Recovery()
    recs = await asyncio.to_thread(lambda: [r for seg in segs for r in journal.read_records(seg)])
    states = await store.prompt_states({(r["d"], r["k"]) for r in recs})
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
        c = dataclasses.replace(c, usage=acc.usage)
        t0, t1 = float(r.get("t0") or time.time()), float(r.get("t1") or time.time())
        writer.add_attempt(st[0], ref[0], 1, t0, t1, "ok", provider=c.provider or None,
                           generation_id=c.generation_id or None, cost_usd=acc.usage.cost_usd)
        writer.add_result(st[0], ref[0], ref[1], c, 1, now=t1, usage_source=acc.source)
        stored.add(ref)
    if stored:
        writer.add_event("warning", "recovered", None, Recovery(len(stored)).line() or "")
    await writer.flush()
    if await store.checkpoint():  # in the database file, not only its -wal; else prune deletes them later
        await asyncio.to_thread(_delete, segs)
    return Recovery(len(stored), segments=len(segs))


async def recover_cut_streams(run_dir: Path, store: Store, price: Callable[[int, int], "float | None"],
                              estimate: "CutEstimate | None" = None, live: Live = _never
                              ) -> tuple[Recovery, list[tuple[str, int, float, str]]]:
    """Record every stream in the in-flight ledgers of ``run_dir`` whose prompt is still pending (cut
    by a kill of the whole run) as an ``aborted`` attempt with its tokens and its estimated bill,
    then delete the ledgers it read. Run it once prices are known (``price`` as in
    :func:`recover_results`). Ledgers for which ``live(path)`` is true (this run's own workers')
    are neither read nor deleted.

    ``estimate(dataset, [(class, provider, prompt tokens, tokens received)])``: the cost figures of
    a dataset's cut streams (:meth:`engine.run.ending.RunEnding.cut_costs`): a stream with a
    generation id is recorded at its estimated bill (``abort_usd``: its provider's observed share of
    the rest of its expected completion, in full before any observation), marked ``estimate`` so
    that ``/generation`` trues it up (:meth:`engine.run.accounting.Accounting.trueup_stored`). Without
    ``estimate`` (no ``/generation`` to true it up), or with no generation id, what it generated
    (``price``; no prompt charge before a token came).

    Returns:
        the :class:`Recovery` figures and ``(dataset, tokens, USD, class)`` per cut stream, for the
        spend ledger and the length estimators of the run about to start (recorded after they were
        seeded from the store: a cut stream is a censored length, :meth:`engine.money.spend.SpendControl.count_lost`).

    Raises:
        sqlite3.Error / OSError: the store could not commit (the ledgers are kept for the next start).
    """
    jdir = journal.journal_dir(run_dir)
    paths = [p for p in await asyncio.to_thread(journal.ledgers, jdir) if not live(p)]
    streams = await asyncio.to_thread(lambda: [s for p in paths for s in journal.read_ledger(p)])
    if not streams:
        await asyncio.to_thread(_delete, paths)
        return Recovery(), []
    states = await store.prompt_states({(s[1], s[2]) for s in streams})
    # a stream that failed after the ledger's last rewrite has its attempt row (and spend) already
    counted = await store.attempted_generations(s[4] for s in streams)
    todo = []
    for _pid, ds, key, tokens, gid, provider, started, *_ in streams:
        st = states.get((ds, key))
        if st is None or st[1] != "pending" or (gid and gid in counted):
            continue
        todo.append((st, ds, int(tokens or 0), gid or "", provider or "", started))
    bills: dict[int, float] = {}
    if estimate is not None:
        by_ds: dict[str, list[int]] = {}
        for i, (_st, ds, _t, gid, _pv, _s) in enumerate(todo):
            if gid:
                by_ds.setdefault(ds, []).append(i)
        for ds, idx in by_ds.items():
            costs = estimate(ds, [(todo[i][0][3], todo[i][4], todo[i][0][2], todo[i][2]) for i in idx])
            bills.update((i, c.abort_usd) for i, c in zip(idx, costs, strict=True))
    writer = StoreWriter(store)
    cut: list[tuple[str, int, float, str]] = []
    for i, (st, ds, tokens, gid, provider, started) in enumerate(todo):
        usd = bills.get(i)
        estimated = usd is not None
        if usd is None:
            usd = price(st[2] if tokens else 0, tokens) or 0.0  # as a live abort: no prompt charge before a token came
        cut.append((ds, tokens, usd, st[3]))
        writer.add_attempt(st[0], ds, 0, float(started or time.time()), time.time(), "aborted",
                           message=KILLED_MESSAGE, provider=provider or None, generation_id=gid or None,
                           tokens_received=tokens, cost_usd=usd, estimated=estimated)
    rec = Recovery(lost_streams=len(cut), lost_usd=sum(c[2] for c in cut))
    if cut:
        writer.add_event("warning", "recovered", None, rec.line() or "")
    await writer.flush()
    await asyncio.to_thread(_delete, paths)
    return rec, cut


def _delete(paths: list[Path]) -> None:
    for p in paths:
        p.unlink(missing_ok=True)


def _segment_refs(seg: Path) -> list[tuple[Any, Any]]:
    """``(dataset, key)`` of every record in journal segment ``seg``."""
    return [(r["d"], r["k"]) for r in journal.read_records(seg)]


async def prune(run_dir: Path, store: Store, keep: Callable[[Path], bool] = _never) -> int:
    """Delete the journal segments of ``run_dir`` whose every prompt is no longer pending in ``store``
    (its result or failure is committed; an empty segment has none pending), except those
    ``keep(path)`` protects: while workers run, ``keep`` must protect each one's open segment
    (:meth:`engine.stream.pool.StreamWorkerPool.is_open_segment`), which may be empty still and be
    written the next moment. A segment is deleted only after a checkpoint that copied every commit
    into the database file (:meth:`engine.storage.store.Store.checkpoint`; none this time: nothing is
    deleted). Returns how many were deleted."""
    jdir = journal.journal_dir(run_dir)
    doomed = []
    for seg in await asyncio.to_thread(journal.segments, jdir):
        if keep(seg):
            continue
        recs = await asyncio.to_thread(_segment_refs, seg)
        states = await store.prompt_states(recs)
        if all(states.get(ref, (0, "gone", 0))[1] != "pending" for ref in recs):
            doomed.append(seg)
    # Deleted only once their results are in the database file itself, not only in its -wal (a lost
    # -wal then loses nothing: the next start stores them from the journals again).
    if doomed and not await store.checkpoint():
        return 0
    for seg in doomed:
        seg.unlink(missing_ok=True)
    return len(doomed)


__all__ = ["KILLED_MESSAGE", "Live", "Recovery", "prune", "recover_cut_streams", "recover_results"]
