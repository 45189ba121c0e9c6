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
from waiting import until

from tui.app import DashboardApp
from tui.logbridge import PaneLogHandler
from tui.modals import QuitScreen
from tui.panes import LogPane
from tui.panes.log import MAX_LINES
from tui.testing import FIXED_GPUS, FakeController, fixed_snapshot, screen_text, sim_config


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
            await until(pilot, lambda: len(app.query_one(LogPane).lines) >= MAX_LINES, what="a full pane", timeout=15.0)
            for i in range(5):
                lg.info("class short concurrency set to %d", 2200 + i)
                await until(pilot, lambda i=i: f"set to {2200 + i}" in screen_text(app), 5, what=f"new line {i} shown")
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


def test_repeated_event_lines_are_all_shown():
    """Before: the pane found new run events by overlapping the 50-line window with the previous one;
    repeated lines ("set to 22", "set to 24", again, in the same second) overlapped wholly and the
    new ones were never shown. The event count in the snapshot makes it exact."""
    from tui.panes.log import new_events

    window = ("12:00:00 INFO    class short concurrency set to 22", "12:00:00 INFO    class short concurrency set to 24")
    prev = window * 25
    assert new_events(prev, prev, 100, 102) == window
    assert new_events(prev, prev, 100, 100) == ()
    assert new_events(prev, prev, 100, 400) == prev  # more than the window: all it holds
    assert new_events(("a", "b"), ("b", "c")) == ("c",)  # no counts (an injected snapshot): overlap


# ---- 2. any stop in progress counts as the first interrupt ---------------------------------------------

def test_interrupt_rule():
    from engine.run.headless import interrupt_action

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
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.in_flight >= 4, what="dispatch", timeout=15.0)
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


# ---- 3. p on a skipped dataset asks; s on a finished one says why nothing happens ---------------------

async def test_p_on_a_skipped_dataset_asks_before_un_skipping(tmp_path):
    """Before: p on a skipped dataset resumed it at once (toast "resumed"), undoing a confirmed skip."""
    from tui.modals import ConfirmScreen

    cfg = sim_config(tmp_path, tokens_per_s=20, mean_completion_tokens=2000)
    app = DashboardApp(cfg)
    async with app.run_test(size=(160, 48), notifications=True) as pilot:
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.in_flight >= 1, what="dispatch", timeout=15.0)
        sched = app.host.scheduler
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 3, what="skip confirm")
        await pilot.press("y")
        await until(pilot, lambda: sched.snapshot().dataset("sharegpt").state == "skipped", 5, what="skipped")
        await pilot.pause(0.6)
        await pilot.press("p")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 3, what="un-skip confirm")
        assert "Un-skip sharegpt?" in screen_text(app) and "requested (and billed) again" in screen_text(app)
        assert sched.snapshot().dataset("sharegpt").state == "skipped"
        await pilot.press("n")
        await pilot.pause(0.5)
        assert sched.snapshot().dataset("sharegpt").state == "skipped"
        assert any("sharegpt stays skipped" == n.message for n in app._notifications)
        # s on the skipped dataset: says why nothing happens, and opens no modal
        await pilot.press("s")
        await pilot.pause(0.3)
        assert not isinstance(app.screen, ConfirmScreen)
        assert any("sharegpt is already skipped (p brings it back)" == n.message for n in app._notifications)
        # p again, confirmed: back to running
        await pilot.press("p")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 3, what="un-skip confirm")
        await pilot.press("y")
        await until(pilot, lambda: sched.snapshot().dataset("sharegpt").state == "running", 5, what="un-skipped")
        app.begin_quit("abort")


@pytest.mark.parametrize("state, why", [("done", "b3_oss_instruct is done: nothing left to skip"),
                                        ("budget_met", "b3_oss_instruct met its token budget: nothing left to skip")])
