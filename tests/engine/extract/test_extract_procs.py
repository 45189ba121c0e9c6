"""Hidden-state extraction as processes: ``datagen extract`` killed with -9 and restarted, and two
CPU workers splitting one job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from extract_jobs import lines

from engine.extract.loader import ExtractedDataset
from engine.extract.shards import OutDir
from engine.extract.tiny import synth_records
from engine.proc.pids import pid_alive
from engine.tokens.records import write_parquet

REPO = Path(__file__).resolve().parents[3]


def setup_job(tmp: Path, tiny: Path, n: int, lo: int, hi: int, max_tokens: int) -> tuple[Path, set[str]]:
    recs = synth_records(n, lo, hi, seed=11)
    write_parquet(tmp / "data" / "a.parquet", recs)
    (tmp / "config.toml").write_text(
        f'[run]\ndir = "run"\n[[datasets]]\nname = "a"\npath = "a.jsonl"\n'
        f'[extract]\nmodel = "{tiny}"\naux_layers = [0, 1, 2]\nmax_tokens_per_batch = {max_tokens}\n'
        f'disk_margin_gb = 0\n')
    return tmp / "run" / "extract", {r.id for r in recs}


def extract(tmp: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "datagen", "extract", str(tmp / "config.toml"), "--data",
                             str(tmp / "data"), "--progress-s", "0.5", *extra], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def kill_worker_then_launcher(p: subprocess.Popen, out: Path, listed, at_least: int = 4,
                              timeout: float = 60) -> int | None:
    """Once ``listed()`` (samples committed) reaches ``at_least``: SIGKILL worker 0 (its pid from its
    status file), wait for it to be gone, then SIGKILL the launcher ``p`` before it restarts the
    worker. Returns the worker's pid, or None when the job ended or ``timeout`` passed first."""
    status = out / "status" / "worker-0.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and p.poll() is None:
        if listed() >= at_least and status.exists():
            pid = json.loads(status.read_text())["pid"]
            os.kill(pid, signal.SIGKILL)
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(p.pid, signal.SIGKILL)
            return pid
        time.sleep(0.005)
    return None


def check_exactly_once(out: Path, ids: set[str]) -> None:
    from safetensors import safe_open

    man = OutDir(out).read_manifest()
    listed = [e["id"] for e in man]
    assert len(listed) == len(set(listed)) and set(listed) == ids  # every sample exactly once
    shards = {e["shard"] for e in man}
    assert shards == {p.name for p in out.glob("shard-*.safetensors")}  # no unlisted shard
    assert not list(out.glob(".tmp-shard*"))
    for name in shards:  # every shard readable, holding what the manifest says
        with safe_open(str(out / name), framework="pt") as f:
            keys = set(f.keys())
            for e in (e for e in man if e["shard"] == name):
                for k in ("input_ids", "loss_mask", "aux_hidden_states", "last_hidden_state"):
                    assert f"{e['id']}/{k}" in keys
                assert f.get_slice(f"{e['id']}/aux_hidden_states").get_shape()[0] == e["length"]
    ds = ExtractedDataset(out)
    assert len(ds) == len(ids) and ds[len(ds) - 1]["input_ids"].shape[0] == ds.entries[-1]["length"]


@pytest.mark.slow  # 17 s; `make slow` (CI runs it)
def test_kill9_worker_then_restart_exactly_once(tmp_path: Path, tiny: Path) -> None:
    out, ids = setup_job(tmp_path, tiny, 60, 8, 160, 256)
    p = extract(tmp_path)
    # the worker, mid-run; then the launcher, before it restarts it (test_extract_control_procs.py)
    pid = kill_worker_then_launcher(p, out, lambda: lines(out / "manifest.jsonl"))
    assert pid is not None, p.communicate()[0]
    log = p.communicate(timeout=60)[0]
    killed_at = lines(out / "manifest.jsonl")
    assert p.returncode == -signal.SIGKILL and 4 <= killed_at < len(ids), (killed_at, log)
    doc = json.loads(subprocess.run([sys.executable, "-c", "import json,sys; from engine.extract.status import collect;"
                                     f"print(json.dumps(collect({str(out)!r})))"], cwd=REPO, capture_output=True,
                                    text=True).stdout)
    assert doc["state"] == "failed" and "is gone" in doc["reason"]
    p = extract(tmp_path)
    log = p.communicate(timeout=120)[0]
    assert p.returncode == 0, log
    assert f"already extracted: {killed_at}" in log
    check_exactly_once(out, ids)


@pytest.mark.slow  # issue 27: long e2e test (>9 s on 2 cores), run by `make slow`
def test_two_cpu_workers_split_and_report(tmp_path: Path, tiny: Path) -> None:
    out, ids = setup_job(tmp_path, tiny, 40, 8, 120, 512)
    p = extract(tmp_path, "--workers", "2")
    log = p.communicate(timeout=120)[0]
    assert p.returncode == 0, log
    assert "started 2 worker(s) on CPU" in log
    ws = [json.loads((out / "status" / f"worker-{r}.json").read_text()) for r in (0, 1)]
    assert [w["state"] for w in ws] == ["done", "done"]
    assert all(w["samples_done"] == w["samples_total"] > 0 and w["bytes_written"] > 0 for w in ws)
    assert ws[0]["pid"] != ws[1]["pid"] and sum(w["samples_done"] for w in ws) == len(ids)
    tok = [w["tokens_done"] for w in ws]
    assert abs(tok[0] - tok[1]) <= 0.25 * sum(tok)  # length-balanced
    assert "w0:running" in log or "w1:running" in log or "w0:done" in log  # progress was reported
    check_exactly_once(out, ids)
