"""The extraction view's widgets: header, GPU/worker table, datasets table (the log is
:class:`tui.panes.log.LogPane`). Each has ``update_from(snapshot)`` and redraws only what changed."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable, Static

from engine.api import ExtractSnapshot
from tui.extract.cells import (
    DATASET_COLUMNS,
    Column,
    dataset_cells,
    gpu_columns,
    gpu_worker_rows,
    header_lines,
)

Rows = list[tuple[str, dict[str, Text]]]
"""``(row key, {column key: cell})`` in display order."""


class ExtractHeader(Static):
    """Three lines at the top (:func:`tui.extract.cells.header_lines`); redraws when its text changes."""

    DEFAULT_CSS = "ExtractHeader { height: 3; padding: 0 1; background: $boost; }"

    def __init__(self, **kw) -> None:
        super().__init__("", **kw)
        self._last: tuple | None = None

    def update_from(self, snapshot: ExtractSnapshot | None, note: str = "") -> None:
        """Render ``snapshot`` (None while extraction starts) with ``note`` at the end of line 1."""
        width = self.content_size.width or max(self.app.size.width - 2, 20)
        text = Text("\n").join(header_lines(snapshot, note, width))
        key = (text.plain, tuple(text.spans))
        if key != self._last:
            self._last = key
            self.update(text, layout=False)


class KeyedTable(DataTable):
    """A :class:`~textual.widgets.DataTable` synced from :data:`Rows`: rebuilt when the columns or
    the row keys change, else only changed cells are updated (the cursor row stays put)."""

    def __init__(self, **kw) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kw)
        self._columns: tuple[Column, ...] = ()
        self._row_keys: tuple[str, ...] = ()
        self._cells: dict[tuple[str, str], tuple] = {}

    @property
    def column_keys(self) -> tuple[str, ...]:
        """The keys of the columns shown now."""
        return tuple(c.key for c in self._columns)

    def sync(self, columns: tuple[Column, ...], rows: Rows) -> None:
        """Show ``rows`` under ``columns`` (cells missing from a row are blank; a cell wider than
        its column ends with an ellipsis)."""
        rows = [(k, {c.key: _fit(cells.get(c.key), c.width) for c in columns}) for k, cells in rows]
        keys = tuple(k for k, _ in rows)
        if columns != self._columns or keys != self._row_keys:
            cursor = self.cursor_row
            self.clear(columns=True)
            for c in columns:
                self.add_column(c.label, width=c.width or None, key=c.key)
            for k, cells in rows:
                self.add_row(*(cells.get(c.key, Text("")) for c in columns), key=k)
            self._columns, self._row_keys = columns, keys
            self._cells = {(k, c.key): _sig(cells.get(c.key)) for k, cells in rows for c in columns}
            if rows:
                self.move_cursor(row=min(cursor, len(rows) - 1), animate=False)
            return
        for k, cells in rows:
            for c in columns:
                cell = cells.get(c.key, Text(""))
                sig = _sig(cell)
                if self._cells.get((k, c.key)) != sig:
                    self._cells[(k, c.key)] = sig
                    self.update_cell(k, c.key, cell)


def _fit(cell: Text | None, width: int) -> Text:
    if cell is None:
        return Text("")
    if width and cell.cell_len > width:
        cell = cell.copy()
        cell.truncate(width, overflow="ellipsis")
    return cell


def _sig(cell: Text | None) -> tuple:
    return () if cell is None else (cell.plain, str(cell.style), tuple(cell.spans))


class GpuWorkerTable(KeyedTable):
    """One row per GPU joined with its worker (:func:`tui.extract.cells.gpu_worker_rows`); the
    columns follow the table's width (:func:`tui.extract.cells.gpu_columns`). No cursor."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.show_cursor = False

    def update_from(self, snapshot: ExtractSnapshot | None) -> None:
        """Show ``snapshot``'s GPUs and workers (None: nothing yet); the border subtitle says why
        there are no GPU readings (``gpu_reason``)."""
        width = self.size.width or self.app.size.width - 2  # no scrollbars (CSS scrollbar-size 0)
        rows = gpu_worker_rows(snapshot) if snapshot is not None else []
        self.sync(gpu_columns(width), rows)
        reason = snapshot.gpu_reason if snapshot is not None else ""
        if self.border_subtitle != reason:
            self.border_subtitle = reason


class ExtractDatasetsTable(KeyedTable):
    """One row per dataset (:func:`tui.extract.cells.dataset_cells`); the cursor row is the
    dataset the skip key acts on."""

    def update_from(self, snapshot: ExtractSnapshot | None) -> None:
        """Show ``snapshot``'s datasets in the snapshot's order."""
        rows = ([(d.name, dataset_cells(d, snapshot.state)) for d in snapshot.datasets]
                if snapshot is not None else [])
        self.sync(DATASET_COLUMNS, rows)

    @property
    def selected(self) -> str | None:
        """The name of the dataset under the cursor (None: no datasets)."""
        if not self._row_keys:
            return None
        return self._row_keys[min(max(self.cursor_row, 0), len(self._row_keys) - 1)]


__all__ = ["ExtractDatasetsTable", "ExtractHeader", "GpuWorkerTable", "KeyedTable"]
