"""Reconstruction off the event loop: live, as results arrive, and over a whole run.

- :class:`ReconstructionService` (live): ``await start()`` loads the tokenizer and runs the
  start-up check (raising :class:`~engine.tokens.tokenizer.TokenizerError` to refuse the run),
  stores the ``[tokenizer]`` section and the resolved ids in ``meta['tokenizer']``; ``submit()``
  (non-blocking, from the loop) queues one completed result; a pool (processes by default, each
  loading the tokenizer once; or threads) rebuilds and checks it; verdict rows are committed to the
  ``validations`` table at most 1 s apart by the service's own SQLite connection (WAL: it does not
  block the run's writer for longer than one small transaction). ``failure_rate(dataset)`` and
  ``guard(dataset)`` feed the anomaly guard.
- :func:`validate_run` (``datagen validate``): the same work over every stored result, so a
  tokenizer fix is re-applied without paying for generation again.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures as cf
import itertools
import json
import logging
import os
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable

from engine.config import TokenizerSection
from engine.proc.childproc import quiet_child, spawn_context, spawn_guard
from engine.storage import validations
from engine.storage.handle import Handle
from engine.tokens import vstore
from engine.tokens.reconstruct import Record, reconstruct
from engine.tokens.report import summarize
from engine.tokens.startup import startup_check
from engine.tokens.tokenizer import Tokenizer, load_tokenizer
from engine.tokens.validate import check

log = logging.getLogger(__name__)

#: The validation reason of a completion cut at ``max_tokens`` (finish reason ``length``).
_CUT = "truncated"

_CHUNK = 32  # records per pool task in validate_run
_MIN_GUARD = 50  # records a dataset needs before its failure rate is reported to the guard
_MAX_POOL_REPLACEMENTS = 5  # dead pools replaced per run before live reconstruction is given up


def process(tok: Tokenizer, r: Record) -> tuple:
    """Rebuild and check one record; returns its ``validations`` row (see :mod:`.vstore`)."""
    rec = reconstruct(tok, r)
    s = tok.section
    v = check(rec, r, thinking=tok.thinking, ids=tok.ids, tolerance_tokens=s.billing_tolerance_tokens,
              tolerance_pct=s.billing_tolerance_pct)
    return vstore.make_row(r, rec, v, tok.fingerprint)


_WORKER: Tokenizer | None = None


BACKLOG_QUEUED = 512
"""Records of an earlier process's unvalidated backlog waiting in the pool at once, at most."""


def _init_worker(section_json: dict[str, Any], parent_pid: int | None = None) -> None:
    global _WORKER
    quiet_child(parent_pid)  # terminal signals are the parent's to handle; die with the parent
    _WORKER = load_tokenizer(TokenizerSection.model_validate(section_json))


def _work(records: list[Record]) -> list[tuple]:
    assert _WORKER is not None, "worker not initialised"
    return [process(_WORKER, r) for r in records]


def _work_with(tok: Tokenizer, records: list[Record]) -> list[tuple]:
    return [process(tok, r) for r in records]


def _make_pool(section: TokenizerSection, tok: Tokenizer, workers: int, kind: str) -> cf.Executor:
    """A reconstruction pool: threads, or spawned processes born immune to terminal signals (Ctrl-C
    and a process-group SIGTERM/SIGHUP reach the parent only: see :mod:`engine.proc.childproc`)."""
    if kind == "thread":
        return cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reconstruct")
    with spawn_guard():  # the pool's queues may start the resource tracker
        return cf.ProcessPoolExecutor(max_workers=workers, mp_context=spawn_context(), initializer=_init_worker,
                                      initargs=(section.model_dump(mode="json"), os.getpid()))


