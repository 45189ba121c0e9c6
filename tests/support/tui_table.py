"""The datasets table alone in an app, for the tests of how it redraws (issue 37, B7)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from textual.app import App, ComposeResult

from tui.panes.datasets import DatasetsTable
from tui.testing import fixed_snapshot


class TableApp(App[None]):
    """An app showing only the datasets table."""

    def compose(self) -> ComposeResult:
        yield DatasetsTable(id="datasets")


@asynccontextmanager
async def shown_table(snap: Any = None) -> AsyncIterator[tuple[Any, DatasetsTable, Any]]:
    """``(pilot, table, snapshot)``: the table at 160x20 showing ``snap`` (default
    :func:`tui.testing.fixed_snapshot`), drawn once."""
    app = TableApp()
    async with app.run_test(size=(160, 20)) as pilot:
        table = app.query_one(DatasetsTable)
        snap = fixed_snapshot() if snap is None else snap
        table.update_from(snap)
        await pilot.pause()
        yield pilot, table, snap


def advanced(snap: Any, i: int = 0, **changes: Any) -> Any:
    """``snap`` with dataset ``i``'s fields replaced."""
    ds = list(snap.datasets)
    ds[i] = dataclasses.replace(ds[i], **changes)
    return dataclasses.replace(snap, datasets=tuple(ds))
