"""kill -9 chaos: the run is SIGKILLed at seeded random moments and restarted until it completes.

Against ``datagen sim`` with faults on (429, 502, midstream, disconnect, stall) and its request log,
``datagen run --headless`` is killed ``CHAOS_KILLS`` times (5 in ``make test``, 20 in ``make
chaos``) at random moments (seed ``CHAOS_SEED``) and restarted each time, then run to the end. Checked:

- every valid prompt has exactly one stored result, and every stored result is a completion the
  simulator fully sent (its generation id and prompt key are in the simulator's log);
- ``PRAGMA integrity_check`` is ok after every kill, and ``datagen status`` counts add up;
- completions fully received but lost to a kill (paid, then requested again) are counted and
  printed; each must have finished within one commit window (``run.commit_interval_s``) of a kill;
- accounted spend vs the simulator's billed total: the difference is printed and explained
  (lost completions + partial spend of the streams the kill cut + the estimate of failed attempts).
"""

from __future__ import annotations

import collections
import os
import random
import signal
import sqlite3
import subprocess
import time

import pytest
from e2e import SimProcess, integrity, live_status, read_log, run_cmd, run_env, write_prompts
from waiting import wait_for

from engine.datasets import iter_prompts
from engine.prompts import Prompt
from engine.report.status import collect_status

KILLS = int(os.environ.get("CHAOS_KILLS", "5"))
SEED = int(os.environ.get("CHAOS_SEED", "20260"))
FAULTS = "429:0.05,502:0.05,midstream:0.04,disconnect:0.04,stall:0.02"
#: run.commit_interval_s; 1.0 is the default, so the figures are those of a default run.
COMMIT_INTERVAL_S = float(os.environ.get("CHAOS_COMMIT_S", "1.0"))
#: Error class the engine gives each injected fault. The simulator's mid-stream error chunk carries code 502 or
#: "server_error": an in-stream error with a code is classed as that HTTP status would be (issue 11).
FAULT_CLASS = {"429": "rate_limit", "502": "server", "midstream": "server", "disconnect": "disconnect",
               "stall": "stall"}
#: Prompts per planned kill: enough that the run cannot finish before the last kill.
PROMPTS_PER_KILL = 80


def _config(tmp_path, base_url, data):
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"""
[run]
name = "chaos"
dir = "{tmp_path / 'run'}"
progress_interval_s = 1
commit_interval_s = {COMMIT_INTERVAL_S}
max_attempts = 10
[provider]
kind = "openai"
base_url = "{base_url}"
api_key_env = "E2E_KEY"
[provider.timeouts]
connect_s = 5
stall_s = 1.0
total_s = 60
[spend]
anomaly_error_rate = 0
[classes.short]
max_tokens = 4096
concurrency = 64
[[datasets]]
name = "chaos"
path = "{data}"
format = "text"
""")
    return cfg