def record_from_completion(prompt_id: int, dataset: str, key: str, messages: list[dict[str, Any]],
                           tools: list[dict[str, Any]] | None, completion: Any) -> Record:
    """A :class:`Record` from an ``engine.client.types.Completion`` and its prompt."""
    u = completion.usage
    return Record(prompt_id=prompt_id, dataset=dataset, key=key, messages=list(messages), tools=list(tools or []),
                  reasoning=completion.reasoning, content=completion.content,
                  tool_calls=[t.to_openai() for t in completion.tool_calls], finish_reason=completion.finish_reason,
                  provider=completion.provider, prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
                  reasoning_tokens=u.reasoning_tokens, wire_flags=tuple(completion.flags),
                  token_ids=None if completion.token_ids is None else list(completion.token_ids))


class ReconstructionService:
    """Live reconstruction and validation of results as they are stored.

    Args:
        section: the ``[tokenizer]`` settings.
        run_dir: the run directory (its ``store.sqlite`` must exist: create the store first).
        on_verdict: optional ``(dataset, ok, reasons)`` callback, called on the event loop.
        commit_interval_s: upper bound on seconds between commits of verdict rows.
        checked: ``(tokenizer, start-up description)``: the tokenizer already loaded from ``section``
            that passed :func:`~engine.tokens.startup.startup_check` (the run loads it before ingest,
            which renders every prompt with it); None: :meth:`start` loads and checks it.
    """

    def __init__(self, section: TokenizerSection, run_dir: Path, *,
                 on_verdict: Callable[[str, bool, list[str]], None] | None = None,
                 commit_interval_s: float = 1.0, checked: tuple[Tokenizer, dict[str, Any]] | None = None) -> None:
        self.section = section
        self.run_dir = Path(run_dir)
        self.on_verdict = on_verdict
        self.commit_interval_s = commit_interval_s
        self.tok: Tokenizer | None = checked[0] if checked else None
        self.info: dict[str, Any] = dict(checked[1]) if checked else {}
        self._pool: cf.Executor | None = None
        self._conn: Handle | None = None
        self._rows: list[tuple] = []
        self._pending: set[asyncio.Future] = set()
        self._windows: dict[str, collections.deque] = {}
        self.counts: dict[str, collections.Counter] = {}
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._wlock = asyncio.Lock()
        self._closing = False
        #: reconstructions that raised or could not run.
        self.errors = 0
        #: records left unvalidated (pool dead, or dropped at close): stored; ``datagen validate`` rebuilds them.
        self.skipped = 0
        #: dead pools replaced so far.
        self.replacements = 0
        #: results stored by earlier processes without a verdict, queued by :meth:`start_backlog`.
        self.backlog = 0
        self._backlog_task: asyncio.Task | None = None

    async def start(self) -> dict[str, Any]:
        """Load the tokenizer, run the start-up check, record it in the store, start the pool.

        Returns:
            the start-up description (kind, path, resolved ``special_ids``, fingerprint, traits).

        Raises:
            TokenizerError: the check refused (do not start generation).
            engine.tokens.vstore.NoStoreError: no store in ``run_dir``.
        """
        if self.tok is None:
            self.tok = await asyncio.to_thread(load_tokenizer, self.section)
            self.info = await asyncio.to_thread(startup_check, self.tok)
        self._conn = await asyncio.to_thread(vstore.connect, self.run_dir)
        await asyncio.to_thread(vstore.set_meta, self._conn, "tokenizer",
                                {"section": self.section.model_dump(mode="json"), "info": self.info})
        self._pool = _make_pool(self.section, self.tok, self.section.workers, self.section.executor)
        self._task = asyncio.get_running_loop().create_task(self._committer())
        return self.info

    async def start_backlog(self, max_queued: int = BACKLOG_QUEUED) -> int:
        """Queue the results stored without a verdict before this start (an earlier process stored them
        and was killed, or stopped, before validating them; completions recovered from the stream
        workers' journals at start): each is validated as a live one is. Returns how many; they are
        read and queued by a background task, at most ``max_queued`` records waiting at once (a store
        of thousands left unvalidated is not read into memory at once).

        Raises:
            RuntimeError: before :meth:`start`."""
        if self._task is None or self._conn is None:
            raise RuntimeError("ReconstructionService.start_backlog before start()")
        conn = self._conn
        n = await asyncio.to_thread(vstore.unvalidated_count, conn)
        if not n:
            return 0
        last = await asyncio.to_thread(validations.last_result_id, conn)
        self.backlog = n
        self._backlog_task = asyncio.get_running_loop().create_task(self._queue_backlog(last, max_queued))
        return n

    async def _queue_backlog(self, last_id: int, max_queued: int) -> None:
        """Read the unvalidated results up to prompt id ``last_id`` (those stored before this start)
        in chunks and queue them, keeping at most ``max_queued`` waiting."""
        conn = await asyncio.to_thread(vstore.connect, self.run_dir)  # its own cursor, beside the committer's
        try:
            it = vstore.iter_records(conn, unvalidated_only=True)
            while not self._closing:
                chunk = await asyncio.to_thread(lambda: list(itertools.islice(it, _CHUNK)))
                chunk = [r for r in chunk if r.prompt_id <= last_id]
                if not chunk:
                    return
                for r in chunk:
                    self._enqueue(r.dataset, r, retries=1)
                while len(self._pending) > max_queued and not self._closing:
                    await asyncio.sleep(0.05)
        except Exception as e:  # the rest stays unvalidated: `datagen validate` or an export rebuilds it
            log.warning("reconstruction: the results left unvalidated by an earlier process were not all queued: %s", e)
        finally:
            conn.close()

    def submit(self, prompt_id: int, dataset: str, key: str, messages: list[dict[str, Any]],
               tools: list[dict[str, Any]] | None, completion: Any) -> None:
        """Queue one stored result (an ``engine.client.types.Completion``); returns at once and never
        raises once started: a dead pool is replaced (up to 5 times a run) and the record resubmitted
        once; a record that still cannot be rebuilt stays without a validation row (counted in
        ``skipped``) and is rebuilt later by ``datagen validate`` or an export (``only_missing``)."""
        if self._task is None or self.tok is None:
            raise RuntimeError("ReconstructionService.submit before start()")
        r = record_from_completion(prompt_id, dataset, key, messages, tools, completion)
        self._enqueue(dataset, r, retries=1)

    def _enqueue(self, dataset: str, r: Record, retries: int) -> None:
        pool = self._pool
        try:
            if pool is None:
                raise RuntimeError("live reconstruction stopped")
            loop = asyncio.get_running_loop()
            if self.section.executor == "thread":
                if self.tok is None:
                    raise RuntimeError("ReconstructionService: no tokenizer (submit before start())")
                fut = loop.run_in_executor(pool, _work_with, self.tok, [r])
            else:  # a worker spawned here is born immune to terminal signals (QuietProcess)
                fut = loop.run_in_executor(pool, _work, [r])
        except Exception as e:  # BrokenExecutor, shut down, spawn failure: never lose the result
            if isinstance(e, cf.BrokenExecutor) and retries > 0 and self._replace_pool(pool, e):
                self._enqueue(dataset, r, retries - 1)
            else:
                self._skip(dataset, r, e)
            return
        self._pending.add(fut)
        fut.add_done_callback(partial(self._done, dataset, r, pool, retries))

    def _replace_pool(self, broken: cf.Executor | None, why: BaseException) -> bool:
        """Replace ``broken`` (if still the current pool) by a new one; False when giving up."""
        if self._closing or self.tok is None:
            return False
        if broken is not self._pool:
            return self._pool is not None  # already replaced by another record's failure
        if broken is not None:
            broken.shutdown(wait=False, cancel_futures=True)
        self._pool = None
        if self.replacements >= _MAX_POOL_REPLACEMENTS:
            log.error("reconstruction pool died %d times (last: %s: %s); live reconstruction stopped: results are "
                      "stored and `datagen validate` rebuilds them", self.replacements, type(why).__name__, why)
            return False
        self.replacements += 1
        log.warning("reconstruction pool died (%s: %s); starting a new one (%d/%d)", type(why).__name__, why,
                    self.replacements, _MAX_POOL_REPLACEMENTS)
        try:
            self._pool = _make_pool(self.section, self.tok, self.section.workers, self.section.executor)
        except Exception as e:  # the run goes on without live reconstruction
            log.error("cannot start a new reconstruction pool (%s: %s); results are stored and `datagen validate` "
                      "rebuilds them", type(e).__name__, e)
            return False
        return True

    def _skip(self, dataset: str, r: Record, e: BaseException) -> None:
        self.errors += 1
        self.skipped += 1
        log.error("[%s] reconstruction of %s skipped (%s: %s); the result is stored and `datagen validate` (or an "
                  "export) rebuilds it", dataset, r.key, type(e).__name__, e)

    def _done(self, dataset: str, r: Record, pool: cf.Executor | None, retries: int, fut: asyncio.Future) -> None:
        self._pending.discard(fut)
        if fut.cancelled():
            self.skipped += 1  # shut down before its turn: stays unvalidated
            return
        exc = fut.exception()
        if isinstance(exc, cf.BrokenExecutor):
            if retries > 0 and self._replace_pool(pool, exc):
                self._enqueue(dataset, r, retries - 1)
            else:
                self._skip(dataset, r, exc)
            return
        if exc is not None:
            self.errors += 1
            log.error("[%s] reconstruction failed: %s: %s", dataset, type(exc).__name__, exc)
            return
        for row in fut.result():
            self._rows.append(row)
            ok, reasons = bool(row[5]), json.loads(row[6])
            w = self._windows.setdefault(dataset, collections.deque(maxlen=self.section.failure_window))
            w.append(ok or _CUT in reasons)  # the guard's window: see failure_rate
            c = self.counts.setdefault(dataset, collections.Counter())
            c["validated"] += 1
            c["invalid"] += not ok
            c.update(f"reason:{x}" for x in reasons)
            if self.on_verdict is not None:
                try:
                    self.on_verdict(dataset, ok, reasons)
                except Exception:  # a callback bug must not lose verdicts
                    log.exception("[%s] on_verdict callback failed", dataset)

    def failure_rate(self, dataset: str) -> float | None:
        """Share of invalid records among the dataset's last ``failure_window`` validated records
        (None before ``min(50, failure_window)`` records), not counting records cut at ``max_tokens``
        (``truncated``, whatever else a cut causes): a cut is the config's choice, not an anomaly of the
        tokenizer, the template or the provider, and cut records come last in a dataset (the longest
        completions finish last), so a window over its tail would pause every dataset near its end.
        They stay invalid (left out of exports) and are counted by ``datagen validate``."""
        w = self._windows.get(dataset)
        if not w or len(w) < min(_MIN_GUARD, self.section.failure_window):
            return None
        return 1.0 - sum(w) / len(w)

    def guard(self, dataset: str) -> str | None:
        """A pause reason when the dataset's failure rate passes ``max_failure_rate``, else None."""
        rate = self.failure_rate(dataset)
        limit = self.section.max_failure_rate
        if rate is None or limit <= 0 or rate <= limit:
            return None
        c = self.counts.get(dataset, collections.Counter())
        top = ", ".join(f"{k[7:]} {n}" for k, n in c.most_common() if k.startswith("reason:"))[:200]
        return (f"validation failures {rate:.0%} of the last {len(self._windows[dataset])} records "
                f"(> {limit:.0%}): {top}")

    async def flush(self) -> int:
        """Commit queued verdict rows now; returns how many."""
        async with self._wlock:
            rows, self._rows = self._rows, []
            if rows:
                try:
                    if self._conn is None:
                        raise RuntimeError("ReconstructionService.flush before start() or after close()")
                    await asyncio.to_thread(vstore.upsert, self._conn, rows)
                except Exception:
                    self._rows[:0] = rows  # kept for the next commit
                    raise
            return len(rows)

    async def _committer(self) -> None:
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.commit_interval_s)
            except TimeoutError:
                pass
            try:
                await self.flush()
            except Exception as e:  # retried at the next tick
                log.error("validations commit failed (will retry): %s", e)

    async def close(self, timeout_s: float | None = None) -> None:
        """Wait for queued work (at most ``timeout_s`` seconds; None: all of it), commit it, stop the
        pool and close the connection. Work still queued at the limit is dropped: those results are
        stored and stay unvalidated until ``datagen validate`` or an export rebuilds them."""
        self._closing = True
        if self._backlog_task is not None:
            await asyncio.gather(self._backlog_task, return_exceptions=True)
        if self._pending:
            _, late = await asyncio.wait(list(self._pending), timeout=timeout_s)
            if late:
                log.warning("reconstruction: %d queued record(s) left for `datagen validate` (run stopping)", len(late))
        self._stop.set()
        if self._task is not None:
            await self._task
        if self._conn is not None:
            await self.flush()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _chunks(it: Iterable[Record], n: int) -> Iterable[list[Record]]:
    buf: list[Record] = []
    for r in it:
        buf.append(r)
        if len(buf) >= n:
            yield buf
            buf = []
    if buf:
        yield buf


