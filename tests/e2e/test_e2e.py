"""The main job end to end: eight datasets through `datagen sim` with faults, kill -9 and resume, export."""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import time

import pytest
from e2e import PY, SimProcess, eight_dataset_config, read_log, run_env, status_json
from waiting import wait_for

FAULTS = "429:0.05,502:0.03,midstream:0.03,disconnect:0.02,stall:0.01"


def test_eight_datasets_with_faults_end_done_or_failed(tmp_path):
    log = tmp_path / "sim.jsonl"
    sim = SimProcess("--faults", FAULTS, "--seed", "7", "--mean-completion-tokens", "200", "--tokens-per-s", "2000", log=log)
    try:
        cfg = eight_dataset_config(tmp_path, sim.base_url)
        r = subprocess.run([PY, "-m", "datagen", "run", str(cfg), "--headless"], env=run_env(), capture_output=True,
                           text=True, timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "run completed" in r.stdout
    finally:
        sim.stop()
    doc = status_json(tmp_path / "run")
    assert doc["run"]["state"] == "completed"
    assert len(doc["datasets"]) == 9  # B3 has two files
    t = doc["totals"]
    assert t["prompts"] == 5 + 1 + 1 + 98 + 5 + 4 * 6
    assert t["done"] + t["failed"] == t["prompts"] and t["pending"] == t["in_flight"] == t["skipped"] == 0
    for d in doc["datasets"]:
        assert d["done"] + d["failed"] + d["skipped"] + d["pending"] + d["in_flight"] == d["prompts"]
    # Faults happened and were counted by class
    entries = read_log(log)
    injected = {e["fault"] for e in entries if e["fault"]}
    assert {"429", "502", "midstream", "disconnect"} <= injected
    errs = t["errors"]
    assert errs.get("rate_limit", 0) > 0 and errs.get("server", 0) > 0
    # the simulator's mid-stream error chunks carry code 502 / "server_error": classed like an HTTP 5xx
    assert errs["server"] == sum(1 for e in entries if e["outcome"] in ("502", "midstream"))
    assert "midstream" not in errs
    assert errs.get("disconnect", 0) > 0
    n429 = sum(1 for e in entries if e["outcome"] == "429")
    assert errs["rate_limit"] == n429
    # A failed prompt carries its reason
    db = sqlite3.connect(tmp_path / "run" / "store.sqlite")
    for _state, ec, err, att in db.execute("SELECT state, error_class, error, attempts FROM prompts WHERE state='failed'"):
        assert ec and err and att >= 1
    # Every stored result matches a completion the simulator fully sent
    sent = {e["generation_id"] for e in entries if e["outcome"] == "completed" and e["fully_sent"]}
    gids = [g for (g,) in db.execute("SELECT generation_id FROM results")]
    assert len(gids) == t["done"] and set(gids) <= sent


@pytest.mark.slow  # 20 s; `make slow` (CI runs it). The chaos tests kill -9 at full load there too
def test_kill9_and_resume_exactly_once(tmp_path):
    log = tmp_path / "sim.jsonl"
    sim = SimProcess("--faults", FAULTS, "--seed", "3", "--mean-completion-tokens", "300", "--tokens-per-s", "600",
                     "--latency-ms", "100", log=log)
    rng = random.Random(5)
    kills = 0
    try:
        cfg = eight_dataset_config(tmp_path, sim.base_url)
        run_dir = tmp_path / "run"
        for _ in range(3):
            p = subprocess.Popen([PY, "-m", "datagen", "run", str(cfg), "--headless"], env=run_env(),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            target = rng.randint(5, 25)
            before = 0
            try:
                before = status_json(run_dir)["totals"]["done"] if (run_dir / "store.sqlite").exists() else 0
            except Exception:
                pass
            try:
                wait_for(lambda p=p, before=before, target=target: p.poll() is not None or (
                    (run_dir / "store.sqlite").exists() and status_json(run_dir)["totals"]["done"] >= before + target),
                    60, interval=0.2)
            except TimeoutError:
                pass
            if p.poll() is None:
                p.kill()
                kills += 1
            p.wait()
        p = subprocess.Popen([PY, "-m", "datagen", "run", str(cfg), "--headless"], env=run_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            out, _ = p.communicate(timeout=180)
        except subprocess.TimeoutExpired as err:
            p.send_signal(signal.SIGUSR1)  # stack dump into the run directory, then fail with it
            time.sleep(2)
            p.kill()
            out, _ = p.communicate()
            stacks = (run_dir / "stacks.txt").read_text() if (run_dir / "stacks.txt").exists() else "(no dump)"
            raise AssertionError(
                f"final run did not finish: {status_json(run_dir)['totals']}\n{out[-3000:]}\n{stacks[-8000:]}") from err
        assert p.returncode == 0, out
    finally:
        sim.stop()
    assert kills >= 2
    doc = status_json(run_dir)
    assert doc["run"]["state"] == "completed"
    out = tmp_path / "export"
    subprocess.run([PY, "-m", "datagen", "export", str(run_dir), "--format", "raw", "--out", str(out)], check=True)
    lines = [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.read_text(encoding="utf-8").split("\n") if line]
    keys = [(x["dataset"], x["key"]) for x in lines]
    assert len(keys) == len(set(keys)) == doc["totals"]["done"]
    assert doc["totals"]["done"] + doc["totals"]["failed"] == doc["totals"]["prompts"]
    # No completed (stored) result was requested again after it was stored.
    db = sqlite3.connect(run_dir / "store.sqlite")
    stored = {k: (t, g) for k, t, g in db.execute("SELECT key, created_at, generation_id FROM results")}
    entries = read_log(log)
    # (the simulator may log the stored generation itself a few ms after the client stored it)
    again = [e for e in entries if e["prompt_key"] in stored and e["t"] > stored[e["prompt_key"]][0] + 0.001
             and e["generation_id"] != stored[e["prompt_key"]][1]]
    assert again == []
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
