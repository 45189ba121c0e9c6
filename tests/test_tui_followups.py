"""Faults a new user found in the merged dashboard (issue 16 follow-up), each driven by Textual's
pilot: the log pane keeps showing new lines once full; any stop in progress makes the next
Ctrl-C/SIGINT abort; ``p``/``s`` on skipped or finished datasets; elapsed stops with the run;
repeated ``-`` shows one toast; the detail view's ETA matches the table; rows drain while the run
stops. The real engine runs on the built-in simulator where the engine matters."""

from __future__ import annotations

import logging
import os
import re
import signal
import time

import pytest

from tui.app import DashboardApp
from tui.logbridge import PaneLogHandler
from tui.modals import QuitScreen
from tui.panes import LogPane
from tui.panes.log import MAX_LINES
from tui.testing import FIXED_GPUS, FakeController, fixed_snapshot, screen_text, sim_config


async def until(pilot, cond, timeout: float = 15.0, step: float = 0.05, what: str = "condition"):
    """Let the app run until ``cond()`` is truthy; return its value (fail after ``timeout`` s)."""
    end = time.monotonic() + timeout
    while not (v := cond()):
        assert time.monotonic() < end, f"timed out after {timeout}s waiting for {what}"
        await pilot.pause(step)
    return v


def injected(snap=None, **kw) -> DashboardApp:
    snap = snap or fixed_snapshot()
    return DashboardApp(snapshot_source=lambda: snap, controller=kw.pop("controller", FakeController()),
                        gpu_source=lambda: FIXED_GPUS, **kw)


# ---- 1. the log pane shows new lines once it holds MAX_LINES -----------------------------------------

@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)])
async def test_log_pane_keeps_showing_new_lines_once_full(size):
    """Before: once the pane held MAX_LINES, each write dropped as many lines as it added, the scroll
    offset stayed put and Textual repainted nothing: the pane froze on old lines at every size."""
    handler = PaneLogHandler()
    lg = logging.getLogger("test.logpane")
    lg.propagate, lg.level = False, logging.INFO
    lg.addHandler(handler)
    app = injected(log_handler=handler, refresh_hz=10)
    try:
        async with app.run_test(size=size) as pilot:
            for i in range(MAX_LINES + 100):
                lg.info("old line %d", i)
                if i % 500 == 0:
                    await pilot.pause(0.15)
            await until(pilot, lambda: len(app.query_one(LogPane).lines) >= MAX_LINES, what="a full pane")
            for i in range(5):
                lg.info("class short concurrency set to %d", 2200 + i)
                await until(pilot, lambda: f"set to {2200 + i}" in screen_text(app), 5, what=f"new line {i} shown")
            pane = app.query_one(LogPane)
            assert len(pane.lines) <= MAX_LINES  # bounded
            assert pane.scroll_y == pane.max_scroll_y  # following the newest line
            # A user who scrolled up stays where they are; new lines are still kept.
            pane.scroll_to(y=10, animate=False, immediate=True)
            lg.info("while scrolled up")
            await pilot.pause(0.3)
            assert pane.scroll_y == 10 and "while scrolled up" in pane.lines[-1]
    finally:
        lg.removeHandler(handler)


# ---- 2. any stop in progress counts as the first interrupt ---------------------------------------------

def test_interrupt_rule():
    from engine.runner import interrupt_action

    assert [interrupt_action(s, False) for s in ("SIGINT", "SIGTERM", "SIGHUP", "Ctrl-C")] == ["drain"] * 4
    assert [interrupt_action(s, True) for s in ("SIGINT", "SIGTERM", "Ctrl-C")] == ["abort"] * 3
    assert interrupt_action("SIGHUP", True) == "continue"  # the terminal went away: not an escalation


@pytest.mark.parametrize("how", ["ctrl+c", "SIGINT"])
async def test_interrupt_after_drain_then_quit_aborts_at_once(tmp_path, how, caplog):
    """Before: after q -> "Drain, then quit" the first Ctrl-C (key or SIGINT) only started draining
    again ("Ctrl-C received: draining"); the engine kept running until a second one."""
    cfg = sim_config(tmp_path, tokens_per_s=20, mean_completion_tokens=2000, drain_timeout_s=120)
    app = DashboardApp(cfg)
    caplog.set_level(logging.INFO)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.in_flight >= 4, what="dispatch")
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, QuitScreen), 3, what="quit modal")
        await pilot.press("d")
        await until(pilot, lambda: app.snapshot.state == "stopping", 5, what="the drain")
        assert app.is_running and app.host.quit_mode == "drain"
        t0 = time.monotonic()
        if how == "ctrl+c":
            await pilot.press("ctrl+c")
        else:
            os.kill(os.getpid(), signal.SIGINT)
        await until(pilot, lambda: not app.is_running, 15, what="exit after one interrupt")
        took = time.monotonic() - t0
    assert app.host.quit_mode == "abort" and app.host.exit_code == 130
    assert took < 15  # the streams last ~100 s; the drain would have waited for them
    log = caplog.text
    name = "Ctrl-C" if how == "ctrl+c" else "SIGINT"
    assert f"{name} received: aborting" in log and f"{name} received: draining" not in log
    assert re.search(r"aborted \d+ in-flight stream", log)
