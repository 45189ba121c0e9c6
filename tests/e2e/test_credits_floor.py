"""The credits floor is checked before each dispatch (a real run against `datagen sim --credits`),
and a run that a guard paused, then completed, reads completed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.request

from e2e import PY, SimProcess, read_log, run_env, status_json
from test_spend_e2e import _run, prompts_file, sim_config

PRICE_IN, PRICE_OUT = 0.40e-6, 1.90e-6  # the simulator's default prices (USD per token)
MAX_TOKENS = 4096


def key_doc(base_url: str) -> dict:
    req = urllib.request.Request(base_url + "/key", headers={"Authorization": "Bearer sk-test-e2e"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)["data"]


def test_credits_floor_checked_before_dispatch_never_overdraws(tmp_path):
    """$0.05 of credits, floor $0.01, 40 concurrent slots of ~$0.0015 each: before the fix all 40 were
    dispatched at once (~$0.06 billed); now the billed total stays within credits - floor plus one
    request's cost, and the run pauses on the floor with prompts pending and none failed."""
    credits, floor = 0.05, 0.01
    log = tmp_path / "sim.jsonl"
    sim = SimProcess("--credits", str(credits), "--mean-completion-tokens", "800", "--tokens-per-s", "3000", log=log)
    try:
        cfg = tmp_path / "config.toml"
        cfg.write_text(f"""
[run]
name = "floor"
dir = "{tmp_path / 'run'}"
progress_interval_s = 1
commit_interval_s = 0.2
[provider]
kind = "openai"
base_url = "{sim.base_url}"
api_key_env = "E2E_KEY"
[spend]
credits_floor_usd = {floor}
[classes.short]
max_tokens = {MAX_TOKENS}
concurrency = 40
[[datasets]]
name = "q"
path = "{prompts_file(tmp_path, 300)}"
format = "text"
""")
        r = subprocess.run([PY, "-m", "datagen", "run", str(cfg), "--headless", "--exit-on-pause"], env=run_env(),
                           capture_output=True, text=True, timeout=240)
        billed = key_doc(sim.base_url)["usage"]
    finally:
        sim.stop()
    out = r.stdout + r.stderr
    assert r.returncode == 3, out
    assert "exit on pause: credits floor:" in out and "below credits_floor_usd $0.01" in out, out
    one_request = 200 * PRICE_IN + MAX_TOKENS * PRICE_OUT  # the largest a request can bill here
    print(f"\nbilled ${billed:.4f} on ${credits} credits, floor ${floor}")
    assert 0.5 * (credits - floor) < billed <= credits - floor + one_request, billed
    assert not [e for e in read_log(log) if e["outcome"] == "402"]
    doc = status_json(tmp_path / "run")
    t = doc["totals"]
    assert t["done"] > 0 and t["pending"] > 0 and t["failed"] == 0, t
    assert doc["run"]["state"] == "stopped" and "credits floor" in doc["run"]["state_reason"], doc["run"]


async def test_run_paused_by_credits_then_completed_reads_completed(tmp_path):
    """The credits floor paused the run once every prompt was dispatched; the streams finished, so the
    run completed: status must say completed, with no stale reason; a dataset the anomaly guard paused
    with nothing left is done."""
    cfg = sim_config(tmp_path, [{"name": "a", "path": str(prompts_file(tmp_path, 30)), "format": "text"}],
                     sim={"mean_completion_tokens": 400, "tokens_per_s": 800, "latency_ms": 50},
                     classes={"short": {"max_tokens": 4000, "concurrency": 100}})
    holder = {}

    def ready(job):
        sched = job.scheduler

        def all_sent() -> bool:  # every stream in flight answered (a pause holds the requests not sent yet)
            streams = sched.runstate.datasets["a"].streams.values()
            return bool(streams) and all(prog.status for _cls, prog, _p in streams)

        async def pauser():
            while sched.snapshot().dataset("a").pending > 0 or not sched.snapshot().in_flight or not all_sent():
                await asyncio.sleep(0.01)
            sched.pause_all("credits floor: $0.05 left minus $0.19 in flight is below credits_floor_usd $0.00",
                            kind="credits")
            await sched.set_dataset_control("a", "paused", "anomaly guard: error rate 74%", guard=True)

        holder["t"] = asyncio.get_running_loop().create_task(pauser())

    code, out = await _run(cfg, on_ready=ready)
    assert code == 0, out
    assert "run completed;" in out and "run completed: credits floor" not in out, out
    doc = status_json(tmp_path / "run")
    assert doc["run"]["state"] == "completed", doc["run"]
    assert not doc["run"].get("state_reason"), doc["run"]
    d = doc["datasets"][0]
    assert d["state"] == "done" and d["done"] == 30 and d["pending"] == 0, d
    st = subprocess.run([PY, "-m", "datagen", "status", str(tmp_path / "run")], capture_output=True, text=True)
    assert "run spend: completed" in st.stdout and "credits floor" not in st.stdout, st.stdout
