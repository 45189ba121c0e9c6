"""Extraction progress: one small JSON file per worker, and the job-wide view.

Each worker rewrites ``out_dir/status/worker-<rank>.json`` atomically (temp + rename) at most once
a second and at every state change: ``state`` (``loading running paused stopped done failed``;
``stopped``: it quit before the end of its share, on a user's quit), ``reason``, ``samples_done/total``
and ``tokens_done/total`` (its share, less the pending samples of skipped datasets; done includes
samples found done at start), ``tokens_per_s`` (over the last minute), ``bytes_written``, ``eta_s``,
``run_tokens`` (tokens this process extracted), ``run_s`` (seconds it spent running, not loading
or paused), ``avg_tokens_per_s`` (their ratio: the job's average rate), ``last_done_at`` (epoch s of
its last committed shard, None before one),
``batch_size`` (samples) and ``max_len`` (tokens) of the batch in hand (0 between batches),
``last_error`` (the last failure's message, kept across the launcher's restarts), ``restarts``,
``datasets`` (``{name: {samples_total, samples_done, tokens_total, tokens_done, skipped}}``, its
share per dataset), ``gpus`` (physical ids), ``host``, ``pid``, ``updated_at`` (epoch s). Any process reads them with
:func:`collect` (no lock, no store); :func:`gpus_json` adds NVML readings from :mod:`engine.extract.gpu`.
"""

from __future__ import annotations

import collections
import json
import os
import socket
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engine.extract.shards import MANIFEST
from engine.extract.snapshot import (
    RATE_WINDOW_S,
    JobState,
    WorkerState,
    job_average_rate,
    rate_basis,
    rate_text,
    recent_rate,
    states_dtype,
)
from engine.proc.pids import pid_alive

#: The states a worker writes to its own file.
STATES = (WorkerState.LOADING, WorkerState.RUNNING, WorkerState.PAUSED, WorkerState.STOPPED, WorkerState.DONE,
          WorkerState.FAILED)
#: The states of a worker at work (its file is checked for a dead process or a stale host).
ACTIVE = (WorkerState.LOADING, WorkerState.RUNNING, WorkerState.PAUSED)
#: A worker on another host that has not updated its file for this long is reported as failed.
STALE_S = 120.0


def status_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / "status"


