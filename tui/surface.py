"""What the dashboard's parts ask of the objects they are given: typed protocols, so that no part imports
the module of the object it serves (no import cycle: :mod:`tui.app` imports the parts, never the reverse).

- :class:`DashboardSurface`: the dashboard app as its manager objects see it
  (:class:`tui.actions.DashboardActions`, :class:`tui.view.DashboardView`); :class:`tui.app.DashboardApp` is one.
- :class:`RetryContext`: what ``f`` (:func:`tui.retry.retry_failed`) uses of the key actions;
  :class:`tui.actions.DashboardActions` is one.
- :class:`WatchedApp`: what :class:`tui.terminal.TerminalWatch` uses of the app whose terminal it watches;
  :class:`tui.app.DashboardApp` and :class:`tui.extract.run_app.RunExtractApp` are.
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Protocol

from textual.notifications import SeverityLevel
from textual.screen import Screen

from engine.api import DatasetSnapshot, RunCommand, RunSnapshot
from tui.host import Commands, DashboardHost
from tui.toasts import Toasts


class DashboardSurface(Protocol):
    """The dashboard app as its manager objects use it: the latest snapshot and selection, polls and quits,
    and the Textual app members they call (notifications, modals, workers, the screen stack, bindings).

    Attributes:
        snapshot: the latest snapshot pulled (None before the engine is prepared).
    """

    snapshot: RunSnapshot | None

    @property
    def selected_dataset(self) -> str | None:
        """Name of the dataset under the table cursor."""
        ...

    @property
    def main_screen(self) -> Screen[Any]:
        """The dashboard's own screen (the bottom of the stack)."""
        ...

    @property
    def screen_stack(self) -> list[Screen[Any]]:
        """Textual's screen stack (more than one screen: a modal is open)."""
        ...

    def request_poll(self) -> None:
        """Pull and render a snapshot now."""
        ...

    def begin_quit(self, mode: str, interrupted: str | None = None) -> None:
        """Quit (``"drain"`` or ``"abort"``): at once when the run has ended, else once the engine stopped."""
        ...

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = True) -> None:
        """Textual's notification."""
        ...

    def push_screen(self, screen: Screen[Any], callback: Callable[[Any], None] | None = None) -> Any:
        """Textual's: open ``screen``; ``callback`` gets what it is dismissed with."""
        ...

    def run_worker(self, work: Any, name: str | None = "", group: str = "default", description: str = "",
                   exit_on_error: bool = True) -> Any:
        """Textual's: run ``work`` (a coroutine) in a worker."""
        ...

    def batch_update(self) -> ContextManager[None]:
        """Textual's: draw the updates made inside the block at once."""
        ...

    def refresh_bindings(self) -> None:
        """Textual's: re-check the footer's keys."""
        ...


class RetryContext(Protocol):
    """What ``f`` uses of the dashboard's key actions: the app, the host, the toasts, the command target,
    the datasets of the latest snapshot, and the command worker."""

    app: DashboardSurface
    host: DashboardHost
    toasts: Toasts

    def commands(self) -> Commands | None:
        """The host's command target; None (and a warning) while the engine is starting."""
        ...

    def dataset(self, name: str | None) -> DatasetSnapshot | None:
        """Dataset ``name`` in the latest snapshot (None: unknown)."""
        ...

    def run_command(self, ctl: Commands, cmd: RunCommand, done: str | None = None, key: str | None = None) -> None:
        """Apply ``cmd`` through ``ctl`` in a worker and toast the result."""
        ...


class WatchedApp(Protocol):
    """What :class:`tui.terminal.TerminalWatch` uses of its app.

    Attributes:
        host: the app's host: its ``quit_mode`` (generation) and ``snapshot()`` say whether a stop is
            in progress.
        _driver: Textual's driver (stopped when the terminal goes away; Textual private API).
    """

    host: Any
    _driver: Any

    def begin_quit(self, mode: str, interrupted: str | None = None) -> None:
        """Stop the run (``"drain"``/``"abort"``), as interrupted by ``interrupted`` when given."""
        ...

    def set_interval(self, interval: float, callback: Callable[[], object] | None = None, *,
                     name: str | None = None) -> Any:
        """Textual's: call ``callback`` every ``interval`` seconds."""
        ...


__all__ = ["DashboardSurface", "RetryContext", "WatchedApp"]
