"""Batched, exactly-once writes of results, failures, attempts and events.

The hot path (thousands of completions a minute) must not commit per row, yet a crash must lose
at most the last commit window. :class:`StoreWriter` queues rows in memory and commits them in
one transaction at most ``interval_s`` seconds apart (default 1 s). In the same transaction it
refreshes the ``runtime`` row with the engine's live figures (in-flight per dataset), taken
synchronously right after the queue is swapped, so ``datagen status`` always sees counts where
``done + failed + skipped + pending + in_flight == prompts``.

Exactly once: ``results`` has PRIMARY KEY ``prompt_id`` and UNIQUE (dataset, key) and is written
with ``INSERT OR IGNORE``; the prompt's ``state`` flips to ``done`` in the same transaction.

A commit that fails because the file is damaged (:func:`engine.storage.health.is_damage`) is never
retried: nothing more is written into a store that cannot be read back (the batch stays in memory, and
every completion in it is in the stream workers' journals, stored again after ``datagen salvage``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Callable

from engine.client.conformance import encode_flags
from engine.client.types import Completion, Usage
from engine.storage.health import is_damage
from engine.storage.store import Store

log = logging.getLogger(__name__)


class StoreWriter:
    """Queue + periodic committer for one :class:`~engine.storage.store.Store`.

    Args:
        store: the open store.
        interval_s: upper bound on seconds between commits.
        live: callable returning the runtime row fields ``{"state", "state_reason", "elapsed_s",
            "live": dict}``; called synchronously at each commit.
        on_error: called with the exception when a commit fails (e.g. disk full); the batch is
            kept and retried at the next tick, nothing is dropped; a damaged file is not retried
            (:attr:`damaged`, see the module docstring).
        on_recover: called once when a commit succeeds after failures.
    """

    def __init__(
        self,
        store: Store,
        interval_s: float = 1.0,
        live: Callable[[], dict[str, Any]] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        on_recover: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.interval_s = interval_s
        self._live = live
        self._on_error = on_error
        self._on_recover = on_recover
        self.failing = False
        self._wake: asyncio.Event | None = None
        #: seconds a commit waits after the first queued result, to group the ones close behind it.
        self.group_delay_s = min(0.05, interval_s)
        self._results: list[tuple] = []
        self._done: list[tuple] = []
        self._failed: list[tuple] = []
        self._attempts: list[tuple] = []
        self._events: list[tuple] = []
        self._touch: list[tuple] = []
        self._costs: list[tuple] = []
        self._usage: list[tuple] = []
        self._lock = asyncio.Lock()
        self.commits = 0
        self.rows_committed = 0
        self.last_error: BaseException | None = None
        #: the error of a commit that found the store's file damaged; no commit is tried after it.
        self.damaged: BaseException | None = None

    # ---- queueing (synchronous, O(1)) -------------------------------------------------------
    def add_result(self, prompt_id: int, dataset: str, key: str, c: Completion, attempts: int, now: float | None = None,
                   usage_source: str = "reported", usage_claimed: str | None = None) -> None:
        """Queue a completed prompt's result (committed within ``interval_s``); ``c.usage`` is stored
        as its tokens and cost, ``usage_source`` says where they come from (:mod:`engine.money.usage`),
        ``usage_claimed`` the provider's figures that were not believed (JSON text; None: none)."""
        u = c.usage
        self._results.append(
            (
                prompt_id, dataset, key, c.reasoning, c.content,
                json.dumps([t.to_openai() for t in c.tool_calls], ensure_ascii=False),
                c.finish_reason, c.native_finish_reason, c.provider, c.model, c.generation_id,
                u.prompt_tokens, u.completion_tokens, u.reasoning_tokens, u.cost_usd, c.latency_s, c.ttft_s,
                attempts, now if now is not None else time.time(), usage_source, encode_flags(c.flags),
                None if c.token_ids is None else json.dumps(list(c.token_ids), separators=(",", ":")),
                usage_claimed, c.endpoint, c.system_fingerprint, c.temperature, c.top_p,
            )
        )
        self._done.append((attempts, prompt_id))
        if self._wake is not None:
            self._wake.set()

    def add_failure(self, prompt_id: int, error_class: str, message: str, attempts: int) -> None:
        """Queue a prompt's terminal failure with its reason."""
        self._failed.append((error_class, message[:2000], attempts, prompt_id))
        if self._wake is not None:
            self._wake.set()

    def add_attempt(
        self,
        prompt_id: int,
        dataset: str,
        n: int,
        started_at: float,
        ended_at: float,
        outcome: str,
        error_class: str | None = None,
        status: int | None = None,
        message: str | None = None,
        provider: str | None = None,
        generation_id: str | None = None,
        tokens_received: int = 0,
        cost_usd: float | None = None,
        estimated: bool = False,
    ) -> None:
        """Queue one finished attempt (``outcome`` is ``ok`` | ``error`` | ``aborted``). ``estimated``:
        ``cost_usd`` (USD) is our estimate of the bill (``cost_source`` ``estimate``), to be replaced
        by :meth:`set_attempt_cost` when ``/generation`` answers."""
        self._attempts.append(
            (prompt_id, dataset, n, started_at, ended_at, outcome, error_class, status,
             (message or "")[:2000] or None, provider, generation_id, tokens_received, cost_usd,
             "estimate" if estimated else None)
        )

    def set_attempts(self, prompt_id: int, attempts: int) -> None:
        """Queue an update of a still-pending prompt's attempt counter (returned to pending)."""
        self._touch.append((attempts, prompt_id))

    def set_result_usage(self, prompt_id: int, usage: Usage, usage_source: str) -> None:
        """Queue new tokens and cost (a late ``/generation`` true-up) of a stored or queued result."""
        self._usage.append((usage.prompt_tokens, usage.completion_tokens, usage.reasoning_tokens, usage.cost_usd,
                            usage_source, prompt_id))

    def set_attempt_cost(self, generation_id: str, cost_usd: float) -> None:
        """Queue the late-known cost (USD) of a failed/aborted attempt, by generation id (its
        ``cost_source`` becomes ``generation``: billed)."""
        self._costs.append((cost_usd, generation_id))

    def add_event(self, level: str, kind: str, dataset: str | None, message: str, now: float | None = None) -> None:
        """Queue a run event (``level`` info|warning|error; ``kind`` e.g. ``pause``, ``credits``)."""
        self._events.append((now if now is not None else time.time(), level, kind, dataset, message))

    @property
    def queued(self) -> int:
        """Rows waiting for the next commit."""
        return (len(self._results) + len(self._failed) + len(self._attempts) + len(self._events) + len(self._touch)
                + len(self._costs) + len(self._usage))

    # ---- committing -------------------------------------------------------------------------
    async def flush(self) -> int:
        """Commit everything queued in one transaction; returns rows written.

        Raises:
            sqlite3.Error / OSError: the commit failed; the batch is put back for the next try.
            engine.storage.health.DamagedStoreError: an earlier commit found the file damaged
                (:attr:`damaged`): nothing is tried.
        """
        if self.damaged is not None:
            from engine.storage.health import DamagedStoreError

            raise DamagedStoreError(self.store.path, str(self.damaged))
        async with self._lock:
            batch = (self._results, self._done, self._failed, self._attempts, self._events, self._touch, self._costs,
                     self._usage)
            (self._results, self._done, self._failed, self._attempts, self._events, self._touch, self._costs,
             self._usage) = ([], [], [], [], [], [], [], [])
            live = self._live() if self._live else None
            results, done, failed, attempts, events, touch, costs, usage = batch
            conn = self.store.conn
            try:
                await conn.execute("BEGIN IMMEDIATE")
                if results:
                    await conn.executemany(
                        "INSERT OR IGNORE INTO results(prompt_id, dataset, key, reasoning, content, tool_calls, "
                        "finish_reason, native_finish_reason, provider, model, generation_id, prompt_tokens, "
                        "completion_tokens, reasoning_tokens, cost_usd, latency_s, ttft_s, attempts, created_at, usage_source, "
                        "wire_flags, token_ids, usage_claimed, endpoint, system_fingerprint, temperature, top_p) "
                        f"VALUES({','.join('?' * 27)})",
                        results,
                    )
                    await conn.executemany("UPDATE prompts SET state='done', attempts=? WHERE id=?", done)
                if usage:  # after the inserts: a true-up may follow its result in the same batch
                    await conn.executemany(
                        "UPDATE results SET prompt_tokens=?, completion_tokens=?, reasoning_tokens=?, cost_usd=?, "
                        "usage_source=? WHERE prompt_id=?", usage)
                if failed:
                    await conn.executemany(
                        "UPDATE prompts SET state='failed', error_class=?, error=?, attempts=? WHERE id=? AND state='pending'",
                        failed,
                    )
                if touch:
                    await conn.executemany("UPDATE prompts SET attempts=? WHERE id=? AND state='pending'", touch)
                if attempts:
                    await conn.executemany(
                        "INSERT INTO attempts(prompt_id, dataset, n, started_at, ended_at, outcome, error_class, "
                        "status, message, provider, generation_id, tokens_received, cost_usd, cost_source) "
                        "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        attempts,
                    )
                if costs:
                    await conn.executemany(
                        "UPDATE attempts SET cost_usd=?, cost_source='generation' WHERE generation_id=? AND outcome!='ok'",
                        costs)
                if events:
                    await conn.executemany("INSERT INTO events(ts, level, kind, dataset, message) VALUES(?,?,?,?,?)", events)
                if live is not None:
                    await conn.execute(
                        "INSERT INTO runtime(id, pid, started_at, heartbeat_at, state, state_reason, elapsed_s, live) "
                        "VALUES(1,?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET pid=excluded.pid, "
                        "started_at=excluded.started_at, heartbeat_at=excluded.heartbeat_at, state=excluded.state, "
                        "state_reason=excluded.state_reason, elapsed_s=excluded.elapsed_s, live=excluded.live",
                        (live["pid"], live["started_at"], time.time(), live["state"], live["state_reason"],
                         live["elapsed_s"], json.dumps(live["live"])),
                    )
                await conn.execute("COMMIT")
            except BaseException as e:
                try:
                    await conn.execute("ROLLBACK")
                except Exception:  # the connection may be gone; the batch is kept anyway
                    pass
                # Put the batch back in front so nothing paid for is dropped.
                self._results[:0], self._done[:0], self._failed[:0] = results, done, failed
                self._attempts[:0], self._events[:0], self._touch[:0] = attempts, events, touch
                self._costs[:0] = costs
                self._usage[:0] = usage
                if isinstance(e, Exception):
                    self.last_error = e
                    if is_damage(e):
                        self.damaged = e
                raise
            n = len(results) + len(failed) + len(attempts) + len(events) + len(touch) + len(costs) + len(usage)
            self.commits += 1
            self.rows_committed += n
            self.last_error = None
            return n

    async def _wait(self, stop: asyncio.Event) -> None:
        wake = self._wake
        assert wake is not None
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
        try:
            await asyncio.wait(waits, timeout=self.interval_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if wake.is_set() and not stop.is_set():
            await asyncio.sleep(self.group_delay_s)  # group the completions right behind this one
        wake.clear()

    async def run(self, stop: asyncio.Event) -> None:
        """Commit results and failures within ``group_delay_s`` (50 ms) of their arrival, everything
        else at least every ``interval_s``, until ``stop`` is set; then commit a last time.

        A ``kill -9`` therefore loses at most the completions of the last ~50 ms plus the commit in
        progress (they are requested, and paid, again on restart).
        """
        self._wake = asyncio.Event()
        while not stop.is_set():
            await self._wait(stop)
            try:
                await self.flush()
            except Exception as e:  # reported, retried next tick
                if self.damaged is not None:  # never retried: see the module docstring
                    if self._on_error:
                        self._on_error(e)  # it says so (the run stops)
                    else:
                        log.error("store commit failed, the store is damaged: %s; nothing more is written to it", e)
                    return
                log.error("store commit failed (will retry): %s", e)
                self.failing = True
                if self._on_error:
                    self._on_error(e)
                continue
            if self.failing:
                self.failing = False
                log.warning("store commits work again")
                if self._on_recover:
                    self._on_recover()
        for _ in range(3):  # last commit; a store that still fails keeps the batch in the log only
            if self.damaged is not None:
                return
            try:
                await self.flush()
                return
            except Exception as e:
                log.error("final store commit failed: %s", e)
                await asyncio.sleep(self.interval_s)
