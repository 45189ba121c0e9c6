"""Figures that agree (issue 25, "Figures"): the run's ETA is what the rows add up to, with a reason
when there is none; a projection never passes the cap that binds it; a rerun re-decides states;
elapsed never goes back after a kill; a percentage reads 100 only when every prompt ended; an
extraction's rate when done or paused is the last minute's or the job's average, labelled.

Pure functions first (engine.money.projection, engine.report.snapshot, engine.extract.snapshot),
then the engine's snapshot and ``datagen status`` on real stores with the scripted provider of
test_scheduler. The end-to-end comparison of ``status --json`` with a live ``datagen run
--headless`` is in test_true_figures_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

import pytest
from helpers import make_config
from scheduling import Fake, build

from engine.client.retry import RetryPolicy
from engine.extract.snapshot import WorkerView, rate_text, worker_view
from engine.extract.snapshot import build_snapshot as extract_snapshot
from engine.extract.status import StatusWriter, collect, format_line
from engine.money.projection import EtaRow, calibration_gate, project_dataset, project_run, schedule_eta
from engine.report.page import status_tables
from engine.report.snapshot import DatasetSnapshot, progress_percent
from engine.report.status import collect_status, format_status
from engine.report.statusserver import ELAPSED_EVERY_S, RUNTIME_FILE, persisted_elapsed
from engine.run.scheduler import Scheduler
from engine.storage.store import Store
from engine.storage.writer import StoreWriter
from tui.extract.cells import header_lines as extract_header
from tui.extract.cells import worker_cells
from tui.panes.datasets import dataset_cells


async def _reopen(tmp_path, **cfgkw):
    """The next start of the run in ``tmp_path``: its store as left, a new engine that loads it."""
    cfg = make_config(tmp_path, **cfgkw)
    store = await Store.open(cfg.run.dir)
    writer = StoreWriter(store, 0.05, live=lambda: sched.live())
    sched = Scheduler(cfg, store, writer, Fake().complete, policy=RetryPolicy(max_attempts=3, base_s=0.001, max_s=0.002))
    await sched.load()
    return cfg, store, writer, sched


def _proj(**over):
    args = dict(prompts_left=90, in_flight=10, used_tokens=0, token_budget=None, mean_completion_tokens=500.0,
                max_tokens=4000, cost_so_far=1.0, cost_per_completion_token=2e-6, recent_tok_per_s=100.0,
                since_start_tok_per_s=50.0, cost_cap=None)
    args.update(over)
    return project_dataset(**args)


# ---- 1. the run's ETA: what the rows add up to ---------------------------------------------------
def test_run_eta_is_the_latest_row_not_hours_of_a_paused_dataset():
    """The trial at 5m25s: rows 8 s, -- (paused) and done while the header said 3h46m: the paused
    dataset's work, at its decaying rate, was summed in. Now the run ETA is the running row's."""
    running = _proj(prompts_left=0, in_flight=4, mean_completion_tokens=200.0)  # 800 tokens at 100 tok/s
    paused = _proj(prompts_left=3000, in_flight=0, mean_completion_tokens=1000.0, recent_tok_per_s=0.2)
    done = _proj(prompts_left=0, in_flight=0)
    rows = [EtaRow.of("a", "running", "short", running, 100.0), EtaRow.of("b", "paused", "short", paused, 0.2),
            EtaRow.of("c", "done", "short", done, 0.0)]
    eta = schedule_eta(rows)
    assert eta.eta_s == eta.rows["a"][0] == running.eta_s_recent == 8.0 and eta.reason == ""
    assert set(eta.rows) == {"a"}  # the paused and the done dataset have no ETA and add none
    # its rate decaying over a minute does not move the run's ETA (1h14m -> 21h15m in the trial)
    assert schedule_eta(rows[:1] + [EtaRow.of("b", "paused", "short", paused, 0.01)] + rows[2:]).eta_s == 8.0


def test_rows_of_one_class_run_one_after_another_of_two_classes_side_by_side():
    a = _proj(prompts_left=0, in_flight=10)  # 5,000 tokens
    b = _proj(prompts_left=20, in_flight=0)  # 10,000 tokens, queued behind a in its class
    c = _proj(prompts_left=60, in_flight=0)  # 30,000 tokens, the other class
    eta = schedule_eta([EtaRow.of("a", "running", "short", a, 100.0), EtaRow.of("b", "pending", "short", b, 0.0),
                        EtaRow.of("c", "running", "long", c, 50.0)])
    assert eta.rows["a"][0] == 50.0  # alone in its class: its own tokens / its own rate
    assert eta.rows["b"][0] == 150.0  # after a, at the class's rate: (5,000 + 10,000) / 100
    assert eta.rows["c"][0] == 600.0  # the other class, meanwhile
    assert eta.eta_s == max(r[0] for r in eta.rows.values()) == 600.0  # the rows add up to the latest finish


def test_no_eta_says_why():
    a = _proj()
    assert schedule_eta([EtaRow.of("a", "running", "short", a, 100.0)], blocked="run cost cap met") == \
        schedule_eta([], blocked="run cost cap met")
    blocked = schedule_eta([EtaRow.of("a", "running", "short", a, 100.0)], blocked="run cost cap met")
    assert blocked.eta_s is None and blocked.reason == "run cost cap met" and blocked.rows == {}
    paused = schedule_eta([EtaRow.of("a", "paused", "short", a, 100.0), EtaRow.of("b", "done", "short", _proj(
        prompts_left=0, in_flight=0), 0.0)])
    assert paused.eta_s is None and paused.reason == "all datasets paused"
    starting = schedule_eta([EtaRow.of("a", "running", "short", a, 0.0)])
    assert starting.eta_s is None and starting.reason == "measuring rate"
    finished = schedule_eta([EtaRow.of("a", "done", "short", _proj(prompts_left=0, in_flight=0), 0.0)])
    assert (finished.eta_s, finished.reason) == (0.0, "")


# ---- 2. projections never pass the cap that binds them -------------------------------------------
def test_dataset_projection_is_clamped_at_its_cap_and_says_so():
    # the trial: $6.23 projected against a $2.00 cap
    p = _proj(prompts_left=2600, cost_so_far=1.0, cost_cap=2.0, mean_completion_tokens=1000.0)
    assert p.uncapped_cost_usd == pytest.approx(1.0 + 2610 * 1000 * 2e-6) and p.uncapped_cost_usd > 6
    assert p.projected_cost_usd == 2.0 and p.capped and p.capped_by == "max_cost_usd" and p.cap_usd == 2.0
    assert p.over_cap  # the work does not fit: the calibration gate still judges the unclamped figure
    assert calibration_gate(50, 1000, p.uncapped_cost_usd, 2.0) is not None
    # what the run's cap leaves binds too, and what is spent is never taken back
    r = _proj(prompts_left=2600, cost_so_far=1.0, run_room_usd=0.5)
    assert r.projected_cost_usd == 1.5 and r.capped_by == "run max_cost_usd"
    over = _proj(cost_so_far=2.1, cost_cap=2.0)
    assert over.projected_cost_usd == 2.1 and over.capped
    # a token budget binds the tokens (and so the dollars)
    t = _proj(token_budget=20_000)
    assert t.tokens_to_come == 20_000 and t.capped_by == "token_budget" and not t.over_cap
    # while calibrating, the high end is clamped too
    cal = _proj(observed=3, calibrate_after=50, cost_so_far=0.0, cost_cap=0.5)
    assert cal.cost_high_usd == 0.5 and cal.capped and cal.cost_low_usd <= cal.cost_high_usd
    free = _proj(cost_cap=100.0)
    assert not free.capped and free.projected_cost_usd == free.uncapped_cost_usd


def test_run_projection_is_clamped_at_the_run_cap():
    """$8.00 cap met, nothing able to run: the header said projected $14.14 > cap!"""
    ds = [_proj(prompts_left=3000, cost_so_far=4.0), _proj(prompts_left=2000, cost_so_far=4.0)]
    run = project_run(ds, None, 8.0, cost_cap=8.0)
    assert run.uncapped_cost_usd > 13 and run.projected_cost_usd == 8.0 and run.capped and run.cap_usd == 8.0
    assert run.cost_high_usd == 8.0 and run.over_cap


# ---- 5. a percentage reads 100 only when every prompt ended ---------------------------------------
def _ds(done: int, prompts: int, in_flight: int, **kw) -> DatasetSnapshot:
    return DatasetSnapshot(name="a", state="running", state_reason="", prompts=prompts, rejected=0, done=done,
                           failed=0, skipped=0, pending=prompts - done - in_flight, in_flight=in_flight,
                           prompt_tokens=0, completion_tokens=0, reasoning_tokens=0, cost_usd=0.0, token_budget=None,
                           **kw)


def test_progress_floors_never_100_while_anything_is_left():
    assert progress_percent(4975, 5000) == 99 and progress_percent(4999, 5000) == 99
    assert progress_percent(5000, 5000) == 100 and progress_percent(0, 0) == 0 and progress_percent(1, 3) == 33
    cell = dataset_cells(_ds(4975, 5000, 25))["progress"]
    assert cell[-1] == ("  99%", "")  # it read 100% with 25 in flight
    assert dataset_cells(_ds(5000, 5000, 0))["progress"][-1] == (" 100%", "")


async def test_status_text_and_json_show_99_until_the_last_one_ends(tmp_path):
    cfg, store, writer, sched = await build(tmp_path, {"a": 200, "b": 1}, Fake())
    await store.close()
    db = sqlite3.connect(cfg.run.dir / "store.sqlite")
    db.execute("UPDATE prompts SET state='done' WHERE dataset='a' AND id IN "
               "(SELECT id FROM prompts WHERE dataset='a' ORDER BY id LIMIT 199)")
    db.commit()
    db.close()
    doc = collect_status(cfg.run.dir)
    assert doc["datasets"][0]["percent"] == 99  # 199/200 = 99.5% used to read 100%
    row = next(line for line in format_status(doc).splitlines() if line.startswith("a "))
    assert " 99% " in row and "100%" not in row


# ---- 6. extraction rates when done or paused -----------------------------------------------------
def _worker(state: str, **kw) -> dict:
    doc = {"worker": 0, "world": 1, "state": state, "pid": 1, "host": "", "samples_total": 10, "samples_done": 10,
           "tokens_total": 156_000, "tokens_done": 156_000, "tokens_per_s": 17_300.0, "run_tokens": 156_000,
           "run_s": 9.0, "avg_tokens_per_s": 17_333.3, "last_done_at": 1000.0, "datasets": {}}
    doc.update(kw)
    return doc


def test_a_done_workers_rate_is_the_last_minutes_then_its_average_labelled():
    """156k tokens in 9 s read `0 tok/s` and `tok/s 1m 0` once done."""
    recent = worker_view(_worker("done"), 0, now=1010.0)
    assert recent.tokens_per_s == 17_300.0  # it ran within the last minute: that minute's rate
    later = worker_view(_worker("done"), 0, now=1200.0)
    assert later.tokens_per_s == 0.0 and later.avg_tokens_per_s == pytest.approx(17_333.3)
    assert worker_cells(later)["tps"].plain == "avg 17k"  # fits the 8-cell column, labelled
    assert worker_cells(WorkerView(rank=0, state="running", tokens_per_s=1234.0))["tps"].plain == "1.23k"
    snap = extract_snapshot(workers=[_worker("done")], world=1, plan={"a": {"samples": 10, "tokens": 156_000}},
                            final_state="done", now=1200.0)
    assert snap.tokens_per_s == 0.0 and snap.avg_tokens_per_s == pytest.approx(156_000 / 9.0, rel=1e-3)
    assert snap.rate_text() == "avg 17.3k tok/s"
    assert "avg 17.3k tok/s" in extract_header(snap, width=160)[1].plain
    assert rate_text(0.0, 0.0) == "0 tok/s" and rate_text(5.0, 9.0) == "5 tok/s"
    paused = extract_snapshot(workers=[_worker("paused")], world=1, plan={}, paused=True, now=1030.0)
    assert paused.tokens_per_s == 17_300.0 and paused.eta_s is None  # the ETA counts on running workers only


def test_status_extraction_section_reports_the_average_after_the_job(tmp_path):
    w = StatusWriter(tmp_path, 0, 1)
    w.set_totals(10, 1000, 0, 0)
    w.set_state("running")
    time.sleep(0.2)
    w.add_done(10, 1000, 4096)
    w.set_state("done")
    doc = json.loads((tmp_path / "status" / "worker-0.json").read_text())
    assert doc["run_tokens"] == 1000 and doc["run_s"] >= 0.2
    assert doc["avg_tokens_per_s"] == pytest.approx(1000 / doc["run_s"], rel=0.01)
    now = collect(tmp_path, now=time.time() + 5)
    assert now["tokens_per_s"] > 0 and now["rate_basis"] == "1m"
    later = collect(tmp_path, now=time.time() + 120)
    assert later["tokens_per_s"] == 0.0 and later["rate_basis"] == "avg" and later["avg_tokens_per_s"] > 0
    assert " avg " in f" {format_line(later)}" and "| 0 tok/s" not in format_line(later)


# ---- the engine's snapshot: rows and run agree, with a reason --------------------------------------
async def test_snapshot_eta_agrees_with_its_rows_and_says_why_when_none(tmp_path):
    fake = Fake()
    fake.gate = asyncio.Event()
    cfg, store, writer, sched = await build(tmp_path, {"a": 20, "b": 30}, fake)
    now = [1000.0]
    sched.clock = lambda: now[0]
    rt = sched.datasets["a"]
    rt.tok_rate.start(now[0] - 30)
    rt.tok_rate.add(now[0] - 1, 3000)
    run = asyncio.create_task(sched.run())
    try:
        await asyncio.sleep(0.1)
        snap = sched.snapshot()
        a, b = snap.dataset("a"), snap.dataset("b")
        assert (a.state, b.state) == ("running", "pending")
        # b waits behind a in the same class: its ETA is a's plus its own at the class's rate
        assert a.eta_s is not None and b.eta_s is not None and b.eta_s > a.eta_s
        assert snap.eta_s == max(a.eta_s, b.eta_s) and snap.eta_reason == ""
        await sched.set_dataset_control("b", "paused", "by test")
        snap = sched.snapshot()
        assert snap.dataset("b").eta_s is None and snap.eta_s == snap.dataset("a").eta_s
        sched.pause_all("paused by user")
        snap = sched.snapshot()
        assert snap.eta_s is None and snap.eta_reason == "paused" and all(d.eta_s is None for d in snap.datasets)
        sched.resume_all()
        await sched.set_dataset_control("a", "paused", "by test")
        snap = sched.snapshot()
        assert snap.eta_s is None and snap.eta_reason == "all datasets paused"
        await writer.flush()
        doc = collect_status(cfg.run.dir)  # on the engine's own loop: its figures, not the store's
        assert doc["run"]["source"] == "engine" and doc["run"]["eta_reason"] == "all datasets paused"
        assert doc["eta_s"] is None and "ETA -- (all datasets paused)" in format_status(doc)
    finally:
        sched.ending.stop("test over")
        fake.gate.set()
        await asyncio.wait_for(run, 10)
    await store.close()


async def test_run_cap_met_no_eta_anywhere_and_projection_capped(tmp_path):
    """The trial: run cap met, `eta_s` 164 while every dataset's was null; `projected $14.14 > cap!`."""
    fake = Fake()
    fake.gate = asyncio.Event()
    cfg, store, writer, sched = await build(
        tmp_path, {"a": 20, "b": 30}, fake, spend={"max_cost_usd": 0.5},
        pricing={"prompt_usd_per_m": 1.0, "completion_usd_per_m": 1000.0},
        datasets=[{"name": "a", "path": "a.jsonl", "max_cost_usd": 0.2}, {"name": "b", "path": "b.jsonl"}])
    for v in [400] * 60:
        sched.spend.budgets["a"].estimators["short"].observe(v)
        sched.spend.budgets["b"].estimators["short"].observe(v)
    snap = sched.snapshot()
    a = snap.dataset("a")
    assert a.projected_cost_uncapped_usd > 0.2 and a.projected_cost_usd == 0.2 and a.projection_capped
    assert snap.projected_total_cost_usd == 0.5 and snap.projection_capped
    sched.spend.add_partial("b", 0.5)  # the run's $0.50 spent
    await sched.set_dataset_control("b", "paused", "by test")  # so the run does not end: nothing can run
    run = asyncio.create_task(sched.run())
    try:
        await asyncio.sleep(0.1)
        snap = sched.snapshot()
        assert snap.eta_s is None and snap.eta_reason == "run cost cap met"
        assert all(d.eta_s is None for d in snap.datasets)
        assert snap.projected_total_cost_usd == pytest.approx(0.5) and snap.projection_capped
        await writer.flush()
        doc = collect_status(cfg.run.dir)
        assert doc["projection_capped"] and doc["run"]["eta_reason"] == "run cost cap met"
        assert all(d["eta_s"] is None for d in doc["datasets"]) and doc["eta_s"] is None
        text = format_status(doc)
        assert "projected capped at $0.5000" in text and "ETA -- (run cost cap met)" in text
        html = status_tables(doc)  # the report's status table says so too
        assert "(capped at the run&#x27;s max_cost_usd)" in html and "-- (run cost cap met)" in html
    finally:
        sched.ending.stop("test over")
        fake.gate.set()
        await asyncio.wait_for(run, 10)
    await store.close()


