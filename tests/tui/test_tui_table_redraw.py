"""The datasets table redraws only the cells that changed (B2/B7, issue 37).

Textual's ``DataTable`` keys its cell cache on a table-wide counter that every ``update_cell`` bumps,
so one changed figure used to re-render every cell of the table each frame. The cell renders are
counted where Textual makes them: each one wraps the cell in ``rich.padding.Padding`` inside
``textual.widgets._data_table`` (counted by replacing that name), or is drawn by the table's text-cell
path, independent of how ``DatasetsTable`` keeps its cells."""

from __future__ import annotations

import pytest
import textual.widgets._data_table as data_table_module
from rich.padding import Padding
from tui_table import advanced, shown_table

from tui.panes.datasets import DatasetsTable
from tui.panes.kepttable import KeptDataTable


@pytest.fixture
def renders(monkeypatch) -> list[int]:
    """``[n]``: cell renders by Textual's DataTable since the fixture was made."""
    count = [0]

    class CountingPadding(Padding):
        def __init__(self, *a, **kw) -> None:
            count[0] += 1
            super().__init__(*a, **kw)

    monkeypatch.setattr(data_table_module, "Padding", CountingPadding)
    # one-line text cells are drawn without Padding, segment for segment alike (tui/panes/kepttable.py)
    text_cell = KeptDataTable._text_cell

    def counting_text_cell(self, *a, **kw):
        lines = text_cell(self, *a, **kw)
        count[0] += lines is not None
        return lines

    monkeypatch.setattr(KeptDataTable, "_text_cell", counting_text_cell)
    return count



def row_text(table: DatasetsTable, row: int) -> str:
    return "".join(seg.text for seg in table.render_line(row + 1)).strip()  # line 0 is the header


async def test_one_changed_cell_renders_one_cell(renders):
    async with shown_table() as (pilot, table, snap):
        rows_before = [r.value for r in table.rows]
        assert rows_before == ["b7_sharegpt", "b1_glaive", "b3_oss_instruct", "b8_swe_agent"]
        n_cells = len(table.rows) * len(table.columns)
        assert renders[0] >= n_cells  # the first frame draws every cell (and the header)

        # one figure changes: the failed count of the first dataset (only its "fail" cell changes)
        before, updates = renders[0], table.cell_updates
        table.update_from(advanced(snap, failed=13))
        await pilot.pause()
        assert table.cell_updates - updates == 1
        assert renders[0] - before == 1  # was every cell of the table: 4 rows x 12 columns + the header
        assert [r.value for r in table.rows] == rows_before  # rows kept, not rebuilt
        assert " 13 " in row_text(table, 0)

        # a frame where nothing changed draws nothing
        before = renders[0]
        table.refresh()
        await pilot.pause()
        assert renders[0] == before


async def test_several_changes_and_the_cursor_redraw_what_they_touch(renders):
    async with shown_table() as (pilot, table, snap):
        n_columns = len(table.columns)

        before, updates = renders[0], table.cell_updates
        snap2 = advanced(snap, done=4121, failed=13, cost_usd=4.5)
        table.update_from(snap2)
        await pilot.pause()
        changed = table.cell_updates - updates
        assert changed >= 3  # done/total, fail, cost (and the progress percentage if it moved)
        assert renders[0] - before == changed
        text = row_text(table, 0)
        assert "4121/9800" in text and "$4.50" in text

        # the cursor moves to row 2: the cells of the rows it left and entered are drawn again, no other
        # (the fixed name column twice: in the fixed part and, in another style, under it)
        before = renders[0]
        table.move_cursor(row=1)
        await pilot.pause()
        assert 2 * n_columns <= renders[0] - before <= 2 * (n_columns + 1)
        assert table.selected == "b1_glaive"


async def test_a_new_width_rebuilds_and_draws_the_new_columns(renders):
    async with shown_table() as (pilot, table, snap):
        assert "tokens" in table.column_keys
        table.fit_width(70)  # narrow: fewer columns, rows rebuilt
        table.update_from(snap)
        await pilot.pause()
        assert "tokens" not in table.column_keys
        text = row_text(table, 0)
        assert "b7_sharegpt" in text and "4120/9800" in text
        before, updates = renders[0], table.cell_updates
        table.update_from(advanced(snap, done=4122))
        await pilot.pause()
        assert "4122/9800" in row_text(table, 0)
        assert table.cell_updates - updates >= 1
        assert renders[0] - before == table.cell_updates - updates
