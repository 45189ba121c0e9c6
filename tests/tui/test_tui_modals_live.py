"""Under a modal the dashboard keeps updating and the footer lists the modal's keys; Left/Right move
between a dialog's buttons (issue 16, h9). Textual's pilot, read from the rendered screen."""

from __future__ import annotations

import dataclasses

import pytest

from tui.app import DashboardApp
from tui.detail import DetailScreen
from tui.modals import ConfirmScreen, QuitScreen
from tui.panes import HeaderPane
from tui.testing import FIXED_GPUS, FakeController, fixed_snapshot, screen_text


class Clock:
    """A snapshot source whose elapsed time the test sets."""

    def __init__(self) -> None:
        self.snap = dataclasses.replace(fixed_snapshot(), elapsed_s=38.0)

    def __call__(self):
        return self.snap


def footer_line(app) -> str:
    return screen_text(app).rstrip("\n").splitlines()[-1]


@pytest.mark.parametrize("key,screen,keys",
                         [("i", DetailScreen, ["Close"]), ("q", QuitScreen, ["Drain", "Abort", "Stay"])])
async def test_header_updates_and_footer_shows_the_modals_keys(key, screen, keys):
    """Before: the dashboard skipped rendering while a modal was open (elapsed froze) and the footer,
    on the dashboard's screen under the modal, went blank."""
    clock = Clock()
    app = DashboardApp(snapshot_source=clock, controller=FakeController(), gpu_source=lambda: FIXED_GPUS, refresh_hz=10)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(0.3)
        assert "elapsed 38s" in screen_text(app)
        await pilot.press(key)
        await pilot.pause(0.3)
        assert isinstance(app.screen, screen)
        clock.snap = dataclasses.replace(clock.snap, elapsed_s=95.0)
        await pilot.pause(0.5)
        # The header as drawn (a screenshot of a modal screen leaves out the screen under it).
        text = str(app.screen_stack[0].query_one(HeaderPane).render())
        assert "elapsed 1m35s" in text or "elapsed 95s" in text, text
        foot = footer_line(app)
        for k in keys:
            assert k in foot, foot


async def test_arrows_move_between_quit_dialog_buttons():
    """Before: Left/Right did nothing in the quit dialog; Enter then pressed the default (Drain)."""
    ctl = FakeController()
    app = DashboardApp(snapshot_source=fixed_snapshot, controller=ctl, gpu_source=lambda: FIXED_GPUS, refresh_hz=10)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(0.2)
        await pilot.press("q")
        await pilot.pause(0.2)
        assert isinstance(app.screen, QuitScreen) and app.focused.id == "drain"
        await pilot.press("right")
        assert app.focused.id == "abort"
        await pilot.press("right")
        assert app.focused.id == "stay"
        await pilot.press("left", "left")
        assert app.focused.id == "drain"
        await pilot.press("right", "enter")
        await pilot.pause(0.2)
        assert ("stop", (True,)) in ctl.calls, ctl.calls  # Abort, the focused button


async def test_arrows_move_between_confirm_dialog_buttons():
    answers: list[bool] = []
    app = DashboardApp(snapshot_source=fixed_snapshot, controller=FakeController(), gpu_source=lambda: FIXED_GPUS)
    async with app.run_test(size=(120, 40)) as pilot:
        app.push_screen(ConfirmScreen("Skip?", "really"), answers.append)
        await pilot.pause(0.2)
        assert app.focused.id == "no"
        await pilot.press("left")
        assert app.focused.id == "yes"
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert answers == [True]
