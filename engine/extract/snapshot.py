"""Immutable snapshots of an extraction job, and the commands the extraction view sends.

What the extraction view of the dashboard (and ``datagen status``) reads, like
:class:`engine.report.snapshot.RunSnapshot` for generation: plain frozen dataclasses, built from
the workers' status files (:mod:`engine.extract.status`), the job's plan and NVML readings
(:mod:`engine.extract.gpu`); nothing here does I/O. Units: bytes, tokens, seconds, percent, watts, °C.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Mapping, Protocol, Sequence

from engine.metrics.rates import fmt_count

#: Seconds of history behind a worker's ``tokens_per_s`` (the last minute).
RATE_WINDOW_S = 60.0

class JobState(StrEnum):
    """An extraction job's state (``ExtractSnapshot.state``, ``datagen status``'s ``extract.state``):
    before any extraction ran (``not_started``), workers importing (``loading``), working, every
    worker down and about to be started again (``restarting``), paused by the user, finishing the
    batches in hand after a quit (``draining``), between two chained extractions (``waiting``: one
    has run, the next waits for its datasets), finished, a worker failed for good (restarts spent),
    stopped before the end (quit or abort). Each member equals its string, so JSON and status
    output read the same values as plain strings."""

    NOT_STARTED = "not_started"
    LOADING = "loading"
    RUNNING = "running"
    RESTARTING = "restarting"
    PAUSED = "paused"
    DRAINING = "draining"
    WAITING = "waiting"
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"


class WorkerState(StrEnum):
    """A worker's state (``WorkerView.state``; a worker's status file holds the ones it writes itself:
    ``loading``, ``running``, ``paused``, ``stopped``, ``done``, ``failed``). ``starting``: no file yet;
    ``restarting``: it died and the launcher starts it again, from the moment the launcher saw it
    die until the new process has written its file; ``failed``: no restart left; ``stopped``: it
    quit before the end of its share on a user's quit, or a quit cancelled its restart (a rerun
    resumes it)."""

    STARTING = "starting"
    LOADING = "loading"
    RUNNING = "running"
    PAUSED = "paused"
    DRAINING = "draining"
    DONE = "done"
    FAILED = "failed"
    RESTARTING = "restarting"
    STOPPED = "stopped"


#: Every job state, in :class:`JobState` order (strings).
JOB_STATES = tuple(s.value for s in JobState)
#: Every worker state, in :class:`WorkerState` order (strings).
WORKER_STATES = tuple(s.value for s in WorkerState)
#: Job states after which nothing more runs.
FINAL_JOB_STATES = (JobState.DONE, JobState.FAILED, JobState.STOPPED)

#: Short names of the model dtypes (``[extract] dtype``) as the extraction view and ``datagen status`` show them.
DTYPE_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def states_dtype(save_dtype: str | None, dtype: str | None) -> str:
    """How the hidden states are stored, as shown: ``"fp8"`` with ``[extract] save_dtype = "fp8"``
    (``float8_e4m3fn`` + a float32 scale per token), else the model dtype's short name (``bf16``,
    ``fp16``, ``fp32``: ``save_dtype = "model"``); "" when neither is known (no job file yet)."""
    if save_dtype == "fp8":
        return "fp8"
    return DTYPE_SHORT.get(dtype or "", dtype or "")


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

    ``tokens_per_s`` is over the last minute (also after a pause or the end, while its last shard is
    under a minute old; 0.0 once nothing ran in the last minute); ``avg_tokens_per_s`` is its
    process's average over its running time (tokens/s), shown, labelled ``avg``, when the last
    minute's is 0; ``batch_size`` (samples) and ``max_len`` (tokens) describe
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
    avg_tokens_per_s: float = 0.0
    run_tokens: int = 0
    run_s: float = 0.0


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
    ``quit_mode`` is None, ``"drain"`` or ``"abort"`` once a quit was asked. ``states_dtype`` is how
    the hidden states are written (:func:`states_dtype`: ``fp8``, or the model dtype ``bf16``/``fp16``/
    ``fp32``; "" unknown), the dtype ``bytes_projected`` counts.
    ``tokens_per_s`` is the workers' rate over the last minute (tokens/s), ``avg_tokens_per_s`` the
    job's average over its running time (:func:`job_average_rate`); show
    :meth:`rate_text`: the last minute's, or the average labelled ``avg`` when nothing ran in it.
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
    avg_tokens_per_s: float = 0.0
    states_dtype: str = ""

    def rate_text(self) -> str:
        """``"12.3k tok/s"`` (last minute) or ``"avg 17.3k tok/s"`` (:func:`rate_text`)."""
        return rate_text(self.tokens_per_s, self.avg_tokens_per_s)


def recent_rate(w: dict[str, Any], now: float) -> float:
    """A worker's rate over the last minute (tokens/s) at ``now`` (epoch s): its file's
    ``tokens_per_s`` while it runs, or when it committed a shard within :data:`RATE_WINDOW_S`
    (paused or done moments ago: what it did in the last minute); 0.0 when nothing ran in it."""
    rate = float(w.get("tokens_per_s") or 0.0)
    if w.get("state") == WorkerState.RUNNING:
        return rate
    last = w.get("last_done_at")
    return rate if last is not None and now - float(last) <= RATE_WINDOW_S else 0.0


def job_average_rate(workers: list[dict[str, Any]] | tuple[Any, ...]) -> float:
    """The job's average rate (tokens/s): the tokens its workers' processes extracted over the
    running time of the longest-running one (workers run side by side); 0.0 before any."""
    tokens = sum(int(_get(w, "run_tokens") or 0) for w in workers)
    run_s = max([float(_get(w, "run_s") or 0.0) for w in workers] or [0.0])
    return tokens / run_s if run_s > 0 else 0.0


def _get(w: Any, key: str) -> Any:
    return w.get(key) if isinstance(w, dict) else getattr(w, key, None)


def rate_basis(recent: float, average: float) -> str:
    """Which rate to show: ``"1m"`` (the last minute's, when anything ran in it), ``"avg"`` (the
    job's average, when nothing did and something ran before), "" (nothing ran yet)."""
    return "1m" if recent > 0 else "avg" if average > 0 else ""


def rate_text(recent: float, average: float) -> str:
    """The extraction rate as shown (tokens/s): ``"12.3k tok/s"`` from the last minute, or
    ``"avg 17.3k tok/s"`` (labelled) when nothing ran in it: a paused or finished job never
    reads ``0 tok/s`` after it worked; ``"0 tok/s"`` before anything ran."""
    if rate_basis(recent, average) == "avg":
        return f"avg {fmt_count(average)} tok/s"
    return f"{fmt_count(recent)} tok/s"


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


@dataclass(frozen=True)
class LauncherWorker:
    """What the launcher knows of one rank that its status file may not say yet.

    ``pid``: the process it started last; ``restarts``: how often it started it again;
    ``last_error``: why the previous process ended; ``failed_at``: wall time (epoch s) the launcher saw
    it die, while a restart is pending (None otherwise); ``gave_up``: it died with no restart left
    (or while the job was draining); ``stopped``: a quit cancelled its pending restart (or the
    launcher killed it on an abort): not a failure, a rerun resumes it; ``restartable``: the
    launcher still supervises its process and would start it again if it ended badly (restarts
    left, no quit), so a status file that already says ``failed`` (the process is gone, not reaped
    yet) means ``restarting``.
    """

    rank: int
    pid: int | None = None
    restarts: int = 0
    last_error: str = ""
    failed_at: float | None = None
    gave_up: bool = False
    stopped: bool = False
    restartable: bool = False


def _i(d: Mapping[str, Any], k: str) -> int:
    try:
        return int(d.get(k) or 0)
    except (TypeError, ValueError):
        return 0


def worker_view(doc: Mapping[str, Any] | None, rank: int, launcher: LauncherWorker | None = None,
                now: float | None = None) -> WorkerView:
    """One :class:`WorkerView` from a worker's status file (``doc``, as
    :func:`engine.extract.status.read_workers` returns it; None: not written yet) and the launcher's
    record. State: ``restarting`` from the moment the launcher saw a dead worker it will start again
    (or a ``failed`` file of a process it would restart) until the new process has written its file;
    ``failed`` once no restart is left; ``stopped`` when a quit cancelled the restart; ``starting``
    before any file. A restarting or failed worker's ``reason`` is why its process ended.
    ``now`` (epoch s): the rate's reference time (:func:`recent_rate`; None: the clock's)."""
    lw = launcher or LauncherWorker(rank)
    pending = lw.failed_at is not None
    state: str  # a WorkerState or, from a status file, what the worker wrote
    if doc is None:
        if lw.gave_up:
            state = WorkerState.FAILED
        elif lw.stopped:
            state = WorkerState.STOPPED
        else:
            state = WorkerState.RESTARTING if pending or lw.restarts else WorkerState.STARTING
        return WorkerView(rank=rank, state=state, pid=lw.pid, last_error=lw.last_error, restarts=lw.restarts,
                          reason=lw.last_error if state in (WorkerState.FAILED, WorkerState.STOPPED) or pending else "")
    state = str(doc.get("state") or WorkerState.STARTING)
    pid = doc.get("pid")
    reason = str(doc.get("reason") or "")
    last_error = str(doc.get("last_error") or "") or lw.last_error
    if lw.gave_up:  # the launcher saw it end for good: it knows the exit status
        state, reason = WorkerState.FAILED, lw.last_error or reason
        last_error = lw.last_error or last_error
    elif lw.stopped:
        state, reason = WorkerState.STOPPED, f"not restarted (quit): {lw.last_error or reason}"
        last_error = lw.last_error or last_error
    elif pending or (state == WorkerState.FAILED and lw.restartable):  # dead; the launcher starts it again
        state, reason = WorkerState.RESTARTING, lw.last_error or reason
        last_error = lw.last_error or last_error
    elif lw.pid is not None and pid is not None and int(pid) != lw.pid:
        state, pid, reason = WorkerState.RESTARTING, lw.pid, ""  # the new process has not written its file yet
    running = state == WorkerState.RUNNING
    rate = recent_rate({**doc, "state": state}, time.time() if now is None else now)
    return WorkerView(
        rank=rank, state=state, host=str(doc.get("host") or ""), pid=int(pid) if pid is not None else None,
        gpus=tuple(int(g) for g in doc.get("gpus") or ()), samples_done=_i(doc, "samples_done"),
        samples_total=_i(doc, "samples_total"), tokens_done=_i(doc, "tokens_done"),
        tokens_total=_i(doc, "tokens_total"),
        tokens_per_s=rate, avg_tokens_per_s=float(doc.get("avg_tokens_per_s") or 0.0),
        run_tokens=_i(doc, "run_tokens"), run_s=float(doc.get("run_s") or 0.0),
        batch_size=_i(doc, "batch_size") if running else 0, max_len=_i(doc, "max_len") if running else 0,
        bytes_written=_i(doc, "bytes_written"), reason=reason,
        last_error=last_error, restarts=max(_i(doc, "restarts"), lw.restarts))


def _job_average(views: Sequence[WorkerView]) -> float:
    return job_average_rate(tuple(views))


def _job_state(views: Sequence[WorkerView], paused: bool, quit_mode: str | None, final: str | None) -> tuple[str, str]:
    if final is not None:
        return final, ""
    if not views or all(v.state == WorkerState.STARTING for v in views):
        return (JobState.LOADING if views else JobState.NOT_STARTED), ""
    active = [v for v in views if v.state in (WorkerState.STARTING, WorkerState.LOADING, WorkerState.RUNNING,
                                              WorkerState.PAUSED, WorkerState.RESTARTING)]
    if quit_mode is not None and active:
        return JobState.DRAINING, ("aborting after the write in progress" if quit_mode == "abort"
                                   else "finishing the batches in hand")
    if paused and active:
        busy = sum(v.state == WorkerState.RUNNING for v in active)
        return JobState.PAUSED, (f"{busy} worker(s) finishing the batch in hand" if busy else "paused by user")
    states = {v.state for v in views}
    for s in (JobState.RUNNING, JobState.PAUSED, JobState.LOADING):
        if s in states:
            return s, ""
    if WorkerState.RESTARTING in states:  # nothing else works: say why
        return JobState.RESTARTING, "; ".join(f"worker {v.rank}: {v.reason or v.last_error or 'starting again'}"
                                              for v in views if v.state == WorkerState.RESTARTING)
    if WorkerState.STARTING in states:
        return JobState.LOADING, ""
    if WorkerState.FAILED in states:
        return JobState.FAILED, "; ".join(f"worker {v.rank}: {v.last_error or v.reason}" for v in views
                                          if v.state == WorkerState.FAILED)
    if WorkerState.STOPPED in states:
        return JobState.STOPPED, ""
    return JobState.DONE, ""


def build_snapshot(*, workers: Sequence[Mapping[str, Any]], world: int, plan: Mapping[str, Mapping[str, int]],
                   done_at_start: Mapping[str, Mapping[str, int]] | None = None,
                   launcher: Mapping[int, LauncherWorker] | None = None, paused: bool = False,
                   skip: Sequence[str] = (), quit_mode: str | None = None, final_state: str | None = None,
                   final_reason: str = "", gpu_reading: Any = None, host: str = "", out_dir: str = "",
                   model: str = "", elapsed_s: float = 0.0, bytes_projected: int = 0,
                   disk_free_bytes: int | None = None, disk_margin_bytes: int = 0,
                   events: Sequence[str] = (), now: float | None = None, states_dtype: str = "") -> ExtractSnapshot:
    """The whole job at one instant, from what the launcher read (pure: no I/O).

    Args:
        workers: the status files' documents (:func:`engine.extract.status.read_workers`).
        world: the job's worker count (ranks without a file show as ``starting``).
        plan: ``{dataset: {"samples", "tokens"}}`` of the whole input (done or not).
        done_at_start: ``{dataset: {"samples", "tokens"}}`` already in the manifest at start (a floor
            for the done counts until every worker has reported).
        launcher: the launcher's record per rank (:class:`LauncherWorker`).
        paused / skip / quit_mode: the control file (:mod:`engine.extract.control`).
        final_state / final_reason: set once the run ended (``done``, ``failed``, ``stopped``).
        gpu_reading: an :class:`engine.extract.gpu.GpuReading` (None: not read).
        host: this host's name (GPUs join only this host's workers).
        bytes_projected: bytes the plan projects for what was left at start.
        now: wall-clock time (epoch s) the last minute's rates are taken at (None: the clock's).
        states_dtype: how the hidden states are stored (:func:`states_dtype` of the job).

    Returns:
        An :class:`ExtractSnapshot`: samples/tokens totals are the plan's, less the pending part of
        skipped datasets; done counts sum the workers' per-dataset counts.
    """
    launcher = launcher or {}
    docs = {_i(d, "worker"): d for d in workers}
    now = time.time() if now is None else now
    views = tuple(worker_view(docs.get(r), r, launcher.get(r), now) for r in range(max(world, len(docs))))
    skipped = set(skip)
    per_done: dict[str, list[int]] = {}
    for d in workers:
        for name, ds in (d.get("datasets") or {}).items():
            acc = per_done.setdefault(name, [0, 0])
            acc[0] += _i(ds, "samples_done")
            acc[1] += _i(ds, "tokens_done")
    floor = done_at_start or {}
    datasets = []
    for name in list(plan) + [n for n in per_done if n not in plan]:
        tot = plan.get(name, {})
        sd = max(per_done.get(name, [0, 0])[0], _i(floor.get(name, {}), "samples"))
        td = max(per_done.get(name, [0, 0])[1], _i(floor.get(name, {}), "tokens"))
        datasets.append(DatasetExtractView(name, sd, max(_i(tot, "samples"), sd), td, max(_i(tot, "tokens"), td),
                                           name in skipped))
    samples_done = sum(d.samples_done for d in datasets)
    tokens_done = sum(d.tokens_done for d in datasets)
    samples_total = sum(d.samples_done if d.skipped else d.samples_total for d in datasets)
    tokens_total = sum(d.tokens_done if d.skipped else d.tokens_total for d in datasets)
    if not datasets:  # no plan (another shell, an old job): the workers' sums
        samples_done = sum(v.samples_done for v in views)
        tokens_done = sum(v.tokens_done for v in views)
        samples_total = sum(v.samples_total for v in views)
        tokens_total = sum(v.tokens_total for v in views)
    state, reason = _job_state(views, paused, quit_mode, final_state)
    reason = final_reason or reason
    tps = round(sum(v.tokens_per_s for v in views), 1)
    running_tps = sum(v.tokens_per_s for v in views if v.state == WorkerState.RUNNING)  # what the ETA counts on
    left = max(0, tokens_total - tokens_done)
    eta = 0.0 if left == 0 and state == JobState.DONE else (round(left / running_tps, 1) if running_tps > 0 else None)
    owner: dict[int, int] = {}
    for v in sorted(views, key=lambda v: v.state not in (WorkerState.LOADING, WorkerState.RUNNING, WorkerState.PAUSED)):
        if v.host in ("", host):
            for g in v.gpus:
                owner.setdefault(g, v.rank)
    gpus: tuple[GpuRow, ...] = ()
    gpu_reason = ""
    if gpu_reading is not None:
        gpu_reason = str(getattr(gpu_reading, "reason", "") or "")
        gpus = tuple(GpuRow(index=g.index, name=g.name, util_pct=g.util_pct, mem_used_bytes=g.mem_used_bytes,
                            mem_total_bytes=g.mem_total_bytes, temp_c=g.temp_c, power_w=g.power_w,
                            power_limit_w=g.power_limit_w, worker=owner.get(g.index))
                     for g in getattr(gpu_reading, "gpus", ()))
    return ExtractSnapshot(
        state=state, out_dir=out_dir, model=model, reason=reason, elapsed_s=round(elapsed_s, 1),
        samples_done=samples_done, samples_total=samples_total, tokens_done=tokens_done, tokens_total=tokens_total,
        tokens_per_s=tps, eta_s=eta, bytes_written=sum(v.bytes_written for v in views),
        avg_tokens_per_s=round(_job_average(views), 1),
        bytes_projected=bytes_projected, disk_free_bytes=disk_free_bytes, disk_margin_bytes=disk_margin_bytes,
        workers=views, datasets=tuple(datasets), gpus=gpus, gpu_reason=gpu_reason, events=tuple(events),
        quit_mode=quit_mode, states_dtype=states_dtype)