@pytest.mark.timeout(180 + 25 * KILLS)
@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
def test_kill9_chaos_exactly_once(tmp_path):
    rng = random.Random(SEED)
    n_valid = PROMPTS_PER_KILL * KILLS + 150
    data = write_prompts(tmp_path / "prompts.jsonl", n_valid, tag="chaos ", bad_rows=True)
    valid = {p.key for p in iter_prompts(data, "text") if isinstance(p, Prompt)}
    assert len(valid) == n_valid
    log = tmp_path / "sim.jsonl"
    sim = SimProcess("--faults", FAULTS, "--seed", str(SEED % 1000), "--mean-completion-tokens", "300",
                     "--tokens-per-s", "400", "--latency-ms", "50", log=log)
    run_dir = tmp_path / "run"
    db_file = run_dir / "store.sqlite"
    kills: list[float] = []  # wall-clock time of each SIGKILL
    done_at_kill: list[int] = []
    finished_early = False
    try:
        cfg = _config(tmp_path, sim.base_url, data)
        starts = 0
        while True:
            starts += 1
            assert starts <= KILLS + 3
            with open(tmp_path / f"run{starts}.out", "w") as out:
                p = subprocess.Popen(run_cmd(cfg), env=run_env(), stdout=out, stderr=subprocess.STDOUT)
            if len(kills) < KILLS:
                delay = rng.uniform(0.4, 3.5)  # includes moments during start-up and ingest
                try:
                    rc = p.wait(delay)
                except subprocess.TimeoutExpired:
                    t = time.time()
                    p.kill()
                    p.wait()
                    kills.append(t)
                else:
                    finished_early = rc == 0
                    assert rc == 0, (tmp_path / f"run{starts}.out").read_text()
                    break
                if db_file.exists():
                    assert integrity(db_file) == "ok", f"store corrupt after kill {len(kills)}"
                    try:
                        doc = collect_status(run_dir)
                    except sqlite3.OperationalError as e:  # killed between creating the file and the schema
                        assert "no such table" in str(e)
                        done_at_kill.append(0)
                        continue
                    assert not doc["run"]["alive"]
                    for d in doc["datasets"]:
                        assert d["done"] + d["failed"] + d["skipped"] + d["pending"] + d["in_flight"] == d["prompts"]
                    done_at_kill.append(doc["totals"]["done"])
                else:
                    done_at_kill.append(0)
                continue
            try:
                rc = p.wait(240)
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGUSR1)  # `datagen run` dumps its stacks into RUN_DIR/stacks.txt
                time.sleep(2)
                p.kill()
                stacks = run_dir / "stacks.txt"
                raise AssertionError(f"final run stuck after {len(kills)} kills: {collect_status(run_dir)['totals']}\n"
                                     f"{(tmp_path / f'run{starts}.out').read_text()[-3000:]}\n"
                                     f"{stacks.read_text()[-8000:] if stacks.exists() else '(no stack dump)'}") from None
            assert rc == 0, (tmp_path / f"run{starts}.out").read_text()
            break
    finally:
        if p.poll() is None:
            p.kill()
        sim.stop()
    assert not finished_early, f"the run completed after only {len(kills)} kills; raise PROMPTS_PER_KILL"
    assert len(kills) == KILLS
    assert integrity(db_file) == "ok"

    db = sqlite3.connect(db_file)
    results = {k: (g, c, t) for k, g, c, t in db.execute("SELECT key, generation_id, cost_usd, created_at FROM results")}
    states = dict(db.execute("SELECT state, COUNT(*) FROM prompts GROUP BY state").fetchall())
    failures = db.execute("SELECT source, error_class, error FROM prompts WHERE state='failed'").fetchall()
    (n_results,) = db.execute("SELECT COUNT(*) FROM results").fetchone()
    (n_keys,) = db.execute("SELECT COUNT(DISTINCT dataset || ':' || key) FROM results").fetchone()
    # Exactly one result per valid prompt, no duplicates, nothing failed.
    assert failures == [], failures
    assert states == {"done": n_valid}
    assert n_results == n_keys == len(results) == n_valid
    assert set(results) == valid
    (rejected,) = db.execute("SELECT rejected FROM datasets").fetchone()
    assert rejected == 2  # the broken row and the duplicate

    entries = read_log(log)
    by_gid = {e["generation_id"]: e for e in entries if e["generation_id"]}
    sent = {g: e for g, e in by_gid.items() if e["outcome"] == "completed" and e["fully_sent"]}
    stored_gids = {g for g, _, _ in results.values()}
    # Nothing stored that the simulator never sent, and each stored answer belongs to its prompt.
    assert stored_gids <= set(sent)
    for key, (gid, cost, _) in results.items():
        assert sent[gid]["prompt_key"] == key
        assert cost == pytest.approx(sent[gid]["cost_usd"], rel=1e-9, abs=1e-12)
    # No prompt was requested again once its result was stored.
    # (The simulator logs a completion after its last byte, so the stored one itself may log a few ms late.)
    again = [e for e in entries if e["prompt_key"] in results and e["generation_id"] != results[e["prompt_key"]][0]
             and e["t"] > results[e["prompt_key"]][2] + 0.001]
    assert again == []

    # Attempts that are not results, by generation id: failures, aborts, and streams a kill cut
    # (recorded at the next start from the stream workers' in-flight ledgers, with an estimated cost).
    attempt_cost = {g: c or 0.0 for g, c in db.execute(
        "SELECT generation_id, cost_usd FROM attempts WHERE outcome!='ok' AND generation_id IS NOT NULL")}
    # Completions fully sent but lost to a kill: paid, then requested again. One the worker had not read
    # yet is in its ledger (an aborted attempt priced from what it had received): with the fault attempts below.
    lost = [e for g, e in sent.items() if g not in stored_gids and g not in attempt_cost]
    window = COMMIT_INTERVAL_S + 1.0  # the commit window, plus parsing and the kill itself

    def kill_of(t, after=0.5):
        return next((i for i, k in enumerate(kills) if k - window <= t <= k + after), None)

    lost_per_kill = collections.Counter(kill_of(e["t"]) for e in lost)
    assert None not in lost_per_kill, f"a completion was lost away from any kill: {lost_per_kill}"

    # Spend: the simulator's billed total vs what the store accounts for.
    (acc_results,) = db.execute("SELECT COALESCE(SUM(cost_usd), 0) FROM results").fetchone()
    (acc_partial,) = db.execute(
        "SELECT COALESCE(SUM(cost_usd), 0) FROM attempts WHERE outcome!='ok' AND cost_usd IS NOT NULL").fetchone()
    billed = sum(e["cost_usd"] for e in entries)
    accounted = acc_results + acc_partial
    lost_usd = sum(e["cost_usd"] for e in lost)
    cut = [e for e in entries if e["cost_usd"] and e["outcome"] != "completed" and e["generation_id"] not in attempt_cost]
    cut_usd = sum(e["cost_usd"] for e in cut)
    fault_billed = sum(by_gid[g]["cost_usd"] for g in attempt_cost if g in by_gid)
    fault_accounted = sum(attempt_cost.values())
    # Every billed request the store does not account for was cut by a kill.
    # (The simulator logs a cut stream when it reads the connection's end: allow it a few seconds.)
    assert all(kill_of(e["t"], 3.0) is not None for e in cut), [e for e in cut if kill_of(e["t"], 3.0) is None][:3]
    assert billed - accounted == pytest.approx(lost_usd + cut_usd + (fault_billed - fault_accounted), abs=1e-9)
    # Failed attempts' cost is an estimate for kind "openai" (no /generation): streamed characters / 4
    # x the learned completion price (+ the prompt). The simulator's estimate-mode token is one word
    # (~6 characters), so the estimate runs ~1.4x high here; with a real tokenizer it is close.
    assert 0.5 * fault_billed <= fault_accounted <= 2.0 * fault_billed

    injected = collections.Counter(e["fault"] for e in entries if e["fault"])
    handled = collections.Counter(dict(db.execute(
        "SELECT error_class, COUNT(*) FROM attempts WHERE outcome='error' GROUP BY error_class").fetchall()))
    for kind, cls in FAULT_CLASS.items():
        assert injected[kind] > 0 and handled[cls] > 0, (kind, injected, handled)
    print(f"\nchaos: {len(kills)} kills survived (seed {SEED}), {n_valid} prompts, each stored exactly once, "
          f"0 duplicates, {starts} starts; done at each kill: {done_at_kill}")
    print(f"lost to kills (fully received, not committed, requested again): {len(lost)} completions, "
          f"${lost_usd:.5f}; per kill {[lost_per_kill.get(i, 0) for i in range(len(kills))]} "
          f"(commit window {COMMIT_INTERVAL_S:g}s)")
    for e in lost[:40]:
        print(f"  lost {e['generation_id']} key {e['prompt_key'][:12]} finished {kills[kill_of(e['t'])] - e['t']:.2f}s "
              f"before kill {kill_of(e['t']) + 1}, ${e['cost_usd']:.6f}")
    if len(lost) > 40:
        print(f"  ... and {len(lost) - 40} more")
    print("faults injected -> attempts stored by class: "
          + ", ".join(f"{k}: {injected[k]} -> {FAULT_CLASS[k]} {handled[FAULT_CLASS[k]]}" for k in FAULT_CLASS))
    print(f"spend: simulator billed ${billed:.5f}, store accounts ${accounted:.5f} (results ${acc_results:.5f} + "
          f"failed attempts ${acc_partial:.5f}); difference ${billed - accounted:.5f} = lost completions "
          f"${lost_usd:.5f} + streams cut by kills ${cut_usd:.5f} ({len(cut)}) + estimate error of failed "
          f"attempts ${fault_billed - fault_accounted:.5f} (billed ${fault_billed:.5f}, estimated ${fault_accounted:.5f})")


