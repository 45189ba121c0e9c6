"""The run's side of the stream workers: requests out, results and batched progress in.

:class:`StreamWorkerPool` starts ``[run] stream_workers`` processes (:mod:`engine.stream.worker`),
each connected by a socket pair, and offers the one call the scheduler makes of a client,
``complete(req, progress) -> Completion`` (:class:`engine.run.seams.CompleteFn`), plus
``send(endpoint_index, req, progress)`` for several endpoints (:class:`engine.client.fleet.EndpointFleet`).

- A request goes to the live worker with the fewest requests in flight. The caller's
  :class:`~engine.client.accumulate.StreamProgress` is updated from the worker's batched progress
  (every 100 ms), so budgets, censored lengths and the dollars in flight read it as before.
- :meth:`StreamWorkerPool.hold` (the run paused, datasets paused or skipped: the scheduler calls it
  in the same step that flips the state) reaches every worker at once: each cuts the requests it
  covers whose bytes have not started to go out and answers them ``unsent``, which :meth:`send`
  raises as :class:`~engine.stream.wire.StreamHeld` (the run returns the prompt to pending, no
  attempt counted); while it holds, :meth:`send` refuses the requests it covers before any frame.
  Each heartbeat says how many requests wait unsent in the worker (:attr:`WorkerFigures.unsent`).
- Cancelling the awaiting task (abort, skip with abort, a drain's deadline) sends ``cancel``: the
  worker closes that stream's connection at once and answers ``gone``. The task waits for that
  answer (up to :data:`CANCEL_WAIT_S`): a completion that finished before the cancel reached the
  worker (already received, or waiting for its journal's group commit) is returned instead, and the
  cancellation withdrawn, so a paid completion is stored, never bought again.
- A worker that dies (its socket ends): its requests whose completion is already in its journal
  are answered from the journal; the others raise :class:`~engine.stream.wire.StreamWorkerLost`
  with the tokens they had received (the run returns them to pending and counts that spend); a new
  worker takes the slot; ``on_event`` hears one line of it.
- A worker that stops answering (its heartbeat, every second, not heard for
  :data:`~engine.stream.liveness.SILENT_S`: ``SIGSTOP``, a debugger, swapped out) is shown frozen in
  the figures and gets no new request; ``on_event`` hears one warning per silence and one line when
  it answers again. Its streams are left to it (:mod:`engine.stream.liveness`).
- Journal files carry their worker's slot and process id: :meth:`StreamWorkerPool.owns` names the
  files of this pool's workers (recovery at start leaves them alone) and
  :meth:`StreamWorkerPool.is_open_segment` the segment each running worker may still write (pruning
  leaves it alone), from the moment the process exists.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from engine.client.accumulate import StreamProgress
from engine.client.aiochoice import stream_backend
from engine.client.types import ChatRequest, Completion, ErrorClass
from engine.stream import journal
from engine.stream.figures import PoolFigures, WorkerFigures
from engine.stream.hold import Hold
from engine.stream.procs import (
    WorkerProc,
    WorkersNotStarted,
    default_stream_workers,
    journaled,
    open_segment,
    owned,
    start_process,
)
from engine.stream.watch import THAW_HEARTBEATS, WorkerWatch
from engine.stream.wire import StreamHeld, StreamWorkerLost, WorkerInit, error_from_fields, read_frame

log = logging.getLogger(__name__)

#: Seconds a new worker may take to start (interpreter, imports) before the run gives up on it.
START_TIMEOUT_S = 60.0
#: Seconds a closing worker may take to cancel its streams and exit before it is killed.
CLOSE_TIMEOUT_S = 5.0

#: Seconds a cancelled request waits for its worker's answer (``gone``, or the completion that
#: finished before the cancel arrived) before it gives up on it.
CANCEL_WAIT_S = 5.0

#: ``on_event(level, message)``: a worker died, was replaced, or could not start.
OnEvent = Callable[[str, str], None]


class _Req:
    __slots__ = ("fut", "progress", "worker")

    def __init__(self, fut: asyncio.Future, progress: StreamProgress, worker: "WorkerProc") -> None:
        self.fut = fut
        self.progress = progress
        self.worker = worker


class StreamWorkerPool:
    """``workers`` stream-worker processes serving one run.

    Args:
        workers: how many processes (``[run] stream_workers``, >= 1).
        endpoints: API roots by index (one ``base_url``, or ``[provider] base_urls``).
        api_key: the provider key (None: none), handed to each worker in its first frame.
        client: keyword arguments of :class:`~engine.client.chat.ChatClient` for each endpoint in each
            worker (``max_connections`` is divided among the workers).
        run_dir: the run directory: journals under ``journal/`` and the workers' stderr in
            ``stream-workers.log``. None: no journal (tests of the pool alone).
        on_event: hears a worker's death and replacement (``level``, message).
        progress_s: seconds between a worker's batched progress messages.
    """

    def __init__(self, workers: int, endpoints: list[str], api_key: str | None, client: dict[str, Any], *,
                 run_dir: Path | None = None, on_event: OnEvent | None = None, progress_s: float = 0.1) -> None:
        if workers < 1:
            raise ValueError("stream_workers must be >= 1")
        self.n = workers
        self.endpoints = tuple(endpoints)
        self._key = api_key
        conns = int(client.get("max_connections", 4096))
        self._client = {**client, "max_connections": max(16, -(-conns // workers) + 16)}
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self._on_event = on_event
        self._progress_s = progress_s
        self._workers = [WorkerProc(i) for i in range(workers)]
        self._reqs: dict[int, _Req] = {}
        self._rids = itertools.count(1)
        self._ready = asyncio.Event()
        self._closing = False
        self.restarts = 0
        self.lost_requests = 0
        self.recovered = 0
        self.late_results = 0
        self._respawns: set[asyncio.Task] = set()
        self._pids: set[int] = set()  # every worker process this pool started
        self._watcher: asyncio.Task | None = None
        self._watch = WorkerWatch(lambda: self._workers, self._emit)
        self._hold = Hold()
        #: requests answered ``unsent`` (held before their first byte left), since start.
        self.held_back = 0
        #: the most requests one worker had waiting unsent, at any moment between two of its heartbeats.
        self.unsent_peak = 0

    def __repr__(self) -> str:
        return f"StreamWorkerPool(workers={self.n}, endpoints={self.endpoints!r})"

    @property
    def journal_dir(self) -> Path | None:
        """``RUN_DIR/journal`` (None without a run directory)."""
        return journal.journal_dir(self.run_dir) if self.run_dir is not None else None

    # ---- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Start every worker and wait until each is ready.

        Raises:
            WorkersNotStarted: (a RuntimeError) a worker did not start within :data:`START_TIMEOUT_S` (its stderr is in
                ``RUN_DIR/stream-workers.log``), or ``DATAGEN_STREAM_HTTP`` names no usable library.
        """
        try:
            stream_backend()  # what each worker will read: a bad DATAGEN_STREAM_HTTP is named here, not in its log
        except ValueError as e:
            raise WorkersNotStarted(f"stream workers not started: {e}") from None
        await asyncio.gather(*(self._spawn(w) for w in self._workers))
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch.loop(), name="stream-worker-liveness")

    async def _spawn(self, w: WorkerProc) -> None:
        w.proc, ours = start_process(self.run_dir)
        w.pid = w.proc.pid  # its journal's names, known before it opens them (it is this process)
        self._pids.add(w.pid)
        w.reader, w.writer = await asyncio.open_connection(sock=ours, limit=2 ** 22)
        w.send(("init", WorkerInit(slot=w.slot, endpoints=self.endpoints, api_key=self._key, client=self._client,
                                   journal_dir=str(self.run_dir) if self.run_dir is not None else "",
                                   progress_s=self._progress_s)))
        if self._hold:
            w.send(("hold", self._hold))
        try:
            msg = await asyncio.wait_for(read_frame(w.reader), START_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as e:
            w.proc.kill()
            raise WorkersNotStarted(f"stream worker {w.slot} did not start ({type(e).__name__}); see "
                               f"{self.run_dir / 'stream-workers.log' if self.run_dir else 'its stderr'}") from None
        w.pid = int(msg[1])
        self._pids.add(w.pid)
        w.heard = time.monotonic()
        w.alive = True
        w.task = asyncio.create_task(self._read(w), name=f"stream-worker-{w.slot}")
        self._ready.set()

    async def aclose(self) -> None:
        """Close every worker (each cancels its streams and exits; killed after :data:`CLOSE_TIMEOUT_S`);
        requests still waiting raise :class:`StreamWorkerLost`."""
        self._closing = True
        for t in list(self._respawns):
            t.cancel()
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        for w in self._workers:
            w.send(("close",))
        for w in self._workers:
            if w.proc is not None:
                try:
                    await asyncio.wait_for(asyncio.to_thread(w.proc.wait), CLOSE_TIMEOUT_S)
                except TimeoutError:
                    w.proc.kill()
                    await asyncio.to_thread(w.proc.wait)
            if w.task is not None:
                w.task.cancel()
                await asyncio.gather(w.task, return_exceptions=True)
            if w.writer is not None:
                w.writer.close()
            w.alive = False
        for r in list(self._reqs.values()):
            if not r.fut.done():
                r.fut.set_exception(StreamWorkerLost(ErrorClass.DISCONNECT, "the run closed its stream workers"))
        self._reqs.clear()
        log.info("stream workers: %d request(s) held back unsent by a pause or skip; at most %d request(s) waited "
                 "unsent in one worker", self.held_back, self.unsent_peak)

    # ---- holds -------------------------------------------------------------------------------
    def hold(self, run: bool, datasets: Iterable[str] = ()) -> None:
        """Set the hold state: ``run`` True holds every request (the run is paused or stopping),
        ``datasets`` those of the datasets named (paused, skipped, budget met); ``hold(False)`` releases.

        Sent to every worker now (one frame each, written before this returns): each cuts the
        requests it covers whose bytes have not started to go out, and their :meth:`send` raises
        :class:`StreamHeld`; requests already sending go on. New workers get it with their init."""
        state = Hold(bool(run), frozenset(datasets))
        if state == self._hold:
            return
        self._hold = state
        for w in self._workers:
            w.send(("hold", state))

    # ---- requests ----------------------------------------------------------------------------
    async def complete(self, req: ChatRequest, progress: StreamProgress | None = None) -> Completion:
        """ONE attempt of ``req`` on the first endpoint (:class:`engine.run.seams.CompleteFn`); see :meth:`send`."""
        return await self.send(0, req, progress)

    async def send(self, endpoint: int, req: ChatRequest, progress: StreamProgress | None = None) -> Completion:
        """ONE attempt of ``req`` on endpoint ``endpoint``, in the least-loaded worker.

        Raises:
            RequestError: the attempt's error, as the client raised it in the worker.
            StreamWorkerLost: the worker died with the request open (the completion was not journaled).
            StreamHeld: the hold (:meth:`hold`) covers it: refused here, or cut in the worker before its
                first byte left; nothing reached the provider.
            asyncio.CancelledError: cancelled; the worker closes the stream.
        """
        if progress is None:
            progress = StreamProgress()
        else:
            progress.reset()
        if self._hold.covers(req):
            raise StreamHeld("held before it was handed to a stream worker")
        w = await self._pick()
        rid = next(self._rids)
        fut = asyncio.get_running_loop().create_future()
        self._reqs[rid] = _Req(fut, progress, w)
        w.in_flight.add(rid)
        w.send(("req", rid, endpoint, req))
        try:
            return await asyncio.shield(fut)  # a cancellation of the caller leaves `fut` to its answer
        except asyncio.CancelledError:
            c = await self._cancel(rid, w, fut)
            if c is None:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # the stream finished before it was cut: its completion is the answer
            return c
        finally:
            w.in_flight.discard(rid)

    async def _cancel(self, rid: int, w: "WorkerProc", fut: asyncio.Future) -> Completion | None:
        """Cut request ``rid`` (its caller was cancelled): the completion when it finished before the
        cut (received already, or answered by the worker to the ``cancel``); None when it was cut."""
        if self._reqs.get(rid) is not None and not fut.done():
            w.send(("cancel", rid))
            await asyncio.wait({fut}, timeout=CANCEL_WAIT_S)  # `gone`, `done`, `err`, or the worker's death
        self._reqs.pop(rid, None)
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            return fut.result()
        if not fut.done():
            fut.cancel()
        return None

    async def _pick(self) -> WorkerProc:
        while True:
            live = [w for w in self._workers if w.alive]
            if live:  # a frozen worker only when every live one is
                return min(live, key=lambda w: (w.frozen, len(w.in_flight)))
            if self._closing:
                raise StreamWorkerLost(ErrorClass.DISCONNECT, "the run is closing its stream workers")
            self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), START_TIMEOUT_S)
            except TimeoutError:
                raise StreamWorkerLost(ErrorClass.DISCONNECT, "no stream worker is running") from None

    # ---- the socket --------------------------------------------------------------------------
    async def _read(self, w: WorkerProc) -> None:
        reqs = self._reqs
        assert w.reader is not None
        try:
            while True:
                msg = await read_frame(w.reader)
                self._watch.heard(w)  # a frozen worker gets requests again at once
                verb = msg[0]
                if verb == "hb":
                    self._watch.heartbeat(w, float(msg[1]))
                    if len(msg) > 3:
                        w.unsent = int(msg[2])
                        self.unsent_peak = max(self.unsent_peak, int(msg[3]))
                elif verb == "prog":
                    for rid, chars, status, gid, provider, cost in msg[1]:
                        r = reqs.get(rid)
                        if r is not None:
                            p = r.progress
                            p.chars_received, p.status, p.generation_id, p.provider, p.cost_usd = (
                                chars, status, gid, provider, cost)
                elif verb == "done":
                    r = reqs.pop(msg[1], None)
                    if r is None:
                        self.late_results += 1  # answered after its cancel gave up waiting: kept in the journal (recovered at start)
                    elif not r.fut.done():
                        _finished(r.progress, msg[2])
                        r.fut.set_result(msg[2])
                elif verb == "err":
                    r = reqs.pop(msg[1], None)
                    if r is not None and not r.fut.done():
                        r.fut.set_exception(error_from_fields(msg[2]))
                elif verb == "unsent":  # held before its first byte left (a hold, or a req under one)
                    r = reqs.pop(msg[1], None)
                    self.held_back += 1
                    if r is not None and not r.fut.done():
                        r.fut.set_exception(StreamHeld("held in the stream worker before it was sent"))
                elif verb == "gone":  # the worker cut the stream (its answer to a cancel)
                    r = reqs.pop(msg[1], None)
                    if r is not None and not r.fut.done():
                        r.fut.cancel()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, EOFError):
            pass
        except asyncio.CancelledError:
            raise
        if not self._closing:
            await self._lost(w)

    async def _lost(self, w: WorkerProc) -> None:
        """Worker ``w`` is gone: answer its requests from its journal or with :class:`StreamWorkerLost`, replace it."""
        w.alive = False
        if w.writer is not None:
            w.writer.close()
        code = None
        if w.proc is not None:
            try:
                code = await asyncio.wait_for(asyncio.to_thread(w.proc.wait), CLOSE_TIMEOUT_S)
            except TimeoutError:
                w.proc.kill()
                code = await asyncio.to_thread(w.proc.wait)
        how = (f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}")
        open_rids = [rid for rid, r in self._reqs.items() if r.worker is w]
        found: dict[int, Completion] = {}
        jdir = self.journal_dir
        if jdir is not None and open_rids:
            found = await asyncio.to_thread(journaled, jdir, f"w{w.slot}-{w.pid}-", set(open_rids))
        lost = 0
        for rid in open_rids:
            r = self._reqs.pop(rid, None)
            if r is None or r.fut.done():
                continue
            if rid in found:
                r.fut.set_result(found[rid])
                self.recovered += 1
            else:
                lost += 1
                p = r.progress
                r.fut.set_exception(StreamWorkerLost(
                    ErrorClass.DISCONNECT, f"stream worker {w.slot} (pid {w.pid}) died ({how}) with this stream open",
                    status=p.status, provider=p.provider, generation_id=p.generation_id,
                    tokens_received=p.tokens_received, partial_cost_usd=p.cost_usd))
        self.lost_requests += lost
        if jdir is not None:
            journal.remove_ledgers(jdir, f"inflight-w{w.slot}-{w.pid}.")  # its open streams are accounted now
        w.in_flight.clear()
        msg = (f"stream worker {w.slot} (pid {w.pid}) died ({how}): {lost} in-flight request(s) returned to pending "
               f"with their streamed spend counted, {len(found)} completion(s) recovered from its journal")
        if self._closing:
            return
        self.restarts += 1
        t = asyncio.create_task(self._respawn(w, msg))
        self._respawns.add(t)
        t.add_done_callback(self._respawns.discard)

    async def _respawn(self, w: WorkerProc, msg: str) -> None:
        fresh = WorkerProc(w.slot)
        self._workers[w.slot] = fresh
        try:
            await self._spawn(fresh)
        except Exception as e:  # the other workers go on; reported
            self._emit("error", f"{msg}; a new worker could not start: {e}")
            return
        self._emit("warning", f"{msg}; a new worker (pid {fresh.pid}) took its place")

    def _emit(self, level: str, msg: str) -> None:
        if self._on_event is not None:  # the run records and logs it (once)
            self._on_event(level, msg)
        else:
            getattr(log, level if level in ("warning", "error") else "info")("%s", msg)

    def owns(self, path: Path) -> bool:
        """Whether journal file ``path`` (a segment or a ledger) is one of a worker this pool started
        (recovery at start leaves those alone: :mod:`engine.stream.recover`)."""
        return owned(path, self._pids)

    def is_open_segment(self, path: Path) -> bool:
        """Whether journal segment ``path`` may still be written (:func:`engine.stream.procs.open_segment`)."""
        return open_segment(path, self._workers)

    # ---- figures -----------------------------------------------------------------------------
    def figures(self) -> PoolFigures:
        """The pool's figures now."""
        now = time.monotonic()
        ws = tuple(WorkerFigures(w.slot, w.pid, w.alive, len(w.in_flight), w.alive and w.frozen,
                                 round(now - w.heard, 1) if w.alive and w.frozen else 0.0, w.unsent if w.alive else 0)
                   for w in self._workers)
        return PoolFigures(self.n, sum(1 for w in ws if w.alive), self.restarts, self.lost_requests, self.recovered, ws,
                           frozen=sum(1 for w in ws if w.frozen), held_back=self.held_back,
                           unsent_peak=self.unsent_peak)


def _finished(p: StreamProgress, c: Completion) -> None:
    """The caller's progress as of the end of the stream (a stream shorter than one progress batch
    never had one): what it received, its generation id and provider."""
    p.chars_received = len(c.reasoning) + len(c.content) + sum(len(t.arguments) for t in c.tool_calls)
    p.status = p.status or 200
    p.generation_id = c.generation_id or p.generation_id
    p.provider = c.provider or p.provider
    if c.usage.cost_usd is not None:
        p.cost_usd = c.usage.cost_usd


__all__ = ["THAW_HEARTBEATS", "PoolFigures", "StreamWorkerPool", "WorkerFigures", "default_stream_workers"]
