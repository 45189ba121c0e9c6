"""Spend control end to end against the simulator: overshoot, credits, abort vs drain, ctl from another shell."""

from __future__ import annotations

import asyncio
import io
import json
import signal
import sqlite3
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
from e2e import PY, SimProcess, read_log, run_env, status_json
from waiting import wait_for

from engine.config import parse_config
from engine.run.headless import run_headless


def prompts_file(tmp_path, n: int, name: str = "p.jsonl", tag: str = ""):
    p = tmp_path / name
    p.write_text("".join(json.dumps({"prompt": f"{tag}Question number {i}: explain topic {i * 7919 % 1000}."}) + "\n"
                         for i in range(n)))
    return p


def sim_config(tmp_path, datasets, *, sim=None, classes=None, spend=None, run=None):
    data = {
        "run": {"name": "spend", "dir": str(tmp_path / "run"), "commit_interval_s": 0.2, "progress_interval_s": 1,
                **(run or {})},
        "provider": {"kind": "simulated", "sim": {"seed": 1, **(sim or {})}, "timeouts": {"stall_s": 30}},
        "classes": classes or {"short": {"max_tokens": 8000, "concurrency": 500}},
        "spend": spend or {},
        "datasets": datasets,
    }
    return parse_config(data, tmp_path / "config.toml")


async def _run(cfg, on_ready=None):
    out = io.StringIO()
    code = await run_headless(cfg, out, install_signals=False, on_ready=on_ready)
    return code, out.getvalue()


def completion_tokens(run_dir) -> int:
    db = sqlite3.connect(run_dir / "store.sqlite")
    (n,) = db.execute("SELECT COALESCE(SUM(completion_tokens), 0) FROM results").fetchone()
    (partial,) = db.execute("SELECT COALESCE(SUM(tokens_received), 0) FROM attempts WHERE outcome != 'ok'").fetchone()
    return n + partial


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
async def test_budget_not_overshot_at_500_concurrency_and_naive_overshoots(tmp_path):
    budget = 200_000
    results = {}
    for mode in ("expected", "none"):
        d = tmp_path / mode
        d.mkdir()
        cfg = sim_config(d, [{"name": "b", "path": str(prompts_file(d, 1500)), "format": "text", "token_budget": budget}],
                         sim={"mean_completion_tokens": 2000, "tokens_per_s": 4000, "latency_ms": 50},
                         spend={"reservation": mode})
        code, out = await _run(cfg)
        assert code == 0, out
        results[mode] = completion_tokens(d / "run")
    used, naive = results["expected"], results["none"]
    print(f"\nbudget {budget:,}: reserved-at-dispatch used {used:,} ({used / budget:.3f}x); "
          f"naive used {naive:,} ({naive / budget:.3f}x)")
    assert 0.9 * budget <= used <= 1.02 * budget
    assert naive > 1.5 * budget
    doc = status_json(tmp_path / "expected" / "run")
    b = doc["datasets"][0]
    assert b["state"] == "budget_met" and b["skipped"] > 1000 and b["pending"] == 0
    assert b["done"] + b["failed"] + b["skipped"] == b["prompts"] == 1500


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
async def test_budget_not_overshot_at_2000_concurrency(tmp_path):
    """Short completions finish first: without censoring the early p90 is biased low (measured 1.22x)."""
    budget = 800_000
    cfg = sim_config(tmp_path, [{"name": "b", "path": str(prompts_file(tmp_path, 2500)), "format": "text",
                                 "token_budget": budget}],
                     sim={"mean_completion_tokens": 2000, "tokens_per_s": 2000, "latency_ms": 50},
                     classes={"short": {"max_tokens": 8000, "concurrency": 2000}},
                     spend={"anomaly_error_rate": 0})
    code, out = await _run(cfg)
    assert code == 0, out
    used = completion_tokens(tmp_path / "run")
    print(f"\nbudget {budget:,} at 2,000 concurrency: used {used:,} ({used / budget:.3f}x)")
    assert 0.9 * budget <= used <= 1.02 * budget


