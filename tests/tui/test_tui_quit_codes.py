"""Exit codes of a quit from the dashboard (issue 16, h9): prompts left -> 130 (interrupted by the
user, as docs/commands.md's exit codes say); a drain that stores the last prompts -> 0 (completed). Real
engine on the built-in simulator, Textual's pilot."""

from __future__ import annotations

import pytest
from waiting import until

from tui.app import DashboardApp
from tui.modals import QuitScreen
from tui.testing import FIXED_GPUS, SAMPLES, sim_config


async def quit_with(app, pilot, key: str) -> None:
    await until(pilot, lambda: app.snapshot is not None and app.snapshot.in_flight >= 3, what="requests in flight", timeout=20.0)
    await pilot.press("q")
    await until(pilot, lambda: isinstance(app.screen, QuitScreen), 3, what="quit dialog")
    await pilot.press(key)
    await until(pilot, lambda: not app.is_running, 30, what="app exit")


async def test_abort_now_with_prompts_left_exits_130(tmp_path):
    """Before: "Abort now" exited 0, read by scripts as completed."""
    cfg = sim_config(tmp_path, tokens_per_s=20, mean_completion_tokens=400, concurrency=4)
    app = DashboardApp(cfg, gpu_source=lambda: FIXED_GPUS, refresh_hz=10, install_signals=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await quit_with(app, pilot, "a")
    assert app.return_code == 130 and app.host.exit_code == 130


async def test_drain_that_stores_the_last_prompts_exits_0(tmp_path):
    """All 5 prompts in flight when quitting with a drain: the drain completes the run, so 0."""
    ds = [{"name": "glaive", "path": str(SAMPLES / "b1_glaive.jsonl"), "format": "glaive"}]
    cfg = sim_config(tmp_path, tokens_per_s=40, mean_completion_tokens=60, concurrency=8, datasets=ds)
    app = DashboardApp(cfg, gpu_source=lambda: FIXED_GPUS, refresh_hz=10, install_signals=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.in_flight >= 3
                    and app.snapshot.datasets[0].pending == 0, what="every prompt in flight", timeout=20.0)
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, QuitScreen) or not app.is_running, 3, what="quit dialog")
        if isinstance(app.screen, QuitScreen):
            await pilot.press("d")
        await until(pilot, lambda: not app.is_running, 30, what="app exit")
    assert app.host.exit_code == 0 and app.return_code == 0


@pytest.mark.slow  # issue 27: long e2e test (>9 s on 2 cores), run by `make slow`
async def test_exit_on_pause_ends_the_dashboard_with_3_when_a_guard_pauses_the_run(tmp_path):
    """The one exit-on-pause rule is the engine's (``runner.run_job``); the dashboard had its own copy,
    dead since run_job existed, now removed: the hosted engine still ends the app with 3."""
    ds = [{"name": "sharegpt", "path": str(SAMPLES / "b7_sharegpt.json"), "format": "sharegpt"}]
    cfg = sim_config(tmp_path, concurrency=8, faults="502:0.7", max_attempts=2, datasets=ds,
                     spend={"anomaly_error_rate": 0.2, "anomaly_window": 10})
    app = DashboardApp(cfg, gpu_source=lambda: FIXED_GPUS, refresh_hz=10, install_signals=False, exit_on_pause=True)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: not app.is_running, 60, what="app exit on the guard pause")
    assert app.host.exit_code == 3 and app.return_code == 3
    snap = app.host.snapshot()
    assert snap.state == "stopped" and snap.state_reason.startswith("exit on pause: sharegpt: anomaly guard")
    assert snap.in_flight == 0