class StatusWriter:
    """Keeps and writes one worker's status file.

    Args:
        out_dir: the job's output directory; rank: the worker's global rank; world: worker count.
        gpus: physical GPU ids it uses; min_interval_s: least seconds between routine writes.
        restarts: how often the launcher restarted this worker (from 1 on, ``bytes_written`` starts
            from the previous process's file: the job's bytes, up to the last second before it died);
            last_error: the previous run's failure.
    """

    def __init__(self, out_dir: str | Path, rank: int, world: int, gpus: tuple[int, ...] = (),
                 device: str = "cpu", min_interval_s: float = 1.0, restarts: int = 0, last_error: str = "") -> None:
        self.path = status_dir(out_dir) / f"worker-{rank}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.min_interval_s = min_interval_s
        now = time.time()
        self.doc: dict[str, Any] = {
            "worker": rank, "world": world, "host": socket.gethostname(), "pid": os.getpid(), "device": device,
            "gpus": list(gpus), "state": WorkerState.LOADING.value, "reason": "", "samples_total": 0, "samples_done": 0,
            "tokens_total": 0, "tokens_done": 0, "tokens_per_s": 0.0, "bytes_written": 0, "eta_s": None,
            "batch_size": 0, "max_len": 0, "last_error": last_error, "restarts": restarts, "datasets": {},
            "started_at": now, "updated_at": now,
            "run_tokens": 0, "run_s": 0.0, "avg_tokens_per_s": 0.0, "last_done_at": None,
        }
        self._run_s = 0.0  # seconds spent running before the current stretch
        self._running_since: float | None = None  # monotonic start of the current running stretch
        if restarts:  # a restarted worker: the bytes its earlier processes wrote still count for the job
            try:
                old = json.loads(self.path.read_text())
                if old.get("worker") == rank:
                    self.doc["bytes_written"] = int(old.get("bytes_written") or 0)
            except (OSError, ValueError, TypeError):
                pass
        self._last_write = 0.0
        self._lock = threading.RLock()
        self._window: collections.deque[tuple[float, int]] = collections.deque()
        self.write(force=True)

    def set_state(self, state: WorkerState, reason: str = "") -> None:
        """Change state (one of :data:`STATES`; written at once)."""
        assert state in STATES, state
        state = WorkerState(state)
        with self._lock:
            self.doc["state"], self.doc["reason"] = state.value, reason
            if state == WorkerState.FAILED and reason:
                self.doc["last_error"] = reason
            if state != WorkerState.RUNNING:
                self.doc["batch_size"] = self.doc["max_len"] = 0
            if state == WorkerState.DONE:
                self.doc["eta_s"] = 0.0
            now = time.monotonic()
            if self._running_since is not None and state != WorkerState.RUNNING:  # a running stretch ends
                self._run_s += now - self._running_since
                self._running_since = None
            if state == WorkerState.RUNNING:  # the rate counts from here (not model loading or a pause)
                self._window = collections.deque([(now, self.doc["tokens_done"])])
                if self._running_since is None:
                    self._running_since = now
            self._average(now)
            self.write(force=True)

    def _average(self, now: float) -> None:
        """``run_s`` and ``avg_tokens_per_s``: this process's tokens over its running seconds."""
        d = self.doc
        run_s = self._run_s + (now - self._running_since if self._running_since is not None else 0.0)
        d["run_s"] = round(run_s, 3)
        d["avg_tokens_per_s"] = round(d["run_tokens"] / run_s, 1) if run_s > 0 else 0.0

    def set_totals(self, samples_total: int, tokens_total: int, samples_done: int, tokens_done: int,
                   datasets: dict[str, dict[str, Any]] | None = None) -> None:
        """The worker's share and what of it was already done at start (``datasets``: the same per
        dataset, ``{name: {samples_total, samples_done, tokens_total, tokens_done, skipped}}``)."""
        with self._lock:
            self.doc.update(samples_total=samples_total, tokens_total=tokens_total, samples_done=samples_done,
                            tokens_done=tokens_done, datasets=datasets or {})
            self._window = collections.deque([(time.monotonic(), tokens_done)])
            self.write(force=True)

    def skip_dataset(self, name: str) -> None:
        """``name`` was skipped: its pending samples leave the worker's totals (written at once)."""
        with self._lock:
            ds = self.doc["datasets"].get(name)
            if ds is None or ds.get("skipped"):
                return
            ds["skipped"] = True
            self.doc["samples_total"] -= ds["samples_total"] - ds["samples_done"]
            self.doc["tokens_total"] -= ds["tokens_total"] - ds["tokens_done"]
            self.write(force=True)

    def set_batch(self, batch_size: int, max_len: int) -> None:
        """The batch in hand: ``batch_size`` samples, longest ``max_len`` tokens (0, 0: none)."""
        with self._lock:
            self.doc["batch_size"], self.doc["max_len"] = int(batch_size), int(max_len)
            self.write()

    def add_done(self, samples: int, tokens: int, nbytes: int,
                 per_dataset: dict[str, tuple[int, int]] | None = None) -> None:
        """Count a committed shard (``per_dataset``: ``{name: (samples, tokens)}`` of it); rate over
        the last minute; written at most every ``min_interval_s``."""
        with self._lock:
            self._add_done(samples, tokens, nbytes, per_dataset or {})

    def _add_done(self, samples: int, tokens: int, nbytes: int, per_dataset: dict[str, tuple[int, int]]) -> None:
        d = self.doc
        d["samples_done"] += samples
        d["tokens_done"] += tokens
        d["run_tokens"] += tokens
        d["last_done_at"] = time.time()
        d["bytes_written"] += nbytes
        for name, (ns, nt) in per_dataset.items():
            ds = d["datasets"].setdefault(name, {"samples_total": 0, "samples_done": 0, "tokens_total": 0,
                                                 "tokens_done": 0, "skipped": False})
            ds["samples_done"] += ns
            ds["tokens_done"] += nt
            if ds["skipped"]:  # written after its skip (the batch in hand then): it counts in the totals again
                d["samples_total"] += ns
                d["tokens_total"] += nt
        now = time.monotonic()
        self._window.append((now, d["tokens_done"]))
        while len(self._window) > 2 and now - self._window[1][0] > RATE_WINDOW_S:
            self._window.popleft()
        t0, k0 = self._window[0]
        if now > t0:
            d["tokens_per_s"] = round((d["tokens_done"] - k0) / (now - t0), 1)
        left = d["tokens_total"] - d["tokens_done"]
        d["eta_s"] = round(left / d["tokens_per_s"], 1) if d["tokens_per_s"] > 0 else None
        self._average(now)
        self.write()

    def write(self, force: bool = False) -> None:
        """Atomically rewrite the file (skipped when the last write was under ``min_interval_s`` ago)."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self._last_write < self.min_interval_s:
                return
            self._last_write = now
            self.doc["updated_at"] = time.time()
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.doc))
            os.replace(tmp, self.path)


def read_workers(out_dir: str | Path) -> list[dict[str, Any]]:
    """Every worker's status (by rank); a worker that died without saying so is shown ``failed``."""
    out: list[dict[str, Any]] = []
    d = status_dir(out_dir)
    if not d.is_dir():
        return out
    host, now = socket.gethostname(), time.time()
    def rank(p: Path) -> int:
        n = p.stem.removeprefix("worker-")
        return int(n) if n.isdigit() else -1

    for p in sorted(d.glob("worker-*.json"), key=rank):
        try:
            w = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if w.get("state") in ACTIVE:
            if w.get("host") == host and not pid_alive(int(w.get("pid", -1))):
                w["state"], w["reason"] = WorkerState.FAILED.value, f"worker process {w.get('pid')} is gone (killed?); rerun to resume"
                w["last_error"] = w["reason"]
            elif w.get("host") != host and now - float(w.get("updated_at", 0)) > STALE_S:
                w["state"], w["reason"] = WorkerState.FAILED.value, f"no update for {now - float(w.get('updated_at', 0)):.0f} s"
                w["last_error"] = w["reason"]
        out.append(w)
    return out


