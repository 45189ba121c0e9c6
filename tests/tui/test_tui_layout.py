"""The dashboard follows the terminal: columns chosen at every resize (both directions), the name
column fixed when the table scrolls sideways, progress bars of skipped datasets, and the pure
column chooser. Driven with Textual's pilot on the fixed snapshot of :mod:`tui.testing`."""

from __future__ import annotations

import dataclasses

import pytest

from tui.app import DashboardApp
from tui.fmt import bar_parts
from tui.panes.datasets import DatasetsTable, choose_columns, dataset_cells, table_width
from tui.testing import FIXED_GPUS, FakeController, fixed_snapshot, screen_text

ALL_KEYS = ("name", "state", "progress", "done", "eta", "cost", "failed", "skipped", "rate", "tokens", "avg", "note")


def app_for(snap=None) -> DashboardApp:
    snap = snap or fixed_snapshot()
    return DashboardApp(snapshot_source=lambda: snap, controller=FakeController(), gpu_source=lambda: FIXED_GPUS,
                        refresh_hz=20)


def table_rows(text: str) -> list[str]:
    """The screen lines of the datasets pane (from its top border to its bottom border)."""
    lines = text.split("\n")
    top = next(i for i, line in enumerate(lines) if "─ datasets ─" in line)
    bottom = next(i for i in range(top + 1, len(lines)) if lines[i].startswith("╰"))
    return lines[top:bottom + 1]


async def settle(pilot) -> None:
    await pilot.pause(0.25)
    await pilot.wait_for_scheduled_animations()


def check_layout(app, width: int) -> str:
    """Assert the layout fits ``width``: every row of the table within the screen, the last
    column ending near the right border (no wide empty band), the footer's Help and Quit shown."""
    text = screen_text(app)
    table = app.query_one(DatasetsTable)
    used = sum(w + 2 for _, _, w in table._columns)
    assert used <= table_width(width), (width, table.column_keys, used)
    # no empty band: what is left is narrower than the narrowest column ("fail" + padding)
    assert table_width(width) - used < 6 or table.column_keys == ALL_KEYS, (width, used, table.column_keys)
    rows = table_rows(text)
    for line in rows:
        assert len(line) <= width, line
        assert line.endswith(("│", "╮", "╯")), f"row cut at {width} columns: {line!r}"
    footer = text.split("\n")[-1]
    assert "? Help" in footer and "q Quit" in footer, f"footer at {width}: {footer!r}"
    return text


@pytest.mark.parametrize("order", [
    [(160, 48), (80, 24), (120, 40), (100, 30), (160, 48)],
    [(80, 24), (100, 30), (120, 40), (160, 48), (80, 24)],
], ids=["shrink-first", "grow-first"])
async def test_columns_are_chosen_at_every_resize_in_both_directions(order):
    app = app_for()
    async with app.run_test(size=order[0]) as pilot:
        seen: dict[int, tuple[str, ...]] = {}
        for size in order:
            await pilot.resize_terminal(*size)
            await settle(pilot)
            text = check_layout(app, size[0])
            keys = app.query_one(DatasetsTable).column_keys
            if size[0] in seen:
                assert keys == seen[size[0]], f"different columns at {size[0]} after other sizes"
            seen[size[0]] = keys
            if size[0] == 80:
                assert keys == ("name", "state", "progress", "done", "eta", "cost"), keys
                assert "cost / cap" not in text and "reason" not in text
            if size[0] >= 100:
                assert "reason" in text and "anomaly guard" in text
            if size[0] == 160:
                assert keys == ALL_KEYS
                assert "tok/budget (+rsv)" in text and "avg now/all" in text and "1.71M/4M (+81k)" in text
        assert len(seen[80]) < len(seen[100]) < len(seen[120]) < len(seen[160])


