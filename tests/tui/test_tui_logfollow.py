"""The log pane follows new lines (issue 16, h9): on a fresh run, across resizes, with lines
wider than the pane; unless the user scrolled up. Read from the rendered screen."""

from __future__ import annotations

import logging

import pytest
from waiting import until

from tui.app import DashboardApp
from tui.logbridge import PaneLogHandler
from tui.panes import LogPane
from tui.testing import FIXED_GPUS, FakeController, fixed_snapshot, screen_text, sim_config


@pytest.fixture
def logger():
    handler = PaneLogHandler()
    lg = logging.getLogger("test.logfollow")
    lg.propagate, lg.level = False, logging.INFO
    lg.addHandler(handler)
    yield lg, handler
    lg.removeHandler(handler)


def pane_text(app) -> str:
    """The rendered screen (the log pane is part of it)."""
    return screen_text(app)


async def test_fresh_pane_follows_lines_wider_than_the_pane(logger):
    """Before: the first batch filled the pane exactly; Textual measured the width in a thread and a
    horizontal scrollbar then took the bottom row, so the pane was one row short of its end and
    ``Log`` stopped following for good: the newest lines were never shown."""
    lg, handler = logger
    app = DashboardApp(snapshot_source=fixed_snapshot, controller=FakeController(), gpu_source=lambda: FIXED_GPUS,
                       log_handler=handler, refresh_hz=10)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(0.3)
        for i in range(app.query_one(LogPane).size.height + 3):
            lg.info("start-up line %02d %s", i, "x" * 150)
        await until(pilot, lambda: "start-up line" in pane_text(app), 5, what="the start-up lines")
        for i in range(30):
            lg.info("class short concurrency set to %d", 2200 + i)
            await until(pilot, lambda i=i: f"set to {2200 + i}" in pane_text(app), 5, what=f"new line {i} on screen")
        pane = app.query_one(LogPane)
        assert pane.scroll_y == pane.max_scroll_y
        # The newest line sits on the pane's bottom row: no horizontal scrollbar row (the stray ▍/▋)
        # under it; long lines still scroll sideways with the arrow keys.
        rows = pane_text(app).splitlines()
        at = next(i for i, r in enumerate(rows) if "set to 2229" in r)
        assert rows[at + 1].lstrip("│ ").startswith("╰") or "╰" in rows[at + 1][80:], rows[at:at + 2]
        assert pane.styles.scrollbar_size_horizontal == 0


async def test_pane_follows_across_resizes_and_stays_put_when_scrolled_up(logger):
    """Before: 160x48 -> 80x24 -> 160x48 left the pane mid-list; new lines were no longer shown."""
    lg, handler = logger
    app = DashboardApp(snapshot_source=fixed_snapshot, controller=FakeController(), gpu_source=lambda: FIXED_GPUS,
                       log_handler=handler, refresh_hz=10)
    async with app.run_test(size=(160, 48)) as pilot:
        for i in range(60):
            lg.info("old line %02d %s", i, "y" * (10 * (i % 12)))
        await until(pilot, lambda: "old line 59" in pane_text(app), 5, what="old lines")
        n = 0
        for size in ((80, 24), (160, 48), (120, 40), (80, 24), (160, 48)):
            await pilot.resize_terminal(*size)
            await pilot.pause(0.3)
            for _ in range(3):
                lg.info("after resize line %d", n)
                await until(pilot, lambda n=n: f"after resize line {n}" in pane_text(app), 5,
                            what=f"line {n} on screen at {size}")
                n += 1
        pane = app.query_one(LogPane)
        pane.scroll_to(y=5, animate=False, immediate=True)
        await pilot.pause(0.2)
        lg.info("while scrolled up")
        await pilot.pause(0.5)
        assert pane.scroll_y == 5 and "while scrolled up" not in pane_text(app)
        assert pane.lines[-1].endswith("while scrolled up")
        pane.scroll_end(animate=False, immediate=True)  # back at the end: following again
        await pilot.pause(0.2)
        lg.info("following again")
        await until(pilot, lambda: "following again" in pane_text(app), 5, what="following after scrolling back")


async def test_fresh_engine_run_shows_its_latest_log_line(tmp_path):
    """A fresh run directory on the simulator: the newest line of the pane is on screen."""
    cfg = sim_config(tmp_path, tokens_per_s=20, mean_completion_tokens=2000, concurrency=4)
    app = DashboardApp(cfg, gpu_source=lambda: FIXED_GPUS, refresh_hz=10, install_signals=False)
    async with app.run_test(size=(160, 48)) as pilot:
        pane = app.query_one(LogPane)
        await until(pilot, lambda: len(pane.lines) >= 1, 20, what="start-up lines")
        for _ in range(40):  # more lines than the pane shows: "concurrency set to 5", then 4, ...
            await pilot.press("plus")
            await pilot.pause(0.15)
            await pilot.press("minus")
            await pilot.pause(0.15)
            if len(pane.lines) > pane.size.height + 2:  # (ingest's per-prompt lines no longer fill it)
                break
        await pilot.pause(1.0)
        assert len(pane.lines) > pane.size.height
        last = pane.lines[-1].rstrip()
        assert last[:60] in pane_text(app), (last, pane.scroll_y, pane.max_scroll_y)
        await pilot.press("q")
        await pilot.pause(0.2)
        await pilot.press("a")
