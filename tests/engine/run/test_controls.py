"""Controls that cannot stall a run in silence, and figures that do not mislead (issue 16, parts 4-5).

Engine-level checks on a real SQLite store with a scripted provider; the dashboard through
Textual's pilot. The CLI (``datagen status`` / ``datagen ctl`` on real run directories) is in
``test_ctl_cli.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from scheduling import Fake, build

from engine.report.status import collect_status
from engine.run.controller import Controller
from engine.run.limiter import concurrency_cap
from tui.app import DashboardApp
from tui.panes.datasets import dataset_cells
from tui.panes.header import eta_text, header_lines
from tui.testing import FIXED_GPUS, FakeController, fixed_snapshot


# ---- 4. controls ----------------------------------------------------------------------------
async def test_concurrency_is_bounded_and_each_class_limit_is_shown(tmp_path):
    """0 and values past 4x the configured concurrency are refused; the limits are in the snapshot
    and in ``status --json`` (``classes``)."""
    fake = Fake()
    cfg, store, writer, sched = await build(tmp_path, {"a": 1}, fake)
    ctl = Controller(sched)
    assert concurrency_cap(4) == 16 and concurrency_cap(24) == 96 and concurrency_cap(2000) == 8000
    assert ctl.concurrency_bounds("short") == (1, 16)
    with pytest.raises(ValueError, match="at least 1.*pause"):
        await ctl.set_concurrency("short", 0)
    with pytest.raises(ValueError, match="at most 16"):
        await ctl.set_concurrency("short", 17)
    assert sched.limiters["short"].capacity == 4  # nothing changed by the refusals
    assert await ctl.set_concurrency("short", 16) == "class short concurrency 16"
    c = ctl.snapshot().classes[0]
    assert (c.name, c.concurrency, c.configured, c.max_concurrency) == ("short", 16, 4, 16)
    await writer.flush()
    doc = collect_status(cfg.run.dir)
    assert doc["classes"][0] == {"name": "short", "concurrency": 16, "configured": 4, "max": 16, "in_flight": 0,
                                 "max_tokens": 1000}
    await store.close()


async def test_include_provider_undoes_exclude_and_rejects_names_not_excluded(tmp_path):
    fake = Fake()
    cfg, store, writer, sched = await build(tmp_path, {"a": 1}, fake, provider={"routing": {"ignore": ["Cfg"]}})
    ctl = Controller(sched)
    await ctl.exclude_provider("SimB")
    assert sched.routing.body["provider"]["ignore"] == ["Cfg", "SimB"]
    with pytest.raises(ValueError, match=r"unknown excluded provider 'SimA'; known: SimB"):
        await ctl.include_provider("SimA")
    assert await ctl.include_provider("simb") == "provider SimB included again"  # spelling matched
    assert sched.routing.body["provider"]["ignore"] == ["Cfg"]  # the config's own ignore stays
    assert sched.excluded_providers == [] and await store.get_meta("excluded_providers") == "[]"
    with pytest.raises(ValueError, match="no provider is excluded"):
        await ctl.include_provider("SimB")
    await store.close()


# ---- 5. figures -----------------------------------------------------------------------------
async def test_budget_limited_dataset_shows_why_it_runs_below_its_concurrency(tmp_path):
    """Token budget 2,500 with 1,000 reserved per request (max_tokens, uncalibrated): 2 of 4 slots."""
    fake = Fake()
    fake.gate = asyncio.Event()
    cfg, store, writer, sched = await build(
        tmp_path, {"a": 10}, fake,
        datasets=[{"name": "a", "path": "a.jsonl", "token_budget": 2500}, {"name": "b", "path": "b.jsonl"}])
    run = asyncio.create_task(sched.run())
    try:
        for _ in range(200):
            await asyncio.sleep(0.01)
            if fake.in_flight == 2:
                break
        await asyncio.sleep(0.05)
        d = sched.snapshot().dataset("a")
        assert d.in_flight == 2 and d.limit_reason == "budget-limited 2/4"
        assert dataset_cells(d)["note"] == (("budget-limited 2/4", "yellow"),)
        await writer.flush()  # the writer's live row (wired by build) carries the note
        assert collect_status(cfg.run.dir)["datasets"][0]["limit_reason"] == "budget-limited 2/4"
    finally:
        sched.ending.stop("test over")
        fake.gate.set()
        await asyncio.wait_for(run, 10)
    await store.close()


async def test_eta_does_not_count_while_paused_or_stopping(tmp_path):
    fake = Fake()
    fake.gate = asyncio.Event()
    cfg, store, writer, sched = await build(tmp_path, {"a": 20}, fake)
    now = [1000.0]
    sched.clock = lambda: now[0]
    rt = sched.datasets["a"]
    rt.tok_rate.start(now[0] - 30)
    rt.tok_rate.add(now[0] - 1, 3000)
    sched.telemetry.tok_rate.start(now[0] - 30)
    sched.telemetry.tok_rate.add(now[0] - 1, 3000)
    run = asyncio.create_task(sched.run())
    try:
        await asyncio.sleep(0.1)
        snap = sched.snapshot()
        assert snap.state == "running" and snap.dataset("a").eta_s is not None and snap.eta_s is not None
        assert snap.eta_s == pytest.approx(snap.dataset("a").eta_s)  # the only active dataset: same figure
        sched.pause_all("paused by user")
        snap = sched.snapshot()
        assert snap.eta_s is None and snap.eta_s_high is None and snap.dataset("a").eta_s is None
        assert eta_text(snap) == "-- (paused)"
        sched.resume_all()
        assert sched.snapshot().eta_s is not None
        sched.ending.stop("drain requested", abort=False)
        snap = sched.snapshot()
        assert snap.eta_s is None and eta_text(snap) == "-- (stopping)"
    finally:
        sched.ending.stop("test over")
        fake.gate.set()
        await asyncio.wait_for(run, 10)
    await store.close()


async def test_projection_is_a_range_until_calibrated(tmp_path):
    """5 of 50 completions observed: the header shows the low-high range, labelled, not one number."""
    fake = Fake()
    cfg, store, writer, sched = await build(tmp_path, {"a": 100}, fake, pricing={
        "prompt_usd_per_m": 1.0, "completion_usd_per_m": 10.0})
    for v in (100, 100, 100, 100, 100):
        sched.spend.budgets["a"].estimators["short"].observe(v)
    snap = sched.snapshot()
    d = snap.dataset("a")
    assert d.calibration == (5, 50) and snap.calibration == (5, 50)
    # 100 short prompts left: 100 x 100 tokens at the low end, 100 x 1,000 (the short class's max_tokens, not
    # the long class's 2,000) at the high end
    assert d.projected_cost_low_usd == pytest.approx(0.1) and d.projected_cost_high_usd == pytest.approx(1.0)
    line2 = header_lines(snap, width=200)[1].plain
    assert "projected $0.1000–$1.00 (calibrating 5/50)" in line2
    # nothing observed anywhere yet: no number at all
    cfg2, store2, _, sched2 = await build(tmp_path / "two", {"a": 100}, Fake(), pricing={
        "prompt_usd_per_m": 1.0, "completion_usd_per_m": 10.0})
    assert "projected calibrating (0/50)" in header_lines(sched2.snapshot(), width=200)[1].plain
    await store.close()
    await store2.close()


def test_header_shows_each_class_slots_and_changed_limits():
    snap = fixed_snapshot()
    classes = tuple(dataclasses.replace(c, configured=c.concurrency, max_concurrency=4 * c.concurrency)
                    for c in snap.classes)
    classes = (dataclasses.replace(classes[0], concurrency=220),) + classes[1:]
    line3 = header_lines(dataclasses.replace(snap, classes=classes), width=160)[2].plain
    assert "slots short 200/220 (cfg 200)  long 0/50" in line3


# ---- dashboard keys (pilot) -------------------------------------------------------------
def _snap_with_class(concurrency: int, configured: int = 24):
    snap = fixed_snapshot()
    cls = tuple(dataclasses.replace(c, concurrency=concurrency if c.name == "short" else c.concurrency,
                                    configured=configured, max_concurrency=concurrency_cap(configured))
                for c in snap.classes)
    return dataclasses.replace(snap, classes=cls)


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
async def test_plus_stops_at_the_cap_and_minus_at_one_saying_so():
    ctl = FakeController()
    ctl.dataset_class = lambda name: "short"
    app = DashboardApp(snapshot_source=lambda: _snap_with_class(24), controller=ctl, gpu_source=lambda: FIXED_GPUS)
    async with app.run_test(size=(160, 48), notifications=True) as pilot:
        await pilot.pause(0.1)
        for _ in range(45):
            await pilot.press("plus")
        await pilot.pause(0.3)
        sets = [a[1] for m, a in ctl.calls if m == "set_concurrency"]
        assert max(sets) == 96 and sets[-1] == 96  # 24 -> ... -> 96 (4x), never 319
        # one concurrency toast at a time (tests/tui/test_tui_followups.py), the latest reason in it
        assert [n.message for n in app._notifications] == ["class short concurrency is at its maximum 96 (4x the configured 24)"]
        for _ in range(60):
            await pilot.press("minus")
        await pilot.pause(0.3)
        sets = [a[1] for m, a in ctl.calls if m == "set_concurrency"]
        assert min(sets) == 1 and sets[-1] == 1
        assert [n.message for n in app._notifications] == [
            "class short concurrency is at its minimum 1 (P pauses the run, p the dataset)"]


async def test_p_on_a_done_dataset_says_why_nothing_happens():
    ctl = FakeController()
    app = DashboardApp(snapshot_source=fixed_snapshot, controller=ctl, gpu_source=lambda: FIXED_GPUS)
    async with app.run_test(size=(160, 48)) as pilot:
        said: list[str] = []
        notify = app.notify
        app.notify = lambda message, **kw: (said.append(message), notify(message, **kw))[1]
        await pilot.pause(0.1)
        await pilot.press("down", "down")  # b3_oss_instruct: done
        await pilot.pause(0.1)
        assert app.selected_dataset == "b3_oss_instruct"
        await pilot.press("p")
        end = time.monotonic() + 3
        while not said and time.monotonic() < end:
            await pilot.pause(0.05)
        assert said == ["b3_oss_instruct is done: nothing left to pause"]
        assert ctl.calls == []
