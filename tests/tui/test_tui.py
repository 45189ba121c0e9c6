"""The dashboard driven by Textual's pilot against the REAL engine on the built-in simulator.

Every test checks the engine's state (``scheduler.snapshot()``, and the store through
``engine.report.status.collect_status`` after the writer's 0.1 s commits), not just the screen.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3

import pytest
from tui_helpers import footer, toasts
from waiting import until

from engine.report.status import collect_status
from tui.app import DashboardApp
from tui.modals import ConfirmScreen, PickScreen, QuitScreen
from tui.testing import FIXED_GPUS, FakeController, fixed_snapshot, screen_text, sim_config

SIZE = (160, 48)


async def until_status(pilot, run_dir, cond, timeout: float = 10.0, what: str = "status"):
    """Wait until the store (as ``datagen status`` reads it) satisfies ``cond(doc)``; return the doc."""
    box: dict = {}

    def check():
        try:
            box["doc"] = collect_status(run_dir)
        except Exception:
            return False
        return cond(box["doc"])

    await until(pilot, check, timeout, step=0.05, what=what)
    return box["doc"]


def ds_status(doc, name):
    return next(d for d in doc["datasets"] if d["name"] == name)


async def started(app, pilot, min_in_flight: int = 1):
    """Wait until the engine dispatches and the dashboard has drawn a snapshot."""
    await until(pilot, lambda: app.snapshot is not None and app.snapshot.in_flight >= min_in_flight,
                15, what="requests in flight")
    sched = app.host.scheduler
    return sched


@pytest.fixture
def cfg(tmp_path):
    return sim_config(tmp_path)


async def test_p_pauses_then_resumes_selected_dataset_and_footer_follows(cfg):
    app = DashboardApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        sched = await started(app, pilot)
        assert app.selected_dataset == "sharegpt"
        await until(pilot, lambda: "p Pause" in footer(app), 3, what="footer Pause")
        assert "Resume" not in footer(app)
        await pilot.press("p")
        await until(pilot, lambda: sched.snapshot().dataset("sharegpt").state == "paused", 2, what="paused")
        doc = await until_status(pilot, cfg.run.dir, lambda d: ds_status(d, "sharegpt")["state"] == "paused")
        assert ds_status(doc, "sharegpt")["state_reason"] == "paused by user"
        await until(pilot, lambda: "p Resume" in footer(app), 3, what="footer Resume")
        await pilot.press("p")
        await until(pilot, lambda: sched.snapshot().dataset("sharegpt").state == "running", 2, what="resumed")
        await until_status(pilot, cfg.run.dir, lambda d: ds_status(d, "sharegpt")["state"] == "running")
        await until(pilot, lambda: "p Pause" in footer(app), 3, what="footer Pause")


async def test_s_skips_only_after_confirm(cfg):
    app = DashboardApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        sched = await started(app, pilot)
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 2, what="confirm modal")
        assert "Skip sharegpt?" in screen_text(app)
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), 2, what="modal closed")
        await pilot.pause(0.2)
        assert sched.snapshot().dataset("sharegpt").state == "running"
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 2, what="confirm modal")
        await pilot.press("y")
        await until(pilot, lambda: sched.snapshot().dataset("sharegpt").state == "skipped", 2, what="skipped")
        doc = await until_status(pilot, cfg.run.dir, lambda d: ds_status(d, "sharegpt")["state"] == "skipped")
        assert ds_status(doc, "sharegpt")["skipped"] > 0
        # The next dataset gets the slots
        await until(pilot, lambda: sched.snapshot().dataset("glaive").in_flight > 0, 5, what="glaive dispatched")


async def test_P_pauses_run_and_R_resumes(cfg):
    app = DashboardApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        sched = await started(app, pilot)
        await pilot.press("P")
        await until(pilot, lambda: sched.snapshot().state == "paused", 2, what="run paused")
        await until_status(pilot, cfg.run.dir, lambda d: d["run"]["state"] == "paused")
        await until(pilot, lambda: "R Resume all" in footer(app), 3, what="footer R")
        await pilot.press("R")
        await until(pilot, lambda: sched.snapshot().state == "running", 2, what="run resumed")
        await until_status(pilot, cfg.run.dir, lambda d: d["run"]["state"] == "running")


async def test_R_resumes_every_paused_dataset_when_the_run_itself_is_not_paused(cfg):
    """A dataset paused (by p, or a guard) while the run runs: R ("resume all") shows and resumes it."""
    app = DashboardApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        sched = await started(app, pilot)
        name = app.selected_dataset
        assert "R Resume all" not in footer(app)
        await pilot.press("p")
        await until(pilot, lambda: sched.snapshot().dataset(name).state == "paused", 2, what="dataset paused")
        await until(pilot, lambda: "R Resume all" in footer(app), 3, what="footer R")
        await pilot.press("R")
        await until(pilot, lambda: sched.snapshot().dataset(name).state == "running", 2, what="dataset resumed")
        await until(pilot, lambda: f"run resumed; 1 paused dataset(s) resumed: {name}" in toasts(app), 2, what="toast")
        assert sched.snapshot().state == "running"


async def test_plus_and_minus_change_the_selected_dataset_class_concurrency(cfg):
    app = DashboardApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        sched = await started(app, pilot)
        conc = lambda: sched.snapshot().classes[0].concurrency  # noqa: E731
        assert conc() == 4
        await pilot.press("plus")
        await until(pilot, lambda: conc() == 5, 2, what="concurrency 5")
        await until(pilot, lambda: sched.snapshot().in_flight == 5, 5, what="5 in flight")
        await pilot.press("minus", "minus")
        await until(pilot, lambda: conc() == 3, 2, what="concurrency 3")


async def test_a_aborts_in_flight_after_confirm_showing_dollars_and_count(cfg):
    app = DashboardApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot, min_in_flight=4)
        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 2, what="confirm modal")
        text = screen_text(app)
        assert "4 requests in flight, est. $" in text and "when they finish" in text
        await pilot.press("y")
        db = sqlite3.connect(cfg.run.dir / "store.sqlite")

        def aborted():
            return db.execute("SELECT COUNT(*) FROM attempts WHERE outcome='aborted'").fetchone()[0]

        await until(pilot, lambda: aborted() >= 4, 5, what="4 aborted attempts stored")
        db.close()


async def test_q_with_drain_exits_130_after_storing_in_flight(cfg):
    """Prompts are left: the quit exits 130 (interrupted by the user), not 0 (completed). Before: 0."""
    app = DashboardApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        sched = await started(app, pilot, min_in_flight=4)
        in_flight = sched.snapshot().in_flight
        done_before = sched.snapshot().dataset("sharegpt").done
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, QuitScreen), 2, what="quit modal")
        await pilot.press("d")
        await until(pilot, lambda: not app.is_running, 20, step=0.05, what="app exit")
    assert app.return_code == 130 and app.host.exit_code == 130
    doc = collect_status(cfg.run.dir)
    t = doc["totals"]
    assert t["in_flight"] == 0 and doc["run"]["state"] == "stopped"  # (the pid is alive: it is this test's)
    assert t["done"] + t["failed"] >= done_before + in_flight  # the drained requests were stored
    assert t["done"] + t["failed"] + t["pending"] + t["skipped"] == t["prompts"]


async def test_sigterm_drains_like_quit_and_exits_130(cfg):
    app = DashboardApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        assert signal.SIGTERM in app.terminal.signals, "SIGTERM handler not installed"
        os.kill(os.getpid(), signal.SIGTERM)
        await until(pilot, lambda: not app.is_running, 20, step=0.05, what="app exit")
    assert app.host.exit_code == 130 and app.return_code == 130  # interrupted (docs/commands.md: exit codes)
    doc = collect_status(cfg.run.dir)
    assert doc["totals"]["in_flight"] == 0 and doc["run"]["state"] in ("stopped", "completed")


async def test_ctrl_c_drains_with_a_countdown_and_a_second_aborts_exit_130(tmp_path):
    """Ctrl-C reaches a raw-mode dashboard as a key, not SIGINT: it must drain like SIGINT (header:
    in flight, dollars, countdown), a second one abort at once, and the run exit 130. Before: Textual's
    default ctrl+c only showed "press q to quit"."""
    from tui.testing import sim_config

    # ~25 s streams; the drain would wait up to 60 s.
    cfg = sim_config(tmp_path, tokens_per_s=40, mean_completion_tokens=1000, drain_timeout_s=60)
    app = DashboardApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot, min_in_flight=4)
        await pilot.press("ctrl+c")
        await until(pilot, lambda: "abort in" in screen_text(app), 5, what="the drain countdown")
        assert re.search(r"draining [1-4] in flight \(\$0\.\d{4}\) · abort in (5\d|1m00)s", screen_text(app))
        assert app.host.quit_mode == "drain" and app.is_running
        await pilot.press("ctrl+c")
        await until(pilot, lambda: not app.is_running, 10, step=0.05, what="app exit")
    assert app.host.exit_code == 130 and app.return_code == 130
    doc = collect_status(cfg.run.dir)
    assert doc["totals"]["in_flight"] == 0 and doc["run"]["state"] == "stopped"


async def test_keys_call_the_controller_with_an_injected_snapshot():
    """x picks a provider (excluded ones are not offered); + uses the class from dataset_class."""
    ctl = FakeController()
    ctl.dataset_class = lambda name: "long"
    app = DashboardApp(snapshot_source=fixed_snapshot, controller=ctl, gpu_source=lambda: FIXED_GPUS)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, PickScreen), 2, what="pick modal")
        text = screen_text(app)
        offered = text.split("Exclude which provider?")[1]
        assert "SimA" in offered and "SimB" in offered
        assert "SimC  (excluded: pick to include it again)" in offered  # excluded: offered for inclusion only
        await pilot.press("down", "enter")
        await until(pilot, lambda: ("exclude_provider", ("SimB",)) in ctl.calls, 2, what="exclude call")
        await pilot.press("plus")
        await until(pilot, lambda: ("set_concurrency", ("long", 55)) in ctl.calls, 2, what="concurrency call")
        await pilot.press("down", "p")  # b1_glaive is paused: p resumes it
        await until(pilot, lambda: ("resume", ("b1_glaive",)) in ctl.calls, 2, what="resume call")


async def test_rendering_goes_on_while_a_modal_is_open():
    """The panes stay visible around a modal, so they keep updating (issue 16: elapsed froze under
    ``i`` and the quit dialog while rendering was skipped)."""
    snaps = [fixed_snapshot()]
    app = DashboardApp(snapshot_source=lambda: snaps[-1], controller=FakeController(), refresh_hz=20,
                       gpu_source=lambda: FIXED_GPUS)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        await pilot.press("question_mark")
        await pilot.pause(0.05)
        renders, polls = app.renders, app.polls
        await pilot.pause(0.5)
        assert app.polls > polls + 3 and app.renders > renders + 3
        await pilot.press("escape")


async def test_dashboard_keys_are_off_while_a_modal_is_open():
    ctl = FakeController()
    app = DashboardApp(snapshot_source=fixed_snapshot, controller=ctl, gpu_source=lambda: FIXED_GPUS)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 2, what="confirm modal")
        await pilot.press("p", "P", "plus")
        await pilot.pause(0.2)
        assert ctl.calls == [] and isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await until(pilot, lambda: ctl.calls == [("skip", ("b7_sharegpt",))], 2, what="skip call")


async def test_command_palette_offers_the_same_actions():
    ctl = FakeController()
    app = DashboardApp(snapshot_source=fixed_snapshot, controller=ctl, gpu_source=lambda: FIXED_GPUS)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        await pilot.press("ctrl+p")
        await pilot.pause(0.2)
        await pilot.press(*"pause dataset b1_glaive")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await until(pilot, lambda: ("pause", ("b1_glaive",)) in ctl.calls, 3, what="pause via palette")


def test_a_hung_up_tty_is_not_a_terminal():
    from tui.terminal import _is_terminal

    master, slave = os.openpty()
    try:
        assert _is_terminal(slave)
        os.close(master)  # the terminal goes away
        assert not _is_terminal(slave)
    finally:
        os.close(slave)


async def test_watchdog_drains_and_exits_when_the_terminal_goes_away(cfg, monkeypatch):
    import tui.terminal

    app = DashboardApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        app.terminal.tty_fds = [0]
        monkeypatch.setattr(tui.terminal, "_is_terminal", lambda fd: False)
        app.terminal.check_terminal()
        assert app.terminal_lost and app.host.quit_mode == "drain"
        polls = app.renders
        await until(pilot, lambda: not app.is_running, 20, step=0.05, what="app exit")
        assert app.renders == polls  # nothing drawn once the terminal is gone
    assert app.host.exit_code == 130  # interrupted by the terminal's loss


async def test_leaving_the_app_with_requests_in_flight_stops_the_engine_and_closes_the_store(cfg):
    app = DashboardApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot, min_in_flight=4)
    # run_test's exit called app.exit(): the engine was aborted and closed before the loop ended
    assert app.host.finished and app.host.quit_mode == "abort"
    doc = collect_status(cfg.run.dir)
    assert doc["run"]["state"] == "stopped" and doc["totals"]["in_flight"] == 0
    db = sqlite3.connect(cfg.run.dir / "store.sqlite")
    assert db.execute("SELECT COUNT(*) FROM attempts WHERE outcome='aborted'").fetchone()[0] >= 4
    db.close()
