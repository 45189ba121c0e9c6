"""Dialogs, help and details at a glance: the buttons name their keys (``Skip [y]``, ``Drain, then
quit [d]``) and mark the focused one (``▸ Cancel [n] ◂``, what Enter presses), a cancelled skip
says so, the ``?`` box is whole at 120x40 (and scrolls at 80x24), and ``i`` on a budget-limited
row shows its limit in full."""

from __future__ import annotations

import dataclasses

from tui.actions import HELP
from tui.app import DashboardApp
from tui.detail import DetailScreen
from tui.modals import ConfirmScreen, HelpScreen, QuitScreen
from tui.testing import FIXED_GPUS, FakeController, fixed_snapshot, screen_text


def app_for(snap=None, ctl=None) -> DashboardApp:
    snap = snap or fixed_snapshot()
    return DashboardApp(snapshot_source=lambda: snap, controller=ctl or FakeController(),
                        gpu_source=lambda: FIXED_GPUS, refresh_hz=20)


def boxed(text: str) -> str:
    """The text inside the modal's thick border (rows between its top and bottom edges, cut at its
    sides), whitespace squeezed: what the box shows, without the dashboard around it."""
    lines = text.split("\n")
    top = next(i for i, line in enumerate(lines) if "█▀" in line)
    left, right = lines[top].index("█▀"), lines[top].rindex("▀█") + 1
    bottom = next(i for i in range(top + 1, len(lines)) if "▄▄▄" in lines[i][left:right + 1])
    return " ".join(" ".join(line[left + 1:right].split()) for line in lines[top + 1:bottom]).strip()


def button_row(text: str) -> str:
    return next(line for line in text.split("\n") if "[y]" in line or "[d]" in line or "[n]" in line)


async def test_skip_dialog_names_its_keys_marks_the_focus_and_enter_on_cancel_says_so():
    ctl = FakeController()
    app = app_for(ctl=ctl)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.pause(0.2)
        await pilot.press("s")
        await pilot.pause(0.1)
        assert isinstance(app.screen, ConfirmScreen)
        row = button_row(screen_text(app))
        assert "Skip [y]" in row and "▸ Cancel [n] ◂" in row and "▸ Skip" not in row, row
        await pilot.press("left")  # the focus moves, and its mark with it
        await pilot.pause(0.1)
        row = button_row(screen_text(app))
        assert "▸ Skip [y] ◂" in row and "▸ Cancel" not in row, row
        await pilot.press("right", "enter")  # Cancel
        await pilot.pause(0.2)
        assert not isinstance(app.screen, ConfirmScreen) and ("skip", ("b7_sharegpt",)) not in ctl.calls
        assert "b7_sharegpt not skipped" in screen_text(app)


async def test_quit_dialog_names_its_keys_and_marks_drain():
    app = app_for()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        await pilot.press("q")
        await pilot.pause(0.1)
        assert isinstance(app.screen, QuitScreen)
        row = button_row(screen_text(app))
        assert "▸ Drain, then quit [d] ◂" in row and "Abort now [a]" in row and "Stay [esc]" in row, row


async def test_help_is_whole_at_120x40_and_scrolls_at_80x24():
    app = app_for()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        await pilot.press("question_mark")
        await pilot.pause(0.2)
        assert isinstance(app.screen, HelpScreen)
        flat = boxed(screen_text(app))  # fails when the box's bottom edge is off the screen
        for key, what in HELP:
            assert f"{key} {' '.join(what.split())}" in flat, f"help cut: {key} {what!r}"
        assert "[extract] after_run" in flat and "Any other key closes this." in flat
        await pilot.press("x")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, HelpScreen)
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.2)
        await pilot.press("question_mark")
        await pilot.pause(0.2)
        assert "closes this." not in boxed(screen_text(app))  # taller than the terminal: the end is below
        await pilot.press("end")
        await pilot.pause(0.2)
        assert isinstance(app.screen, HelpScreen) and "Any other key closes this." in boxed(screen_text(app))


async def test_details_of_a_budget_limited_row_show_the_limit_whole():
    snap = fixed_snapshot()
    ds = list(snap.datasets)
    ds[0] = dataclasses.replace(ds[0], limit_reason="budget-limited 5/24")
    app = app_for(dataclasses.replace(snap, datasets=tuple(ds)))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        await pilot.press("i")
        await pilot.pause(0.2)
        assert isinstance(app.screen, DetailScreen)
        flat = boxed(screen_text(app))
        assert "limit budget-limited 5/24 (in flight / class slots): its token budget holds dispatch" in flat
