"""The extraction worker's shard writer: a background thread writing shards in order, each committed with
its fidelity score lines, waiting for disk space (split from :mod:`engine.extract.worker`)."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

from engine.errors import DatagenError
from engine.extract import scorefiles
from engine.extract.disk import DiskGuard
from engine.extract.shards import OutDir
from engine.extract.snapshot import WorkerState
from engine.extract.status import StatusWriter


class Stopped(DatagenError):
    """The worker was asked to stop (signal or stop event)."""


class ShardWriter:
    """Background thread writing shards in order; ``submit`` blocks while ``depth`` shards wait.

    Errors in the thread are re-raised by the next :meth:`submit` or by :meth:`close`. ``poll`` is
    called about every 0.5 s while the caller waits in :meth:`submit` or :meth:`flush` (the worker's
    :meth:`Gate.aborting`, so an abort reaches a writer waiting for disk space). ``scores``: where a
    shard's fidelity score lines go, committed with it (:mod:`engine.extract.scorefiles`).
    """

    def __init__(self, out: OutDir, guard: DiskGuard, status: StatusWriter, stop: threading.Event, depth: int = 1,
                 poll: Callable[[], Any] | None = None, scores: scorefiles.ScoreFiles | None = None) -> None:
        self.out, self.guard, self.status, self.stop = out, guard, status, stop
        self.poll = poll
        self.scores = scores
        self.q: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.write_s = 0.0
        self.bytes = 0
        self.samples = 0
        self.tokens = 0
        self.thread = threading.Thread(target=self._run, name="shard-writer", daemon=True)
        self.thread.start()

    def submit(self, tensors: dict[str, Any], entries: list[dict[str, Any]], est_bytes: int, tokens: int,
               ready: Any = None, scores: list[dict[str, Any]] | None = None) -> None:
        """Queue one shard. ``ready``: a CUDA event to wait on before reading ``tensors``; ``scores``: its
        samples' fidelity score lines (None: not scored)."""
        self._raise()
        while True:
            try:
                self.q.put((tensors, entries, est_bytes, tokens, ready, scores), timeout=0.5)
                return
            except queue.Full:
                self._raise()
                if self.poll is not None:
                    self.poll()

    def flush(self) -> None:
        """Wait until every queued shard is written (or dropped after a stop); re-raise the thread's error."""
        while True:
            with self.q.all_tasks_done:
                if not self.q.unfinished_tasks:
                    break
                self.q.all_tasks_done.wait(0.5)
            if self.poll is not None:
                self.poll()
        self._raise()

    def close(self) -> None:
        """Write everything queued, stop the thread, re-raise its error."""
        self.q.put(None)
        self.thread.join()
        self._raise()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        while True:
            item = self.q.get()
            try:
                if item is None:
                    return
                if self.error is not None or self.stop.is_set():
                    continue  # after a failure or an abort: drop without writing
                try:
                    self._write(*item)
                except BaseException as e:  # handed to the main thread
                    self.error = e
            finally:
                self.q.task_done()

    def _write(self, tensors: dict[str, Any], entries: list[dict[str, Any]], est_bytes: int, tokens: int, ready: Any,
               scores: list[dict[str, Any]] | None = None) -> None:
        if ready is not None:
            ready.synchronize()
        while True:
            ok = self.guard.wait_for_space(est_bytes, lambda r: self.status.set_state(WorkerState.PAUSED, r),
                                           lambda: self.status.set_state(WorkerState.RUNNING), self.stop)
            if not ok:
                raise Stopped("stopped while paused for disk space")
            t0 = time.perf_counter()
            ref = None
            try:
                if scores is not None and self.scores is not None:  # durable before the commit that lists it
                    ref = self.scores.write(scores)
                    for entry in entries:
                        entry[scorefiles.MANIFEST_KEY] = ref
                size = self.out.layout.write(self.out, tensors, entries)  # temp file(s), fsync, commit
            except BaseException as e:
                if ref is not None:  # the batch is not listed: neither is its score file
                    self.scores.discard(ref)  # type: ignore[union-attr]
                    for entry in entries:
                        entry.pop(scorefiles.MANIFEST_KEY, None)
                if not isinstance(e, OSError):
                    raise
                if e.errno == 28:  # ENOSPC despite the guard (another writer on the disk): wait, retry
                    self.status.set_state(WorkerState.PAUSED, f"disk full while writing a shard: {e.strerror}; waiting")
                    if self.stop.wait(10.0):
                        raise Stopped("stopped while paused for disk space") from None
                    continue
                raise
            self.write_s += time.perf_counter() - t0
            self.guard.note_written(size)
            self.bytes += size
            self.samples += len(entries)
            self.tokens += tokens
            per: dict[str, tuple[int, int]] = {}
            for entry in entries:
                ns, nt = per.get(entry["dataset"], (0, 0))
                per[entry["dataset"]] = (ns + 1, nt + int(entry["length"]))
            self.status.add_done(len(entries), tokens, size, per)
            return
