"""Dispatch from a run's store: pending prompts fetched in id order, the journal's prompts looked
up, commands from ``datagen ctl`` polled and marked, failed prompts returned to pending
(``retry-failed``). Part of :class:`engine.storage.store.Store`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

import aiosqlite

from engine.storage.offline import failed_filter


@dataclass(frozen=True, slots=True)
class PendingPrompt:
    """A prompt fetched for dispatch.

    Attributes:
        id: row id (dispatch order within a dataset and class).
        dataset: dataset name.
        key: stable prompt key.
        cls: request class name.
        messages: OpenAI-shape messages.
        tools: OpenAI-shape tools (may be empty).
        attempts: attempts already made in earlier runs.
        est_prompt_tokens: estimated prompt length (tokens; characters / 4 + 4 per message).
    """

    id: int
    dataset: str
    key: str
    cls: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    attempts: int
    est_prompt_tokens: int = 0


class DispatchQueries:
    """The dispatch methods of :class:`engine.storage.store.Store` (on its aiosqlite connection)."""

    conn: aiosqlite.Connection

    async def fetch_pending(self, dataset: str, cls: str, after_id: int, limit: int) -> list[PendingPrompt]:
        """Return up to ``limit`` pending prompts of (dataset, class) with id > ``after_id``, by id."""
        cur = await self.conn.execute(
            "SELECT id, key, messages, tools, attempts, est_prompt_tokens FROM prompts "
            "WHERE dataset=? AND class=? AND state='pending' AND id>? ORDER BY id LIMIT ?",
            (dataset, cls, after_id, limit),
        )
        return [
            PendingPrompt(id=i, dataset=dataset, key=k, cls=cls, messages=json.loads(m), tools=json.loads(t),
                          attempts=a, est_prompt_tokens=e)
            for i, k, m, t, a, e in await cur.fetchall()
        ]

    async def prompt_states(self, refs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, str, int, str]]:
        """``{(dataset, key): (prompt id, state, est_prompt_tokens, class)}`` of the prompts among ``refs``
        that exist (a stream worker's journal names its completions by dataset and key)."""
        by_ds: dict[str, list[str]] = {}
        for ds, key in refs:
            by_ds.setdefault(ds, []).append(key)
        out: dict[tuple[str, str], tuple[int, str, int, str]] = {}
        for ds, keys in by_ds.items():
            for i in range(0, len(keys), 500):
                part = keys[i:i + 500]
                cur = await self.conn.execute(
                    f"SELECT key, id, state, est_prompt_tokens, class FROM prompts WHERE dataset=? AND key IN "
                    f"({','.join('?' * len(part))})", (ds, *part))
                for key, pid, state, est, cls in await cur.fetchall():
                    out[(ds, key)] = (pid, state, est, cls)
        return out

    async def attempted_generations(self, generation_ids: Iterable[str]) -> set[str]:
        """The generation ids among ``generation_ids`` that already have an attempt row (its spend is
        counted there)."""
        ids = [g for g in set(generation_ids) if g]
        out: set[str] = set()
        for i in range(0, len(ids), 500):
            part = ids[i:i + 500]
            cur = await self.conn.execute(
                f"SELECT DISTINCT generation_id FROM attempts WHERE generation_id IN ({','.join('?' * len(part))})", part)
            out.update(g for (g,) in await cur.fetchall())
        return out

    async def pending_commands(self) -> list[tuple[int, str, str | None, str | None]]:
        """Return control commands not yet applied: ``(id, verb, dataset, arg)`` in order."""
        cur = await self.conn.execute("SELECT id, verb, dataset, arg FROM commands WHERE done_at IS NULL ORDER BY id")
        return [tuple(r) for r in await cur.fetchall()]

    async def mark_command(self, cid: int, now: float, result: str, ok: bool) -> None:
        """Record that command ``cid`` was handled with ``result`` (its line) and ``ok`` (applied or not)."""
        await self.conn.execute("UPDATE commands SET done_at=?, result=?, ok=? WHERE id=?", (now, result, int(ok), cid))

    async def failed_counts(self, dataset: str | None = None) -> dict[str, int]:
        """Failed prompts of ``dataset`` (None: all) by error class, most first: ``{class: n}``."""
        cur = await self.conn.execute(
            "SELECT COALESCE(error_class, 'other'), COUNT(*) FROM prompts WHERE state='failed' "
            + ("AND dataset=? " if dataset is not None else "") + "GROUP BY 1 ORDER BY 2 DESC, 1",
            (dataset,) if dataset is not None else ())
        return {c: n for c, n in await cur.fetchall()}

    async def retry_failed(self, dataset: str | None = None, error_class: str | None = None) -> list[PendingPrompt]:
        """Return failed prompts to ``pending`` and return them, by id (``datagen ctl retry-failed``).

        Args:
            dataset: only this dataset's prompts (None: every dataset).
            error_class: only prompts that failed with this error class (``bad_request``,
                ``server``...; None: any).

        Their attempt counters are kept (``max_attempts`` applies per dispatch, not per prompt);
        the reason of the failure is cleared (the attempts table keeps every attempt's error).
        """
        where, args = failed_filter(dataset, error_class)
        cur = await self.conn.execute(
            f"SELECT id, dataset, key, class, messages, tools, attempts, est_prompt_tokens FROM prompts "
            f"WHERE {where} ORDER BY id", args)
        rows = await cur.fetchall()
        # One statement per row, each conditional on the row still being failed: safe beside the
        # writer's batched transactions on the same connection.
        await self.conn.executemany(
            "UPDATE prompts SET state='pending', error_class=NULL, error=NULL WHERE id=? AND state='failed'",
            [(r[0],) for r in rows])
        return [PendingPrompt(id=i, dataset=d, key=k, cls=c, messages=json.loads(m), tools=json.loads(t),
                              attempts=a, est_prompt_tokens=e) for i, d, k, c, m, t, a, e in rows]
