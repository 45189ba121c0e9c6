"""Immutable snapshots of an extraction job, and the commands the extraction view sends.

What the extraction view of the dashboard (and ``datagen status``) reads, like
:class:`engine.report.snapshot.RunSnapshot` for generation: plain frozen dataclasses, built from
the workers' status files (:mod:`engine.extract.status`), the job's plan and NVML readings
(:mod:`engine.extract.gpu`); nothing here does I/O. Units: bytes, tokens, seconds, percent, watts, °C.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

#: Job states: before any worker reported, working, paused by the user, finishing the batches in
#: hand after a quit, finished, a worker failed for good, stopped before the end (quit or abort).
JOB_STATES = ("not_started", "loading", "running", "paused", "draining", "done", "failed", "stopped")
#: Worker states (``restarting``: it died and the launcher starts it again).
WORKER_STATES = ("starting", "loading", "running", "paused", "draining", "done", "failed", "restarting")


@dataclass(frozen=True)
class GpuRow:
    """One GPU's NVML reading joined with the worker that uses it (``worker`` None: no worker of this
    host uses it). Fields None where NVML gave no value."""

    index: int
    name: str
    util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    worker: int | None = None


@dataclass(frozen=True)
class WorkerView:
    """One worker process: its share of the job and what it is doing now.

    ``tokens_per_s`` is over the last minute; ``batch_size`` (samples) and ``max_len`` (tokens) describe
    the batch in hand (0 between batches); ``last_error`` is the last failure's message (kept after a
    restart); ``restarts`` counts how often the launcher started it again.
    """

    rank: int
    state: str
    host: str = ""
    pid: int | None = None
    gpus: tuple[int, ...] = ()
    samples_done: int = 0
    samples_total: int = 0
    tokens_done: int = 0
    tokens_total: int = 0
    tokens_per_s: float = 0.0
    batch_size: int = 0
    max_len: int = 0
    bytes_written: int = 0
    reason: str = ""
    last_error: str = ""
    restarts: int = 0


@dataclass(frozen=True)
class DatasetExtractView:
    """One dataset's extraction progress (samples and tokens); ``skipped``: the user skipped it."""

    name: str
    samples_done: int = 0
    samples_total: int = 0
    tokens_done: int = 0
    tokens_total: int = 0
    skipped: bool = False


@dataclass(frozen=True)
class ExtractSnapshot:
    """The whole extraction job at one instant (see :data:`JOB_STATES` for ``state``).

    ``bytes_projected`` is the plan's projection of the output (engine.extract.plan.project);
    ``disk_free_bytes`` the output file system's free space (None: unknown), ``disk_margin_bytes`` the
    margin under which workers pause; ``eta_s`` None while unknown; ``gpu_reason`` says why ``gpus``
    is empty (no NVIDIA GPU, no driver); ``events`` are the latest log lines, oldest first;
    ``quit_mode`` is None, ``"drain"`` or ``"abort"`` once a quit was asked.
    """

    state: str
    out_dir: str = ""
    model: str = ""
    reason: str = ""
    elapsed_s: float = 0.0
    samples_done: int = 0
    samples_total: int = 0
    tokens_done: int = 0
    tokens_total: int = 0
    tokens_per_s: float = 0.0
    eta_s: float | None = None
    bytes_written: int = 0
    bytes_projected: int = 0
    disk_free_bytes: int | None = None
    disk_margin_bytes: int = 0
    workers: tuple[WorkerView, ...] = ()
    datasets: tuple[DatasetExtractView, ...] = ()
    gpus: tuple[GpuRow, ...] = ()
    gpu_reason: str = ""
    events: tuple[str, ...] = ()
    quit_mode: str | None = None


class ExtractCommands(Protocol):
    """What the extraction view's keys and ``datagen ctl ... extract-*`` do. Each returns a short
    human-readable result; an unknown dataset raises ``ValueError`` naming the valid ones."""

    def pause(self) -> str:
        """Workers finish and write the batch in hand, then wait."""
        ...

    def resume(self) -> str:
        """Paused workers continue."""
        ...

    def skip(self, dataset: str) -> str:
        """No more batches of ``dataset`` (what is written stays); persisted, so a restart honours it."""
        ...

    def quit(self) -> str:
        """First call: drain (finish the batches in hand, flush shards, exit 0). Second: abort after
        the current write."""
        ...
