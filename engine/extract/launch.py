"""``datagen extract`` headless: check the disk, start the workers, show progress lines.

Without ``torchrun`` the launcher is an :class:`engine.extract.run.ExtractRun` (the same object the
dashboard drives): it reads the input once to project the output size, refuses to start when it does
not fit, writes ``out_dir/job.json`` and starts one worker process per GPU group
(``CUDA_VISIBLE_DEVICES`` = its GPUs) or ``workers`` CPU processes, printing a progress line every
few seconds. Workers die with the launcher (Linux ``PR_SET_PDEATHSIG``); a dead worker is restarted
(bounded), except one whose model or engine could not start (a start-up error would repeat: the
job fails with it at once), and a rerun resumes.

Under ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` set) nothing is spawned: this process
is worker ``RANK`` of ``WORLD_SIZE`` on GPU group ``LOCAL_RANK``, so several hosts sharing a file
system split one job (every rank must see the same input and settings).
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any, Callable, Protocol

from engine.extract.job import ExtractError, ExtractJob, resolve_job
from engine.extract.run import ExtractRun, prepare


def torchrun_env() -> tuple[int, int, int] | None:
    """``(RANK, WORLD_SIZE, LOCAL_RANK)`` when launched by torchrun, else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        r, w = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        return r, w, int(os.environ.get("LOCAL_RANK", r))
    return None


def run_extract(cfg: Any, *, data: Path | None = None, gpus: list[int] | None = None, workers: int | None = None,
                free_bytes: int | None = None, progress_s: float = 5.0, say: Callable[[str], None] | None = None,
                restart_delay_s: float = 2.0, max_restarts: int = 3,
                metrics: Callable[[ExtractRun], Served | None] | None = None) -> int:
    """Run the whole extraction job of ``cfg`` headless; returns the exit code (0 done, or drained
    after a quit; 1 error/failed; 130 interrupted).

    Outside torchrun this is :class:`engine.extract.run.ExtractRun` on an event loop of its own, with
    SIGINT/SIGTERM/SIGHUP turned into its quit (first: drain; second: kill the workers) and a progress
    line every ``progress_s`` seconds. It holds ``OUT_DIR/extract.lock`` (:mod:`engine.proc.runlock`)
    for the whole job: a second ``datagen extract`` on the same output directory is refused before it
    touches it. ``metrics`` builds the Prometheus endpoint over the run (``datagen extract`` passes
    :func:`engine.report.metricsserver.open_metrics` with ``extract=run.snapshot``; it returns None
    without ``[run] metrics_port``); it is bound before ``prepare`` and served on the run's loop.

    Raises:
        ExtractError: bad settings, missing input or model, not enough disk (nothing started).
        engine.proc.runlock.DirectoryInUse: another live ``datagen extract`` writes the same output directory.
        DatagenError: from ``metrics`` (the port cannot be bound; nothing started).
    """
    say = say or _print_line
    tr = torchrun_env()
    job = resolve_job(cfg, data=data, gpus=gpus, workers=None if tr else workers, free_bytes=free_bytes)
    if tr is not None:  # the ranks share one output directory on purpose (shards.py serialises their commits)
        return _run_torchrun(job.with_(workers=tr[1]), *tr, say=say)
    run = ExtractRun(cfg, job=job, say=say, progress_s=progress_s, restart_delay_s=restart_delay_s,
                     max_restarts=max_restarts)
    server = metrics(run) if metrics is not None else None  # bound now: a port in use refuses before any write
    try:
        run.prepare()  # errors before any event loop or signal handler
    except BaseException:
        if server is not None:
            asyncio.run(server.close())
        raise
    return asyncio.run(_headless(run, server))


def _print_line(line: str) -> None:
    """Print ``line`` at once (stdout is block-buffered when piped: ``datagen extract | tee log``)."""
    print(line, flush=True)


class Served(Protocol):
    """An endpoint served beside the run on its loop (:class:`engine.report.metricsserver.MetricsServer`
    fits it: the extraction layer does not import the report layer above it)."""

    @property
    def url(self) -> str: ...

    async def start(self) -> None: ...
    async def close(self) -> None: ...


async def _headless(run: ExtractRun, server: Served | None) -> int:
    if server is None:
        return await _supervised(run)
    try:
        await server.start()
        run.say(f"metrics: {server.url} (Prometheus)")
        return await _supervised(run)
    finally:
        await server.close()


async def _supervised(run: ExtractRun) -> int:
    loop = asyncio.get_running_loop()
    sigs = [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    installed = []
    for s in sigs:
        try:
            loop.add_signal_handler(s, run.interrupt, signal.Signals(s).name)
            installed.append(s)
        except (ValueError, RuntimeError, NotImplementedError):  # not the main thread
            pass
    try:
        return await run.run()
    finally:
        for s in installed:
            loop.remove_signal_handler(s)


def _run_torchrun(job: ExtractJob, rank: int, world: int, local_rank: int, say: Callable[[str], None]) -> int:
    from engine.extract.snapshot import WorkerState
    from engine.extract.worker import run_worker

    if local_rank == 0:
        prepare(job, say if rank == 0 else (lambda _s: None))  # every host checks its own file system
    res = run_worker(job, rank, world, local_rank)
    say(f"rank {rank}/{world}: {res.state}, {res.samples} samples, {res.bytes_written} bytes")
    return 0 if res.state == WorkerState.DONE else 1


__all__ = ["ExtractError", "ExtractRun", "prepare", "run_extract", "torchrun_env"]