def _holder(out_dir: str | Path) -> dict[str, Any] | None:
    """Who holds ``out_dir/extract.lock`` (the live ``datagen extract`` launcher), or None."""
    from engine.proc.runlock import EXTRACT_LOCK, holder

    h = holder(Path(out_dir), EXTRACT_LOCK)
    return h.as_dict() if h is not None else None


def collect(out_dir: str | Path, now: float | None = None) -> dict[str, Any]:
    """The job-wide extraction status of ``out_dir`` (JSON-able), for ``datagen status --json``.

    Returns:
        ``{"out_dir", "state", "reason", "workers": [...], "samples_total", "samples_done",
        "tokens_total", "tokens_done", "tokens_per_s", "avg_tokens_per_s", "rate_basis",
        "bytes_written", "eta_s", "manifest_samples", "lock", "save_dtype", "dtype", "states_dtype"}``
        (``tokens_per_s``: the last minute's rate at ``now``, :func:`recent_rate`, summed;
        ``avg_tokens_per_s``: :func:`job_average_rate`; ``rate_basis``: which one to show,
        :func:`rate_basis` and :func:`rate_text`)
        (``lock``: the live launcher holding ``out_dir/extract.lock``, :meth:`engine.proc.runlock.Holder.as_dict`, or null;
        ``save_dtype``: the job's ``[extract] save_dtype``, ``model`` or ``fp8``; ``dtype``: the model dtype
        (``bfloat16``...; "" before ``job.json`` is written); ``states_dtype``: how the states are stored, as
        shown: ``fp8``, ``bf16``, ``fp16``, ``fp32`` or "", :func:`engine.extract.snapshot.states_dtype`);
        ``state`` is ``not_started`` when no worker has reported, ``failed`` if any worker failed
        and none is active, ``stopped`` if one quit before its end and none is active, else
        ``loading``/``running``/``paused`` (any worker) or ``done`` (all).
    """
    ws = read_workers(out_dir)
    try:
        manifest_samples = (Path(out_dir) / MANIFEST).read_bytes().count(b"\n")
    except OSError:
        manifest_samples = 0
    states = [w.get("state") for w in ws]
    if not ws:
        state = JobState.NOT_STARTED
    elif any(s in ACTIVE for s in states):
        state = next(s for s in (JobState.RUNNING, JobState.PAUSED, JobState.LOADING) if s in states)
    elif WorkerState.FAILED in states:
        state = JobState.FAILED
    elif WorkerState.STOPPED in states:
        state = JobState.STOPPED
    else:
        state = JobState.DONE
    reason = "; ".join(f"worker {w['worker']}: {w['reason']}" for w in ws if w.get("reason"))
    now = time.time() if now is None else now
    tps = sum(recent_rate(w, now) for w in ws)
    avg = job_average_rate(ws)
    left = sum(int(w.get("tokens_total", 0)) - int(w.get("tokens_done", 0)) for w in ws)
    # the slowest running worker; none while the job is paused (the view says "ETA -- (paused)")
    etas = [w["eta_s"] for w in ws if w.get("state") in (WorkerState.LOADING, WorkerState.RUNNING)
            and w.get("eta_s") is not None]
    eta = 0.0 if left <= 0 else (max(etas) if etas and state != JobState.PAUSED else None)
    return {
        "out_dir": str(out_dir), "state": state, "reason": reason, "workers": ws,
        "samples_total": sum(int(w.get("samples_total", 0)) for w in ws),
        "samples_done": sum(int(w.get("samples_done", 0)) for w in ws),
        "tokens_total": sum(int(w.get("tokens_total", 0)) for w in ws),
        "tokens_done": sum(int(w.get("tokens_done", 0)) for w in ws),
        "tokens_per_s": round(tps, 1), "avg_tokens_per_s": round(avg, 1), "rate_basis": rate_basis(tps, avg),
        "bytes_written": sum(int(w.get("bytes_written", 0)) for w in ws),
        "eta_s": eta,
        "manifest_samples": manifest_samples,
        "lock": _holder(out_dir),
        **_dtypes(out_dir),
    }


