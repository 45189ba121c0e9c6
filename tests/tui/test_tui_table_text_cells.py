"""The datasets table draws its one-line text cells without Rich's generic render path, segment for
segment as Textual's ``DataTable._render_cell`` draws them (B7, issue 37)."""

from __future__ import annotations

import dataclasses

from rich.text import Text
from textual.widgets import DataTable
from tui_table import shown_table

from tui.panes.datasets import DatasetsTable


def textual_cell(table: DatasetsTable, row: int, column: int, width: int, cursor: bool, hover: bool):
    table._clear_caches()  # Textual's own caches (and the table's kept cells)
    return DataTable._render_cell(table, row, column, table.rich_style, width, cursor, hover)


async def test_text_cells_match_textual_segment_for_segment():
    async with shown_table() as (pilot, table, snap):
        # a long name (ellipsis), a wide character and a styled span
        odd = dataclasses.replace(snap.datasets[0], name="a_rather_long_dataset_name_that_is_cut_here",
                                  state_reason="paused: 予算 reached")
        table.update_from(dataclasses.replace(snap, datasets=(odd, *snap.datasets[1:])))
        await pilot.pause()
        checked = 0
        for row in range(len(table.rows)):
            for column, col in enumerate(table.ordered_columns):
                value = table.get_cell_at((row, column))
                assert isinstance(value, Text)
                for width in (col.get_render_width(table), 4, 3, 2):
                    for cursor, hover in ((False, False), (True, False), (False, True), (True, True)):
                        ref = textual_cell(table, row, column, width, cursor, hover)
                        n = table.text_cells
                        got = table._text_cell(row, column, value, table.rich_style, width, 1, cursor, hover)
                        if width - 2 * table.cell_padding < 1:
                            assert got is None
                            continue
                        assert table.text_cells == n + 1
                        assert got == ref, (row, column, width, cursor, hover)
                        checked += 1
        assert checked == len(table.rows) * len(table.columns) * 3 * 4 >= 4 * 10 * 3 * 4
        # the header, a taller row and other renderables go Textual's way
        assert table._text_cell(-1, 0, Text("x"), table.rich_style, 10, 1, False, False) is None
        assert table._text_cell(0, 0, Text("x"), table.rich_style, 10, 2, False, False) is None
        assert table._text_cell(0, 0, "x", table.rich_style, 10, 1, False, False) is None


async def test_the_table_draws_its_cells_by_the_text_path():
    async with shown_table() as (pilot, table, snap):
        # every data cell drawn by the text path; the header cells by Textual
        assert table.text_cells >= len(table.rows) * len(table.columns)
        assert table.cell_renders - table.text_cells == len(table.columns)
        line = "".join(seg.text for seg in table.render_line(1))
        assert "b7_sharegpt" in line and "4120/9800" in line
