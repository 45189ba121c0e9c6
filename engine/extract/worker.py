"""One extraction worker: its share of the batches, through the model, into shards.

A worker (one process per GPU group, or one CPU process) recovers the output directory (removes
what a killed worker left, see :mod:`engine.extract.shards`), reads the input, computes the job's
plan and takes its share (rank ``r`` of ``world``), skips samples already in the manifest (a batch
with nothing left is never sent to the model), loads the model only if there is work, then runs
batch after batch: collate (right padding + attention mask) -> forward -> slice each sample's real
positions -> hand the shard to a background writer thread (bounded queue) that waits for disk
space, writes the temp file and commits it. The next forward runs while the previous shard is
written.

Between batches the worker obeys ``out_dir/control.json`` (:mod:`engine.extract.control`): pause
(flush the shards in hand, status ``paused``, wait), skip a dataset (its pending samples leave every
batch not yet started), quit ``drain`` (finish the batch in hand, flush, status ``stopped``, exit 0)
or ``abort`` (drop what is not being written yet, status ``stopped``). The first SIGTERM/SIGINT is a
drain, the second an abort.

Run as ``python -m engine.extract.worker --job out_dir/job.json --rank R --world W --local-rank L``
(the launcher does this), or call :func:`run_worker`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.extract import scorefiles
from engine.extract.control import ControlReader
from engine.extract.disk import DiskGuard
from engine.extract.gate import Gate
from engine.extract.job import STARTUP_EXIT, ExtractError, ExtractJob, StartupError
from engine.extract.layouts import finish_layout, layout_for
from engine.extract.layouts.base import SCALES_KEY, quantize_rows
from engine.extract.plan import Batch, make_batches, pending, per_token_bytes, split
from engine.extract.shards import OutDir
from engine.extract.shardwriter import ShardWriter, Stopped
from engine.extract.snapshot import WorkerState
from engine.extract.source import TokenTable, load_table
from engine.extract.status import StatusWriter

log = logging.getLogger(__name__)


@dataclass
class WorkerResult:
    """What a worker did. ``timings`` are seconds: ``read``, ``load``, ``loop`` (first batch to last
    commit), ``forward`` (model calls, synchronised), ``prep`` (collate + slicing), ``blocked``
    (main thread waiting for the writer), ``write`` (writer thread: save + fsync + commit),
    ``fidelity`` (phase-two scoring: LM head + scores, synchronised; 0 when off)."""

    state: WorkerState
    samples: int = 0
    tokens: int = 0
    bytes_written: int = 0
    batches: int = 0
    skipped_done: int = 0
    timings: dict[str, float] = field(default_factory=dict)


def _sync(device: Any) -> None:
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.synchronize(device)


def _to_host(t: Any) -> Any:
    """Start copying a device tensor to (pinned) host memory; CPU tensors are returned as they are."""
    import torch

    if not t.is_cuda:
        return t
    buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    buf.copy_(t, non_blocking=True)
    return buf


def run_worker(job: ExtractJob, rank: int = 0, world: int | None = None, local_rank: int | None = None, *,
               table: TokenTable | None = None, model: Any = None, stop: threading.Event | None = None,
               guard: DiskGuard | None = None, drain: threading.Event | None = None, restarts: int = 0,
               last_error: str = "") -> WorkerResult:
    """Run worker ``rank`` of ``world`` (default ``job.workers``) to completion.

    Args:
        local_rank: index of this worker's GPU group on this host (default ``rank``).
        table: the input, already loaded (default: read from the job's source).
        model: a loaded model to use (default: loaded from ``job.model`` when there is work).
        stop: set it to abort (the batch in hand is dropped; the write in progress completes).
        guard: the disk guard to use (default: ``job``'s margin and stated free space).
        drain: set it to stop after the batch in hand is written (like a ``drain`` quit).
        restarts / last_error: what the launcher says about earlier runs of this rank (shown in status).

    Returns:
        A :class:`WorkerResult` (``state`` is ``done``, or ``stopped`` after a quit, an abort or a
        stop while paused for disk space).

    Raises:
        StartupError: the model or engine could not start (before the first batch); ExtractError and
            anything else that failed the worker (its status says ``failed`` + reason).
    """
    world = job.workers if world is None else world
    local_rank = rank if local_rank is None else local_rank
    stop = stop or threading.Event()
    gpus = job.gpu_group(local_rank)
    status = StatusWriter(job.out_dir, rank, world, gpus, job.device, restarts=restarts, last_error=last_error)
    res = WorkerResult(WorkerState.LOADING)
    gate = Gate(ControlReader(job.out_dir), status, stop, drain)
    try:
        guard = guard or DiskGuard(job.out_dir, job.disk_margin_bytes, job.free_bytes)
        _run(job, rank, world, gpus, table, model, gate, status, res, guard)
    except Stopped as e:
        status.set_state(WorkerState.STOPPED, f"{e}; rerun to resume")
        res.state = WorkerState.STOPPED
    except BaseException as e:
        status.set_state(WorkerState.FAILED, f"{type(e).__name__}: {e}"[:500])
        raise
    return res


def _share_by_dataset(table: TokenTable, mine: list[Batch], done: set[str]) -> dict[str, dict[str, Any]]:
    per: dict[str, dict[str, Any]] = {}
    for b in mine:
        for row in b.rows:
            d = per.setdefault(table.datasets[row], {"samples_total": 0, "samples_done": 0, "tokens_total": 0,
                                                     "tokens_done": 0, "skipped": False})
            n = int(table.lengths[row])
            d["samples_total"] += 1
            d["tokens_total"] += n
            if table.ids[row] in done:
                d["samples_done"] += 1
                d["tokens_done"] += n
    return per


def _without(table: TokenTable, batch: Batch, skipped: set[str]) -> Batch | None:
    """``batch`` less the rows of ``skipped`` datasets (None when nothing is left)."""
    if not skipped:
        return batch
    rows = tuple(r for r in batch.rows if table.datasets[r] not in skipped)
    if len(rows) == len(batch.rows):
        return batch
    if not rows:
        return None
    return Batch(rows, max(int(table.lengths[r]) for r in rows), sum(int(table.lengths[r]) for r in rows))


def _run(job: ExtractJob, rank: int, world: int, gpus: tuple[int, ...], table: TokenTable | None, model: Any,
         gate: Gate, status: StatusWriter, res: WorkerResult, guard: DiskGuard) -> None:
    stop = gate.stop
    t = res.timings
    out = OutDir(job.out_dir, layout_for(job))
    rep = out.recover()
    if job.fidelity:
        rep["score_files"] = scorefiles.recover(job.out_dir)
    if any(rep.values()):
        log.warning("worker %d: recovered %s", rank, rep)
    t0 = time.perf_counter()
    table = table if table is not None else load_table(job)
    mine = split(make_batches(table.lengths, table.ids, job.max_tokens_per_batch), world)[rank]
    done = out.done_ids()
    todo = pending(mine, table.ids, table.lengths, done)
    t["read"] = time.perf_counter() - t0
    share_samples = sum(len(b.rows) for b in mine)
    share_tokens = sum(b.tokens for b in mine)
    left_samples = sum(len(b.rows) for b in todo)
    left_tokens = sum(b.tokens for b in todo)
    res.skipped_done = share_samples - left_samples
    status.set_totals(share_samples, share_tokens, share_samples - left_samples, share_tokens - left_tokens,
                      _share_by_dataset(table, mine, done))
    if gate.check() == "abort" or gate.drain.is_set():
        raise Stopped("quit before the first batch")
    todo = [b for b in (_without(table, b, gate.skipped) for b in todo) if b is not None]
    if not todo:
        finish_layout(out, table, gate.skipped)
        status.set_state(WorkerState.DONE, ("nothing left to do" + (" (the rest is skipped)" if gate.skipped else ""))
                         if share_samples else "no samples for this worker")
        res.state = WorkerState.DONE
        return
    t0 = time.perf_counter()
    try:
        hs = _hidden_states(job, gpus, model, out)
    except (Stopped, StartupError):
        raise
    except Exception as e:  # loading, config, vLLM init: a restart would fail the same way
        raise StartupError(str(e) if isinstance(e, ExtractError) else f"{type(e).__name__}: {e}") from e
    t["load"] = time.perf_counter() - t0
    if gate.check() is not None:  # a quit while the model loaded
        raise Stopped("quit before the first batch")
    scoring = _scoring(job, hs)
    writer = ShardWriter(out, guard, status, stop, poll=gate.aborting,
                         scores=scorefiles.ScoreFiles(job.out_dir) if scoring is not None else None)
    status.set_state(WorkerState.RUNNING)
    quit_mode: str | None = None
    tok_bytes = per_token_bytes(job.hidden_size, len(job.aux_layers), job.dtype_bytes, job.layout)
    fwd = prep = blocked = fid = 0.0
    loop0 = time.perf_counter()
    try:
        for planned in todo:
            quit_mode = gate.check(writer.flush)
            if quit_mode is not None:
                break
            batch = _without(table, planned, gate.skipped)
            if batch is None:
                continue
            status.set_batch(len(batch.rows), batch.max_len)
            a = time.perf_counter()
            tensors, entries, samples = _inputs(table, batch)
            input_ids, mask = hs.collate(samples)
            b = time.perf_counter()
            aux, last = hs.forward(input_ids, mask)
            _sync(hs.device)
            c = time.perf_counter()
            ready = None
            if job.save_dtype == "fp8":  # quantized where the states are (half the copy), per token
                q, scales = quantize_rows(aux, last)
                keys, host = ("hidden_states", SCALES_KEY), (_to_host(q), _to_host(scales))
            else:
                keys, host = ("aux_hidden_states", "last_hidden_state"), (_to_host(aux), _to_host(last))
            if aux.is_cuda:
                import torch

                ready = torch.cuda.Event()
                ready.record()
            for k, row in enumerate(batch.rows):
                n = int(table.lengths[row])
                sid = table.ids[row]
                for key, h in zip(keys, host, strict=True):
                    tensors[f"{sid}/{key}"] = h[k, :n]  # contiguous prefix of row k
            d = time.perf_counter()
            scores = None
            if scoring is not None:
                scores = scoring(table, batch.rows)
                _sync(hs.device)
                fid += time.perf_counter() - d
                d = time.perf_counter()
            if gate.aborting():  # the batch in hand is dropped; a rerun redoes it
                quit_mode = "abort"
                break
            writer.submit(tensors, entries, batch.tokens * tok_bytes, batch.tokens, ready, scores)
            t_end = time.perf_counter()
            fwd += c - b
            prep += (b - a) + (d - c)
            blocked += t_end - d
            res.batches += 1
        writer.close()
    except BaseException:
        stop.set()
        getattr(hs, "close", lambda: None)()
        try:
            writer.close()
        except BaseException:  # the first error is the one to report
            pass
        res.samples, res.tokens, res.bytes_written = writer.samples, writer.tokens, writer.bytes
        raise
    t.update(loop=time.perf_counter() - loop0, forward=fwd, prep=prep, blocked=blocked, write=writer.write_s,
             fidelity=fid)
    c0 = time.perf_counter()
    getattr(hs, "close", lambda: None)()  # vLLM's shutdown takes seconds: not part of the loop's time
    t["close"] = time.perf_counter() - c0
    res.samples, res.tokens, res.bytes_written = writer.samples, writer.tokens, writer.bytes
    if quit_mode is not None:
        res.state = WorkerState.STOPPED
        status.set_state(WorkerState.STOPPED, ("drained: the batches in hand are written" if quit_mode == "drain" else
                                     "aborted after the write in progress") + "; rerun to resume")
        return
    finish_layout(out, table, gate.skipped)
    res.state = WorkerState.DONE
    status.set_state(WorkerState.DONE)


def _hidden_states(job: ExtractJob, gpus: tuple[int, ...], model: Any, out: OutDir) -> Any:
    """The forward-pass object of ``job.engine``: ``HiddenStates`` on transformers (``model``: a loaded
    model, else loaded here), or ``VllmHiddenStates`` (``model``: an already built ``vllm.LLM``)."""
    if job.engine == "vllm":
        from engine.extract.onvllm.hidden import VllmHiddenStates

        return VllmHiddenStates(job, gpus, prenorm_last=out.layout.prenorm_last, llm=model)
    from engine.extract.model import HiddenStates, load_model

    return out.layout.wrap(HiddenStates(model if model is not None else load_model(job, gpus), job.aux_layers,
                                        job.num_layers))


def _scoring(job: ExtractJob, hs: Any) -> Any:
    """The batch scorer of ``[extract] fidelity`` (:mod:`engine.extract.fidelity`) for ``hs``'s engine, or
    None (off, or the model cannot be scored: logged)."""
    if not job.fidelity:
        return None
    if job.engine == "vllm":
        make = getattr(hs, "fidelity_scoring", None)
        s = make(job) if callable(make) else None
    else:
        from engine.extract.fidelity import TransformersScoring

        s = TransformersScoring(job, hs)
    return s if s is not None and s.on else None


def _inputs(table: TokenTable, batch: Batch) -> tuple[dict[str, Any], list[dict[str, Any]], list[np.ndarray]]:
    """Per-sample ``input_ids``/``loss_mask`` tensors, manifest entries and the token arrays to collate."""
    import torch

    if not batch.rows:
        raise ValueError("empty batch")  # pending() drops them; never send one to the model
    tensors: dict[str, Any] = {}
    entries: list[dict[str, Any]] = []
    samples: list[np.ndarray] = []
    for row in batch.rows:
        ids, mask = table.tokens(row)
        sid = table.ids[row]
        tensors[f"{sid}/input_ids"] = torch.from_numpy(ids.astype(np.int64))
        tensors[f"{sid}/loss_mask"] = torch.from_numpy(mask.copy())
        e: dict[str, Any] = {"id": sid, "length": int(table.lengths[row]), "dataset": table.datasets[row]}
        if table.full_lengths[row] != table.lengths[row]:
            e["truncated_from"] = int(table.full_lengths[row])
        entries.append(e)
        samples.append(ids)
    return tensors, entries, samples


def main(argv: list[str] | None = None) -> int:
    """``python -m engine.extract.worker``: run one worker of a job file. Exit 0 done or stopped (quit), 1 failed,
    :data:`~engine.extract.job.STARTUP_EXIT` (3) failed while starting the model (the launcher does not restart it)."""
    p = argparse.ArgumentParser(prog="python -m engine.extract.worker")
    p.add_argument("--job", required=True, help="job.json written by datagen extract")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--local-rank", type=int, default=None)
    p.add_argument("--restarts", type=int, default=0, help="how often the launcher restarted this rank")
    p.add_argument("--last-error", default="", help="the previous run's failure (shown in status)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default on CPU: OMP_NUM_THREADS if set, else cores / workers)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s worker-{a.rank} %(levelname)s %(message)s")
    job = ExtractJob.from_json(Path(a.job).read_text())
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    elif job.device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, job.workers)))
    stop, drain = threading.Event(), threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        if drain.is_set():
            log.warning("signal %d again: aborting after the write in progress", signum)
            stop.set()
        else:
            log.warning("signal %d: stopping after the batch in hand", signum)
            drain.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        res = run_worker(job, a.rank, a.world, a.local_rank, stop=stop, drain=drain, restarts=a.restarts,
                         last_error=a.last_error)
    except StartupError as e:
        print(f"worker {a.rank}: error while starting the model (not restarted): {e}", file=sys.stderr)
        return STARTUP_EXIT
    except ExtractError as e:
        print(f"worker {a.rank}: error: {e}", file=sys.stderr)
        return 1
    except Exception:
        log.exception("worker %d failed", a.rank)
        return 1
    log.info("worker %d %s: %d samples, %d tokens, %d bytes, %d batches (%d samples already done); timings %s",
             a.rank, res.state, res.samples, res.tokens, res.bytes_written, res.batches, res.skipped_done,
             {k: round(v, 3) for k, v in res.timings.items()})
    return 0 if res.state in (WorkerState.DONE, WorkerState.STOPPED) else 1


if __name__ == "__main__":
    sys.exit(main())
