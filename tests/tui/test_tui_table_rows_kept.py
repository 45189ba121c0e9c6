"""The datasets table assembles again only the row lines that changed (B7, issue 37).

Textual's ``DataTable`` keys its row-line and screen-line caches on a table-wide counter that every
``update_cell`` bumps, so one changed figure made it assemble every row's line from its cells and build
every screen line's strip again. Row-line assemblies are counted where Textual makes them
(``DataTable._render_line_in_row``, wrapped), independent of how ``DatasetsTable`` keeps them."""

from __future__ import annotations

import dataclasses

import pytest
from textual.dom import DOMNode
from textual.widgets import DataTable
from tui_table import advanced, shown_table

from tui.panes.datasets import DatasetsTable


@pytest.fixture
def assembled(monkeypatch) -> list[str]:
    """Row keys (dataset names, ``None`` for the header) of the row lines Textual assembled since the fixture was made."""
    seen: list[str] = []
    orig = DataTable._render_line_in_row

    def counting(self, row_key, *a, **kw):
        seen.append(row_key.value)
        return orig(self, row_key, *a, **kw)

    monkeypatch.setattr(DataTable, "_render_line_in_row", counting)
    return seen



def lines(table: DatasetsTable) -> list[str]:
    return ["".join(seg.text for seg in table.render_line(y)).rstrip() for y in range(1 + len(table.rows))]


async def test_one_changed_row_is_assembled_again_alone(assembled):
    async with shown_table() as (pilot, table, snap):
        assert len(table.rows) == 4
        assert {None, "b7_sharegpt", "b1_glaive", "b3_oss_instruct", "b8_swe_agent"} <= set(assembled)

        # the third dataset's failed count changes: only its row line is assembled again
        del assembled[:]
        lines0, builds0 = lines(table), table.line_builds
        table.update_from(advanced(snap, 2, failed=77))
        await pilot.pause()
        assert assembled == ["b3_oss_instruct"]  # was the header and all 4 rows
        assert table.line_builds - builds0 == 1  # one screen line rebuilt
        now = lines(table)
        assert " 77 " in now[3] and " 77 " not in lines0[3]
        assert now[:3] == lines0[:3] and now[4] == lines0[4]

        # a frame with nothing changed assembles nothing
        del assembled[:]
        table.refresh()
        await pilot.pause()
        assert assembled == []


async def test_the_cursor_reassembles_the_two_rows_it_touches(assembled):
    async with shown_table() as (pilot, table, snap):
        before = lines(table)
        del assembled[:]
        table.move_cursor(row=2)
        await pilot.pause()
        assert sorted(assembled) == ["b3_oss_instruct", "b7_sharegpt"]
        assert table.selected == "b3_oss_instruct"
        assert lines(table) == before  # same text; the cursor is a style
        # a new width lays out every row again
        del assembled[:]
        await pilot.resize_terminal(140, 20)
        await pilot.pause()
        assert {"b7_sharegpt", "b1_glaive", "b3_oss_instruct", "b8_swe_agent"} <= set(assembled)


async def test_component_styles_are_computed_once_a_pass(monkeypatch):
    """Textual computes the header/fixed/row component styles (an ancestors walk each) for every row line it
    assembles; the table takes each once per drawing pass."""
    looked_up: list[tuple[str, ...]] = []
    orig = DOMNode.get_component_styles

    def counting(self, *names):
        if isinstance(self, DatasetsTable):
            looked_up.append(names)
        return orig(self, *names)

    async with shown_table() as (pilot, table, snap):
        monkeypatch.setattr(DOMNode, "get_component_styles", counting)
        # every dataset changes: every row line is assembled again, in one pass
        ds = tuple(dataclasses.replace(d, failed=d.failed + 5) for d in snap.datasets)
        builds = table.row_builds
        table.update_from(dataclasses.replace(snap, datasets=ds))
        await pilot.pause()
        assert table.row_builds - builds == 4
        assert looked_up  # the row styles were looked up ...
        assert len(looked_up) == len(set(looked_up)) <= 4  # ... each once (was 3 per row line: 12)
        assert all(f" {d.failed} " in line for d, line in zip(ds, lines(table)[1:], strict=True))