async def test_s_on_a_finished_dataset_says_why(state, why):
    """Before: s on a done/budget_met dataset was a disabled binding: nothing happened, nothing said."""
    import dataclasses

    snap = fixed_snapshot()
    ds = list(snap.datasets)
    ds[2] = dataclasses.replace(ds[2], state=state)
    snap = dataclasses.replace(snap, datasets=tuple(ds))
    ctl = FakeController()
    app = injected(snap, controller=ctl)
    async with app.run_test(size=(160, 48), notifications=True) as pilot:
        await pilot.pause(0.2)
        await pilot.press("down", "down")
        assert app.selected_dataset == "b3_oss_instruct"
        await pilot.press("s")
        await pilot.pause(0.3)
        assert len(app.screen_stack) == 1 and ctl.calls == []
        assert [n.message for n in app._notifications] == [why]


# ---- 4. elapsed stops when the run ends ------------------------------------------------------------

GLAIVE_ONLY = [{"name": "glaive", "path": "b1_glaive.jsonl", "format": "glaive"}]


async def test_elapsed_stops_when_the_run_completes_and_matches_status(tmp_path):
    """Before: the header's elapsed kept counting after COMPLETED (7 s, then 17 s ten seconds later)
    while ``datagen status`` said ``completed, elapsed 4s``."""
    from engine.report.status import collect_status
    from tui.testing import SAMPLES

    ds = [{**GLAIVE_ONLY[0], "path": str(SAMPLES / GLAIVE_ONLY[0]["path"])}]
    cfg = sim_config(tmp_path, tokens_per_s=400, mean_completion_tokens=100, datasets=ds)
    app = DashboardApp(cfg, refresh_hz=10)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.engine_finished, 30, what="the run to complete")
        assert app.snapshot.state == "completed"
        first = app.snapshot.elapsed_s
        header = re.search(r"elapsed (\S+)", screen_text(app)).group(1)
        await pilot.pause(2.5)
        assert app.host.scheduler.snapshot().elapsed_s == first
        assert re.search(r"elapsed (\S+)", screen_text(app)).group(1) == header
        doc = collect_status(cfg.run.dir)
        assert doc["run"]["state"] == "completed" and doc["run"]["elapsed_s"] == round(first, 3)
        await pilot.press("q")


# ---- 5. repeated concurrency keys show one toast ---------------------------------------------------

@pytest.mark.slow  # issue 27: long e2e test (>9 s on 2 cores), run by `make slow`
async def test_pressing_minus_30_times_shows_one_toast(tmp_path):
    """Before: each press left its own toast ("class short concurrency 21", "... 19", ...): 30 presses
    stacked 30 toasts over half the screen."""
    cfg = sim_config(tmp_path, tokens_per_s=20, mean_completion_tokens=2000, concurrency=24)
    app = DashboardApp(cfg)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.in_flight >= 1, what="dispatch", timeout=15.0)
        for _ in range(30):
            await pilot.press("minus")
        await until(pilot, lambda: app.host.scheduler.snapshot().classes[0].concurrency == 1, 5, what="concurrency 1")
        await pilot.pause(0.5)
        toasts = [n.message for n in app._notifications]
        assert toasts in (["class short concurrency 1"],
                          ["class short concurrency is at its minimum 1 (P pauses the run, p the dataset)"]), toasts
        for _ in range(3):
            await pilot.press("plus")
        await until(pilot, lambda: app.host.scheduler.snapshot().classes[0].concurrency == 4, 5, what="concurrency 4")
        await pilot.pause(0.3)
        assert [n.message for n in app._notifications] == ["class short concurrency 4"]
        app.begin_quit("abort")


# ---- 6. the detail view's ETA is the table's --------------------------------------------------------

async def test_detail_view_eta_matches_the_tables_range_while_calibrating():
    """Before: ``i`` said ``ETA 36s`` while the table showed ``35s–38m30s`` for the same dataset."""
    import dataclasses

    from tui.detail import DetailScreen

    snap = fixed_snapshot()
    ds = list(snap.datasets)
    ds[0] = dataclasses.replace(ds[0], eta_s=36.0, eta_s_low=35.0, eta_s_high=2310.0, calibration=(3, 50))
    snap = dataclasses.replace(snap, datasets=tuple(ds))
    app = injected(snap, refresh_hz=20)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(0.2)
        assert "35s–38m30s" in screen_text(app)  # the table
        await pilot.press("i")
        await pilot.pause(0.2)
        assert isinstance(app.screen, DetailScreen)
        shown = " ".join(screen_text(app).split())
        assert "ETA 35s–38m30s (calibrating 3/50)" in shown and "ETA 36s" not in shown