def validate_run(run_dir: Path, section: TokenizerSection, *, workers: int | None = None, only_missing: bool = False,
                 progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Rebuild and check every stored result of ``run_dir`` (``datagen validate``).

    Args:
        run_dir: a run directory.
        section: the ``[tokenizer]`` settings to use (from ``--config`` or ``meta['tokenizer']``).
        workers: processes (default ``section.workers``; 1 = in this process).
        only_missing: only results without a validation row (exports use this).
        progress: called with the number of records done so far, after each chunk.

    Returns:
        the report of :func:`engine.tokens.report.summarize` with ``tokenizer`` (start-up info).

    Raises:
        TokenizerError: the start-up check refused the tokenizer.
        engine.tokens.vstore.NoStoreError: not a run directory.
    """
    tok = load_tokenizer(section)
    info = startup_check(tok)
    conn = vstore.connect(run_dir)
    try:
        vstore.set_meta(conn, "tokenizer_validate", {"section": section.model_dump(mode="json"), "info": info,
                                                     "at": time.time()})
        records = vstore.iter_records(conn, unvalidated_only=only_missing)
        n = workers or section.workers
        done = 0

        def commit(rows: list[tuple]) -> None:
            nonlocal done
            vstore.upsert(conn, rows)
            done += len(rows)
            if progress:
                progress(done)

        if n <= 1:
            for chunk in _chunks(records, _CHUNK):
                commit([process(tok, r) for r in chunk])
        else:
            pool = _make_pool(section, tok, n, "process")
            try:
                inflight: collections.deque[cf.Future] = collections.deque()
                for chunk in _chunks(records, _CHUNK):
                    inflight.append(pool.submit(_work, chunk))
                    if len(inflight) >= 4 * n:  # bounded: results are committed in order
                        commit(inflight.popleft().result())
                while inflight:
                    commit(inflight.popleft().result())
            finally:  # Ctrl-C: the workers ignore it; queued chunks are dropped, committed ones stay
                pool.shutdown(wait=True, cancel_futures=True)
        doc = summarize(conn)
    finally:
        conn.close()
    doc["tokenizer"] = info
    return doc


def section_for_run(run_dir: Path, config: Path | str | None = None) -> TokenizerSection | None:
    """The ``[tokenizer]`` settings for ``run_dir``: from ``config`` when given, else the one of the
    last ``datagen validate`` (``meta['tokenizer_validate']``: a fix applied once stays applied),
    else the section the live run stored (``meta['tokenizer']``); None if there is none.

    Raises:
        engine.config.ConfigError: ``config`` is invalid or has no ``[tokenizer]`` section.
        engine.tokens.vstore.NoStoreError: not a run directory.
    """
    if config is not None:
        from engine.config import ConfigError, load_config

        cfg = load_config(config, check_files=False)
        if cfg.tokenizer is None:
            raise ConfigError(f"{config}: no [tokenizer] section (it names the target's tokenizer)")
        return cfg.tokenizer
    conn = vstore.connect(run_dir)
    try:
        for key in ("tokenizer_validate", "tokenizer"):
            v = vstore.get_meta(conn, key)
            if v and v.get("section"):
                return TokenizerSection.model_validate(v["section"])
    finally:
        conn.close()
    return None