def _dtypes(out_dir: str | Path) -> dict[str, str]:
    """``save_dtype`` (``fp8``: 1 byte per state element + a scale per token), ``dtype`` (the model's)
    and ``states_dtype`` (as shown) of ``out_dir/job.json`` (``model``, "", "" when it is absent)."""
    try:
        job = json.loads((Path(out_dir) / "job.json").read_text())
    except (OSError, ValueError):
        job = {}
    job = job if isinstance(job, dict) else {}
    save, dtype = str(job.get("save_dtype") or "model"), str(job.get("dtype") or "")
    return {"save_dtype": save, "dtype": dtype, "states_dtype": states_dtype(save, dtype)}


def gpus_json(reading: Any, extract: dict[str, Any] | None = None) -> dict[str, Any]:
    """An :class:`engine.extract.gpu.GpuReading` as JSON, each GPU's ``worker`` filled from ``extract``.

    Returns:
        ``{"available", "reason", "gpus": [{index, name, util_pct, mem_used_bytes, mem_total_bytes,
        temp_c, power_w, power_limit_w, worker}]}``; ``worker`` is ``"worker-<rank>"`` for a GPU an
        active worker of this host uses, else "".
    """
    owner: dict[int, str] = {}
    host = socket.gethostname()
    for w in (extract or {}).get("workers", []):
        if w.get("state") in ACTIVE and w.get("host") == host:
            for g in w.get("gpus", []):
                owner[int(g)] = f"worker-{w['worker']}"
    gpus = []
    for g in reading.gpus:
        d = asdict(g)
        d["worker"] = owner.get(g.index, d.get("worker", ""))
        gpus.append(d)
    return {"available": bool(reading.available), "reason": reading.reason, "gpus": gpus}


def run_dir_out_dir(run_dir: str | Path) -> Path:
    """Where a run's extraction writes: ``run_dir/extract.json``'s ``out_dir`` (written by
    ``datagen extract``), else the default ``run_dir/extract``."""
    p = Path(run_dir) / "extract.json"
    try:
        return Path(json.loads(p.read_text())["out_dir"])
    except (OSError, ValueError, KeyError, TypeError):
        return Path(run_dir) / "extract"


def format_line(doc: dict[str, Any]) -> str:
    """One headless progress line for :func:`collect`'s result."""
    from engine.extract.disk import fmt_bytes

    eta = doc.get("eta_s")
    parts = [f"extract {doc['state']}", f"{doc['samples_done']}/{doc['samples_total']} samples",
             f"{doc['tokens_done']}/{doc['tokens_total']} tokens",
             rate_text(doc.get("tokens_per_s") or 0.0, doc.get("avg_tokens_per_s") or 0.0),
             fmt_bytes(doc["bytes_written"]) + _dtype_suffix(doc),
             f"ETA {eta:.0f}s" if eta is not None else f"ETA -- ({doc['state']})" if doc["state"] in (
                 JobState.PAUSED, JobState.STOPPED, JobState.FAILED) else "ETA --"]
    ws = " ".join(f"w{w['worker']}:{w['state']}" for w in doc["workers"])
    return " | ".join(parts) + (f" | {ws}" if ws else "") + (f" | {doc['reason']}" if doc.get("reason") else "")


def _dtype_suffix(doc: dict[str, Any]) -> str:
    """`` fp8`` / `` bf16`` after the bytes written: how the states are stored (:func:`collect`'s
    ``states_dtype``; "" when unknown)."""
    shown = doc.get("states_dtype") or ("fp8" if doc.get("save_dtype") == "fp8" else "")
    return f" {shown}" if shown else ""


def status_fields(run_dir: str | Path) -> dict[str, Any]:
    """``{"extract": collect(...), "gpus": gpus_json(read_gpus(), ...)}`` for ``datagen status --json``
    of ``run_dir`` (never raises for a missing extraction or GPU: ``not_started`` / ``available: false``)."""
    from engine.extract.gpu import read_gpus

    extract = collect(run_dir_out_dir(run_dir))
    return {"extract": extract, "gpus": gpus_json(read_gpus(), extract)}


def gpu_line(reading: Any) -> str:
    """``GPU0 97% 71.2/143.8 GB 64C 612W`` for each GPU, or the reason there is none."""
    if not reading.available:
        return reading.reason
    out = []
    for g in reading.gpus:
        mem = (f"{g.mem_used_bytes / 1e9:.1f}/{g.mem_total_bytes / 1e9:.1f} GB"
               if g.mem_used_bytes is not None and g.mem_total_bytes else "? GB")
        def num(x: float | None) -> str:
            return "?" if x is None else f"{x:.0f}"

        out.append(f"GPU{g.index} {num(g.util_pct)}% {mem} {num(g.temp_c)}C {num(g.power_w)}W")
    return " ".join(out)
