"""One extraction job as an object: prepare, run (spawn and supervise workers), snapshot, commands.

:class:`ExtractRun` is what ``datagen extract`` runs, headless (:func:`engine.extract.launch.run_extract`
prints progress lines) or under the dashboard (which awaits :meth:`ExtractRun.run` on its event loop,
reads :meth:`ExtractRun.snapshot` and sends :attr:`ExtractRun.commands`). One worker process per GPU
group (``CUDA_VISIBLE_DEVICES`` = its GPUs) or ``workers`` CPU processes, each in its own session
and killed with the launcher (Linux ``PR_SET_PDEATHSIG``). A worker that dies (``kill -9``, a crash)
shows as ``restarting`` with its error for ``restart_delay_s``, then is started again (at most
``max_restarts`` times per rank; after that it shows ``failed``); the restarted worker recovers the
output directory and resumes exactly once (:mod:`engine.extract.shards`). A quit while a restart is
pending cancels it (the worker shows ``stopped``, and the drain ends as drains do: exit 0). A worker
whose model or engine could not start (exit :data:`~engine.extract.job.STARTUP_EXIT`: loading, config,
vLLM init, before its first batch) is not restarted: that error would repeat, and the job fails with it.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, Callable

from engine.extract.control import (
    Control,
    ControlError,
    ExtractControl,
    read_control,
    reset_for_start,
    update_control,
    write_plan,
)
from engine.extract.job import STARTUP_EXIT, ExtractJob, resolve_job
from engine.extract.prepare import prepare
from engine.extract.snapshot import ExtractSnapshot, JobState, LauncherWorker, WorkerState, build_snapshot, states_dtype
from engine.extract.status import collect, format_line, gpu_line, read_workers, status_dir
from engine.proc import runlock
from engine.storage.schema import db_path


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class ExtractRun:
    """One ``datagen extract`` job of this host (not under torchrun).

    Args:
        cfg: the validated :class:`engine.config.Config` (``extract`` and ``run`` sections).
        data / gpus / workers / free_bytes: the command line's overrides (see
            :func:`engine.extract.job.resolve_job`); ``job``: an already resolved job instead.
        datasets: extract only these datasets (None: all; chained extraction, :mod:`engine.run.chain`).
        say: where messages go (headless: print); every message also lands in :attr:`events`.
        progress_s: seconds between progress lines through ``say`` (None: none, for the dashboard).
        max_restarts: restarts per rank after a worker died (never after a start-up error, exit
            :data:`~engine.extract.job.STARTUP_EXIT`); restart_delay_s: seconds it shows
            ``restarting`` (with its error) before its restart.
        worker_output: ``"inherit"`` (the workers' logs go to this terminal) or ``"file"``
            (``out_dir/status/worker-<rank>.log``: nothing may write to a dashboard's terminal).
        poller: a :class:`engine.extract.gpu.GpuPoller` for the GPU rows (None: one is made; it is
            started by :meth:`run` and stopped when the run ends).

    Raises:
        ExtractError: bad settings (from ``resolve_job``).
    """

    def __init__(self, cfg: Any, *, data: Path | None = None, gpus: list[int] | None = None,
                 workers: int | None = None, free_bytes: int | None = None, job: ExtractJob | None = None,
                 datasets: list[str] | None = None,
                 say: Callable[[str], None] = print, progress_s: float | None = 5.0, max_restarts: int = 3,
                 restart_delay_s: float = 2.0, worker_output: str = "inherit", poller: Any = None,
                 events_max: int = 200) -> None:
        if worker_output not in ("inherit", "file"):
            raise ValueError(f"worker_output must be 'inherit' or 'file', got {worker_output!r}")
        self.cfg = cfg
        self.job = job or resolve_job(cfg, data=data, gpus=gpus, workers=workers, free_bytes=free_bytes,
                                      datasets=datasets)
        self._say = say
        self.progress_s = progress_s
        self.max_restarts = max_restarts
        self.restart_delay_s = restart_delay_s
        self.worker_output = worker_output
        if poller is None:
            from engine.extract.gpu import GpuPoller

            poller = GpuPoller()
        self.poller = poller
        self.events: collections.deque[str] = collections.deque(maxlen=events_max)
        self.commands = ExtractControl(self.job.out_dir, on_change=self._own_change)
        self._ctl_seen: Control | None = None
        self.info: dict[str, Any] | None = None
        self.final_state: JobState | None = None
        self.final_reason = ""
        self.exit_code: int | None = None
        self._lock: runlock.DirLock | None = None
        self._procs: dict[int, subprocess.Popen | None] = {}
        self._logs: dict[int, IO[bytes]] = {}
        self._lw: dict[int, LauncherWorker] = {}
        self._restart_at: dict[int, float] = {}
        self._interrupts = 0
        self._started = 0.0
        self._ended = 0.0

    # ------------------------------------------------------------------ messages
    def say(self, line: str) -> None:
        """Send ``line`` to ``say`` and keep it in :attr:`events` (with the time)."""
        self.events.append(f"{time.strftime('%H:%M:%S')} {line}")
        try:
            self._say(line)
        except (OSError, ValueError, RuntimeError):  # a closed terminal; print re-entered from a signal
            pass

    def _own_change(self, c: Control, line: str) -> None:
        self._ctl_seen = c
        self.say(line)

    def _watch_control(self) -> None:
        """Log what another shell (``datagen ctl``) changed in the control file."""
        c: Control | None
        try:
            c = read_control(self.job.out_dir)
        except ControlError as e:
            c = self._ctl_seen
            if c is not None and not any(str(e) in ev for ev in list(self.events)[-3:]):
                self.say(f"warning: {e}; workers keep the last good control")
            return
        old = self._ctl_seen
        self._ctl_seen = c
        if old is None or old.seq == c.seq:
            return
        if c.paused != old.paused:
            self.say("extraction " + ("paused" if c.paused else "resumed") + " (control file)")
        for ds in c.skip:
            if ds not in old.skip:
                self.say(f"{ds} skipped (control file): its pending samples are dropped")
        if c.quit != old.quit and c.quit is not None:
            self.say(f"quit: {c.quit} (control file)")

    # ------------------------------------------------------------------ prepare
    def prepare(self) -> dict[str, Any]:
        """Take ``out_dir/extract.lock``, recover the output, project and check the disk, write
        ``job.json``, ``status/plan.json`` and the run directory's ``extract.json``, reset the control
        file (unpaused, no quit; skips kept). Idempotent.

        Returns:
            :func:`prepare`'s numbers (``samples`` 0: nothing to do).

        Raises:
            ExtractError: input, model or disk problem (the lock is released again).
            engine.proc.runlock.DirectoryInUse: another live ``datagen extract`` writes ``out_dir``.
        """
        if self.info is not None:
            return self.info
        job = self.job
        Path(job.out_dir).mkdir(parents=True, exist_ok=True)
        self._lock = runlock.acquire(Path(job.out_dir), runlock.EXTRACT_LOCK, "extract output directory")
        try:
            try:
                skip = read_control(job.out_dir).skip
            except ControlError as e:
                self.say(f"warning: {e}; starting with a fresh control file")
                Path(job.out_dir, "control.json").unlink(missing_ok=True)
                skip = ()
            info = prepare(job, self.say, skip=skip)
            run_dir = Path(self.cfg.run.dir)
            if run_dir.is_dir():
                (run_dir / "extract.json").write_text(json.dumps({"out_dir": job.out_dir}))
            write_plan(job.out_dir, info["plan"])
            self._ctl_seen = reset_for_start(job.out_dir)
            sd = status_dir(job.out_dir)
            for p in sd.glob("worker-*.json") if sd.is_dir() else []:
                p.unlink(missing_ok=True)  # a previous run may have had more workers
            job.save(Path(job.out_dir) / "job.json")
        except BaseException:
            self._release()
            raise
        self.info = info
        return info

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # ------------------------------------------------------------------ workers
    def _spawn(self, rank: int) -> subprocess.Popen:
        job = self.job
        env = dict(os.environ)
        if job.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, job.gpu_group(rank)))
        lw = self._lw.get(rank, LauncherWorker(rank))
        cmd = [sys.executable, "-m", "engine.extract.worker", "--job", str(Path(job.out_dir) / "job.json"),
               "--rank", str(rank), "--world", str(job.workers), "--local-rank", str(rank),
               "--restarts", str(lw.restarts), "--last-error", lw.last_error[:500]]
        out: Any = None
        if self.worker_output == "file":
            if rank not in self._logs:
                self._logs[rank] = open(status_dir(job.out_dir) / f"worker-{rank}.log", "ab")
            out = self._logs[rank]
        # A session of their own: Ctrl-C and process-group signals reach the launcher only, which
        # turns them into a quit (first) or kills the workers (second).
        p = subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent, start_new_session=True,
                             stdout=out, stderr=subprocess.STDOUT if out is not None else None)
        self._procs[rank] = p
        self._lw[rank] = replace(lw, pid=p.pid, failed_at=None)
        return p

    def _status_doc(self, rank: int) -> dict[str, Any] | None:
        return next((w for w in read_workers(self.job.out_dir) if w.get("worker") == rank), None)

    def _quit_mode(self) -> str | None:
        try:
            return read_control(self.job.out_dir).quit
        except ControlError:
            return None

    def _ended_proc(self, rank: int, code: int) -> None:
        p = self._procs[rank]
        self._procs[rank] = None
        if code == 0:
            return
        doc = self._status_doc(rank)
        why = _signal_name(code) if code < 0 else f"exit code {code}"
        if doc is not None and p is not None and doc.get("pid") == p.pid and doc.get("state") == WorkerState.FAILED \
                and doc.get("reason") and "is gone" not in doc["reason"]:
            err = f"{doc['reason']} ({why})"
        else:
            err = f"worker process {p.pid if p else '?'} ended by {why}" if code < 0 else f"worker ended with {why}"
        lw = replace(self._lw.get(rank, LauncherWorker(rank)), last_error=err, failed_at=time.time())
        if self._interrupts >= 2:  # killed by the launcher itself (a second signal): stopped, not failed
            self._lw[rank] = replace(lw, failed_at=None, stopped=True)
            self.say(f"worker {rank} stopped: {err}")
        elif self._quit_mode() is not None and code < 0:
            # killed while a quit is in force (before or after its death was noticed, as a pending restart
            # that the quit cancels): stopped like the drain, its share resumes at the next run
            self._lw[rank] = replace(lw, failed_at=None, stopped=True)
            self.say(f"worker {rank} stopped: {err}; not restarted: quitting (a rerun resumes its share)")
        elif self._quit_mode() is not None:
            self._lw[rank] = replace(lw, failed_at=None, gave_up=True)
            self.say(f"worker {rank} failed: {err}; not restarted (quitting)")
        elif code == STARTUP_EXIT:
            self._lw[rank] = replace(lw, failed_at=None, gave_up=True)
            self.say(f"worker {rank} failed: {err}; not restarted: the model could not start, before the first "
                     "batch (a restart would fail the same way; fix the cause and rerun)")
        elif lw.restarts >= self.max_restarts:
            self._lw[rank] = replace(lw, failed_at=None, gave_up=True)
            self.say(f"worker {rank} failed: {err}; not restarted ({lw.restarts} restart(s) already)")
        else:
            self._lw[rank] = lw
            self._restart_at[rank] = time.monotonic() + self.restart_delay_s
            self.say(f"worker {rank} failed: {err}; restarting it in {self.restart_delay_s:.0f} s "
                     f"(restart {lw.restarts + 1} of at most {self.max_restarts})")

    def _restart_due(self) -> None:
        now = time.monotonic()
        for rank, at in list(self._restart_at.items()):
            if self._quitting():  # a quit cancels the pending restart: the drain ends without it
                del self._restart_at[rank]
                self._lw[rank] = replace(self._lw[rank], failed_at=None, stopped=True)
                self.say(f"worker {rank} not restarted: quitting (a rerun resumes its share)")
                continue
            if now >= at:
                del self._restart_at[rank]
                self._lw[rank] = replace(self._lw[rank], restarts=self._lw[rank].restarts + 1)
                p = self._spawn(rank)
                self.say(f"worker {rank} restarted (pid {p.pid})")

    def _quitting(self) -> bool:
        """True once a quit is in the control file or a second signal arrived: no restart any more."""
        return self._interrupts >= 2 or self._quit_mode() is not None

    def interrupt(self, name: str = "SIGINT") -> None:
        """A signal to the launcher: the first asks every worker to drain (quit), the second kills them."""
        self._interrupts += 1
        if self._interrupts == 1:
            self.say(f"{name}: stopping workers after their current batch; again to kill them")
            try:
                self._ctl_seen = update_control(self.job.out_dir,
                                                lambda c: replace(c, quit=c.quit or "drain", paused=False))
            except (ControlError, OSError) as e:
                self.say(f"cannot write the control file ({e}); signalling the workers")
                self._signal_all(signal.SIGTERM)
        else:
            self.say(f"{name}: killing workers now")
            self._signal_all(signal.SIGKILL)

    def _signal_all(self, sig: int) -> None:
        for p in self._procs.values():
            if p is not None and p.poll() is None:
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass

    # ------------------------------------------------------------------ run
    async def run(self) -> int:
        """Prepare (if not yet), start the workers, supervise them until every one ended; never
        blocks the event loop for long (it polls every 0.1 s).

        Returns:
            0 done, or drained after a quit; 1 a worker failed for good (restarts spent); 130
            interrupted (a signal, or an abort) with samples left.

        Raises:
            ExtractError / DirectoryInUse: from :meth:`prepare` (nothing started).
        """
        try:
            info = self.info if self.info is not None else await asyncio.to_thread(self.prepare)  # reads the input
            self._started = time.monotonic()
            if self._interrupts:  # a signal while preparing (prepare reset the control file): start nothing
                self.say("interrupted before the workers started; rerun to extract")
                self.final_state, self.final_reason, self.exit_code = JobState.STOPPED, "interrupted", 130
                return 130
            if info["samples"] == 0:
                self.say("nothing to do: every sample is already in the manifest"
                         + (" or in a skipped dataset" if read_control(self.job.out_dir).skip else ""))
                self.final_state, self.exit_code = JobState.DONE, 0
                return 0
            if hasattr(self.poller, "start"):
                self.poller.start()
            for rank in range(self.job.workers):
                self._spawn(rank)
            self.say(f"started {self.job.workers} worker(s) on "
                     + (f"GPUs {list(self.job.gpus)}" if self.job.device == "cuda" else "CPU")
                     + f"; status: {status_dir(self.job.out_dir)}")
            await self._supervise()
            return self._finish()
        finally:
            self._ended = time.monotonic()
            self._signal_all(signal.SIGKILL)  # only if run() itself was cancelled with workers alive
            for p in self._procs.values():
                if p is not None:
                    p.wait()
            for f in self._logs.values():
                f.close()
            if hasattr(self.poller, "stop"):
                self.poller.stop()
            self._release()

    async def _supervise(self) -> None:
        last = time.monotonic()
        while True:
            for rank, p in list(self._procs.items()):
                if p is not None:
                    code = p.poll()
                    if code is not None:
                        self._ended_proc(rank, code)
            self._restart_due()
            self._watch_control()
            if all(p is None for p in self._procs.values()) and not self._restart_at:
                return
            if self.progress_s is not None and time.monotonic() - last >= self.progress_s:
                last = time.monotonic()
                self._progress_line()
            await asyncio.sleep(0.1)

    def _progress_line(self) -> None:
        doc = collect(self.job.out_dir)
        if doc["state"] == JobState.NOT_STARTED:
            return  # workers still importing
        line = format_line(doc)
        if self.job.device == "cuda" and hasattr(self.poller, "latest"):
            line += " | " + gpu_line(self.poller.latest())
        try:
            self._say(line)
        except (OSError, ValueError, RuntimeError):
            pass

    def _finish(self) -> int:
        self._import_scores()
        doc = collect(self.job.out_dir)
        code = self._final_state(doc)
        # the last line says how the job ended (a worker whose restart a quit cancelled is stopped,
        # though its status file, its process gone, reads failed)
        stopped = {lw.rank for lw in self._lw.values() if lw.stopped}
        workers = [dict(w, state=WorkerState.STOPPED) if w.get("worker") in stopped else w for w in doc["workers"]]
        self.say(format_line({**doc, "state": self.final_state, "workers": workers,
                              "reason": self.final_reason or ("" if stopped else doc["reason"])}))
        proj = self.info["projected_bytes"] if self.info else 0
        self.say(f"bytes written {doc['bytes_written']} vs projected {proj} "
                 f"({doc['bytes_written'] / max(1, proj):.4f}x)")
        self.exit_code = code
        return code

    def _import_scores(self) -> None:
        """Save the fidelity scores of the samples listed so far into the run's store: the source run
        directory, else the config's ``[run] dir`` when it holds a store (nothing without one)."""
        if not self.job.fidelity:
            return
        run = getattr(getattr(self.cfg, "run", None), "dir", None)
        run_dir = Path(self.job.source_path) if self.job.source_kind == "run_dir" else (Path(run) if run else None)
        if run_dir is None or not db_path(run_dir).is_file():
            return
        try:
            from engine.extract.scorefiles import import_scores

            n = import_scores(self.job.out_dir, run_dir)
        except Exception as e:  # the extraction's own result stands; the scores stay beside the samples
            self.say(f"warning: fidelity scores not saved to {run_dir}'s store: {type(e).__name__}: {e}")
            return
        if n:
            self.say(f"fidelity: {n} sample score(s) in {run_dir}'s store")

    def _final_state(self, doc: dict[str, Any]) -> int:
        """Set :attr:`final_state` and :attr:`final_reason` from the workers' files (``doc``:
        :func:`collect`), the launcher's records, signals and the control file; returns the exit code."""
        gave_up = [lw for lw in self._lw.values() if lw.gave_up]
        quit_mode = self._quit_mode()
        if doc["state"] == JobState.DONE and not gave_up:
            self.final_state, code = JobState.DONE, 0
        elif self._interrupts or quit_mode == "abort":
            self.final_state, code = JobState.STOPPED, 130
            self.final_reason = "interrupted" if self._interrupts else "aborted"
        elif gave_up:
            self.final_state, code = JobState.FAILED, 1
            self.final_reason = "; ".join(f"worker {lw.rank}: {lw.last_error}" for lw in gave_up)
        elif quit_mode == "drain":
            self.final_state, code = JobState.STOPPED, 0
            self.final_reason = "quit: the batches in hand are written; rerun to resume"
        else:
            self.final_state, code = doc["state"], (0 if doc["state"] == JobState.DONE else 1)
            self.final_reason = doc.get("reason", "")
        return code

    # ------------------------------------------------------------------ snapshot
    def snapshot(self) -> ExtractSnapshot:
        """The job now: status files, control file, plan, the poller's last GPU reading, free disk.

        Reads a few small files; never blocks on the GPU driver (the poller's slot).
        """
        job = self.job
        try:
            c = read_control(job.out_dir)
            paused, skip, quit_mode = c.paused, c.skip, c.quit
        except ControlError:
            paused, skip, quit_mode = False, (), None
        workers = read_workers(job.out_dir) if self.info is not None else []
        written = sum(int(w.get("bytes_written") or 0) for w in workers)
        try:
            free = (job.free_bytes - written) if job.free_bytes is not None else shutil.disk_usage(job.out_dir).free
        except OSError:
            free = None
        elapsed = 0.0
        if self._started:
            elapsed = (self._ended or time.monotonic()) - self._started
        reading = self.poller.latest() if hasattr(self.poller, "latest") else None
        info = self.info or {}
        quitting = self._interrupts >= 2 or quit_mode is not None
        launcher = {r: replace(lw, restartable=self._procs.get(r) is not None and not quitting
                               and lw.restarts < self.max_restarts) for r, lw in self._lw.items()}
        return build_snapshot(
            workers=workers, world=job.workers if self.info and info.get("samples") else 0,
            plan=info.get("plan", {}), done_at_start=info.get("done", {}), launcher=launcher,
            paused=paused, skip=skip, quit_mode=quit_mode,
            final_state=self.final_state if self.exit_code is not None else None, final_reason=self.final_reason,
            gpu_reading=reading, host=socket.gethostname(), out_dir=job.out_dir, model=job.model,
            elapsed_s=elapsed, bytes_projected=int(info.get("projected_bytes", 0)), disk_free_bytes=free,
            disk_margin_bytes=job.disk_margin_bytes, events=tuple(self.events),
            states_dtype=states_dtype(job.save_dtype, job.dtype))


__all__ = ["ExtractRun", "prepare"]
