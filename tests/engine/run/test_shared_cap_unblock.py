"""A dataset held back by the shared run cost cap while another dataset's request is in flight is
let go when that request settles.

Before (found by a new-user trial): with ``[spend] max_cost_usd`` shared by five datasets, the two
one-prompt datasets were refused while b8's requests were in flight, waited for "reservations to
settle", and were never woken (a settle unblocked only its own dataset): the run sat at "running | 0 in
flight" forever with $0.0164 of $0.05 spent."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

from engine.config import load_config
from engine.report.status import collect_status
from engine.run.headless import run_headless

SAMPLES = Path(__file__).resolve().parents[3] / "engine" / "samples"


def test_a_settle_in_one_dataset_wakes_datasets_waiting_on_the_shared_run_cap(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"""
[run]
name = "cap"
dir = "{tmp_path / 'run'}"
commit_interval_s = 0.2
progress_interval_s = 30
[provider]
kind = "simulated"
[provider.sim]
seed = 0
latency_ms = 50
tokens_per_s = 2000
mean_completion_tokens = 400
faults = ""
[spend]
max_cost_usd = 0.05
[classes.short]
max_tokens = 10240
concurrency = 2000
[classes.long]
max_tokens = 16384
concurrency = 500
min_prompt_tokens = 8000
[[datasets]]
name = "b1_glaive"
path = "{SAMPLES / 'b1_glaive.jsonl'}"
format = "glaive"
max_cost_usd = 0.001
[[datasets]]
name = "b3_oss_instruct"
path = "{SAMPLES / 'b3_magicoder_oss_instruct.jsonl'}"
format = "oss_instruct"
[[datasets]]
name = "b3_evol_instruct"
path = "{SAMPLES / 'b3_magicoder_evol_instruct.jsonl'}"
format = "instruction"
[[datasets]]
name = "b7_sharegpt"
path = "{SAMPLES / 'b7_sharegpt.json'}"
format = "sharegpt"
token_budget = 3000
[[datasets]]
name = "b8_swe_agent"
path = "{SAMPLES / 'b8_swe_agent_trajectories.jsonl'}"
format = "swe_agent"
""")
    out = io.StringIO()
    code = asyncio.run(asyncio.wait_for(run_headless(load_config(cfg), out, install_signals=False), 120))
    assert code == 0, out.getvalue()[-2000:]
    doc = collect_status(tmp_path / "run")
    states = {d["name"]: d["state"] for d in doc["datasets"]}
    assert all(s in ("done", "budget_met") for s in states.values()), states
    assert states["b3_oss_instruct"] in ("done", "budget_met") and doc["totals"]["pending"] == 0
    assert doc["totals"]["cost_usd"] <= 0.05
    assert "run completed" in out.getvalue()
