"""The calibration gate never leaves a run ``running`` with nothing it can do (issue 33).

In the trial at the real shape, a dataset ended its prompts past its $6.00 cap ($6.41); then the
calibration gate paused it at 97% done and the run sat ``running`` until the user skipped its last
10 prompts. The gate now lets a small remainder finish (its cap still stops it where it binds) and
leaves a dataset whose spend reached its cap to dispatch, which ends it ``budget_met`` with the cap's
reason: the run completes. Real runs on the simulator (``datagen run --headless`` subprocesses, a
real SQLite store), the store brought to 390 of 400 done as the trial was.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from casesrv import case_config, prompts, run_case, states, status

from engine.money.projection import SMALL_REMAINDER, calibration_gate

N = 400
LEFT = 10  # 2.5% of the dataset: a small remainder


def test_the_gate_lets_a_small_remainder_finish_and_leaves_a_met_cap_to_the_budget():
    msg = "projected cost $6.60 exceeds max_cost_usd $6.00 after 390 completions"
    assert SMALL_REMAINDER == 0.05
    assert calibration_gate(390, 400, 6.60, 6.00) == msg  # nothing said about what is left: as before
    assert calibration_gate(390, 400, 6.60, 6.00, left=100, spent=5.0) == msg  # a real decision left
    assert calibration_gate(390, 400, 6.60, 6.00, left=20, spent=5.0) is None  # 5%: a small remainder
    assert calibration_gate(390, 400, 6.60, 6.00, left=21, spent=5.0) == msg
    assert calibration_gate(300, 400, 6.60, 6.00, left=100, spent=6.0) is None  # cap met: budget_met ends it
    assert calibration_gate(50, 1000, 123.45, 100.0, left=950, spent=10.0) == (
        "projected cost $123.45 exceeds max_cost_usd $100.00 after 50 completions")  # the early gate stays


def _config(tmp_path: Path, cap: float | None) -> Path:
    cfg = case_config(tmp_path, "unused", prompts(N), kind="simulated", concurrency=8, max_tokens=512,
                      dataset_extra=f"max_cost_usd = {cap!r}" if cap is not None else "")
    text = cfg.read_text().replace('base_url = "unused"\n', "")
    text = text.replace("[pricing]\nprompt_usd_per_m = 0.6\ncompletion_usd_per_m = 2.5\n", "")
    text += "\n[provider.sim]\nlatency_ms = 5\ntokens_per_s = 5000\nmean_completion_tokens = 300\n"
    cfg.write_text(text)
    return cfg


def _near_the_end(tmp_path: Path) -> tuple[Path, float, float]:
    """Run the dataset to its end without a cap, then return its last ``LEFT`` prompts to pending (their
    results and attempts removed, as if never sent): 390/400 done. Returns the run directory, the
    dollars spent on the 390 and what the 10 had cost (USD)."""
    r = run_case(_config(tmp_path, None), timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    run_dir = tmp_path / "run"
    with sqlite3.connect(run_dir / "store.sqlite") as c:
        ids = [i for (i,) in c.execute("SELECT id FROM prompts ORDER BY id DESC LIMIT ?", (LEFT,))]
        marks = ",".join("?" * len(ids))
        (tail,) = c.execute(f"SELECT SUM(cost_usd) FROM results WHERE prompt_id IN ({marks})", ids).fetchone()
        c.execute(f"DELETE FROM results WHERE prompt_id IN ({marks})", ids)
        c.execute(f"DELETE FROM attempts WHERE prompt_id IN ({marks})", ids)
        c.execute(f"UPDATE prompts SET state='pending', attempts=0 WHERE id IN ({marks})", ids)
        (spent,) = c.execute("SELECT SUM(cost_usd) FROM results").fetchone()
    assert states(run_dir) == {"done": N - LEFT, "pending": LEFT}
    return run_dir, spent, tail


def test_a_dataset_past_its_cap_at_97_percent_ends_budget_met_and_the_run_completes(tmp_path):
    """Its spend is over the cap (as the trial's $6.41 of $6.00): before, the gate paused it at the
    restart (exit 3 with --exit-on-pause; without it the run sat running); now dispatch ends it
    ``budget_met`` with the cap's reason and the run completes, exit 0, no request sent."""
    run_dir, spent, _tail = _near_the_end(tmp_path)
    cap = round(spent * 0.94, 4)
    r = run_case(_config(tmp_path, cap), "--exit-on-pause", timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "calibration gate" not in r.stdout + r.stderr
    d = status(run_dir)["datasets"][0]
    assert d["state"] == "budget_met" and d["state_reason"].startswith("cost cap max_cost_usd met: $"), d
    assert (d["done"], d["skipped"]) == (N - LEFT, LEFT)
    assert status(run_dir)["run"]["state"] == "completed"


def test_a_small_remainder_under_its_cap_is_sent_and_the_run_completes(tmp_path):
    """The projection is over the cap but the spend is not: before, the gate paused the dataset with
    its last 10 prompts (exit 3 with --exit-on-pause); now they are sent, as far as the cap allows."""
    run_dir, spent, tail = _near_the_end(tmp_path)
    cap = round(spent + tail / 2, 6)  # room for about half of what the last 10 cost
    r = run_case(_config(tmp_path, cap), "--exit-on-pause", timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "calibration gate" not in r.stdout + r.stderr
    doc = status(run_dir)
    d = doc["datasets"][0]
    assert d["done"] > N - LEFT, d  # some of the remainder was bought
    assert d["state"] in ("done", "budget_met") and d["done"] + d["skipped"] == N, d
    assert d["cost_usd"] <= cap * 1.02 + 1e-9, (d["cost_usd"], cap)
    assert doc["run"]["state"] == "completed"