def burn_credits(base_url: str, workers: int = 30) -> threading.Thread:
    """Another user of the same key: non-streamed requests from ``workers`` threads until each meets
    a 402 (the engine's own accounting cannot see this spend, so only the 402 stops the run)."""
    body = json.dumps({"model": "moonshotai/kimi-k2.5", "messages": [{"role": "user", "content": "burn"}],
                       "max_tokens": 4096, "stream": False}).encode()

    def one() -> None:
        for _ in range(2000):
            req = urllib.request.Request(base_url + "/chat/completions", data=body, headers={
                "Authorization": "Bearer sk-other-user", "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    r.read()
            except urllib.error.HTTPError as e:
                if e.code == 402:
                    return
            except OSError:
                return

    def all_() -> None:
        ts = [threading.Thread(target=one, daemon=True) for _ in range(workers)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    t = threading.Thread(target=all_, daemon=True)
    t.start()
    return t


def test_out_of_credits_pauses_without_402_loop_and_exit_on_pause(tmp_path):
    """Credits spent behind the engine's back (the floor cannot foresee them): the 402 pauses the run."""
    log = tmp_path / "sim.jsonl"
    sim = SimProcess("--credits", "0.50", "--mean-completion-tokens", "800", "--tokens-per-s", "3000", log=log)
    try:
        burn_credits(sim.base_url)
        cfg = tmp_path / "config.toml"
        cfg.write_text(f"""
[run]
name = "credits"
dir = "{tmp_path / 'run'}"
progress_interval_s = 1
commit_interval_s = 0.2
[provider]
kind = "openai"
base_url = "{sim.base_url}"
api_key_env = "E2E_KEY"
[classes.short]
max_tokens = 4096
concurrency = 40
[[datasets]]
name = "q"
path = "{prompts_file(tmp_path, 2000)}"
format = "text"
""")
        r = subprocess.run([PY, "-m", "datagen", "run", str(cfg), "--headless", "--exit-on-pause"], env=run_env(),
                           capture_output=True, text=True, timeout=240)
    finally:
        sim.stop()
    assert r.returncode == 3, r.stdout + r.stderr
    assert "out of credits (HTTP 402)" in r.stdout
    entries = read_log(log)
    n402 = sum(1 for e in entries if e["outcome"] == "402" and e.get("stream"))  # the engine's (it streams)
    # Each in-flight request may meet one 402; nothing retries it in a loop.
    assert 1 <= n402 <= 40, n402
    doc = status_json(tmp_path / "run")
    assert doc["totals"]["done"] > 0 and doc["totals"]["pending"] > 0 and doc["totals"]["failed"] == 0
    assert doc["run"]["state"] == "stopped"


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
async def test_abort_bills_less_than_drain_and_spend_matches_key_usage(tmp_path):
    figures = {}
    for mode in ("drain", "abort"):
        d = tmp_path / mode
        d.mkdir()
        cfg = sim_config(d, [{"name": "a", "path": str(prompts_file(d, 400)), "format": "text"}],
                         sim={"mean_completion_tokens": 3000, "tokens_per_s": 1500, "providers": ["SimA"],
                              "cancellable": ["SimA"]},
                         classes={"short": {"max_tokens": 12000, "concurrency": 60}})
        holder = {}

        def ready(job, holder=holder, mode=mode):
            holder["job"] = job

            async def stopper():
                while job.scheduler.snapshot().dataset("a").done < 30:
                    await asyncio.sleep(0.05)
                job.scheduler.ending.stop(f"test {mode}", abort=(mode == "abort"))

            holder["t"] = asyncio.get_running_loop().create_task(stopper())

        code, out = await _run(cfg, on_ready=ready)
        job = holder["job"]
        billed = job.sim.ledger.billed_usd
        doc = status_json(d / "run")
        figures[mode] = (billed, doc["totals"]["cost_usd"], doc["totals"]["done"], doc["credits_drift_usd"])
    print(f"\n(billed, accounted, done, drift): drain {figures['drain']}, abort {figures['abort']}")
    (bd, ad, dd, _), (ba, aa, da, drift) = figures["drain"], figures["abort"]
    # both stopped once 30 were done; a drain then finishes what was in flight, an abort cancels it
    assert 30 <= da < dd, (da, dd)
    assert ba < bd
    assert abs(ad - bd) <= 0.01 * bd, (ad, bd)
    # An aborted stream is billed up to where the provider noticed the disconnect, which can be past the
    # last token the engine read (more so on a loaded machine): what the engine did not account is
    # exactly the credits drift it reports, and small.
    assert drift is not None and abs((ba - aa) - drift) <= 1e-6, (ba, aa, drift)
    assert abs(aa - ba) <= 0.03 * ba, (aa, ba)


@pytest.mark.slow  # issue 27: long e2e test (>9 s on 2 cores), run by `make slow`
def test_ctl_pause_survives_restart_and_resume_continues(tmp_path):
    sim = SimProcess("--mean-completion-tokens", "300", "--tokens-per-s", "300")
    env = run_env()
    run_dir = tmp_path / "run"
    try:
        cfg = tmp_path / "config.toml"
        cfg.write_text(f"""
[run]
name = "ctl"
dir = "{run_dir}"
progress_interval_s = 1
commit_interval_s = 0.2
[provider]
kind = "openai"
base_url = "{sim.base_url}"
api_key_env = "E2E_KEY"
[classes.short]
max_tokens = 4096
concurrency = 8
[[datasets]]
name = "A"
path = "{prompts_file(tmp_path, 30, 'a.jsonl', 'A ')}"
format = "text"
[[datasets]]
name = "B"
path = "{prompts_file(tmp_path, 40, 'b.jsonl', 'B ')}"
format = "text"
""")
        cmd = [PY, "-m", "datagen", "run", str(cfg), "--headless"]
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: run_dir.joinpath("store.sqlite").exists() and status_json(run_dir)["run"]["alive"], 30)
        t0 = time.monotonic()
        r = subprocess.run([PY, "-m", "datagen", "ctl", str(run_dir), "pause", "B"], capture_output=True, text=True)
        assert r.returncode == 0 and "B paused" in r.stdout, r.stdout + r.stderr
        wait_for(lambda: status_json(run_dir)["datasets"][1]["state"] == "paused", 15, interval=0.05)
        print(f"ctl pause seen by status after {time.monotonic() - t0:.2f} s")  # measured, not asserted (shared CPUs)
        # A completes; B stays paused (the run keeps waiting for a resume)
        wait_for(lambda: status_json(run_dir)["datasets"][0]["state"] == "done", 60)
        b_done = status_json(run_dir)["datasets"][1]["done"]
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 130  # interrupted (drained)
        # restart: B is still paused
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: status_json(run_dir)["run"]["alive"], 30)
        time.sleep(1.5)
        doc = status_json(run_dir)
        assert doc["datasets"][1]["state"] == "paused" and doc["datasets"][1]["done"] == b_done
        r = subprocess.run([PY, "-m", "datagen", "ctl", str(run_dir), "resume", "B"], capture_output=True, text=True)
        assert "B resumed" in r.stdout, r.stdout + r.stderr
        assert p.wait(120) == 0
    finally:
        if p.poll() is None:
            p.kill()
        sim.stop()
    doc = status_json(run_dir)
    assert doc["run"]["state"] == "completed" and doc["datasets"][1]["done"] == 40


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
async def test_hard_cap_never_exceeds_a_token_budget_or_a_dollar_cap(tmp_path):
    """`[spend] hard_cap = true`: every request reserves max_tokens (and 4x its prompt estimate in dollars),
    so the budget is never passed, whatever the lengths; default reservations may pass it by ~1-2%."""
    sim = {"mean_completion_tokens": 2000, "tokens_per_s": 4000, "latency_ms": 50}
    d = tmp_path / "tokens"
    d.mkdir()
    budget = 150_000
    cfg = sim_config(d, [{"name": "b", "path": str(prompts_file(d, 800)), "format": "text", "token_budget": budget}],
                     sim=sim, spend={"hard_cap": True, "anomaly_error_rate": 0})
    code, out = await _run(cfg)
    assert code == 0, out
    used = completion_tokens(d / "run")
    doc = status_json(d / "run")
    print(f"\nhard_cap: budget {budget:,}, used {used:,} ({used / budget:.4f}x)")
    assert budget - 8000 <= used <= budget  # stops when one more max_tokens no longer fits
    assert doc["datasets"][0]["state"] == "budget_met"
    d = tmp_path / "dollars"
    d.mkdir()
    cap = 0.25
    data = {"run": {"name": "spend", "dir": str(d / "run"), "commit_interval_s": 0.2, "progress_interval_s": 1},
            "provider": {"kind": "simulated", "sim": {"seed": 1, **sim}, "timeouts": {"stall_s": 30}},
            "classes": {"short": {"max_tokens": 8000, "concurrency": 500}},
            "pricing": {"prompt_usd_per_m": 0.40, "completion_usd_per_m": 1.90},
            "spend": {"hard_cap": True, "max_cost_usd": cap, "anomaly_error_rate": 0},
            "datasets": [{"name": "b", "path": str(prompts_file(d, 800)), "format": "text"}]}
    code, out = await _run(parse_config(data, d / "config.toml"))
    assert code == 0, out
    doc = status_json(d / "run")
    cost = doc["totals"]["cost_usd"]
    print(f"hard_cap: dollar cap ${cap}, spent ${cost:.4f} ({cost / cap:.4f}x)")
    assert cap - 8000 * 1.9e-6 - 0.001 <= cost <= cap