# ---- 3. a rerun re-decides states; status agrees ---------------------------------------------------
async def test_a_rerun_with_a_raised_cap_makes_the_dataset_active_in_the_store_too(tmp_path):
    """After raising the cap and rerunning, `status` kept "run cost cap met: $8.00 / $8.00" and
    `skipped 3315` while the dashboard showed the dataset running."""
    cfg, store, writer, sched = await build(tmp_path, {"a": 30, "b": 5}, Fake())
    await store.set_dataset_state("a", "budget_met", "run cost cap met: $8.00 / $8.00", time.time())
    await store.close()
    assert collect_status(cfg.run.dir)["datasets"][0]["skipped"] == 30  # as the earlier run left it
    cfg, store, writer, sched = await _reopen(tmp_path, spend={"max_cost_usd": 40.0},
                                              pricing={"prompt_usd_per_m": 1.0, "completion_usd_per_m": 1.0})
    assert sched.datasets["a"].control == "active"
    await store.close()
    doc = collect_status(cfg.run.dir)
    a = doc["datasets"][0]
    assert (a["skipped"], a["pending"], a["state_reason"]) == (0, 30, "")
    assert a["state"] != "budget_met"


# ---- 4. a killed run's elapsed never goes back -----------------------------------------------------
async def test_a_killed_runs_elapsed_is_what_the_screen_last_showed_at_least(tmp_path):
    """After a kill, `elapsed` went from 33 s (screen) back to 24 s (`status`): the last commit was older."""
    cfg, store, writer, sched = await build(tmp_path, {"a": 3}, Fake())
    await store.close()
    started = time.time() - 40
    db = sqlite3.connect(cfg.run.dir / "store.sqlite")
    db.execute("INSERT OR REPLACE INTO runtime(id, pid, started_at, heartbeat_at, state, state_reason, elapsed_s, live) "
               "VALUES(1, NULL, ?, ?, 'running', '', 24.0, '{}')", (started, started + 24))
    db.commit()
    db.close()
    (cfg.run.dir / RUNTIME_FILE).write_text(json.dumps({"pid": 1, "started_at": started, "elapsed_s": 33.0,
                                                        "state": "running", "at": started + 33, "final": False}))
    doc = collect_status(cfg.run.dir)
    assert not doc["run"]["alive"] and doc["run"]["elapsed_s"] >= 33.0
    assert doc["run"]["elapsed_s"] == pytest.approx(33.0 + ELAPSED_EVERY_S)
    # the next start counts from there, not from the store's 24 s
    cfg, store, writer, sched = await _reopen(tmp_path)
    assert sched.runstate.prior_elapsed_s == pytest.approx(33.0 + ELAPSED_EVERY_S)
    await store.close()
    # a file of another store's run (started before this row's last commit) is not taken
    assert persisted_elapsed(cfg.run.dir, started + 100, started + 150, 24.0) == 24.0


def test_status_of_a_paused_extraction_has_no_eta_and_says_why(tmp_path):
    """`datagen status` printed `ETA 162s` for a paused extraction while the view said `ETA -- (paused)`."""
    w = StatusWriter(tmp_path, 0, 1)
    w.set_totals(20, 2000, 0, 0)
    w.set_state("running")
    w.add_done(5, 500, 2048)
    time.sleep(0.2)
    w.add_done(5, 500, 2048)
    w.set_state("running")  # written now
    running = collect(tmp_path)
    assert running["state"] == "running" and running["eta_s"] is not None and running["eta_s"] > 0
    w.set_state("paused")
    paused = collect(tmp_path)
    assert paused["state"] == "paused" and paused["eta_s"] is None
    assert "| ETA -- (paused)" in format_line(paused)
