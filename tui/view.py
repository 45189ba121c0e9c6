"""Drawing one snapshot on the dashboard's own screen: header, datasets table, panes, footer keys."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from textual.widgets import Footer

from engine.api import GpuReading, RunSnapshot
from tui.layout import shown
from tui.logbridge import PaneLogHandler
from tui.panes import (
    DatasetsTable,
    ErrorsPane,
    GpusPane,
    HeaderPane,
    LogPane,
    ProvidersPane,
    SamplePane,
    ThroughputPane,
)
from tui.panes.datasets import table_width

if TYPE_CHECKING:
    from tui.actions import DashboardActions
    from tui.surface import DashboardSurface


class DashboardView:
    """Renders snapshots into the widgets of the app's own screen (the bottom of the screen stack:
    the panes keep updating under a modal, which shows them).

    Args:
        app: the dashboard (its screens, batch updates and footer bindings).
        actions: the app's actions (the selected dataset, for the sample pane and the footer).
        log_source: the handler whose lines the log pane appends (None: no log lines).

    Raises (from every method): ``textual.css.query.NoMatches`` or ``IndexError`` once the app is
    shutting down (its screens and widgets are gone).
    """

    def __init__(self, app: DashboardSurface, actions: DashboardActions, log_source: PaneLogHandler | None) -> None:
        self.app = app
        self.actions = actions
        self.log_source = log_source
        self._binding_key: tuple | None = None

    def render(self, snap: RunSnapshot | None, note: str, gpu_source: Callable[[], GpuReading] | None) -> None:
        """Draw ``snap`` (None: the header only says the engine is starting); ``note`` goes in the
        header; ``gpu_source`` is read only while the GPU pane is shown."""
        screen = self.app.main_screen
        table = screen.query_one(DatasetsTable)
        with self.app.batch_update():
            screen.query_one(HeaderPane).update_from(snap, note)
            if snap is not None:
                table.update_from(snap)
                for pane in (screen.query_one(ThroughputPane), screen.query_one(ErrorsPane),
                             screen.query_one(ProvidersPane)):
                    if shown(pane):
                        pane.update_from(snap)
                self.render_sample()
            log_pane = screen.query_one(LogPane)
            if shown(log_pane):
                log_pane.update_from(snap, self.log_source.drain() if self.log_source else ())
            gpus = screen.query_one(GpusPane)
            if shown(gpus) and gpu_source is not None:
                gpus.update_from(gpu_source())
        self.refresh_footer()

    def render_sample(self) -> None:
        """Show the selected dataset's latest sample (when the sample pane is shown)."""
        pane = self.app.main_screen.query_one(SamplePane)
        if shown(pane):
            pane.update_from(self.actions.selected())

    def refresh_footer(self) -> None:
        """Refresh the footer's keys when the selection, its state or the run's state changed
        (``p`` reads Pause or Resume, see :meth:`tui.actions.DashboardActions.check`)."""
        d = self.actions.selected()
        snap = self.app.snapshot
        key = (d.name if d else None, d.state if d else None, snap.state if snap else None)
        if key != self._binding_key:
            self._binding_key = key
            self.app.refresh_bindings()

    def resize(self, width: int) -> None:
        """Lay out for a terminal ``width`` columns wide: a compact footer below 120 (every key still
        fits in 80), the palette key from 100, the table's columns and the header re-fitted."""
        screen = self.app.main_screen
        footer = screen.query_one(Footer)
        footer.compact = width < 120
        if footer.show_command_palette != (width >= 100):
            footer.show_command_palette = width >= 100
            footer.refresh(recompose=True)  # not a recomposing reactive: the palette key would stay
        screen.query_one(DatasetsTable).fit_width(table_width(width))
        screen.query_one(HeaderPane)._last = None  # re-fit the header to the new width


__all__ = ["DashboardView"]
