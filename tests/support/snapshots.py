"""Screenshot comparison for the dashboard and the extraction view: tests/tui/snapshots/*.svg.

Regenerate after an intended change with ``UPDATE_SNAPSHOTS=1 pytest tests/tui/test_tui_snapshots.py
tests/tui/test_tui_extract_snapshots.py`` and review the SVGs (open them in a browser). The comparison
first diffs the visible text (a readable failure), then the whole SVG (colours, styles) with Textual's
per-render ids normalised."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from tui.testing import svg_text

SNAPSHOTS = Path(__file__).resolve().parents[1] / "tui" / "snapshots"
UPDATE = os.environ.get("UPDATE_SNAPSHOTS") == "1"


def compare(name: str, svg: str, tmp_path: Path) -> None:
    path = SNAPSHOTS / name
    if UPDATE:
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(svg, encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(f"{path} is missing; run with UPDATE_SNAPSHOTS=1 to write it")
    want = path.read_text(encoding="utf-8")
    if svg == want:
        return
    (tmp_path / name).write_text(svg, encoding="utf-8")
    diff = "\n".join(difflib.unified_diff(svg_text(want).splitlines(), svg_text(svg).splitlines(),
                                          "expected", "actual", lineterm="", n=1))
    pytest.fail(f"{name} differs from the saved snapshot (actual: {tmp_path / name}).\n"
                + (diff or "the text is the same: styles or colours differ"))
