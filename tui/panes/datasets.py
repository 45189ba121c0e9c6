"""The datasets table: one keyed row per dataset; only changed cells are updated.

Which columns show is chosen from the terminal width at every resize (:func:`choose_columns`):
the most glanced-at columns first, each as wide as its content, the reason column taking what is
left. The dataset name column stays fixed when the table scrolls sideways. Whatever a cell cannot
show in full is in the detail view (``i``, :mod:`tui.detail`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rich.text import Text

from engine.api import DatasetSnapshot, RunSnapshot, range_text
from tui.fmt import bar_parts, fmt_count, fmt_duration, money
from tui.panes.kepttable import KeptDataTable

DS_STATE_STYLE = {
    "pending": "dim", "running": "green", "paused": "bold yellow", "skipped": "magenta", "done": "blue",
    "budget_met": "bold cyan", "draining": "bold yellow", "stopping": "yellow", "stopped": "dim",
}
"""Rich style per dataset state."""

Cell = tuple[tuple[str, str], ...]
"""A cell: ``((text, rich style), ...)`` segments (compared to skip unchanged cells)."""


@dataclass(frozen=True, slots=True)
class Column:
    """A datasets-table column: ``key``, header ``label``, ``min_width`` (cells)."""

    key: str
    label: str
    min_width: int


COLUMNS: tuple[Column, ...] = (
    Column("name", "dataset", 7),
    Column("state", "state", 10),
    Column("progress", "progress", 12),
    Column("done", "done/total", 10),
    Column("eta", "ETA", 6),
    Column("cost", "cost", 7),
    Column("failed", "fail", 4),
    Column("skipped", "skip", 4),
    Column("rate", "req/s", 5),
    Column("tokens", "tok/budget (+rsv)", 17),
    Column("avg", "avg now/all", 11),
    Column("note", "reason", 12),  # NOTE_MIN
)
"""Every column in display order."""

PRIORITY: tuple[str, ...] = ("name", "state", "progress", "done", "eta", "cost", "note", "tokens", "failed", "rate",
                             "skipped", "avg")
"""Column keys from most to least important: a narrow terminal drops the last ones first (tokens vs
budget is shown from 120 columns; below, the header sums it)."""

ALWAYS = ("name", "state", "progress", "done")
"""Columns shown at any width (below ~60 cells the table scrolls sideways, the name stays)."""

PAD = 2
"""Cells DataTable adds to each column (one each side)."""

WIDE_FROM = 116
"""Table widths (cells) from which the progress bar is 9 cells and the cost shows its cap."""

NOTE_MIN = 12
"""Narrowest reason column (cells)."""

RESERVED_FROM = 150
"""Table widths (cells) from which the tokens column also shows the tokens reserved in flight."""

NAME_MAX = 28
"""Widest name column (longer names end with an ellipsis; the detail view shows them whole)."""


def table_width(terminal_width: int) -> int:
    """Cells the datasets table has for its columns in a terminal ``terminal_width`` wide: the
    border (2) and room for a vertical scrollbar (2, shown when the datasets outgrow the pane)
    taken off, so rows never need a sideways scroll when the scrollbar appears."""
    return max(terminal_width - 4, 0)


def choose_columns(available: int, needs: Mapping[str, int],
                   reserved: bool = True) -> tuple[tuple[str, str, int], ...]:
    """The columns that fit ``available`` cells, in display order, as ``(key, label, width)``.

    Each column is as wide as its label, its ``min_width`` and ``needs[key]`` (the widest cell it
    must show). Columns are taken in :data:`PRIORITY` order while they fit (:data:`ALWAYS` ones in
    any case); the reason column then takes whatever is left, so the row fills the table.
    ``reserved`` False: the tokens column leaves out the reserved tokens (label ``tok/budget``).
    """
    labels = {c.key: c.label for c in COLUMNS}
    if not reserved:
        labels["tokens"] = "tok/budget"
    widths = {c.key: max(c.min_width if c.key != "tokens" or reserved else 0, len(labels[c.key]),
                         needs.get(c.key, 0)) for c in COLUMNS}
    widths["name"] = min(widths["name"], NAME_MAX)
    widths["note"] = NOTE_MIN  # the reason column only takes what is left (the detail view has it whole)
    picked: set[str] = set()
    used = 0
    for key in PRIORITY:
        w = widths[key] + PAD
        if key in ALWAYS or used + w <= available:
            picked.add(key)
            used += w
    if "note" in picked and used < available:
        widths["note"] += available - used
    return tuple((c.key, labels[c.key], widths[c.key]) for c in COLUMNS if c.key in picked)


def dataset_cells(d: DatasetSnapshot, wide: bool = True, reserved: bool = True) -> dict[str, Cell]:
    """``{column key: cell}`` for one dataset row (``wide``: 9-cell bar, cost with its cap;
    ``reserved``: the tokens cell ends with the tokens reserved in flight, ``(+81k)``).

    The progress bar shows done vs failed (red) vs skipped (``░``) vs left (``·``), and the
    percentage is the finished share (done or failed), rounded down
    (:func:`engine.report.snapshot.progress_percent`): a skipped or budget-met dataset never reads
    100 %, nor one with prompts pending or in flight (``4975/5000`` reads 99 %).
    """
    tokens = fmt_count(d.completion_tokens)
    tok_style = ""
    if d.token_budget:
        tokens += f"/{fmt_count(d.token_budget)}"
        used = (d.completion_tokens + d.reserved_tokens) / d.token_budget
        tok_style = "bold red" if used >= 1 else "yellow" if used >= 0.9 else ""
    if d.reserved_tokens and reserved:
        tokens += f" (+{fmt_count(d.reserved_tokens)})"
    cost = money(d.cost_usd)
    cost_style = ""
    if d.max_cost_usd is not None:
        cost_style = "bold red" if d.cost_usd >= d.max_cost_usd else ""
        if wide:
            cost += f" / {money(d.max_cost_usd, 2)}"
    done_bar, fail_bar, skip_bar, left_bar = bar_parts(d.done, d.skipped, d.prompts, 9 if wide else 7, d.failed)
    pct = f" {d.percent:3d}%"
    progress: Cell = (
        (done_bar, "green" if d.state == "running" else ""), (fail_bar, "red"), (skip_bar, "magenta"),
        (left_bar, "dim"), (pct, ""),
    )
    return {
        "name": ((d.name, "bold"),),
        "state": ((d.state, DS_STATE_STYLE.get(d.state, "")),),
        "progress": progress,
        "done": ((f"{d.done}/{d.prompts}", ""),),
        "failed": ((str(d.failed), "red" if d.failed else "dim"),),
        "skipped": ((str(d.skipped), "magenta" if d.skipped else "dim"),),
        "cost": ((cost, cost_style),),
        "eta": (eta_cell(d, not wide),),
        "rate": ((f"{d.req_per_s:.1f}", ""),),
        "tokens": ((tokens, tok_style),),
        "avg": ((f"{d.avg_completion_tokens_recent:.0f}/{d.avg_completion_tokens:.0f}", ""),),
        "note": ((d.state_reason or d.limit_reason, "yellow" if d.state_reason or d.limit_reason else ""),),
    }


def cell_text(cell: Cell) -> Text:
    """A cell as one-line Rich text that ends with an ellipsis when its column is too narrow."""
    t = Text(no_wrap=True, overflow="ellipsis", end="")
    for text, style in cell:
        t.append(text, style)
    return t


def eta_cell(d: DatasetSnapshot, compact: bool = False, label: bool = False) -> tuple[str, str]:
    """ETA text and style, the table's cell and the detail view's figure (one formatting for both):
    blank once finished, "--" while paused or the run stops (no progress is made); while calibrating
    a range ``"8m05s–1h46m"`` (``compact``: its high end ``"≤1h46m"``; ``label``: followed by
    ``"(calibrating 3/50)"``), or ``"cal 3/50"`` before anything is known."""
    if d.state in ("done", "skipped", "budget_met"):
        return "", ""
    if d.state in ("paused", "draining", "stopping", "stopped"):  # not progressing
        return "--", "dim"
    if d.calibration is not None:  # a range (or "cal n/N") until the dataset is calibrated
        if d.eta_s_low is None or d.eta_s_high is None:
            return f"cal {d.calibration[0]}/{d.calibration[1]}", "dim"
        if compact:
            return f"≤{fmt_duration(d.eta_s_high)}", "dim"
        return range_text(d.eta_s, d.eta_s_low, d.eta_s_high, d.calibration, fmt_duration, short=not label), "dim"
    return fmt_duration(d.eta_s), ""


def _needs(rows: Mapping[str, dict[str, Cell]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for cells in rows.values():
        for key, cell in cells.items():
            out[key] = max(out.get(key, 0), sum(len(text) for text, _ in cell))
    return out


class DatasetsTable(KeptDataTable):
    """Datasets with state, progress, counts, cost, ETA, rate, tokens, average lengths and reason.

    Rows are keyed by dataset name; :meth:`update_from` calls ``update_cell`` only for cells whose
    text or style changed (inside ``app.batch_update()``), and rebuilds only when the set of
    datasets or the set/widths of columns changes. :meth:`fit_width` chooses the columns for a
    table width (call it from every resize); the name column is fixed when scrolling sideways.

    Drawing re-renders only what changed (:class:`~tui.panes.kepttable.KeptDataTable`): Textual's
    ``DataTable`` keys its caches on a table-wide counter that every ``update_cell`` bumps, so one
    changed cell made it re-render every cell (~100 Rich renders, 10-25 ms a frame at 2,000 streams,
    B2's longest callback) and re-assemble every row's line.

    Args:
        details_key: the key that opens the detail view, hinted on the bottom border.
    """

    def __init__(self, details_key: str = "i", **kw) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, fixed_columns=1, **kw)
        self.border_subtitle = f"{details_key.split(',')[0].strip()} details"
        self._cells: dict[str, dict[str, Cell]] = {}
        self.available = table_width(160)
        """Cells the columns may use (set by :meth:`fit_width`)."""
        self._columns: tuple[tuple[str, str, int], ...] = ()
        self._keep: str | None = None
        self._stale = True
        self.cell_updates = 0
        """Cells rewritten so far (for tests and profiling)."""

    @property
    def wide(self) -> bool:
        """True when the table is wide enough for 9-cell bars and costs with their caps."""
        return self.available >= WIDE_FROM

    @property
    def column_keys(self) -> tuple[str, ...]:
        """Keys of the columns shown now, in display order."""
        return tuple(k for k, _, _ in self._columns)

    def fit_width(self, available: int) -> None:
        """Choose the columns for ``available`` cells (see :func:`table_width`) at the next
        :meth:`update_from` (columns and rows are then rebuilt)."""
        if available != self.available:
            self.available = available
            self._stale = True

    def _set_columns(self, columns: tuple[tuple[str, str, int], ...]) -> None:
        self._keep = self.selected or self._keep
        self._columns = columns
        self._stale = False
        self.clear(columns=True)
        self._cells = {}
        for key, label, width in columns:
            self.add_column(label, key=key, width=width)

    @property
    def selected(self) -> str | None:
        """Name of the dataset under the cursor (None when the table is empty)."""
        if not self.row_count:
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:  # cursor out of range during a rebuild
            return None

    def update_from(self, snapshot: RunSnapshot) -> None:
        """Show ``snapshot.datasets``, touching only changed cells."""
        reserved = self.available >= RESERVED_FROM
        rows = {d.name: dataset_cells(d, self.wide, reserved) for d in snapshot.datasets}
        columns = choose_columns(self.available, _needs(rows), reserved)
        if self.wide and any(d.max_cost_usd is not None for d in snapshot.datasets):
            columns = tuple((k, "cost / cap" if k == "cost" else label, w) for k, label, w in columns)
        if columns != self._columns:
            # Rebuild on a new width or a new set of columns, or when a column must grow; a column
            # never shrinks while the width stays (no rebuild each time an ETA gets shorter).
            shown = {k: w for k, _, w in self._columns}
            if (self._stale or [k for k, _, _ in columns] != list(shown)
                    or any(w > shown[k] for k, _, w in columns if k != "note")):
                self._set_columns(columns)
        names = list(rows)
        if names != list(self._cells):
            keep = self.selected or self._keep
            self._keep = None
            self.clear()
            self._cells = {}
            for name, cells in rows.items():
                self.add_row(*(cell_text(cells[k]) for k, _, _ in self._columns), key=name)
                self._cells[name] = cells
            if keep in names:
                self.move_cursor(row=names.index(keep))
            return
        for name, new in rows.items():
            old = self._cells[name]
            for key, _, _ in self._columns:
                if new[key] != old[key]:
                    self.update_cell(name, key, cell_text(new[key]))
                    self.cell_updates += 1
            self._cells[name] = new
