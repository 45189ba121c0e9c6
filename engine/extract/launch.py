"""``datagen extract``: check the disk, start the workers, show progress.

Without ``torchrun`` the launcher reads the input once to project the output size, refuses to
start when it does not fit, writes ``out_dir/job.json`` and starts one worker process per GPU group
(``CUDA_VISIBLE_DEVICES`` = its GPUs) or ``workers`` CPU processes, printing a progress line every
few seconds. Workers die with the launcher (Linux ``PR_SET_PDEATHSIG``); a restart resumes.

Under ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` set) nothing is spawned: this process
is worker ``RANK`` of ``WORLD_SIZE`` on GPU group ``LOCAL_RANK``, so several hosts sharing a file
system split one job (every rank must see the same input and settings).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from engine.proc import runlock
from engine.extract.disk import check_job_fits, fmt_bytes
from engine.extract.job import ExtractError, ExtractJob, resolve_job
from engine.extract.plan import project
from engine.extract.shards import OutDir
from engine.extract.source import load_table
from engine.extract.status import collect, format_line, gpu_line, status_dir


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def torchrun_env() -> tuple[int, int, int] | None:
    """``(RANK, WORLD_SIZE, LOCAL_RANK)`` when launched by torchrun, else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        r, w = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        return r, w, int(os.environ.get("LOCAL_RANK", r))
    return None


def prepare(job: ExtractJob, say: Callable[[str], None], check_disk: bool = True) -> dict[str, Any]:
    """Recover the output dir, project the bytes still to write, check the disk (raises
    :class:`ExtractError` when it does not fit). Returns the projection numbers."""
    out = OutDir(job.out_dir)
    out.recover()
    table = load_table(job)
    done = out.done_ids()
    left = [i for i, sid in enumerate(table.ids) if sid not in done]
    proj = project(table.lengths[left], job.hidden_size, len(job.aux_layers), job.dtype_bytes)
    say(f"input: {len(table)} samples ({int(table.lengths.sum())} tokens); already extracted: {len(table) - len(left)}; "
        f"to do: {proj.samples} samples, {proj.tokens} tokens"
        + (f"; left out: {table.dropped}" if any(table.dropped.values()) else ""))
    say(f"model {job.model}: H={job.hidden_size}, L={job.num_layers}, aux layers {list(job.aux_layers)} "
        f"(0-based layer outputs), {job.dtype}; per token {(len(job.aux_layers) + 1)} x {job.hidden_size} x "
        f"{job.dtype_bytes} B")
    if check_disk:
        say(check_job_fits(job.out_dir, proj.total, job.disk_margin_bytes, job.free_bytes)
            + f" [hidden states {fmt_bytes(proj.hidden_bytes)} + ids/masks/headers {fmt_bytes(proj.overhead_bytes)}]")
    return {"samples": proj.samples, "tokens": proj.tokens, "projected_bytes": proj.total,
            "projected_hidden_bytes": proj.hidden_bytes}


def run_extract(cfg: Any, *, data: Path | None = None, gpus: list[int] | None = None, workers: int | None = None,
                free_bytes: int | None = None, progress_s: float = 5.0, say: Callable[[str], None] = print) -> int:
    """Run the whole extraction job of ``cfg``; returns the exit code (0 done, 1 error/failed, 130 interrupted).

    Outside torchrun the launcher holds ``OUT_DIR/extract.lock`` (:mod:`engine.proc.runlock`) for the whole
    job: a second ``datagen extract`` on the same output directory is refused before it touches it.

    Raises:
        ExtractError: bad settings, missing input or model, not enough disk (nothing started).
        engine.proc.runlock.DirectoryInUse: another live ``datagen extract`` writes the same output directory.
    """
    tr = torchrun_env()
    job = resolve_job(cfg, data=data, gpus=gpus, workers=None if tr else workers, free_bytes=free_bytes)
    if tr is not None:  # the ranks share one output directory on purpose (shards.py serialises their commits)
        return _run_torchrun(job.with_(workers=tr[1]), *tr, say=say)
    Path(job.out_dir).mkdir(parents=True, exist_ok=True)
    with runlock.acquire(Path(job.out_dir), runlock.EXTRACT_LOCK, "extract output directory"):
        return _run_locked(cfg, job, progress_s, say)


