"""``datagen ctl`` and ``datagen status`` as a user runs them: the real CLI on real run directories
(the built-in simulator as the provider), with and without a live engine."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import SAMPLES
from waiting import wait_for

PY = sys.executable


def _config(tmp_path: Path, *, latency_ms: int = 0, tokens_per_s: int = 0, concurrency: int = 24,
            dataset: tuple[str, str, str] = ("glaive", "b1_glaive.jsonl", "glaive")) -> Path:
    name, fname, fmt = dataset
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"""
[run]
name = "cli"
dir = "{tmp_path / 'run'}"
progress_interval_s = 1
commit_interval_s = 0.2
[provider]
kind = "simulated"
[provider.sim]
seed = 3
latency_ms = {latency_ms}
tokens_per_s = {tokens_per_s}
mean_completion_tokens = 300
faults = ""
[classes.short]
max_tokens = 4096
concurrency = {concurrency}
[[datasets]]
name = "{name}"
path = "{SAMPLES / fname}"
format = "{fmt}"
""")
    return cfg


def datagen(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "datagen", *args], capture_output=True, text=True, timeout=timeout)


def status(run_dir: Path) -> dict:
    r = datagen("status", str(run_dir), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)



@pytest.fixture
def finished_run(tmp_path) -> Path:
    """A completed run directory: 5 prompts answered by the built-in simulator's SimA/SimB/SimC."""
    cfg = _config(tmp_path)
    r = datagen("run", str(cfg), "--headless", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return tmp_path / "run"


def test_ctl_without_an_engine_fails_unless_it_is_saved_for_the_next_start(finished_run):
    run = str(finished_run)
    r = datagen("ctl", run, "concurrency", "short", "8")
    assert r.returncode == 1 and "not applied: the engine is not running" in r.stderr
    assert "[classes.short] concurrency" in r.stderr
    r = datagen("ctl", run, "abort", "--yes")
    assert r.returncode == 1 and "not applied" in r.stderr
    r = datagen("ctl", run, "pause")
    assert r.returncode == 1 and "run-wide pause is not saved" in r.stderr
    r = datagen("ctl", run, "pause", "glaive")
    assert r.returncode == 0 and "saved, the engine is not running; applies at the next start" in r.stdout
    db = sqlite3.connect(finished_run / "store.sqlite")
    assert db.execute("SELECT state FROM datasets WHERE name = 'glaive'").fetchone() == ("paused",)  # saved
    db.close()
    assert status(finished_run)["datasets"][0]["state"] == "done"  # ... but nothing is left to pause: done
    r = datagen("ctl", run, "resume", "glaive")
    assert r.returncode == 0 and "applies at the next start" in r.stdout
    r = datagen("ctl", run, "pause", "nope")
    assert r.returncode == 1 and "unknown dataset 'nope'" in r.stderr


def test_provider_names_are_checked_and_an_excluded_one_comes_back(finished_run):
    run = str(finished_run)
    known = {p["name"] for p in status(finished_run)["providers"]}
    assert known and known <= {"SimA", "SimB", "SimC"}
    r = datagen("ctl", run, "exclude-provider", "DeepInfra")
    assert r.returncode == 1
    assert f"unknown provider 'DeepInfra'; known: {', '.join(sorted(known))}" in r.stderr and "--force" in r.stderr
    assert status(finished_run)["excluded_providers"] == []
    name = sorted(known)[0]
    r = datagen("ctl", run, "exclude-provider", name.lower())  # spelling matched to the known name
    assert r.returncode == 0 and f"provider {name} excluded" in r.stdout
    assert status(finished_run)["excluded_providers"] == [name]
    r = datagen("ctl", run, "include-provider", "SimZ")
    assert r.returncode == 1 and f"unknown excluded provider 'SimZ'; known: {name}" in r.stderr
    r = datagen("ctl", run, "include-provider", name)
    assert r.returncode == 0 and f"provider {name} included again" in r.stdout
    assert status(finished_run)["excluded_providers"] == []
    r = datagen("ctl", run, "exclude-provider", "DeepInfra", "--force")
    assert r.returncode == 0 and status(finished_run)["excluded_providers"] == ["DeepInfra"]


def test_exclude_before_any_request_needs_force(tmp_path):
    """Nothing seen and nothing in [provider.routing]: the name cannot be checked, so --force it."""
    cfg = _config(tmp_path)
    run = tmp_path / "run"
    r = datagen("run", str(cfg), "--headless", timeout=120)
    assert r.returncode == 0
    con = sqlite3.connect(run / "store.sqlite")
    with con:
        con.execute("DELETE FROM results")
        con.execute("DELETE FROM attempts")
    con.close()
    r = datagen("ctl", str(run), "exclude-provider", "SimA")
    assert r.returncode == 1 and "no provider is known to this run yet" in r.stderr and "--force" in r.stderr


def test_status_after_the_run_has_providers_live_credits_age_and_money_line(finished_run):
    first = status(finished_run)
    names = {p["name"] for p in first["providers"]}
    assert names and sum(p["requests"] for p in first["providers"]) >= 5
    # a second start on the finished run dispatches nothing: providers still come from the store
    r = datagen("run", str(finished_run.parent / "config.toml"), "--headless", timeout=120)
    assert r.returncode == 0
    again = status(finished_run)
    assert {p["name"] for p in again["providers"]} == names
    assert sum(p["requests"] for p in again["providers"]) == sum(p["requests"] for p in first["providers"])
    assert again["credits_usd"] is not None
    age1 = again["credits_age_s"]
    time.sleep(1.2)
    age2 = status(finished_run)["credits_age_s"]
    assert age2 >= age1 + 1.0  # computed when read, never frozen
    assert again["classes"][0]["name"] == "short" and again["classes"][0]["concurrency"] == 24
    r = datagen("status", str(finished_run))
    assert r.returncode == 0
    line = r.stdout.splitlines()[1]
    assert line.startswith("spent $") and " rate $" in line and " projected $" in line and " ETA 0s" in line
    assert " credits $" in line and "ago)" in line
    assert "concurrency short 0/24" in r.stdout


def test_elapsed_never_goes_back_once_the_run_has_ended(finished_run):
    """An engine still alive after its run completed (closing down) must not extrapolate elapsed
    past the figure it stored, or status goes backwards when the process exits."""
    con = sqlite3.connect(finished_run / "store.sqlite")
    stored = con.execute("SELECT elapsed_s FROM runtime").fetchone()[0]
    with con:  # as if this process were the engine, 5 s after its last heartbeat, run completed
        con.execute("UPDATE runtime SET pid=?, heartbeat_at=?, state='completed'", (os.getpid(), time.time() - 5))
    alive = status(finished_run)
    assert alive["run"]["alive"] and alive["run"]["elapsed_s"] == pytest.approx(stored, abs=1e-3)
    t0 = time.time()
    with con:
        con.execute("UPDATE runtime SET pid=?, heartbeat_at=?, state='running'", (os.getpid(), t0 - 5))
    running = status(finished_run)["run"]["elapsed_s"]
    slack = time.time() - t0  # a loaded machine takes a while between the update and the reading
    assert stored + 5 - 0.5 <= running <= stored + 5 + slack + 0.5  # running: extrapolated from the heartbeat
    con.close()


def test_status_watch_prints_until_the_engine_is_gone(finished_run):
    r = datagen("status", str(finished_run), "--watch", "--interval", "0.2")
    assert r.returncode == 0 and r.stdout.startswith("run cli: completed")
    r = datagen("status", str(finished_run), "--watch", "--json")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1 and json.loads(r.stdout)["run"]["state"] == "completed"
    r = datagen("status", str(finished_run), "--interval", "1")
    assert r.returncode == 1 and "--interval goes with --watch" in r.stderr
    r = datagen("status", str(finished_run), "--watch", "--interval", "0")
    assert r.returncode == 1 and "must be > 0" in r.stderr


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
def test_ctl_and_status_on_a_live_engine(tmp_path):
    """Concurrency bounds and class limits, pause shown as such (no ETA), --watch follows the run
    to its end."""
    cfg = _config(tmp_path, latency_ms=300, tokens_per_s=100, concurrency=4,
                  dataset=("sharegpt", "b7_sharegpt.json", "sharegpt"))
    run_dir = tmp_path / "run"
    p = subprocess.Popen([PY, "-m", "datagen", "run", str(cfg), "--headless"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    watch = None
    try:
        wait_for(lambda: run_dir.joinpath("store.sqlite").exists() and status(run_dir)["run"]["alive"], 60)
        run = str(run_dir)
        r = datagen("ctl", run, "concurrency", "short", "0")
        assert r.returncode == 1 and "at least 1" in r.stderr and "pause" in r.stderr
        r = datagen("ctl", run, "concurrency", "short", "17")
        assert r.returncode == 1 and "at most 16" in r.stderr
        r = datagen("ctl", run, "concurrency", "short", "6")
        assert r.returncode == 0 and "class short concurrency 6" in r.stdout
        wait_for(lambda: status(run_dir)["classes"][0]["concurrency"] == 6, 10)
        c = status(run_dir)["classes"][0]
        assert (c["configured"], c["max"]) == (4, 16)
        wait_for(lambda: status(run_dir)["totals"]["done"] >= 1, 60)
        r = datagen("ctl", run, "exclude-provider", "Nobody")
        assert r.returncode == 1 and "unknown provider 'Nobody'; known: Sim" in r.stderr
        r = datagen("ctl", run, "pause")
        assert r.returncode == 0 and "run paused" in r.stdout
        doc = wait_for(lambda: (d := status(run_dir))["run"]["state"] == "paused" and d, 10)
        assert doc["eta_s"] is None and doc["datasets"][0]["eta_s"] is None
        assert "ETA -- (paused)" in datagen("status", run).stdout
        watch = subprocess.Popen([PY, "-m", "datagen", "status", run, "--watch", "--interval", "0.3", "--json"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        assert watch.poll() is None  # the engine still runs: --watch keeps going
        p.send_signal(signal.SIGTERM)
        p.wait(60)
        out, _ = watch.communicate(timeout=30)
        docs = [json.loads(x) for x in out.splitlines()]
        assert watch.returncode == 0 and len(docs) >= 2
        assert docs[0]["run"]["alive"] and not docs[-1]["run"]["alive"]
        elapsed = [d["run"]["elapsed_s"] for d in docs]
        assert elapsed == sorted(elapsed)  # never backwards, the exit included
    finally:
        for proc in (p, watch):
            if proc is not None and proc.poll() is None:
                proc.kill()


def test_a_restart_names_the_datasets_an_earlier_run_left_paused_and_how_to_resume(tmp_path):
    """A dataset paused in an earlier process (here by ctl, as a guard would) with prompts left is announced
    at the next start, with its reason and the resume command, not left silently idle."""
    cfg = _config(tmp_path, latency_ms=200, tokens_per_s=20, concurrency=2)
    run = tmp_path / "run"
    first = subprocess.Popen([PY, "-m", "datagen", "run", str(cfg), "--headless"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (run / "store.sqlite").exists() and datagen("ctl", str(run), "pause", "glaive").returncode == 0,
                 60, "the live run paused glaive")
        first.send_signal(signal.SIGTERM)  # drain and exit: glaive keeps its pause and its pending prompts
        first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert status(run)["datasets"][0]["state"] == "paused" and status(run)["datasets"][0]["pending"] > 0
    second = subprocess.Popen([PY, "-m", "datagen", "run", str(cfg), "--headless"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        lines: list[str] = []
        assert second.stderr is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("still paused" in x for x in lines):
            lines.append(second.stderr.readline())
        said = next((x for x in lines if "still paused" in x), "")
        assert (f"[glaive] still paused (an earlier run paused it: paused by user); resume: p on its row, or "
                f"datagen ctl {run} resume glaive") in said, lines
    finally:
        second.send_signal(signal.SIGTERM)
        try:
            second.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            second.kill()
