"""Ingest into a run's store: dataset rows become prompts (``INSERT OR IGNORE``: a re-read keeps
what is stored), rejects are replaced, prompts whose row left the file are dropped or failed, the
copies of a prompt stored in several datasets are read and marked (``dup``:
:mod:`engine.datasets.overlap`), and the dataset's row records the ingest. Part of
:class:`engine.storage.store.Store`."""

from __future__ import annotations

from typing import Iterable

import aiosqlite


class IngestQueries:
    """The ingest methods of :class:`engine.storage.store.Store` (on its aiosqlite connection)."""

    conn: aiosqlite.Connection

    async def ingest_batch(self, dataset: str, rows: Iterable[tuple[str, str, str, int, str, str, str | None]]) -> int:
        """Insert prompts ``(key, source, class, est_prompt_tokens, messages_json, tools_json, special_text)``
        (``special_text``: None, or the special-token texts found in the messages; a 6-tuple without
        it stores None).

        Existing (dataset, key) rows are left untouched (their state and results are kept).
        Returns the number of rows inserted.
        """
        rows = list(rows)
        if not rows:
            return 0
        before = self.conn.total_changes
        await self.conn.execute("BEGIN")
        await self.conn.executemany(
            "INSERT OR IGNORE INTO prompts(dataset, key, source, class, est_prompt_tokens, messages, tools, special_text) "
            "VALUES(?,?,?,?,?,?,?,?)",
            [(dataset, *r) if len(r) == 7 else (dataset, *r, None) for r in rows],
        )
        await self.conn.execute("COMMIT")
        return self.conn.total_changes - before

    async def replace_rejects(self, dataset: str, rejects: list[tuple[str, str]]) -> None:
        """Replace the dataset's reject list with ``(source, reason)`` rows."""
        await self.conn.execute("BEGIN")
        await self.conn.execute("DELETE FROM rejects WHERE dataset=?", (dataset,))
        await self.conn.executemany("INSERT INTO rejects(dataset, source, reason) VALUES(?,?,?)", [(dataset, s, r) for s, r in rejects])
        await self.conn.execute("COMMIT")

    async def drop_stale(self, dataset: str, keys: set[str]) -> tuple[int, int, int]:
        """After a re-read: the dataset's stored prompts whose key is not in ``keys`` (their row was
        edited, deleted, or is now rejected). Pending ones never sent, and duplicates (``dup``), are
        deleted (nothing was paid for them); pending ones with attempts become ``failed`` with error class ``removed`` (their
        billed attempts stay counted); done and failed ones are kept with their results.

        Returns:
            ``(deleted, marked_failed, kept_with_results)``.
        """
        cur = await self.conn.execute("SELECT id, key, state, attempts FROM prompts WHERE dataset=?", (dataset,))
        stale = [(i, st, a) for i, k, st, a in await cur.fetchall() if k not in keys]
        drop = [(i,) for i, st, a in stale if st in ("pending", "dup") and not a]
        mark = [(i,) for i, st, a in stale if st == "pending" and a]
        if drop or mark:
            await self.conn.execute("BEGIN")
            await self.conn.executemany("DELETE FROM prompts WHERE id=?", drop)
            await self.conn.executemany(
                "UPDATE prompts SET state='failed', error_class='removed', error='its row is no longer in the "
                "dataset file (edited, deleted or now rejected); not sent again' WHERE id=?", mark)
            await self.conn.execute("COMMIT")
        return len(drop), len(mark), len(stale) - len(drop) - len(mark)

    async def finish_ingest(self, dataset: str, fingerprint: str, rejected: int, revision: str | None = None) -> int:
        """Record a completed ingest (``revision``: the commit sha of an ``hf://`` dataset, None for a
        local path); returns the dataset's prompt count (its duplicates, ``dup``, not counted)."""
        cur = await self.conn.execute("SELECT COUNT(*) FROM prompts WHERE dataset=? AND state!='dup'", (dataset,))
        row = await cur.fetchone()
        n = row[0] if row is not None else 0  # COUNT(*) always gives its row
        await self.conn.execute(
            "UPDATE datasets SET fingerprint=?, prompts=?, rejected=?, revision=? WHERE name=?",
            (fingerprint, n, rejected, revision, dataset),
        )
        return n

    async def reclassify(self, dataset: str, classify) -> None:
        """Recompute every prompt's class with ``classify(est_prompt_tokens) -> class``."""
        cur = await self.conn.execute("SELECT DISTINCT est_prompt_tokens, class FROM prompts WHERE dataset=?", (dataset,))
        changes = [(classify(t), dataset, t) for t, c in await cur.fetchall() if classify(t) != c]
        if changes:
            await self.conn.executemany("UPDATE prompts SET class=? WHERE dataset=? AND est_prompt_tokens=?", changes)

    async def shared_copies(self) -> list[tuple[int, str, str, str, str, int, str | None, int | None]]:
        """Every copy of a prompt key stored in more than one dataset, and every ``dup`` copy:
        ``(id, dataset, key, class, state, attempts, error_class, dup_of)``, by id."""
        cur = await self.conn.execute(
            "SELECT id, dataset, key, class, state, attempts, error_class, dup_of FROM prompts "
            "WHERE state='dup' OR key IN (SELECT key FROM prompts GROUP BY key HAVING COUNT(*) > 1) ORDER BY id")
        return [tuple(r) for r in await cur.fetchall()]

    async def mark_copies(self, to_dup: list[tuple[int, int]], to_pending: list[int]) -> None:
        """Store copies as duplicates, ``(prompt id, id of the copy bought)`` (only pending copies never
        sent, or ``dup`` ones), and make ``dup`` copies ``pending`` again; then recount every dataset's
        prompts (duplicates not counted). One transaction."""
        await self.conn.execute("BEGIN")
        await self.conn.executemany(
            "UPDATE prompts SET state='dup', dup_of=? WHERE id=? AND (state='dup' OR (state='pending' AND attempts=0))",
            [(owner, i) for i, owner in to_dup])
        await self.conn.executemany("UPDATE prompts SET state='pending', dup_of=NULL WHERE id=? AND state='dup'",
                                    [(i,) for i in to_pending])
        await self.conn.execute(
            "UPDATE datasets SET prompts=(SELECT COUNT(*) FROM prompts p WHERE p.dataset=datasets.name AND "
            "p.state!='dup') WHERE fingerprint IS NOT NULL")
        await self.conn.execute("COMMIT")

    async def duplicate_count(self, dataset: str) -> int:
        """The dataset's copies stored as duplicates of another dataset's (``dup``)."""
        cur = await self.conn.execute("SELECT COUNT(*) FROM prompts WHERE dataset=? AND state='dup'", (dataset,))
        row = await cur.fetchone()
        return int(row[0]) if row is not None else 0