async def test_name_column_stays_when_the_table_scrolls_sideways():
    """Below ~60 columns the always-shown columns overflow: scrolled right, the names stay."""
    snap = fixed_snapshot()
    ds = list(snap.datasets)
    ds[0] = dataclasses.replace(ds[0], done=41_200, prompts=98_000)
    app = app_for(dataclasses.replace(snap, datasets=tuple(ds)))
    async with app.run_test(size=(50, 24)) as pilot:
        await settle(pilot)
        table = app.query_one(DatasetsTable)
        assert table.max_scroll_x > 0
        table.scroll_to(x=table.max_scroll_x, animate=False)
        await settle(pilot)
        rows = table_rows(screen_text(app))
        assert "41200/98000" in "\n".join(rows)  # scrolled to the far right column
        for name in ("b7_sharegpt", "b1_glaive", "b3_oss_instruct", "b8_swe_agent"):
            assert any(name in row for row in rows), f"{name} scrolled out of view:\n" + "\n".join(rows)


def test_choose_columns_fills_the_width_by_priority():
    narrow = {"name": 15, "progress": 12, "cost": 9, "note": 40}
    assert [k for k, _, _ in choose_columns(76, narrow)] == ["name", "state", "progress", "done", "eta", "cost"]
    # a column that does not fit is left out; a narrower one after it still comes in
    keys = [k for k, _, _ in choose_columns(76, {**narrow, "cost": 14})]
    assert "cost" not in keys and keys[-2:] == ["failed", "rate"]
    needs = {"name": 15, "progress": 14, "cost": 14, "tokens": 16, "note": 40}
    full = choose_columns(156, needs)
    assert [k for k, _, _ in full] == list(ALL_KEYS)
    assert sum(w + 2 for _, _, w in full) == 156  # the reason column takes what is left
    mid = choose_columns(116, needs)
    assert "note" in [k for k, _, _ in mid] and sum(w + 2 for _, _, w in mid) == 116
    tokens = dict((k, w) for k, _, w in choose_columns(156, {**needs, "tokens": 21}))
    assert tokens["tokens"] == 21  # a cell is never cut: the column is as wide as its widest cell


def test_progress_of_a_skipped_dataset_shows_done_skipped_and_left():
    assert bar_parts(80, 60, 140, 7) == ("████", "", "░░░", "")
    assert bar_parts(0, 60, 60, 7) == ("", "", "░░░░░░░", "")
    assert bar_parts(139, 0, 140, 9) == ("████████▉", "", "", "")  # one left never reads as full
    assert bar_parts(60, 0, 140, 7) == ("███", "", "", "····")
    assert bar_parts(62, 0, 140, 7)[0] == "███▏"
    assert bar_parts(139, 1, 140, 9) == ("████████", "", "░", "")
    assert bar_parts(10, 1, 140, 9) == ("█", "", "░", "·······")
    assert bar_parts(0, 0, 5, 9, failed=5) == ("", "█████████", "", "")  # all failed: red, not "done"
    assert bar_parts(50, 20, 100, 10, failed=10) == ("█████", "█", "░░", "··")
    assert sum(map(len, bar_parts(33, 33, 100, 7, failed=1))) == 7
    snap = fixed_snapshot()
    skipped = dataclasses.replace(snap.datasets[3], done=80, prompts=140, skipped=60, state="skipped")
    plain = "".join(t for t, _ in dataset_cells(skipped, wide=False)["progress"])
    assert plain == "████░░░  57%"
    met = dataclasses.replace(snap.datasets[0], state="budget_met", done=5000, failed=0, skipped=4800, pending=0,
                              prompts=9800)
    plain = "".join(t for t, _ in dataset_cells(met)["progress"])
    assert plain.endswith(" 51%") and "░" in plain and "100%" not in plain


async def test_skipped_dataset_does_not_read_100_percent_on_screen():
    app = app_for()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        row = next(r for r in table_rows(screen_text(app)) if "b8_swe_agent" in r)
        assert "100%" not in row and "░" in row and "0%" in row, row


async def test_a_resize_while_a_modal_is_open_applies_when_it_closes():
    app = app_for()
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")  # the help screen: the dashboard is not redrawn meanwhile
        await pilot.resize_terminal(80, 24)
        await settle(pilot)
        await pilot.press("escape")
        await settle(pilot)
        check_layout(app, 80)
        assert app.query_one(DatasetsTable).column_keys == ("name", "state", "progress", "done", "eta", "cost")
