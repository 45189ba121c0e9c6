"""The dashboard's chrome at a glance: the footer keeps its keys through an ``e`` view switch (it
was rebuilt, and blank meanwhile, at each switch), and toasts sit inside the log pane, clear of
its borders. Textual's pilot, the chained extraction view over a static extraction snapshot."""

from __future__ import annotations

import re

from engine.extract.snapshot import DatasetExtractView, ExtractSnapshot
from tui.app import DashboardApp
from tui.extract.host import RecordingCommands, StaticExtractHost
from tui.extract.screen import ExtractScreen
from tui.footer import PriorityFooter
from tui.testing import FIXED_GPUS, FakeController, fixed_snapshot, screen_text


class StaticChain:
    """Stands in for :class:`tui.extract.chain.ChainedExtraction`: an extraction view over one
    fixed snapshot, shown and left with ``e``."""

    def __init__(self, app: DashboardApp) -> None:
        self.app = app
        self.running = True

    def start(self) -> None:
        snap = ExtractSnapshot(state="running", datasets=(DatasetExtractView("b1", 5, 5, 50, 50),), quit_mode=None)
        self.app.install_screen(ExtractScreen(StaticExtractHost(lambda: snap, RecordingCommands()), 2), name="extract")

    async def close(self) -> None:
        pass

    def observe(self) -> None:
        pass

    def note(self) -> None:
        return None

    def show(self) -> None:
        if len(self.app.screen_stack) == 1:
            self.app.push_screen("extract")

    def back(self) -> None:
        if isinstance(self.app.screen, ExtractScreen):
            self.app.pop_screen()

    def check(self, action: str) -> bool:
        if action == "show_extract":
            return len(self.app.screen_stack) == 1
        return isinstance(self.app.screen, ExtractScreen)

    def hold_exit(self, mode: str) -> bool:
        return False

    def exit_code(self) -> int:
        return 0


def app_for() -> DashboardApp:
    snap = fixed_snapshot()
    return DashboardApp(snapshot_source=lambda: snap, controller=FakeController(), gpu_source=lambda: FIXED_GPUS,
                        refresh_hz=20)


async def test_e_switches_views_without_rebuilding_the_footer(monkeypatch):
    rebuilt: list[str] = []
    original = PriorityFooter.recompose

    async def counted(self):
        rebuilt.append(type(self.screen).__name__)
        return await original(self)

    monkeypatch.setattr(PriorityFooter, "recompose", counted)
    app = app_for()
    app.chained = StaticChain(app)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.3)
        rebuilt.clear()  # the first compositions are done
        for view, key in (("ExtractScreen", "e Generation"), ("Screen", "e Extraction")) * 2:
            await pilot.press("e")
            await pilot.pause(0.05)
            assert type(app.screen).__name__ == view
            footer = screen_text(app).split("\n")[-1]
            assert key in footer and "q Quit" in footer and "p Pause" in footer, footer
        await pilot.pause(0.3)
    assert rebuilt == [], f"the footer was rebuilt (and blank meanwhile) on a view switch: {rebuilt}"


async def test_toasts_sit_inside_the_log_pane():
    app = app_for()
    for size in ((120, 40), (80, 24)):
        async with app.run_test(size=size, notifications=True) as pilot:
            await pilot.pause(0.2)
            app.notify("run paused by the user: a toast long enough to fill the box")
            await pilot.pause(0.3)
            lines = screen_text(app).split("\n")
            row = next(i for i, line in enumerate(lines) if "run paused by the user" in line)
            border = lines[-2]  # the log pane's bottom border, above the footer
            assert re.fullmatch(r"(╰─+╯)+", border.strip()), f"the toast covers the border: {border!r}"
            for line in lines[row - 1:row + 2]:  # the toast's rows keep the pane's side borders
                assert line.rstrip().endswith("│"), line
                if size[0] == 120:
                    assert line[59:61] == "││", line  # the sample pane's and the log pane's borders
            app = app_for()
