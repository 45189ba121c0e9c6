"""Screenshots of the extraction view showing a FIXED job state (tui.extract.demo.fixed_extract_snapshot)
at 80x24 and 160x48, compared by pytest-textual-snapshot's ``snap_compare`` with
tests/tui/__snapshots__/test_tui_extract_snapshots/*.svg.

Regenerate after an intended change with ``pytest tests/tui/test_tui_extract_snapshots.py --snapshot-update``
and review the SVGs. A mismatch fails the test and writes ``snapshot_report.html`` (saved and new screenshot
side by side; see tests/support/snapshots.py).
"""

from __future__ import annotations

import dataclasses

import pytest
from snapshots import matches, screenshot, settle, stored

from tui.extract.app import ExtractApp
from tui.extract.demo import fixed_extract_snapshot
from tui.extract.host import RecordingCommands, StaticExtractHost
from tui.testing import svg_text


def extract_view(snap=None) -> ExtractApp:
    """The extraction view showing ``snap`` (default: the fixed snapshot)."""
    snap = snap or fixed_extract_snapshot()
    return ExtractApp(StaticExtractHost(lambda: snap, RecordingCommands()), refresh_hz=50)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_extract_view_snapshot(size, snap_compare):
    assert snap_compare(extract_view(), terminal_size=size, run_before=settle)


@pytest.mark.slow  # 13 s (two 160x48 screenshots); the dashboard's twin stays in `make test`
def test_snapshot_comparison_catches_a_changed_gpu_reading(request):
    """The saved 160x48 snapshot matches the fixed state as snap_compare takes it, and not a state where one
    GPU's temperature changed."""
    saved = stored(request, "test_extract_view_snapshot[160x48]")
    if saved is None:
        pytest.skip("snapshot not written yet")
    assert matches(screenshot(extract_view(), (160, 48)), saved)
    snap = fixed_extract_snapshot()
    gpus = list(snap.gpus)
    gpus[3] = dataclasses.replace(gpus[3], temp_c=88.0)
    changed = screenshot(extract_view(dataclasses.replace(snap, gpus=tuple(gpus))), (160, 48))
    assert not matches(changed, saved)
    assert "88°C" in svg_text(changed) and "88°C" not in svg_text(saved)