def _run_locked(cfg: Any, job: ExtractJob, progress_s: float, say: Callable[[str], None]) -> int:
    info = prepare(job, say)
    run_dir = Path(cfg.run.dir)
    if run_dir.is_dir():
        (run_dir / "extract.json").write_text(json.dumps({"out_dir": job.out_dir}))
    if info["samples"] == 0:
        say("nothing to do: every sample is already in the manifest")
        return 0
    sd = status_dir(job.out_dir)
    for p in sd.glob("worker-*.json") if sd.is_dir() else []:
        p.unlink(missing_ok=True)  # a previous run may have had more workers
    job_path = Path(job.out_dir) / "job.json"
    job.save(job_path)
    procs = []
    for rank in range(job.workers):
        env = dict(os.environ)
        if job.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, job.gpu_group(rank)))
        cmd = [sys.executable, "-m", "engine.extract.worker", "--job", str(job_path), "--rank", str(rank),
               "--world", str(job.workers), "--local-rank", str(rank)]
        # A session of their own: Ctrl-C and process-group signals reach the launcher only, which
        # forwards a stop (SIGTERM) on the first and kills on the second.
        procs.append(subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent, start_new_session=True))
    say(f"started {job.workers} worker(s) on " + (f"GPUs {list(job.gpus)}" if job.device == "cuda" else "CPU")
        + f"; status: {sd}")
    codes = _wait(procs, job.out_dir, progress_s, say, gpus=job.device == "cuda")
    doc = collect(job.out_dir)
    say(format_line(doc))
    say(f"bytes written {doc['bytes_written']} vs projected {info['projected_bytes']} "
        f"({doc['bytes_written'] / max(1, info['projected_bytes']):.4f}x)")
    if any(c in (-signal.SIGINT, 130) for c in codes) and doc["state"] != "done":
        return 130
    return 0 if all(c == 0 for c in codes) else 1


def _wait(procs: list[subprocess.Popen], out_dir: str, progress_s: float, say: Callable[[str], None],
          gpus: bool = False) -> list[int]:
    interrupted = 0

    def forward(signum: int, _frame: Any) -> None:
        # First signal: workers stop after their current batch (its shard is committed). Second: kill
        # them now (the shard being written is discarded by the next run's recovery).
        nonlocal interrupted
        interrupted += 1
        name = signal.Signals(signum).name
        try:
            say(f"{name}: " + ("stopping workers after their current batch; again to kill them" if interrupted == 1
                               else "killing workers now"))
        except (OSError, ValueError, RuntimeError):  # a closed terminal; print re-entered
            pass
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM if interrupted == 1 else signal.SIGKILL)

    sigs = [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    old = {s: signal.signal(s, forward) for s in sigs}
    try:
        last = 0.0
        while any(p.poll() is None for p in procs):
            time.sleep(0.2)
            if time.monotonic() - last >= progress_s:
                last = time.monotonic()
                doc = collect(out_dir)
                if doc["state"] == "not_started":
                    continue  # workers still importing
                line = format_line(doc)
                if gpus:
                    from engine.extract.gpu import read_gpus

                    line += " | " + gpu_line(read_gpus())
                say(line)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    codes = [p.wait() for p in procs]
    return [130 if interrupted and c != 0 else c for c in codes]


def _run_torchrun(job: ExtractJob, rank: int, world: int, local_rank: int, say: Callable[[str], None]) -> int:
    from engine.extract.worker import run_worker

    if local_rank == 0:
        prepare(job, say if rank == 0 else (lambda _s: None))  # every host checks its own file system
    res = run_worker(job, rank, world, local_rank)
    say(f"rank {rank}/{world}: {res.state}, {res.samples} samples, {res.bytes_written} bytes")
    return 0 if res.state == "done" else 1


__all__ = ["ExtractError", "prepare", "run_extract", "torchrun_env"]
