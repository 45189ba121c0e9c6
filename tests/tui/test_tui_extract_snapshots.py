"""Screenshots of the extraction view showing a FIXED job state (tui.extract.demo.fixed_extract_snapshot)
at 80x24 and 160x48, compared with tests/tui/snapshots/extract_*.svg.

Regenerate after an intended change with ``UPDATE_SNAPSHOTS=1 pytest tests/tui/test_tui_extract_snapshots.py``
and review the SVGs. The comparison diffs the visible text first (a readable failure), then the whole
SVG (colours, styles) with Textual's per-render ids normalised.
"""

from __future__ import annotations

import dataclasses

import pytest

from tui.extract.app import ExtractApp
from tui.extract.demo import fixed_extract_snapshot
from tui.extract.host import RecordingCommands, StaticExtractHost
from tui.testing import normalise_svg, svg_text
from snapshots import SNAPSHOTS, compare

async def render(size: tuple[int, int], snap=None) -> str:
    """The normalised SVG of the extraction view showing ``snap`` (default: the fixed snapshot)."""
    snap = snap or fixed_extract_snapshot()
    app = ExtractApp(StaticExtractHost(lambda: snap, RecordingCommands()), refresh_hz=50)
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.3)
        await pilot.wait_for_scheduled_animations()
        svg = app.export_screenshot(title="eagle-datagen extract")
    return normalise_svg(svg)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
async def test_extract_view_snapshot(size, tmp_path):
    compare(f"extract_{size[0]}x{size[1]}.svg", await render(size), tmp_path)


async def test_snapshot_comparison_catches_a_changed_gpu_reading():
    path = SNAPSHOTS / "extract_160x48.svg"
    if not path.exists():
        pytest.skip("snapshot not written yet")
    snap = fixed_extract_snapshot()
    gpus = list(snap.gpus)
    gpus[3] = dataclasses.replace(gpus[3], temp_c=88.0)
    changed = await render((160, 48), dataclasses.replace(snap, gpus=tuple(gpus)))
    assert changed != path.read_text(encoding="utf-8")
    assert "88°C" in svg_text(changed)
