"""Pure text of the extraction view: header lines, GPU/worker rows, dataset rows (no Textual widgets).

Everything here reads one :class:`~engine.extract.snapshot.ExtractSnapshot` and returns Rich
``Text``; the widgets in :mod:`tui.extract.panes` only place it. Units: bytes (shown in powers of
1000, like ``datagen extract``'s lines), GPU memory in GiB (like the generation view's GPU pane),
tokens, seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text

from engine.api import (
    FINAL_JOB_STATES,
    DatasetExtractView,
    ExtractSnapshot,
    GpuRow,
    JobState,
    WorkerState,
    WorkerView,
    fmt_bytes,
    progress_percent,
)
from tui.fmt import GIB, bar_parts, fmt_count, fmt_duration, trim
from tui.panes.gpus import level_style
from tui.panes.header import fit

JOB_STYLE: dict[str, str] = {  # keyed by JobState (a str: a snapshot's state looks it up)
    JobState.NOT_STARTED: "bold cyan", JobState.LOADING: "bold cyan", JobState.RUNNING: "bold green",
    JobState.RESTARTING: "bold magenta", JobState.PAUSED: "bold yellow", JobState.DRAINING: "bold yellow",
    JobState.WAITING: "bold cyan", JobState.DONE: "bold blue", JobState.FAILED: "bold red", JobState.STOPPED: "bold red",
}
"""Rich style per job state (:class:`engine.extract.snapshot.JobState`)."""

WORKER_STYLE: dict[str, str] = {
    WorkerState.STARTING: "cyan", WorkerState.LOADING: "cyan", WorkerState.RUNNING: "green",
    WorkerState.PAUSED: "yellow", WorkerState.DRAINING: "yellow", WorkerState.DONE: "blue",
    WorkerState.FAILED: "bold red", WorkerState.RESTARTING: "bold magenta",
}
"""Rich style per worker state (:class:`engine.extract.snapshot.WorkerState`)."""

FINAL_STATES = FINAL_JOB_STATES
"""Job states after which nothing runs any more (a quit then exits at once)."""


def exit_code(snap: ExtractSnapshot, interrupted: bool = False) -> int:
    """The extraction view's exit code for a job in a final state: 0 done, or stopped by a drain
    of ``q`` (the batches in hand were written, the rest resumes later); 130 stopped by an abort,
    or by any stop after an interrupt (Ctrl-C, like SIGINT: docs/commands.md "Exit codes": interrupted with
    samples left); 1 failed."""
    if snap.state == JobState.FAILED:
        return 1
    if snap.state == JobState.STOPPED and (snap.quit_mode == "abort" or interrupted):
        return 130
    return 0


def _t(*parts: tuple[str, str] | str) -> Text:
    t = Text()
    for p in parts:
        t.append(*(p if isinstance(p, tuple) else (p,)))
    return t


def done_total(done: int, total: int) -> str:
    """``"1.2k/4.5k"`` (compact counts)."""
    return f"{fmt_count(done)}/{fmt_count(total)}"


def share(done: int, total: int) -> str:
    """``done / total`` as ``" (27%)"``, rounded down (``" (99%)"`` until the last one is done);
    empty when ``total`` is 0."""
    return f" ({progress_percent(done, total)}%)" if total > 0 else ""


def short_count(n: float) -> str:
    """At most 4 characters: ``950``, ``9.9k``, ``17k``, ``156k``, ``1.2M``."""
    a = abs(n)
    if a < 1000:
        return f"{n:.0f}"
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            v = n / div
            return f"{v:.1f}{suf}" if abs(v) < 9.95 else f"{v:.0f}{suf}"
    return f"{n:.0f}"


def worker_rate(w: WorkerView) -> Text:
    """A worker's rate cell (8 cells): its last minute's tokens/s, or, when nothing ran in the last
    minute, its process's average labelled ``avg`` (dim): a paused or finished worker never reads 0
    after it worked."""
    if w.tokens_per_s <= 0 and w.avg_tokens_per_s > 0:
        return Text(f"avg {short_count(w.avg_tokens_per_s)}", style="dim")
    return Text(fmt_count(w.tokens_per_s))


def header_lines(s: ExtractSnapshot | None, note: str = "", width: int = 160) -> list[Text]:
    """The header's three lines (``s`` None: extraction is starting), each fitted to ``width``
    cells by dropping the least important segments first (state, samples, tokens, ETA, bytes and
    disk stay at 80 columns; how the states are saved, ``saved as fp8`` or ``saved as bf16``, from 120)."""
    if s is None:
        return [fit([(0, _t(("extract", "bold"), "  ", ("STARTING", JOB_STYLE[JobState.LOADING]))),
                     (1, Text("planning the job and starting workers…"))], width), Text(), Text()]
    state = _t(("extract", "bold"), "  ", (s.state.upper(), JOB_STYLE.get(s.state, "bold")))
    if s.quit_mode and s.state not in FINAL_STATES:
        state.append(f" (quit: {s.quit_mode})", style="bold yellow")
    if s.reason:
        state.append(f" ({s.reason})", style="red" if s.state in (JobState.FAILED, JobState.STOPPED) else "yellow")
    line1 = fit([
        (0, state),
        (1, Text(f"elapsed {fmt_duration(s.elapsed_s)}")),
        (3, _t("model ", (s.model, "bold")) if s.model else Text()),
        (4, _t("out ", s.out_dir) if s.out_dir else Text()),
        (0, _t((note, "bold reverse")) if note else Text()),
    ], width)
    eta = "0s" if s.state == JobState.DONE else (fmt_duration(s.eta_s) if s.state == JobState.RUNNING else f"-- ({s.state})")
    line2 = fit([
        (0, _t("samples ", (done_total(s.samples_done, s.samples_total), "bold"),
               share(s.samples_done, s.samples_total))),
        (0, _t("tokens ", (done_total(s.tokens_done, s.tokens_total), "bold"))),
        (0, _t((s.rate_text(), "bold"))),  # the last minute's, else "avg 17.3k tok/s"
        (0, _t(("ETA ", "bold"), (eta, "bold"))),
        # the dtype the states are written in (``save_dtype``: fp8, or the model's), the one the projection counts
        (2, _t("saved as ", (s.states_dtype, "bold magenta" if s.states_dtype == "fp8" else "bold"))
         if s.states_dtype else Text()),
    ], width)
    over = s.bytes_projected > 0 and s.bytes_written > s.bytes_projected
    written = _t("written ", (fmt_bytes(s.bytes_written), "bold"), " / projected ",
                 (fmt_bytes(s.bytes_projected), "bold red" if over else "bold"))
    if s.disk_free_bytes is None:
        disk = _t("disk free --")
    else:
        low = s.disk_free_bytes < s.disk_margin_bytes
        tight = s.disk_free_bytes < s.disk_margin_bytes + (s.bytes_projected - s.bytes_written)
        style = "bold red" if low else "bold yellow" if tight else "bold green"
        disk = _t("disk free ", (fmt_bytes(s.disk_free_bytes), style), f" (margin {fmt_bytes(s.disk_margin_bytes)})")
        if low:
            disk.append(" under margin!", style="bold red")
    failed = sum(1 for w in s.workers if w.state == WorkerState.FAILED)
    restarting = sum(1 for w in s.workers if w.state == WorkerState.RESTARTING)
    running = sum(1 for w in s.workers if w.state == WorkerState.RUNNING)
    workers = _t(f"workers {running}/{len(s.workers)} running")
    if restarting:
        workers.append(f"  {restarting} restarting", style=WORKER_STYLE[WorkerState.RESTARTING])
    if failed:
        workers.append(f"  {failed} failed", style="bold red")
    line3 = fit([(0, written), (0, disk), (1, workers)], width)
    return [line1, line2, line3]


@dataclass(frozen=True, slots=True)
class Column:
    """A column of a table: ``key``, header ``label``, ``width`` in cells (``0``: takes what is left)."""

    key: str
    label: str
    width: int


GPU_COLUMNS: tuple[Column, ...] = (
    Column("gpu", "GPU", 3),
    Column("util", "util", 4),
    Column("mem", "mem GiB", 11),
    Column("temp", "temp", 4),
    Column("power", "power", 8),
    Column("rank", "wkr", 3),
    Column("state", "state", 13),  # "restarting ↻2"
    Column("samples", "samples", 11),
    Column("tokens", "tokens", 11),
    Column("tps", "tok/s 1m", 8),
    Column("batch", "batch×len", 10),
    Column("written", "written", 9),
    Column("error", "last error", 0),
)
"""Every GPU/worker column in display order."""

GPU_PRIORITY = ("gpu", "util", "mem", "rank", "state", "tps", "samples", "temp", "power", "batch", "tokens",
                "written", "error")
"""GPU/worker column keys from most to least important: a narrow terminal drops the last ones."""

ERROR_MIN = 12
"""The last-error column is shown only with at least this many cells left."""
PAD = 2
"""Cells of padding per column (DataTable's ``cell_padding=1`` on each side)."""


def gpu_columns(available: int) -> tuple[Column, ...]:
    """The GPU/worker columns that fit ``available`` cells, in display order (GPU, util, memory,
    worker rank and state always); the last-error column takes what is left."""
    fixed = {c.key: c for c in GPU_COLUMNS}
    used = 0
    picked: set[str] = set()
    for key in GPU_PRIORITY:
        c = fixed[key]
        w = (ERROR_MIN if key == "error" else c.width) + PAD
        if key in ("gpu", "util", "mem", "rank", "state") or used + w <= available:
            picked.add(key)
            used += w
    out = []
    for c in GPU_COLUMNS:
        if c.key in picked:
            out.append(Column(c.key, c.label, ERROR_MIN + available - used) if c.key == "error" else c)
    return tuple(out)


def gpu_cells(g: GpuRow | None) -> dict[str, Text]:
    """The NVML half of a row (``g`` None: a worker with no GPU reading: dashes)."""
    if g is None:
        return {k: Text("--", style="dim") for k in ("gpu", "util", "mem", "temp", "power")}
    util = Text("--") if g.util_pct is None else Text(f"{g.util_pct:.0f}%", style=level_style(g.util_pct / 100))
    if g.mem_used_bytes is None or not g.mem_total_bytes:
        mem = Text("--")
    else:
        mem = Text(f"{g.mem_used_bytes / GIB:.1f}/{g.mem_total_bytes / GIB:.1f}",
                   style=level_style(g.mem_used_bytes / g.mem_total_bytes))
    temp = Text("--") if g.temp_c is None else Text(
        f"{g.temp_c:.0f}°C", style="red" if g.temp_c >= 85 else "yellow" if g.temp_c >= 75 else "")
    if g.power_w is None:
        power = Text("--")
    else:
        power = Text(f"{g.power_w:.0f}/{g.power_limit_w:.0f}W" if g.power_limit_w else f"{g.power_w:.0f}W")
    return {"gpu": Text(str(g.index), style="bold"), "util": util, "mem": mem, "temp": temp, "power": power}


def worker_cells(w: WorkerView | None, first: bool = True) -> dict[str, Text]:
    """The worker half of a row (``w`` None: no worker uses this GPU; ``first`` False: a further
    GPU of a worker already shown, with only its rank and state)."""
    if w is None:
        return {"rank": Text("-", style="dim"), "state": Text("idle", style="dim")}
    state = Text(w.state, style=WORKER_STYLE.get(w.state, ""))
    if w.restarts:
        state.append(f" ↻{w.restarts}", style="magenta")
    cells = {"rank": Text(f"w{w.rank}", style="cyan"), "state": state}
    if not first:
        return cells
    cells.update({
        "samples": Text(done_total(w.samples_done, w.samples_total)),
        "tokens": Text(done_total(w.tokens_done, w.tokens_total)),
        "tps": worker_rate(w),
        "batch": Text(f"{w.batch_size}×{fmt_count(w.max_len)}" if w.batch_size else "--",
                      style="" if w.batch_size else "dim"),
        "written": Text(fmt_bytes(w.bytes_written)),
        "error": Text(trim(w.last_error.replace("\n", " "), 200), style="red") if w.last_error else Text(""),
    })
    return cells


def gpu_worker_rows(s: ExtractSnapshot) -> list[tuple[str, dict[str, Text]]]:
    """``(row key, {column key: cell})`` per GPU (NVML order) joined with its worker (the row of a
    worker's first GPU carries its figures), then one row per worker with no GPU row (no NVML, or
    a GPU of another host). Row keys: ``"g<index>"`` and ``"w<rank>"``."""
    by_rank = {w.rank: w for w in s.workers}
    shown: set[int] = set()
    rows = []
    for g in s.gpus:
        w = by_rank.get(g.worker) if g.worker is not None else None
        first = w is not None and w.rank not in shown
        if w is not None:
            shown.add(w.rank)
        rows.append((f"g{g.index}", {**gpu_cells(g), **worker_cells(w, first)}))
    for w in s.workers:
        if w.rank not in shown:
            cells = gpu_cells(None)
            if w.gpus:
                cells["gpu"] = Text(",".join(map(str, w.gpus)), style="dim")
            rows.append((f"w{w.rank}", {**cells, **worker_cells(w)}))
    return rows


DATASET_COLUMNS: tuple[Column, ...] = (
    Column("name", "dataset", 18),
    Column("state", "state", 8),
    Column("progress", "progress", 14),
    Column("samples", "samples", 11),
    Column("tokens", "tokens", 13),
)
"""The per-dataset table's columns (they fit 80 columns)."""


IN_HAND: dict[str, str] = {JobState.PAUSED: "paused", JobState.DRAINING: "draining", JobState.STOPPED: "stopped",
           JobState.FAILED: "stopped", JobState.WAITING: "waiting", JobState.NOT_STARTED: "waiting"}
"""What a dataset with samples left shows while the job is in one of these states (else ``running``
once some of it is done, ``waiting`` before): a paused job's datasets read ``paused``, not ``running``."""


def dataset_state(d: DatasetExtractView, job_state: str = JobState.RUNNING) -> str:
    """``skipped``, ``done`` (every sample), else what the job (``job_state``) is doing with it:
    ``running`` (some done) or ``waiting`` (none yet) while it runs (or restarts a worker);
    ``paused``, ``draining`` (some done), ``stopped`` (the job stopped or failed before its end) or
    ``waiting`` (between chained extractions) otherwise (:data:`IN_HAND`)."""
    if d.skipped:
        return "skipped"
    if d.samples_total and d.samples_done >= d.samples_total:
        return "done"
    if job_state in IN_HAND and (d.samples_done or job_state not in (JobState.PAUSED, JobState.DRAINING)):
        return IN_HAND[job_state]
    return "running" if d.samples_done else "waiting"


DS_STYLE = {"skipped": "magenta", "done": "blue", "running": "green", "waiting": "dim", "paused": "yellow",
            "draining": "yellow", "stopped": "red"}


def dataset_cells(d: DatasetExtractView, job_state: str = JobState.RUNNING) -> dict[str, Text]:
    """One dataset row: name, state (:func:`dataset_state` in a job in ``job_state``), a bar (done
    vs skipped ``░`` vs left) with its percentage, samples, tokens."""
    state = dataset_state(d, job_state)
    skipped = d.samples_total - d.samples_done if d.skipped else 0
    done_s, _, skip_s, left_s = bar_parts(d.samples_done, skipped, d.samples_total, 8)
    bar = _t((done_s, "green"), (skip_s, "magenta"), (left_s, "dim"))
    bar.append(f" {progress_percent(d.samples_done, d.samples_total):3d}%" if d.samples_total else "   --")
    return {
        "name": Text(trim(d.name, 18), style="bold"),
        "state": Text(state, style=DS_STYLE[state]),
        "progress": bar,
        "samples": Text(done_total(d.samples_done, d.samples_total)),
        "tokens": Text(done_total(d.tokens_done, d.tokens_total)),
    }


__all__ = [
    "Column", "DATASET_COLUMNS", "FINAL_STATES", "GPU_COLUMNS", "IN_HAND", "JOB_STYLE", "WORKER_STYLE", "dataset_cells",
    "dataset_state", "exit_code", "gpu_cells", "gpu_columns", "gpu_worker_rows", "header_lines", "worker_cells",
]
