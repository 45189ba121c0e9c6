"""The datasets table: one keyed row per dataset; only changed cells are updated."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from engine.projection import range_text
from engine.snapshot import DatasetSnapshot, RunSnapshot
from tui.fmt import bar, fmt_count, fmt_duration, money

DS_STATE_STYLE = {
    "pending": "dim", "running": "green", "paused": "bold yellow", "skipped": "magenta", "done": "blue",
    "budget_met": "bold cyan",
}
"""Rich style per dataset state."""

# (key, label, width): the most glanced-at columns first.
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("name", "dataset", 16),
    ("state", "state", 10),
    ("progress", "progress", 14),
    ("done", "done/total", 11),
    ("eta", "ETA", 13),
    ("cost", "cost / cap", 15),
    ("failed", "fail", 4),
    ("skipped", "skip", 5),
    ("rate", "req/s", 5),
    ("tokens", "tok/budget (+rsv)", 17),
    ("avg", "avg now/all", 11),
    ("note", "reason", 18),
)
"""Columns at 120 cells and wider: key, header label, width (cells)."""

COMPACT_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("name", "dataset", 16),
    ("state", "state", 10),
    ("progress", "progress", 12),
    ("done", "done/total", 11),
    ("eta", "ETA", 7),
    ("cost", "cost", 9),
)
"""Columns below 120 cells (fit 80 columns without scrolling)."""


def dataset_cells(d: DatasetSnapshot, compact: bool = False) -> dict[str, tuple[str, str]]:
    """``{column key: (text, rich style)}`` for one dataset row (``compact``: shorter bar and cost)."""
    finished = d.done + d.failed + d.skipped
    frac = finished / d.prompts if d.prompts else 0.0
    tokens = fmt_count(d.completion_tokens)
    tok_style = ""
    if d.token_budget:
        tokens += f"/{fmt_count(d.token_budget)}"
        used = (d.completion_tokens + d.reserved_tokens) / d.token_budget
        tok_style = "bold red" if used >= 1 else "yellow" if used >= 0.9 else ""
    if d.reserved_tokens:
        tokens += f" (+{fmt_count(d.reserved_tokens)})"
    cost = money(d.cost_usd)
    cost_style = ""
    if d.max_cost_usd is not None:
        cost_style = "bold red" if d.cost_usd >= d.max_cost_usd else ""
        if not compact:
            cost += f" / {money(d.max_cost_usd, 2)}"
    return {
        "name": (d.name, "bold"),
        "state": (d.state, DS_STATE_STYLE.get(d.state, "")),
        "progress": (f"{bar(frac, 7 if compact else 9)} {frac * 100:3.0f}%", "green" if d.state == "running" else ""),
        "done": (f"{d.done}/{d.prompts}", ""),
        "failed": (str(d.failed), "red" if d.failed else "dim"),
        "skipped": (str(d.skipped), "magenta" if d.skipped else "dim"),
        "cost": (cost, cost_style),
        "eta": _eta(d, compact),
        "rate": (f"{d.req_per_s:.1f}", ""),
        "tokens": (tokens, tok_style),
        "avg": (f"{d.avg_completion_tokens_recent:.0f}/{d.avg_completion_tokens:.0f}", ""),
        "note": (d.state_reason or d.limit_reason, "yellow" if d.state_reason or d.limit_reason else ""),
    }


def _eta(d: DatasetSnapshot, compact: bool = False) -> tuple[str, str]:
    """ETA cell: blank once finished, "--" while paused (a paused dataset does not progress); while
    calibrating a range ``"8m05s–1h46m"`` (``compact``: its high end ``"≤1h46m"``), or ``"cal 3/50"``
    before anything is known."""
    if d.state in ("done", "skipped", "budget_met"):
        return "", ""
    if d.state == "paused":
        return "--", "dim"
    if d.calibration is not None:  # a range (or "cal n/N") until the dataset is calibrated
        if d.eta_s_low is None or d.eta_s_high is None:
            return f"cal {d.calibration[0]}/{d.calibration[1]}", "dim"
        if compact:
            return f"≤{fmt_duration(d.eta_s_high)}", "dim"
        return range_text(d.eta_s, d.eta_s_low, d.eta_s_high, d.calibration, fmt_duration, short=True), "dim"
    return fmt_duration(d.eta_s), ""


class DatasetsTable(DataTable):
    """Datasets with state, progress, counts, cost, ETA, rate, tokens and average lengths.

    Rows are keyed by dataset name; :meth:`update_from` calls ``update_cell`` only for cells whose
    text or style changed (inside ``app.batch_update()``), and rebuilds only when the set of
    datasets changes.
    """

    def __init__(self, **kw) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kw)
        self._cells: dict[str, dict[str, tuple[str, str]]] = {}
        self.compact = False
        self._columns = COLUMNS
        self._keep: str | None = None
        self.cell_updates = 0
        """Cells rewritten so far (for tests and profiling)."""

    def on_mount(self) -> None:
        self._add_columns()

    def _add_columns(self) -> None:
        for key, label, width in self._columns:
            self.add_column(label, key=key, width=width)

    def set_compact(self, compact: bool) -> None:
        """Switch between the full and the 80-column set of columns (rows are re-added by the
        next :meth:`update_from`)."""
        if compact == self.compact:
            return
        self._keep = self.selected
        self.compact = compact
        self._columns = COMPACT_COLUMNS if compact else COLUMNS
        self.clear(columns=True)
        self._cells = {}
        self._add_columns()

    @property
    def selected(self) -> str | None:
        """Name of the dataset under the cursor (None when the table is empty)."""
        if not self.row_count:
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:  # noqa: BLE001 - cursor out of range during a rebuild
            return None

    def update_from(self, snapshot: RunSnapshot) -> None:
        """Show ``snapshot.datasets``, touching only changed cells."""
        names = [d.name for d in snapshot.datasets]
        if names != list(self._cells):
            keep = self.selected or self._keep
            self._keep = None
            self.clear()
            self._cells = {}
            for d in snapshot.datasets:
                cells = dataset_cells(d, self.compact)
                self.add_row(*(Text(*cells[k]) for k, _, _ in self._columns), key=d.name)
                self._cells[d.name] = cells
            if keep in names:
                self.move_cursor(row=names.index(keep))
            return
        for d in snapshot.datasets:
            old = self._cells[d.name]
            new = dataset_cells(d, self.compact)
            for key, _, _ in self._columns:
                if new[key] != old[key]:
                    self.update_cell(d.name, key, Text(*new[key]))
                    self.cell_updates += 1
            self._cells[d.name] = new
