"""Extraction control and supervision with real worker processes on the tiny model (CPU):
pause / resume / skip / quit through ``out_dir/control.json`` (the dashboard's commands) and through
``datagen ctl`` from another shell; a worker killed with -9 shows as failed with its error, is
restarted, and the output equals a clean run's; the snapshot's figures equal the status files and
the manifest."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from extract_jobs import lines
from waiting import async_wait_for

from engine.config import parse_config
from engine.extract.control import Control, ControlReader, ExtractControl, read_control, resolve_out_dir, send
from engine.extract.gpu import GpuReading, GpuSnapshot
from engine.extract.loader import ExtractedDataset
from engine.extract.run import ExtractRun
from engine.extract.shards import OutDir
from engine.extract.snapshot import ExtractSnapshot, LauncherWorker, build_snapshot
from engine.extract.status import read_workers
from engine.extract.tiny import synth_records
from engine.tokens.records import write_parquet

pytestmark = pytest.mark.usefixtures("one_thread")  # the workers: the machine is shared

REPO = Path(__file__).resolve().parents[3]


def make_job(tmp: Path, tiny: Path, n: int = 120, max_tokens: int = 192, out: str | None = None,
             seed: int = 11) -> tuple[Any, set[str], dict[str, str]]:
    recs = synth_records(n, 8, 96, seed=seed)
    data = tmp / "data"
    if not data.exists():
        write_parquet(data / "a.parquet", recs)
    extract = {"model": str(tiny), "aux_layers": [0, 1, 2], "max_tokens_per_batch": max_tokens, "disk_margin_gb": 0}
    if out is not None:
        extract["out_dir"] = str(tmp / out)
    cfg = parse_config({"run": {"dir": str(tmp / "run")}, "datasets": [{"name": "a", "path": "a.jsonl"}],
                        "extract": extract}, tmp / "config.toml", check_files=False)
    return cfg, {r.id for r in recs}, {r.id: r.dataset for r in recs}


def new_run(cfg: Any, tmp: Path, said: list[str], **kw: Any) -> ExtractRun:
    return ExtractRun(cfg, data=tmp / "data", workers=kw.pop("workers", 1), say=said.append, progress_s=None,
                      **kw)


def ctl(path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "datagen", "ctl", str(path), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def check_exactly_once(out: Path, ids: set[str] | None = None) -> list[dict[str, Any]]:
    man = OutDir(out).read_manifest()
    listed = [e["id"] for e in man]
    assert len(listed) == len(set(listed))
    if ids is not None:
        assert set(listed) == ids
    assert {e["shard"] for e in man} == {p.name for p in out.glob("shard-*.safetensors")}
    assert not list(out.glob(".tmp-shard*"))
    return man


def check_snapshot_matches_files(snap: ExtractSnapshot, out: Path) -> None:
    ws = read_workers(out)
    man = OutDir(out).read_manifest()
    assert snap.samples_done == sum(w["samples_done"] for w in ws) == len(man)
    assert snap.tokens_done == sum(w["tokens_done"] for w in ws) == sum(e["length"] for e in man)
    assert snap.bytes_written == sum(w["bytes_written"] for w in ws)
    assert [(v.rank, v.samples_done, v.tokens_done, v.bytes_written) for v in snap.workers] == [
        (w["worker"], w["samples_done"], w["tokens_done"], w["bytes_written"]) for w in ws]
    for d in snap.datasets:
        mine = [e for e in man if e["dataset"] == d.name]
        assert (d.samples_done, d.tokens_done) == (len(mine), sum(e["length"] for e in mine)), d


# ------------------------------------------------------------------------------------------ pure parts

def test_control_file_round_trip_and_bad_input(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "out" / "status").mkdir()
    (out / "status" / "plan.json").write_text(json.dumps({"datasets": {"a": {"samples": 3, "tokens": 30},
                                                                      "b": {"samples": 1, "tokens": 5}}}))
    reader = ControlReader(out)
    assert reader.read() == Control()
    said: list[str] = []
    c = ExtractControl(out, on_change=lambda _c, line: said.append(line))
    assert "paused" in c.pause() and read_control(out).paused
    c.skip("b")
    c.skip("b")
    assert read_control(out).skip == ("b",) and reader.read().skip == ("b",)
    with pytest.raises(ValueError, match="unknown dataset 'zz'; expected one of: a, b"):
        c.skip("zz")
    assert "quit again to abort" in c.quit() and read_control(out).quit == "drain"
    assert not read_control(out).paused  # a quit ends a pause: workers must get to drain
    assert "aborting" in c.quit() and read_control(out).quit == "abort"
    assert len(said) == 5 and read_control(out).seq == 5 and reader.read().quit == "abort"
    (out / "control.json").write_text('{"quit": "later"}')
    with pytest.raises(Exception, match=r"control.json: 'quit' must be null, \"drain\" or \"abort\", got 'later'"):
        read_control(out)
    assert reader.read().quit == "abort" and "'quit' must be" in reader.error  # a worker keeps the last good one


def test_ctl_resolution_and_refusals(tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = tmp_path / "elsewhere"
    out.mkdir(parents=True)
    run.mkdir()
    with pytest.raises(Exception, match="not an extraction output directory"):
        resolve_out_dir(run)
    (run / "extract.json").write_text(json.dumps({"out_dir": str(out)}))
    (out / "job.json").write_text("{}")
    assert resolve_out_dir(run) == out and resolve_out_dir(out) == out
    (out / "status").mkdir()
    (out / "status" / "plan.json").write_text(json.dumps({"datasets": {"a": {"samples": 1, "tokens": 1}}}))
    r = send(run, "extract-pause")
    assert not r.ok and "no extraction is running" in r.text and not read_control(out).paused
    r = send(run, "extract-skip", "a")
    assert r.ok and "applies at the next start" in r.text and read_control(out).skip == ("a",)
    p = ctl(run, "extract-skip", "nope")
    assert p.returncode == 1 and "unknown dataset 'nope'; expected one of: a" in p.stderr
    p = ctl(run, "extract-skip")
    assert p.returncode == 1 and "usage: datagen ctl OUT_OR_RUN_DIR extract-skip DATASET" in p.stderr
    p = ctl(tmp_path / "missing", "extract-resume")
    assert p.returncode == 1 and "no such directory" in p.stderr


def test_snapshot_joins_gpus_workers_and_datasets() -> None:
    host = "h1"
    ws = [{"worker": 0, "state": "running", "host": host, "pid": 10, "gpus": [2], "samples_done": 3, "samples_total": 8,
           "tokens_done": 30, "tokens_total": 80, "tokens_per_s": 12.5, "batch_size": 4, "max_len": 9,
           "bytes_written": 100, "reason": "", "last_error": "", "restarts": 0,
           "datasets": {"a": {"samples_done": 2, "tokens_done": 20}, "b": {"samples_done": 1, "tokens_done": 10}}},
          {"worker": 1, "state": "failed", "host": host, "pid": 11, "gpus": [5], "samples_done": 1, "samples_total": 4,
           "tokens_done": 5, "tokens_total": 40, "tokens_per_s": 3.0, "batch_size": 2, "max_len": 7,
           "bytes_written": 50, "reason": "worker process 11 is gone (killed?); rerun to resume",
           "last_error": "worker process 11 is gone (killed?); rerun to resume",
           "datasets": {"a": {"samples_done": 1, "tokens_done": 5}}}]
    gpus = tuple(GpuSnapshot(i, "NVIDIA H200", 50.0 + i, i * 10**9, 143 * 10**9, 40.0 + i, 300.0 + i, 700.0)
                 for i in range(8))
    snap = build_snapshot(workers=ws, world=2, plan={"a": {"samples": 9, "tokens": 90}, "b": {"samples": 3, "tokens": 30}},
                          launcher={1: LauncherWorker(1, pid=12, restarts=1, last_error="ended by SIGKILL")},
                          skip=("b",), gpu_reading=GpuReading(True, "", gpus, 1.0), host=host)
    assert [g.worker for g in snap.gpus] == [None, None, 0, None, None, 1, None, None]
    assert snap.gpus[2].util_pct == 52.0 and snap.gpus[2].mem_total_bytes == 143 * 10**9
    w0, w1 = snap.workers
    assert (w0.state, w0.tokens_per_s, w0.batch_size, w0.max_len) == ("running", 12.5, 4, 9)
    # the launcher started pid 12 again; the file still has the dead pid 11's figures
    assert (w1.state, w1.pid, w1.restarts, w1.batch_size, w1.tokens_per_s) == ("restarting", 12, 1, 0, 0.0)
    assert "is gone" in w1.last_error
    a, b = snap.datasets
    assert (a.name, a.samples_done, a.samples_total, a.skipped) == ("a", 3, 9, False)
    assert (b.name, b.samples_done, b.samples_total, b.skipped) == ("b", 1, 3, True)
    assert (snap.samples_done, snap.samples_total) == (4, 9 + 1)  # b's pending samples left the total
    assert (snap.tokens_done, snap.tokens_total, snap.tokens_per_s) == (35, 90 + 10, 12.5)
    assert snap.eta_s == round(65 / 12.5, 1) and snap.state == "running"
    dead = build_snapshot(workers=ws[1:], world=2, plan={}, launcher={1: LauncherWorker(1, pid=11, failed_at=5.0,
                                                                                       last_error="boom (SIGKILL)")})
    # its restart is pending: restarting (not failed: the job is not over), with why it ended
    assert [v.state for v in dead.workers] == ["starting", "restarting"] and dead.workers[1].reason == "boom (SIGKILL)"
    assert dead.state == "restarting" and dead.reason == "worker 1: boom (SIGKILL)"
    assert build_snapshot(workers=[], world=0, plan={}).state == "not_started"


# ------------------------------------------------------------------------------------------ real workers

@pytest.mark.slow  # issue 27: long e2e test (>9 s on 2 cores), run by `make slow`
def test_pause_skip_resume_through_the_file_and_ctl(tmp_path: Path, tiny: Path) -> None:
    cfg, ids, ds_of = make_job(tmp_path, tiny, n=160, max_tokens=160)
    out = Path(cfg.run.dir) / "extract"
    manifest = out / "manifest.jsonl"
    said: list[str] = []

    async def drive() -> tuple[int, ExtractSnapshot, ExtractSnapshot, int]:
        run = new_run(cfg, tmp_path, said, workers=2)
        gaps: list[float] = []

        async def ticker() -> None:  # the event loop stays free while the run prepares and supervises
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.02)
                gaps.append(time.monotonic() - last)
                last = time.monotonic()

        tick = asyncio.create_task(ticker())
        task = asyncio.create_task(run.run())
        await async_wait_for(lambda: lines(manifest) >= 3, what="first shards", timeout=90.0)
        run.commands.pause()  # the dashboard's key
        await async_wait_for(lambda: [w["state"] for w in read_workers(out)] == ["paused", "paused"], what="paused", timeout=90.0)
        paused_at = lines(manifest)
        snap = run.snapshot()
        assert snap.state == "paused" and all(w.state == "paused" and w.batch_size == 0 for w in snap.workers)
        check_snapshot_matches_files(snap, out)
        await asyncio.sleep(1.0)
        assert lines(manifest) == paused_at  # nothing written while paused
        # from another shell, through the run directory (extract.json)
        p = await asyncio.to_thread(ctl, Path(cfg.run.dir), "extract-skip", "b")
        assert p.returncode == 0 and "b skipped" in p.stdout, p.stderr
        b_at_skip = sum(ds_of[e["id"]] == "b" for e in OutDir(out).read_manifest())
        assert 0 < b_at_skip < sum(d == "b" for d in ds_of.values())
        p = await asyncio.to_thread(ctl, out, "extract-resume")
        assert p.returncode == 0 and "resumed" in p.stdout, p.stderr
        rc = await asyncio.wait_for(task, 120)
        tick.cancel()
        assert len(gaps) > 100 and max(gaps) < 2.0, max(gaps)  # liveness, generous: never blocked for long
        return rc, snap, run.snapshot(), b_at_skip

    rc, _, end, b_at_skip = asyncio.run(drive())
    assert rc == 0, said
    man = check_exactly_once(out)
    assert sum(ds_of[e["id"]] == "b" for e in man) == b_at_skip  # nothing of b after the skip
    assert {e["id"] for e in man if ds_of[e["id"]] == "a"} == {i for i, d in ds_of.items() if d == "a"}
    assert end.state == "done" and end.samples_done == end.samples_total == len(man)
    b = next(d for d in end.datasets if d.name == "b")
    assert b.skipped and b.samples_done == b_at_skip < b.samples_total
    check_snapshot_matches_files(end, out)
    assert any("extraction paused" in e for e in end.events) and any("b skipped (control file)" in e for e in end.events)
    assert any("extraction resumed (control file)" in e for e in end.events)
    ws = read_workers(out)
    assert [w["state"] for w in ws] == ["done", "done"]
    assert all(w["samples_done"] == w["samples_total"] for w in ws)  # skipped pending samples left the totals
    # a restart honours the skip: nothing left to do
    said.clear()
    assert asyncio.run(new_run(cfg, tmp_path, said).run()) == 0
    assert any("to do: 0 samples" in s and "skipped datasets: b" in s for s in said), said


def _quit_after(cfg: Any, tmp: Path, said: list[str], n_quits: int, pause_first: bool = False
                ) -> tuple[int, ExtractSnapshot]:
    out = Path(cfg.run.dir) / "extract"
    manifest = out / "manifest.jsonl"

    async def drive() -> tuple[int, ExtractSnapshot]:
        run = new_run(cfg, tmp, said)
        task = asyncio.create_task(run.run())
        start = lines(manifest)
        await async_wait_for(lambda: lines(manifest) >= start + 2 and (read_workers(out) or [{}])[0].get("state") == "running",
                    what="running", timeout=90.0)
        if pause_first:  # from another shell, straight at the output directory; a quit ends the pause
            p = await asyncio.to_thread(ctl, out, "extract-pause")
            assert p.returncode == 0 and "extraction paused" in p.stdout, p.stderr
            await async_wait_for(lambda: read_workers(out)[0]["state"] == "paused", what="paused", timeout=90.0)
            assert run.snapshot().state == "paused"
        for _ in range(n_quits):
            run.commands.quit()
        rc = await asyncio.wait_for(task, 60)
        return rc, run.snapshot()

    return asyncio.run(drive())


def test_quit_while_paused_drains_and_exits_0(tmp_path: Path, tiny: Path) -> None:
    # 600 samples: on a loaded machine `ctl extract-pause` (a subprocess) must land before the job ends
    cfg, ids, _ = make_job(tmp_path, tiny, n=600, max_tokens=160)
    out = Path(cfg.run.dir) / "extract"
    said: list[str] = []
    rc, snap = _quit_after(cfg, tmp_path, said, 1, pause_first=True)
    assert rc == 0, said
    w = read_workers(out)[0]
    assert w["state"] == "stopped" and "drained" in w["reason"]
    assert snap.state == "stopped" and snap.quit_mode == "drain" and snap.samples_done < snap.samples_total
    check_snapshot_matches_files(snap, out)
    drained = len(check_exactly_once(out))
    assert 2 <= drained < len(ids)
    assert any("quit again to abort" in e for e in snap.events)


@pytest.mark.slow  # ~30 s on a shared machine: three runs of the tiny model
def test_second_quit_aborts_and_the_next_start_finishes(tmp_path: Path, tiny: Path) -> None:
    cfg, ids, _ = make_job(tmp_path, tiny, n=120, max_tokens=160)
    out = Path(cfg.run.dir) / "extract"
    said: list[str] = []
    assert _quit_after(cfg, tmp_path, said, 1)[0] == 0
    drained = len(check_exactly_once(out))
    rc, snap = _quit_after(cfg, tmp_path, said, 2)
    assert rc == 130 and snap.state == "stopped" and snap.quit_mode == "abort", said
    # the worker saw the abort, or (between the two quits) the drain it turned into
    assert read_workers(out)[0]["reason"].startswith(("aborted after the write in progress", "drained:"))
    assert drained < len(check_exactly_once(out)) < len(ids)
    assert asyncio.run(new_run(cfg, tmp_path, said).run()) == 0  # a quit is not kept: the next start runs
    check_exactly_once(out, ids)


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
def test_kill9_worker_shows_restarting_restarts_and_output_equals_a_clean_run(tmp_path: Path, tiny: Path) -> None:
    from engine.extract.job import resolve_job
    from engine.extract.worker import run_worker

    torch.set_num_threads(1)
    cfg_clean, ids, _ = make_job(tmp_path, tiny, n=64, max_tokens=192, out="clean")
    assert run_worker(resolve_job(cfg_clean, data=tmp_path / "data", device="cpu")).state == "done"  # in process
    cfg, _, _ = make_job(tmp_path, tiny, n=64, max_tokens=192)
    out = Path(cfg.run.dir) / "extract"
    manifest = out / "manifest.jsonl"
    said: list[str] = []

    async def drive() -> tuple[int, list[ExtractSnapshot], int]:
        run = new_run(cfg, tmp_path, said, restart_delay_s=1.0)
        task = asyncio.create_task(run.run())
        await async_wait_for(lambda: lines(manifest) >= 3 and bool(read_workers(out)), what="first shards", timeout=90.0)
        pid = read_workers(out)[0]["pid"]
        os.kill(pid, signal.SIGKILL)
        assert lines(manifest) < len(ids)  # mid-run
        seen: list[ExtractSnapshot] = []
        while not task.done():
            seen.append(run.snapshot())
            await asyncio.sleep(0.05)
        seen.append(run.snapshot())
        return await task, seen, pid

    rc, seen, pid = asyncio.run(drive())
    assert rc == 0, said
    # from its death to the new process: restarting with the error, never failed (restarts are left)
    assert not [s for s in seen if s.state == "failed" or (s.workers and s.workers[0].state == "failed")], said
    waiting = [s.workers[0] for s in seen if s.workers and s.workers[0].state == "restarting"
               and "SIGKILL" in s.workers[0].last_error]
    assert waiting and str(pid) in waiting[0].last_error, said
    assert any(s.workers[0].state in ("restarting", "loading", "running") and s.workers[0].restarts == 1
               for s in seen if s.workers)
    end = seen[-1]
    assert end.state == "done" and end.workers[0].restarts == 1 and "SIGKILL" in end.workers[0].last_error
    assert any("worker 0 failed" in s and "restarting it in 1 s" in s for s in said)
    w = read_workers(out)[0]
    assert w["restarts"] == 1 and w["pid"] != pid and "SIGKILL" in w["last_error"]
    check_exactly_once(out, ids)
    got, ref = ExtractedDataset(out), ExtractedDataset(tmp_path / "clean")
    for sid in ids:
        a, b = got[got.index(sid)], ref[ref.index(sid)]
        for k in ("input_ids", "loss_mask", "aux_hidden_states", "last_hidden_state"):
            assert torch.equal(a[k], b[k]), (sid, k)


def test_a_model_that_cannot_start_is_not_restarted(tmp_path: Path, tiny: Path) -> None:
    """A worker failing while its model starts (here: unreadable weights; on vLLM e.g. a missing weight
    name at init) fails the job at once with the error: before, the launcher restarted it 3 times, each
    reloading the model (on Kimi-K2.5 ~595 GB) only to fail the same way. A worker killed mid-run is
    still restarted (the test above)."""
    import shutil

    broken = tmp_path / "broken-model"
    shutil.copytree(tiny, broken)
    for f in broken.glob("*.safetensors"):
        f.write_bytes(b"not a safetensors file")
    cfg, _, _ = make_job(tmp_path, broken, n=16)
    said: list[str] = []
    run = new_run(cfg, tmp_path, said, restart_delay_s=0.2, max_restarts=3)
    rc = asyncio.run(run.run())
    assert rc == 1 and run.final_state == "failed", said
    assert not any("restart" in s and "not restarted" not in s for s in said), said  # never restarted
    gave_up = [s for s in said if "worker 0 failed" in s]
    assert len(gave_up) == 1 and "cannot load model" in gave_up[0] and "exit code 3" in gave_up[0], said
    assert "not restarted: the model could not start, before the first batch" in gave_up[0]
    assert "cannot load model" in run.final_reason
    w = read_workers(Path(cfg.run.dir) / "extract")[0]
    assert w["state"] == "failed" and w["restarts"] == 0 and "StartupError: cannot load model" in w["last_error"]
    assert run.snapshot().workers[0].restarts == 0


def test_abort_reaches_a_writer_waiting_for_disk_space(tmp_path: Path) -> None:
    """A shard waiting for disk space (stated free 0) holds the worker in ``flush``; a second quit
    (abort) through the control file ends the wait without writing. Before: the wait only ended on space."""
    import threading

    from engine.extract.disk import DiskGuard
    from engine.extract.gate import Gate
    from engine.extract.status import StatusWriter
    from engine.extract.worker import ShardWriter, Stopped

    out = OutDir(tmp_path)
    status = StatusWriter(tmp_path, 0, 1)
    stop = threading.Event()
    gate = Gate(ControlReader(tmp_path), status, stop)
    writer = ShardWriter(out, DiskGuard(tmp_path, 0, stated_free=0, poll_s=30.0), status, stop, poll=gate.aborting)
    writer.submit({"x/input_ids": torch.zeros(3, dtype=torch.int64)}, [{"id": "x", "length": 3, "dataset": "a"}], 100, 3)
    deadline = time.monotonic() + 10
    while json.loads(status.path.read_text())["state"] != "paused" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "low disk space" in json.loads(status.path.read_text())["reason"]
    ctl_ = ExtractControl(tmp_path, datasets=["a"])
    threading.Timer(0.3, lambda: (ctl_.quit(), ctl_.quit())).start()
    t0 = time.monotonic()
    with pytest.raises(Stopped, match="disk space"):
        writer.flush()
    assert time.monotonic() - t0 < 10  # liveness (the guard polls every 30 s)
    assert out.read_manifest() == [] and not list(tmp_path.glob("shard-*"))


def test_a_batch_written_after_its_datasets_skip_never_pushes_done_past_total(tmp_path: Path) -> None:
    """A skip takes the dataset's pending samples out of the totals; the batch of it already in hand is
    still written. Before the fix that batch counted as done but not in the total: ``40/39 samples``."""
    from engine.extract.status import StatusWriter

    status = StatusWriter(tmp_path, 0, 1, min_interval_s=0.0)
    status.set_totals(30, 3000, 0, 0, {"a": {"samples_total": 10, "samples_done": 0, "tokens_total": 1000,
                                              "tokens_done": 0, "skipped": False},
                                        "b": {"samples_total": 20, "samples_done": 0, "tokens_total": 2000,
                                              "tokens_done": 0, "skipped": False}})
    status.add_done(4, 400, 1, {"b": (4, 400)})
    status.skip_dataset("b")  # 16 pending samples of b leave the totals: 14 left in all
    doc = json.loads(status.path.read_text())
    assert (doc["samples_done"], doc["samples_total"]) == (4, 14)
    status.add_done(3, 300, 1, {"b": (3, 300)})  # b's batch in hand, written after the skip
    status.add_done(10, 1000, 1, {"a": (10, 1000)})
    doc = json.loads(status.path.read_text())
    assert (doc["samples_done"], doc["samples_total"]) == (17, 17)
    assert (doc["tokens_done"], doc["tokens_total"]) == (1700, 1700)
    assert doc["datasets"]["b"]["samples_done"] == 7 and doc["datasets"]["b"]["skipped"]
