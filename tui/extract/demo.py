"""Extraction states without an engine: a fixed snapshot (snapshot tests, docs/extraction.md screenshot) and a
scripted job that moves with the clock and obeys the keys (``python -m tui.extract --demo``).

Figures are Kimi-K2.5-like: hidden size 7168, three auxiliary layers plus the last, bf16, so one
token costs 4 x 7168 x 2 = 57,344 bytes of hidden states.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

from engine.api import DatasetExtractView, ExtractSnapshot, GpuRow, JobState, WorkerState, WorkerView
from tui.extract.cells import FINAL_STATES

GPU_NAME = "NVIDIA H200"
GPU_MEM = 143_771 * 2**20
"""An H200's memory as NVML reports it (bytes)."""
BYTES_PER_TOKEN = 4 * 7168 * 2
"""Hidden-state bytes per token: 4 layers x hidden size 7168 x 2 bytes (bf16)."""


def fixed_extract_snapshot() -> ExtractSnapshot:
    """A literal mid-job state on 8 GPUs: seven workers running, worker 5 restarting after an
    out-of-memory error, one dataset done, one running, one skipped (its samples left out of the totals);
    the workers' figures add up to the datasets'; disk comfortably above its margin."""
    errors = {5: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB (GPU 5; 139.8 GiB total)"}
    workers = []
    for r in range(8):
        restarting = r == 5
        workers.append(WorkerView(
            rank=r, state=WorkerState.RESTARTING if restarting else WorkerState.RUNNING, host="gpu-node-1", pid=41000 + r, gpus=(r,),
            samples_done=1228 + (r == 0), samples_total=1234 + (r < 3), tokens_done=2_175_000 + 5_000 * r,
            tokens_total=2_216_250, tokens_per_s=0.0 if restarting else 11_800.0 + 120 * r,
            batch_size=0 if restarting else 16, max_len=0 if restarting else 4096,
            bytes_written=(2_175_000 + 5_000 * r) * BYTES_PER_TOKEN, last_error=errors.get(r, ""),
            restarts=1 if restarting else 0))
    gpus = tuple(
        GpuRow(index=i, name=GPU_NAME, util_pct=3.0 if i == 5 else 91.0 + i % 4, mem_used_bytes=(
            2 * 2**30 if i == 5 else (118 + i) * 2**30), mem_total_bytes=GPU_MEM, temp_c=41.0 if i == 5 else 66.0 + i,
            power_w=118.0 if i == 5 else 640.0 + 5 * i, power_limit_w=700.0, worker=i)
        for i in range(8))
    datasets = (
        DatasetExtractView("b3_oss_instruct", 75, 75, 90_000, 90_000),
        DatasetExtractView("b7_sharegpt", 9_750, 9_800, 17_450_000, 17_640_000),
        DatasetExtractView("b1_glaive", 0, 500, 0, 450_000, skipped=True),
    )
    done = sum(w.tokens_done for w in workers)
    return ExtractSnapshot(
        state=JobState.RUNNING, out_dir="/data/hs/kimi-k2.5", model="moonshotai/Kimi-K2.5", elapsed_s=1840.0,
        samples_done=sum(w.samples_done for w in workers), samples_total=9_875, tokens_done=done,
        tokens_total=17_730_000, tokens_per_s=82_900.0, eta_s=2.3,
        bytes_written=done * BYTES_PER_TOKEN, bytes_projected=17_730_000 * BYTES_PER_TOKEN,
        disk_free_bytes=6_400_000_000_000, disk_margin_bytes=200_000_000_000, workers=tuple(workers),
        datasets=datasets, gpus=gpus, states_dtype="bf16",
        events=(
            "12:00:02 INFO    extraction started: 8 workers on gpu-node-1, 10,375 samples, 18.2M tokens",
            "12:00:41 INFO    [b3_oss_instruct] done: 75 samples, 90k tokens",
            "12:21:13 INFO    [b1_glaive] skipped by user",
            "12:30:17 ERROR   worker 5 failed: torch.OutOfMemoryError: CUDA out of memory",
            "12:30:18 WARNING worker 5 restarting (1st restart)",
        ),
    )


class DemoExtraction:
    """A scripted extraction on 8 GPUs that is both an :class:`~tui.extract.host.ExtractHost` and its
    :class:`~engine.extract.snapshot.ExtractCommands`: progress follows ``clock`` (seconds), pause
    stops it, skip drops a dataset, quit drains for ``drain_s`` seconds then stops (again: stops now).
    Worker 5 fails with an out-of-memory error ``fail_at_s`` seconds in and restarts 5 s later.

    Args:
        clock: monotonic seconds (tests pass a fake).
        tokens_per_s: the job's speed (tokens per second, all workers together).
        fail_at_s: when worker 5 fails (None: never).
        drain_s: seconds a drain takes.
    """

    N = 8

    def __init__(self, clock: Callable[[], float] = time.monotonic, tokens_per_s: float = 400_000.0,
                 fail_at_s: float | None = 20.0, drain_s: float = 3.0) -> None:
        self.clock = clock
        self.rate = tokens_per_s
        self.fail_at_s = fail_at_s
        self.drain_s = drain_s
        self.t0 = self.last = clock()
        self.elapsed = 0.0
        self.state = JobState.RUNNING
        self.quit_mode: str | None = None
        self.drain_left = 0.0
        # name, samples, tokens per sample
        self.plan = [("b3_oss_instruct", 75, 1200), ("b7_sharegpt", 9800, 1800), ("b1_glaive", 500, 900)]
        self.tokens = {n: 0.0 for n, _, _ in self.plan}
        self.skipped: set[str] = set()
        self.events: list[str] = [self._line("INFO", f"extraction started: {self.N} workers, "
                                             f"{sum(s for _, s, _ in self.plan):,} samples")]
        self.failed_logged = False

    @property
    def commands(self) -> "DemoExtraction":
        """Itself: the demo obeys its own commands."""
        return self

    def _line(self, level: str, text: str) -> str:
        s = int(self.elapsed)
        return f"00:{s // 60:02d}:{s % 60:02d} {level:<7} {text}"

    # ---- commands ---------------------------------------------------------------------------
    def pause(self) -> str:
        """Pause (only while running)."""
        if self.state != JobState.RUNNING:
            return f"extraction is {self.state}: nothing to pause"
        self.state = JobState.PAUSED
        self.events.append(self._line("INFO", "extraction paused by user"))
        return "extraction paused: workers wrote the batch in hand"

    def resume(self) -> str:
        """Resume a paused job."""
        if self.state != JobState.PAUSED:
            return f"extraction is {self.state}: nothing to resume"
        self.state = JobState.RUNNING
        self.events.append(self._line("INFO", "extraction resumed"))
        return "extraction resumed"

    def skip(self, dataset: str) -> str:
        """Skip ``dataset``.

        Raises:
            ValueError: unknown ``dataset``, naming the valid ones.
        """
        names = [n for n, _, _ in self.plan]
        if dataset not in names:
            raise ValueError(f"unknown dataset {dataset!r}; the datasets are: {', '.join(names)}")
        self.skipped.add(dataset)
        self.events.append(self._line("INFO", f"[{dataset}] skipped by user"))
        return f"{dataset} skipped: no more batches of it"

    def quit(self) -> str:
        """Drain, or abort when already draining."""
        if self.quit_mode is None and self.state not in FINAL_STATES:
            self.quit_mode, self.state, self.drain_left = "drain", JobState.DRAINING, self.drain_s
            self.events.append(self._line("WARNING", "quit: draining (finish batches in hand, flush shards)"))
            return "draining: workers finish the batches in hand and flush shards; quit again to abort"
        self.quit_mode, self.state = "abort", JobState.STOPPED
        self.events.append(self._line("WARNING", "quit again: aborted after the current write"))
        return "aborting after the current write"

    # ---- the job ----------------------------------------------------------------------------
    def _advance(self) -> None:
        now = self.clock()
        dt, self.last = max(now - self.last, 0.0), now
        if self.state in FINAL_STATES:
            return
        self.elapsed += dt
        if self.state == JobState.DRAINING:
            self.drain_left -= dt
            if self.drain_left <= 0:
                self.state = JobState.STOPPED
                self.events.append(self._line("INFO", "drained: shards flushed; extraction stopped"))
            return
        if self.state != JobState.RUNNING:
            return
        if self._worker_down() and not self.failed_logged:
            self.failed_logged = True
            self.events.append(self._line("ERROR", "worker 5 failed: torch.OutOfMemoryError: CUDA out of memory"))
            self.events.append(self._line("WARNING", "worker 5 restarting (1st restart)"))
        budget = self.rate * dt * ((self.N - 1) / self.N if self._worker_down() else 1.0)
        for name, samples, per in self.plan:
            if name in self.skipped:
                continue
            room = samples * per - self.tokens[name]
            take = min(room, budget)
            if take > 0:
                self.tokens[name] += take
                budget -= take
                if self.tokens[name] >= samples * per:
                    self.events.append(self._line("INFO", f"[{name}] done: {samples:,} samples"))
        if all(n in self.skipped or self.tokens[n] >= s * p for n, s, p in self.plan):
            self.state = JobState.DONE
            self.events.append(self._line("INFO", "extraction done"))

    def _worker_down(self) -> bool:
        return self.fail_at_s is not None and self.fail_at_s <= self.elapsed < self.fail_at_s + 5

    def snapshot(self) -> ExtractSnapshot:
        """The job now (advanced to ``clock()``)."""
        self._advance()
        ds = tuple(DatasetExtractView(n, int(self.tokens[n] // p), s, int(self.tokens[n]), s * p, n in self.skipped)
                   for n, s, p in self.plan)
        done_tok = sum(d.tokens_done for d in ds)
        total_tok = sum(d.tokens_total for d in ds if not d.skipped) + sum(d.tokens_done for d in ds if d.skipped)
        total_s = sum(d.samples_total for d in ds if not d.skipped) + sum(d.samples_done for d in ds if d.skipped)
        running = self.state == JobState.RUNNING
        rate = self.rate * ((self.N - 1) / self.N if self._worker_down() else 1.0) if running else 0.0
        workers, gpus = [], []
        wstate = {JobState.RUNNING: WorkerState.RUNNING, JobState.PAUSED: WorkerState.PAUSED,
                  JobState.DRAINING: WorkerState.DRAINING, JobState.DONE: WorkerState.DONE,
                  JobState.STOPPED: WorkerState.DONE}.get(self.state, self.state)
        for r in range(self.N):
            down = r == 5 and self._worker_down()
            failed_before = r == 5 and self.failed_logged
            share_tok = done_tok // self.N
            workers.append(WorkerView(
                rank=r, state=WorkerState.RESTARTING if down else wstate, host="demo", pid=50000 + r, gpus=(r,),
                samples_done=sum(d.samples_done for d in ds) // self.N, samples_total=total_s // self.N,
                tokens_done=share_tok, tokens_total=total_tok // self.N,
                tokens_per_s=0.0 if down else rate / self.N, batch_size=16 if running and not down else 0,
                max_len=2048 + 256 * ((r + int(self.elapsed)) % 8) if running and not down else 0,
                bytes_written=share_tok * BYTES_PER_TOKEN,
                last_error="torch.OutOfMemoryError: CUDA out of memory" if failed_before else "",
                restarts=1 if failed_before and not down else 0))
            busy = running and not down
            k = int(self.elapsed * 2) + r
            gpus.append(GpuRow(
                index=r, name=GPU_NAME, util_pct=float(85 + k % 14) if busy else 2.0,
                mem_used_bytes=(110 + k % 20) * 2**30 if busy else 3 * 2**30, mem_total_bytes=GPU_MEM,
                temp_c=float(62 + k % 15) if busy else 40.0, power_w=float(560 + (k * 13) % 130) if busy else 115.0,
                power_limit_w=700.0, worker=r))
        left = total_tok - done_tok
        return ExtractSnapshot(
            state=self.state, out_dir="runs/demo/hidden", model="tiny-kimi (demo)", elapsed_s=self.elapsed,
            samples_done=sum(d.samples_done for d in ds), samples_total=total_s, tokens_done=done_tok,
            tokens_total=total_tok, tokens_per_s=rate, eta_s=left / rate if rate else None,
            bytes_written=done_tok * BYTES_PER_TOKEN, bytes_projected=total_tok * BYTES_PER_TOKEN,
            disk_free_bytes=3_000_000_000_000 - done_tok * BYTES_PER_TOKEN, disk_margin_bytes=100_000_000_000,
            workers=tuple(workers), datasets=ds, gpus=tuple(gpus), events=tuple(self.events[-200:]),
            quit_mode=self.quit_mode, states_dtype="bf16")


def with_state(snap: ExtractSnapshot, state: str, **kw) -> ExtractSnapshot:
    """``snap`` with another job ``state`` (and any other fields), for tests."""
    return replace(snap, state=state, **kw)


__all__ = ["BYTES_PER_TOKEN", "DemoExtraction", "fixed_extract_snapshot", "with_state"]
