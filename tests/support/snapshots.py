"""Screen snapshots of the dashboard and the extraction view, taken and compared by pytest-textual-snapshot.

The snapshot tests (tests/tui/test_tui_snapshots.py, tests/tui/test_tui_extract_snapshots.py) call its
``snap_compare(app, terminal_size=..., run_before=settle)`` fixture; syrupy keeps the accepted SVGs in
tests/tui/__snapshots__/<test module>/<test>[<size>].svg. Regenerate after an intended change with
``pytest tests/tui/test_tui_snapshots.py tests/tui/test_tui_extract_snapshots.py --snapshot-update`` and review
the SVGs (open them in a browser). A failing run writes ``snapshot_report.html`` (the current working directory;
``--snapshot-report PATH`` to move it): the saved and the new screenshot side by side.

:func:`screenshot` and :func:`stored` let a test compare another state with a saved snapshot exactly as
``snap_compare`` does, without writing, updating or reporting anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pytest_textual_snapshot import SVGImageExtension, normalize_svg
from syrupy.location import PyTestLocation
from textual._doc import take_svg_screenshot  # what snap_compare itself calls
from textual.app import App
from textual.pilot import Pilot


async def settle(pilot: Pilot) -> None:
    """``run_before`` of every snapshot: a few polls at refresh_hz=50 (the footer composed), animations done."""
    await pilot.pause(0.3)
    await pilot.wait_for_scheduled_animations()


def screenshot(app: App[Any], size: tuple[int, int]) -> str:
    """The SVG ``snap_compare(app, terminal_size=size, run_before=settle)`` compares: the same screenshot,
    serialised (render ids normalised) by the same syrupy extension."""
    svg = take_svg_screenshot(app=app, terminal_size=size, run_before=settle)
    return str(SVGImageExtension().serialize(svg))


def stored(request: pytest.FixtureRequest, name: str) -> str | None:
    """The saved snapshot ``name`` (e.g. ``test_dashboard_snapshot[160x48]``) of the requesting test's module,
    as ``snap_compare`` reads it (normalised); None when it has not been written."""
    folder = Path(SVGImageExtension.dirname(test_location=PyTestLocation(request.node)))
    path = folder / f"{name}.svg"
    return normalize_svg(path.read_text(encoding="utf-8")) if path.exists() else None


def matches(svg: str, saved: str) -> bool:
    """Whether ``snap_compare`` would pass for ``svg`` (from :func:`screenshot`) against ``saved``."""
    return SVGImageExtension().matches(serialized_data=svg, snapshot_data=saved)
