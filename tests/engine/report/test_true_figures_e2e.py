"""``datagen status --json`` against the engine at the same moment (issue 25, "Figures"), on a real
``datagen run --headless`` over the built-in simulator: two datasets, one paused, then the whole run;
the engine's own figures read through its Prometheus endpoint.

Before the fix ``status`` read committed rows plus the live row of the last commit (in flight 1,191
vs the dashboard's 1,608 under load), summed a paused dataset's work into the run's ETA, and after a
kill its elapsed went back to the last commit's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import httpx
from e2e import PY, write_prompts
from test_metrics import get, parse, value
from waiting import wait_for

from engine.run.ctl import send


def _config(tmp_path: Path) -> Path:
    """Two 40-prompt datasets on 4 slots of one class, about 0.6 s a completion (~12 s in all)."""
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"""
[run]
name = "figures"
dir = "{tmp_path / 'run'}"
progress_interval_s = 5
commit_interval_s = 0.5
metrics_port = 0
[provider]
kind = "simulated"
[provider.sim]
seed = 11
latency_ms = 20
tokens_per_s = 100
mean_completion_tokens = 60
faults = ""
[classes.short]
max_tokens = 400
concurrency = 4
[[datasets]]
name = "a"
path = "{write_prompts(tmp_path / 'a.jsonl', 40, 'a')}"
format = "text"
[[datasets]]
name = "b"
path = "{write_prompts(tmp_path / 'b.jsonl', 40, 'b')}"
format = "text"
""")
    return cfg


def _status(run_dir: Path) -> dict:
    r = subprocess.run([PY, "-m", "datagen", "status", str(run_dir), "--json"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _ctl(run_dir: Path, verb: str, dataset: str | None = None) -> None:
    r = send(run_dir, verb, dataset)
    assert r.ok, r.text


def test_status_is_the_engines_own_figures_while_it_runs_and_never_goes_back_after_a_kill(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([PY, "-m", "datagen", "run", str(_config(tmp_path)), "--headless"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()  # type: ignore[arg-type]

    def url() -> str | None:
        for line in list(lines):
            m = re.match(r"metrics: (http://127\.0\.0\.1:\d+/metrics)", line)
            if m:
                return m.group(1)
        assert proc.poll() is None, "".join(lines)
        return None

    def scrape() -> dict:
        return parse(httpx.get(metrics, timeout=5).text)

    try:
        metrics = wait_for(url, 60, what="the metrics line")
        wait_for(lambda: (get(scrape(), "datagen_completions_total", dataset="a") or 0) >= 6, 60, what="a's rate")

        # one dataset paused: the run's ETA is the running row's, the paused one adds nothing
        _ctl(run_dir, "pause", "b")
        doc = wait_for(lambda: (d := _status(run_dir)) and d["datasets"][1]["state"] == "paused"
                       and d["datasets"][0]["eta_s"] is not None and d, 30, what="b paused, a's ETA")
        a, b = doc["datasets"]
        assert doc["run"]["source"] == "engine" and doc["run"]["alive"]
        assert b["eta_s"] is None and doc["eta_s"] == a["eta_s"] and doc["run"]["eta_reason"] == ""

        # the whole run paused and drained: status --json and the engine agree, figure for figure
        _ctl(run_dir, "pause")
        wait_for(lambda: (m := scrape()) and get(m, "datagen_run_info", run="figures", state="paused") == 1
                 and all(v == 0 for k, v in m.items() if k[0] == "datagen_in_flight"), 60, what="a drained pause")
        before = scrape()
        doc = _status(run_dir)
        after = scrape()
        assert doc["run"]["source"] == "engine" and doc["run"]["state"] == "paused"
        assert doc["eta_s"] is None and doc["run"]["eta_reason"] == "paused"
        assert all(d["eta_s"] is None for d in doc["datasets"])
        for d in doc["datasets"]:
            n = d["name"]
            for s in ("done", "failed", "skipped", "pending", "in_flight"):
                assert value(before, "datagen_prompts", dataset=n, state=s) == d[s], (n, s)
            assert value(before, "datagen_completion_tokens_total", dataset=n) == d["completion_tokens"]
            assert abs(value(before, "datagen_spend_usd_total", dataset=n) - d["cost_usd"]) < 1e-9
            assert d["percent"] == (d["done"] + d["failed"]) * 100 // d["prompts"]
        elapsed = doc["run"]["elapsed_s"]
        assert (value(before, "datagen_run_elapsed_seconds") <= elapsed
                <= value(after, "datagen_run_elapsed_seconds")), (before, elapsed, after)

        # killed: status reads the store, and its elapsed is not below what the engine last showed
        last = value(scrape(), "datagen_run_elapsed_seconds")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        gone = wait_for(lambda: (d := _status(run_dir)) and not d["run"]["alive"] and d, 30, what="the engine gone")
        assert gone["run"]["source"] == "store" and gone["run"]["elapsed_s"] >= last, (gone["run"], last)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