@pytest.mark.serial
def test_a_kill_loses_almost_nothing_with_default_commit_interval(tmp_path):
    """Three kills in steady state, each 0.6 s after a commit was seen, with the default commit
    interval: the completions lost must stay under a quarter of a second's worth (a commit window of
    at most ~0.2 s)."""
    data = write_prompts(tmp_path / "prompts.jsonl", 600, tag="window ")
    log = tmp_path / "sim.jsonl"
    sim = SimProcess("--seed", "21", "--mean-completion-tokens", "300", "--tokens-per-s", "400", "--latency-ms", "50",
                     log=log)
    run_dir = tmp_path / "run"
    cfg = _config(tmp_path, sim.base_url, data)
    cfg.write_text(cfg.read_text().replace(f"commit_interval_s = {COMMIT_INTERVAL_S}\n", ""))  # the default
    kills = []
    try:
        for _ in range(3):
            p = subprocess.Popen(run_cmd(cfg), env=run_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            start = collect_status(run_dir)["totals"]["done"] if (run_dir / "store.sqlite").exists() else 0
            try:
                wait_for(lambda start=start: (live_status(run_dir) or {"totals": {"done": 0}})["totals"]["done"] >= start + 60,
                         60, interval=0.02)
                time.sleep(0.6)  # a commit was just seen: kill in the middle of the next window
            finally:
                kills.append(time.time())
                p.kill()
                p.wait()
    finally:
        sim.stop()
    db = sqlite3.connect(run_dir / "store.sqlite")
    stored = {g for (g,) in db.execute("SELECT generation_id FROM results")}
    completed = [e for e in read_log(log) if e["outcome"] == "completed" and e["fully_sent"]]
    lost = [e for e in completed if e["generation_id"] not in stored]
    per_s = [sum(1 for e in completed if k - 3 <= e["t"] <= k) / 3 for k in kills]
    print(f"\n3 kills with the default commit interval: {len(lost)} fully received completions lost "
          f"at {[round(r) for r in per_s]} completions/s")
    assert len(lost) <= max(6, 0.25 * sum(per_s))
