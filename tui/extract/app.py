"""A Textual app that shows only the extraction view (:class:`tui.extract.screen.ExtractScreen`).

``datagen extract CONFIG`` on a TTY runs it over the engine's extraction run (an
:class:`~tui.extract.host.ExtractHost`); tests and ``python -m tui.extract --demo`` run it over a
:class:`~tui.extract.host.StaticExtractHost` or :class:`tui.extract.demo.DemoExtraction`. The app
exits with the screen's code once the job has ended after a quit (0 done or drained by ``q``, 130
aborted or stopped after Ctrl-C, 1 failed: :func:`tui.extract.cells.exit_code`). Ctrl-C
(:class:`~tui.extract.screen.ExtractScreen.Interrupt`) drains, and aborts the second time, through
the commands (the live app, :class:`tui.extract.run_app.RunExtractApp`, sends it to the run's
interrupt like SIGINT).
"""

from __future__ import annotations

import os

from textual.app import App

from tui.extract.host import ExtractHost
from tui.extract.screen import ExtractScreen
from tui.layout import parse_keymap


class ExtractApp(App[int]):
    """The extraction dashboard.

    Args:
        host: snapshots and commands (see :class:`tui.extract.host.ExtractHost`).
        refresh_hz: snapshot polls per second (> 0; default 2).
        keymap: ``{binding id: keys}`` overrides, e.g. ``{"extract.quit": "ctrl+x"}`` (also read from
            ``$DATAGEN_KEYS``, like the generation dashboard: ``"extract.pause=f5;extract.quit=ctrl+x"``).

    Attributes:
        view: the :class:`~tui.extract.screen.ExtractScreen` (pushed on mount).

    Raises:
        ValueError: ``refresh_hz`` <= 0.
    """

    TITLE = "eagle-datagen extract"

    def __init__(self, host: ExtractHost, *, refresh_hz: float = 2.0, keymap: dict[str, str] | None = None) -> None:
        super().__init__()
        self.host = host
        self.view = ExtractScreen(host, refresh_hz)
        self._keymap = {**parse_keymap(os.environ.get("DATAGEN_KEYS", "")), **(keymap or {})}

    def on_mount(self) -> None:
        if self._keymap:
            self.set_keymap(self._keymap)
        self.push_screen(self.view)

    async def action_quit(self) -> None:
        """Textual's own quit (Ctrl-Q, the command palette) quits like ``q``: drain first, never a
        silent exit while workers write."""
        self.view.action_quit_extract()

    def on_extract_screen_interrupt(self, message: ExtractScreen.Interrupt) -> None:
        """Ctrl-C over a host without signals: drain, then abort (as ``q``), exit 130 unless done."""
        self.view.action_quit_extract()

    def on_extract_screen_done(self, message: ExtractScreen.Done) -> None:
        """The job ended after a quit: exit with its code."""
        self.exit(message.code, return_code=message.code)


__all__ = ["ExtractApp"]
