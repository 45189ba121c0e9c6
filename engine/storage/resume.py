"""What a restart loads back from a run's store: counts per state, tokens, dollars
(:mod:`engine.storage.dollars`: the one definition ``datagen status`` reads too), errors, recent
completion lengths and abort bills, each dataset's latest result. Part of
:class:`engine.storage.store.Store`."""

from __future__ import annotations

import json
from typing import Any

import aiosqlite

from engine.storage.dollars import DATASET_DOLLARS, Dollars, dollars_from_rows


class ResumeQueries:
    """The restart's reads of :class:`engine.storage.store.Store` (on its aiosqlite connection)."""

    conn: aiosqlite.Connection

    async def prior_elapsed_s(self) -> float:
        """Run seconds accumulated by earlier processes of this run (0.0 for a new run)."""
        cur = await self.conn.execute("SELECT elapsed_s FROM runtime WHERE id=1")
        row = await cur.fetchone()
        return float(row[0] or 0.0) if row else 0.0

    async def runtime_times(self) -> tuple[float | None, float | None] | None:
        """The ``runtime`` row's ``(started_at, heartbeat_at)`` (wall clock, s), None before an engine wrote it."""
        cur = await self.conn.execute("SELECT started_at, heartbeat_at FROM runtime WHERE id=1")
        row = await cur.fetchone()
        return None if row is None else (row[0], row[1])

    async def recent_completion_tokens(self, dataset: str, limit: int = 2000) -> dict[str, list[int]]:
        """The last ``limit`` completion lengths (tokens) of a dataset per class, oldest first."""
        cur = await self.conn.execute(
            "SELECT p.class, r.completion_tokens FROM results r JOIN prompts p ON p.id = r.prompt_id "
            "WHERE r.dataset=? ORDER BY r.created_at DESC LIMIT ?", (dataset, limit))
        out: dict[str, list[int]] = {}
        for cls, n in await cur.fetchall():
            out.setdefault(cls, []).append(n)
        return {c: v[::-1] for c, v in out.items()}

    async def recent_lengths(self, dataset: str, limit: int = 2000) -> dict[str, list[tuple[int, int]]]:
        """The last ``limit`` completion lengths of a dataset per class in dispatch order, oldest first,
        as ``(tokens, censored)``: a stored result's completion tokens (censored 0; dispatched at
        ``created_at - latency_s``), and the tokens an attempt that did not end in a result had
        streamed (``tokens_received`` > 0: aborted, cut by a kill or a worker's death, failed mid-stream;
        censored 1, a lower bound of its length; dispatched at ``started_at``).

        The cut streams matter after aborts and kills: the results stored are then the short
        completions that finished before the cut, and a restart seeded from them alone reserved ~200
        tokens a stream for a mean of 2,000 (a 2M-token budget ended at 5.37M in a trial)."""
        cur = await self.conn.execute(
            "SELECT cls, tokens, censored FROM ("
            " SELECT p.class AS cls, r.completion_tokens AS tokens, 0 AS censored, r.created_at - r.latency_s AS t"
            " FROM results r JOIN prompts p ON p.id = r.prompt_id WHERE r.dataset = ?"
            " UNION ALL"
            " SELECT p.class, a.tokens_received, 1, a.started_at FROM attempts a JOIN prompts p ON p.id = a.prompt_id"
            " WHERE a.dataset = ? AND a.outcome != 'ok' AND a.tokens_received > 0"
            ") ORDER BY t DESC LIMIT ?", (dataset, dataset, limit))
        out: dict[str, list[tuple[int, int]]] = {}
        for cls, n, censored in await cur.fetchall():
            out.setdefault(cls, []).append((int(n), int(censored)))
        return {c: v[::-1] for c, v in out.items()}

    async def aborted_bills(self, limit: int = 2000) -> list[tuple[str, str, str, int, int, float]]:
        """The latest ``limit`` aborted attempts whose bill is known (a generation id and a cost, set by
        the ``/generation`` true-up; our estimates left out): ``(dataset, class, provider, est_prompt_tokens, tokens_received,
        cost_usd)`` (tokens, USD), newest first."""
        cur = await self.conn.execute(
            "SELECT a.dataset, p.class, COALESCE(a.provider, ''), p.est_prompt_tokens, a.tokens_received, a.cost_usd "
            "FROM attempts a JOIN prompts p ON p.id = a.prompt_id WHERE a.outcome = 'aborted' "
            "AND a.cost_usd IS NOT NULL AND a.generation_id IS NOT NULL AND a.cost_source IS NOT 'estimate' "
            "ORDER BY a.id DESC LIMIT ?", (limit,))
        return [tuple(r) for r in await cur.fetchall()]

    async def estimated_attempts(self, limit: int = 20_000) -> list[tuple[str, str, str, str, int, int, float]]:
        """The latest ``limit`` failed or aborted attempts whose cost is still our estimate
        (``cost_source`` ``estimate``) and which have a generation id to true it up with:
        ``(dataset, class, provider, generation_id, est_prompt_tokens, tokens_received, estimated USD)``
        (tokens, USD), newest first."""
        cur = await self.conn.execute(
            "SELECT a.dataset, p.class, COALESCE(a.provider, ''), a.generation_id, p.est_prompt_tokens, "
            "a.tokens_received, a.cost_usd FROM attempts a JOIN prompts p ON p.id = a.prompt_id "
            "WHERE a.cost_source = 'estimate' AND a.outcome != 'ok' AND a.generation_id IS NOT NULL "
            "AND a.generation_id != '' ORDER BY a.id DESC LIMIT ?", (limit,))
        return [tuple(r) for r in await cur.fetchall()]

    async def latest_results(self) -> dict[str, dict[str, Any]]:
        """The most recent stored result of each dataset that has one: ``{dataset: {key, reasoning,
        content, tool_names, finish_reason, provider, completion_tokens, prompt_tail}}`` (tool names
        from the stored OpenAI tool calls; ``prompt_tail``: the last prompt message's text)."""
        cur = await self.conn.execute(
            "SELECT r.dataset, r.key, r.reasoning, r.content, r.tool_calls, r.finish_reason, r.provider, "
            "r.completion_tokens, p.messages FROM results r JOIN prompts p ON p.id = r.prompt_id "
            "WHERE r.prompt_id IN (SELECT (SELECT prompt_id FROM results x WHERE x.dataset = d.name "
            "ORDER BY x.created_at DESC, x.prompt_id DESC LIMIT 1) FROM datasets d)")
        out: dict[str, dict[str, Any]] = {}
        for ds, key, reasoning, content, tools, finish, provider, ctok, messages in await cur.fetchall():
            try:
                names = [str((t.get("function") or {}).get("name", "?")) for t in json.loads(tools or "[]")]
                msgs = json.loads(messages or "[]")
            except (ValueError, AttributeError):
                names, msgs = [], []
            last = msgs[-1].get("content") if msgs and isinstance(msgs[-1], dict) else ""
            out[ds] = {"key": key, "reasoning": reasoning, "content": content, "tool_names": names,
                       "finish_reason": finish, "provider": provider, "completion_tokens": ctok,
                       "prompt_tail": last if isinstance(last, str) else ""}
        return out

    async def dataset_dollars(self) -> dict[str, Dollars]:
        """``{dataset: Dollars}`` of every dataset billed anything: its results' and its lost attempts'
        USD (:mod:`engine.storage.dollars`, the same query as :func:`engine.storage.dollars.dataset_dollars`)."""
        cur = await self.conn.execute(DATASET_DOLLARS)
        return dollars_from_rows([tuple(r) for r in await cur.fetchall()])

    async def lost_costs(self) -> dict[str, float]:
        """USD billed for attempts that produced no result (failures, aborts), per dataset
        (:meth:`dataset_dollars`'s ``lost_usd``)."""
        return {d: v.lost_usd for d, v in (await self.dataset_dollars()).items()}

    async def lost_tokens(self) -> dict[str, int]:
        """Completion tokens streamed by attempts that produced no result (aborted, cut by a kill or a
        worker's death, failed mid-stream), per dataset. A token budget counts them as used, as the
        process that cut them did (:meth:`engine.run.accounting.Accounting.partial_spend`): a restart
        that left them out forgot the tokens of every earlier kill (a trial ended a 2M-token budget at
        2.57M after two kills, the budget reading 1.62M)."""
        cur = await self.conn.execute(
            "SELECT dataset, SUM(tokens_received) FROM attempts WHERE outcome != 'ok' AND tokens_received > 0 "
            "GROUP BY dataset")
        return {d: int(n or 0) for d, n in await cur.fetchall()}

    async def state_counts(self) -> dict[tuple[str, str, str], int]:
        """Return ``{(dataset, class, state): count}`` over all prompts."""
        cur = await self.conn.execute("SELECT dataset, class, state, COUNT(*) FROM prompts GROUP BY 1, 2, 3")
        return {(d, c, s): n for d, c, s, n in await cur.fetchall()}

    async def usage_totals(self) -> dict[str, tuple[int, int, int, float, int]]:
        """Return ``{dataset: (prompt_tokens, completion_tokens, reasoning_tokens, cost_usd, results)}``
        (``cost_usd``: its results' USD, :meth:`dataset_dollars`'s ``results_usd``)."""
        cur = await self.conn.execute(
            "SELECT dataset, SUM(prompt_tokens), SUM(completion_tokens), SUM(reasoning_tokens), COUNT(*) "
            "FROM results GROUP BY dataset"
        )
        usd = await self.dataset_dollars()
        return {d: (p or 0, c or 0, r or 0, usd.get(d, Dollars()).results_usd, n)
                for d, p, c, r, n in await cur.fetchall()}

    async def usage_sources(self) -> dict[str, dict[str, int]]:
        """Return ``{dataset: {usage_source: results}}`` (see :mod:`engine.money.usage`)."""
        cur = await self.conn.execute("SELECT dataset, usage_source, COUNT(*) FROM results GROUP BY 1, 2")
        out: dict[str, dict[str, int]] = {}
        for d, s, n in await cur.fetchall():
            out.setdefault(d, {})[s] = n
        return out

    async def error_counts(self) -> dict[str, dict[str, int]]:
        """Return ``{dataset: {error_class: failed attempts}}``."""
        cur = await self.conn.execute(
            "SELECT dataset, error_class, COUNT(*) FROM attempts WHERE outcome='error' GROUP BY 1, 2"
        )
        out: dict[str, dict[str, int]] = {}
        for d, c, n in await cur.fetchall():
            out.setdefault(d, {})[c] = n
        return out