# ---- 7. rows drain while the run stops ---------------------------------------------------------------

def test_stopping_state_rule():
    from engine.run.observe import stopping_state

    assert stopping_state("running", "running", 3) == "running"
    assert stopping_state("running", "stopping", 3) == "draining"
    assert stopping_state("paused", "stopping", 2) == "draining"
    assert stopping_state("running", "stopping", 0) == "stopping"
    assert stopping_state("pending", "stopped", 0) == "stopped"
    assert stopping_state("paused", "stopping", 0) == "paused"
    assert stopping_state("done", "stopping", 0) == "done" and stopping_state("skipped", "stopped", 0) == "skipped"


async def test_rows_show_draining_while_the_run_drains_and_the_store_keeps_its_state(tmp_path):
    """Before: dataset rows stayed ``running`` while the header said STOPPING."""
    import sqlite3

    cfg = sim_config(tmp_path, tokens_per_s=20, mean_completion_tokens=2000, drain_timeout_s=120)
    app = DashboardApp(cfg)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.in_flight >= 4, what="dispatch", timeout=15.0)
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, QuitScreen), 3, what="quit modal")
        await pilot.press("d")
        await until(pilot, lambda: app.snapshot.state == "stopping", 5, what="the drain")
        await pilot.pause(0.6)
        d = app.snapshot.dataset("sharegpt")
        assert d.in_flight >= 1 and d.state == "draining"
        row = [line for line in screen_text(app).splitlines() if "sharegpt" in line][0]
        assert "draining" in row and "running" not in row and "cal " not in row, row  # no ETA while stopping
        assert row.split("│")[1].split()[5] == "--", row
        assert "STOPPING" in screen_text(app)
        with sqlite3.connect(cfg.run.dir / "store.sqlite") as db:  # the stored control is unchanged
            states = dict(db.execute("SELECT name, state FROM datasets"))
        assert states["sharegpt"] == "active", states
        app.begin_quit("abort")


# ---- 8. a refused start creates nothing --------------------------------------------------------------

REFUSED = """
[run]
name = "refused"
dir = "{run_dir}"

[provider]
kind = "{kind}"
{extra}

[classes.short]
max_tokens = 2000
concurrency = 2

[[datasets]]
name = "glaive"
path = "{samples}/b1_glaive.jsonl"
format = "glaive"
"""


def _refused_run(tmp_path, kind: str, extra: str = "", env_drop: str = "") -> tuple[int, str]:
    import subprocess
    import sys
    from pathlib import Path

    from tui.testing import SAMPLES

    cfg = tmp_path / "config.toml"
    cfg.write_text(REFUSED.format(run_dir=tmp_path / "run", kind=kind, extra=extra, samples=SAMPLES))
    env = {k: v for k, v in os.environ.items() if k != env_drop}
    datagen = Path(sys.executable).with_name("datagen")
    r = subprocess.run([str(datagen), "run", str(cfg), "--headless"], capture_output=True, text=True, env=env,
                       timeout=60)
    return r.returncode, r.stderr


def test_missing_api_key_refuses_the_start_and_creates_nothing(tmp_path):
    """Before: the refused start still created RUN_DIR and RUN_DIR/datagen.log."""
    rc, err = _refused_run(tmp_path, "openrouter", env_drop="OPENROUTER_API_KEY")
    assert rc == 1 and "OPENROUTER_API_KEY is not set" in err, err
    assert not (tmp_path / "run").exists()


def test_a_keyless_server_that_wants_a_key_refuses_the_start_and_creates_nothing(tmp_path):
    """The refusal found while preparing (GET /key answers 401) removes the log and the run dir it made."""
    import http.server
    import threading

    class Deny(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(401)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Deny)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        rc, err = _refused_run(tmp_path, "openai", f'base_url = "http://127.0.0.1:{srv.server_port}/v1"',
                               env_drop="OPENAI_API_KEY")
    finally:
        srv.shutdown()
    assert rc == 1 and "HTTP 401 on GET /key" in err, err
    assert not (tmp_path / "run").exists()
