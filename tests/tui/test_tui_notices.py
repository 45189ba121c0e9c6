"""What the dashboard (and the headless runner) tell the user without being asked: a guard pause
is announced like a user's pause (toast, log pane at WARNING, a headless line), and after a
restart the sample pane shows the latest stored completion. Real engine on the simulator."""

from __future__ import annotations

import dataclasses
import io
import logging
import sqlite3

import pytest
from waiting import until

from engine.report.progress import format_notices
from engine.run.headless import run_headless
from tui.app import DashboardApp
from tui.panes import LogPane
from tui.testing import SAMPLES, FakeController, fixed_snapshot, screen_text, sim_config

GLAIVE = [{"name": "glaive", "path": str(SAMPLES / "b1_glaive.jsonl"), "format": "glaive"}]
SHAREGPT = [{"name": "sharegpt", "path": str(SAMPLES / "b7_sharegpt.json"), "format": "sharegpt"}]
GUARD = {"anomaly_error_rate": 0.2, "anomaly_window": 10}


def guard_toasts(app) -> list[str]:
    return [n.message for n in app._notifications if n.title == "paused by a guard"]


@pytest.mark.slow  # issue 27: long e2e test (>9 s on 2 cores), run by `make slow`
async def test_anomaly_guard_pause_toasts_and_logs_a_warning(tmp_path, caplog):
    cfg = sim_config(tmp_path, concurrency=8, faults="502:0.7", spend=GUARD)
    app = DashboardApp(cfg)
    with caplog.at_level(logging.INFO, logger="engine.run.scheduler"):
        async with app.run_test(size=(160, 48), notifications=True) as pilot:
            await until(pilot, lambda: app.snapshot and app.snapshot.dataset("sharegpt").state == "paused",
                        what="the anomaly guard to pause sharegpt",
                        show=lambda: (app.snapshot.events, app.snapshot.notices), timeout=20.0)
            await until(pilot, lambda: guard_toasts(app), 3, "a toast")
            toast = guard_toasts(app)[0]
            assert toast.startswith("[sharegpt] paused by a guard: anomaly guard:")
            assert f"datagen ctl {cfg.run.dir} resume sharegpt" in toast
            await pilot.pause(0.6)
            log_lines = app.query_one(LogPane).lines
            assert any("WARNING [sharegpt] dataset paused: anomaly guard" in line for line in log_lines), log_lines
            assert "paused by a guard" in screen_text(app)  # the toast is on screen
            n = len(guard_toasts(app))
            await pilot.pause(0.6)
            assert len(guard_toasts(app)) == n  # announced once, not at every poll
            app.begin_quit("abort")
    recs = [r for r in caplog.records if "dataset paused: anomaly guard" in r.getMessage()]
    assert recs and all(r.levelno == logging.WARNING for r in recs)


async def test_user_pause_is_not_announced_as_a_guard_pause(tmp_path):
    app = DashboardApp(sim_config(tmp_path, concurrency=2))
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot and app.snapshot.in_flight, what="dispatch", timeout=20.0)
        await pilot.press("p")
        await until(pilot, lambda: app.snapshot.dataset("sharegpt").state == "paused", what="user pause", timeout=20.0)
        await pilot.pause(0.5)
        assert guard_toasts(app) == [] and app.snapshot.notices == ()
        app.begin_quit("abort")


async def test_headless_prints_a_line_when_a_guard_pauses(tmp_path):
    cfg = sim_config(tmp_path, concurrency=8, faults="502:0.7", spend=GUARD, progress_interval_s=60, max_attempts=2,
                     datasets=SHAREGPT)
    out = io.StringIO()
    code = await run_headless(cfg, out, install_signals=False, exit_on_pause=True)
    text = out.getvalue()
    assert code == 3
    lines = [line for line in text.splitlines() if line.startswith("GUARD: ")]
    assert lines, text
    assert lines[0].startswith("GUARD: [sharegpt] paused by a guard: anomaly guard:")
    assert len(lines) == len(set(lines))


def test_format_notices_returns_only_new_ones():
    notices = ((1, "a"), (2, "b"), (3, "c"))
    assert format_notices(notices, 0) == (["GUARD: a", "GUARD: b", "GUARD: c"], 3)
    assert format_notices(notices, 2) == (["GUARD: c"], 3)
    assert format_notices(notices, 3) == ([], 3)


async def test_injected_snapshot_notices_toast_once():
    snap = fixed_snapshot()
    box = {"snap": snap}
    app = DashboardApp(snapshot_source=lambda: box["snap"], controller=FakeController(), refresh_hz=20)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await pilot.pause(0.2)
        assert guard_toasts(app) == []
        box["snap"] = dataclasses.replace(snap, notices=((1, "[b1_glaive] paused by a guard: calibration gate"),))
        await until(pilot, lambda: guard_toasts(app), 2, "toast")
        await pilot.pause(0.3)
        assert guard_toasts(app) == ["[b1_glaive] paused by a guard: calibration gate"]
        assert "[b1_glaive] paused by a guard: calibration gate" in screen_text(app)  # not read as markup


async def test_sample_pane_shows_the_latest_stored_completion_after_a_restart(tmp_path):
    cfg = sim_config(tmp_path, tokens_per_s=2000, mean_completion_tokens=30, datasets=GLAIVE)
    assert await run_headless(cfg, io.StringIO(), install_signals=False) == 0
    with sqlite3.connect(tmp_path / "run" / "store.sqlite") as con:
        (key, content), = con.execute(
            "SELECT key, content FROM results WHERE dataset='glaive' ORDER BY created_at DESC, prompt_id DESC LIMIT 1")
    app = DashboardApp(cfg)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.engine_finished and app.snapshot is not None, what="the restarted run", timeout=20.0)
        await pilot.pause(0.3)
        text = screen_text(app)
        assert "no completion stored yet" not in text
        assert key in text and "sample stored by an earlier run" in text, text
        s = app.snapshot.dataset("glaive").latest_sample
        assert s is not None and s.key == key and s.content == content[:2000] and s.restored


def test_anomaly_guard_firing_on_a_success_is_not_lost():
    """The window can first hold enough outcomes on a success, the rate already above the
    threshold: the guard fires then, and that reason must reach the scheduler (it used to be dropped,
    and the guard, having fired, never paused the dataset)."""
    from engine.client.types import Completion, Usage
    from engine.run.telemetry import Telemetry

    tel = Telemetry(anomaly_error_rate=0.2, anomaly_window=10)
    assert [tel.on_error("ds", "SimA", "server", "502") for _ in range(9)] == [None] * 9
    c = Completion(reasoning="", content="x", tool_calls=(), finish_reason="stop", native_finish_reason=None,
                   usage=Usage(1, 1, 0, 0.0), provider="SimA", model="m", generation_id="g", latency_s=1.0, ttft_s=0.1)
    assert tel.on_success("ds", "k", "", c, 0.0) == "error rate 90% over the last 10 attempts in dispatch order exceeds 20%"
