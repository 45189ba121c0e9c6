"""Pure pieces of the dashboard: event de-duplication, key steps, keymaps, logging while the app
owns the terminal, header fitting and the keymap override."""

from __future__ import annotations

import ast
import logging
import sys
from pathlib import Path

from rich.text import Text

from tui.actions import concurrency_step
from tui.app import DashboardApp
from tui.fmt import bar, money, secs
from tui.layout import parse_keymap
from tui.logbridge import PaneLogHandler, quiet_terminal_logging
from tui.panes.header import fit, header_lines
from tui.panes.log import new_events
from tui.testing import FIXED_GPUS, FakeController, fixed_snapshot


def test_new_events_appends_only_unseen_lines_of_the_sliding_window():
    assert new_events((), ("a", "b")) == ("a", "b")
    assert new_events(("a", "b"), ("a", "b")) == ()
    assert new_events(("a", "b", "c"), ("b", "c", "d", "e")) == ("d", "e")  # window slid by one
    assert new_events(("a", "b"), ("x", "y")) == ("x", "y")  # everything rotated out


def test_concurrency_step_is_about_ten_percent_and_bounded():
    """- stops at 1 (0 would stall dispatch while the run reads RUNNING); + stops at the class's cap."""
    assert concurrency_step(2000, +1) == 2200 and concurrency_step(2000, -1) == 1818
    # `-` undoes `+` (a user saw 2000 -> six + -> six - end at 1884)
    for n in range(1, 5001):
        assert concurrency_step(concurrency_step(n, +1), -1) == n, n
    n = 2000
    for _ in range(6):
        n = concurrency_step(n, +1)
    for _ in range(6):
        n = concurrency_step(n, -1)
    assert n == 2000
    assert concurrency_step(4, +1) == 5 and concurrency_step(1, -1) == 1 and concurrency_step(2, -1) == 1
    assert concurrency_step(95, +1, cap=96) == 96 and concurrency_step(96, +1, cap=96) == 96
    n = 24
    for _ in range(45):  # 45 presses of + from 24 used to reach 319
        n = concurrency_step(n, +1, cap=96)
    assert n == 96
    for _ in range(60):
        n = concurrency_step(n, -1, cap=96)
    assert n == 1


def test_keymap_spec():
    assert parse_keymap("dashboard.pause=f5; dashboard.quit=ctrl+x;junk") == {
        "dashboard.pause": "f5", "dashboard.quit": "ctrl+x"}


def test_formatting():
    assert money(0.01234) == "$0.0123" and money(1234.5) == "$1,234.50" and money(None) == "--"
    assert secs(0.0123) == "12ms" and secs(2.54) == "2.5s" and secs(None) == "--"
    assert bar(0.5, 4) == "██··" and bar(1.0, 4) == "████" and len(bar(0.33, 9)) == 9


def test_header_drops_low_priority_segments_first_when_narrow():
    line = fit([(0, Text("spent $1")), (3, Text("rate $2/h")), (0, Text("ETA 5m"))], 18)
    assert line.plain == "spent $1  ETA 5m"
    lines = header_lines(fixed_snapshot(), width=78)
    assert all(len(x.plain) <= 78 for x in lines)
    assert "spent $4.34" in lines[1].plain and "projected $10.05" in lines[1].plain and "ETA" in lines[1].plain


def test_pane_log_handler_skips_scheduler_events_and_per_request_noise():
    h = PaneLogHandler()
    logging.getLogger("httpx").handlers.append(h)
    try:
        logging.getLogger("httpx").warning("HTTP 500 from upstream")
    finally:
        logging.getLogger("httpx").handlers.remove(h)
    rec = logging.LogRecord("httpx", logging.INFO, __file__, 1, "HTTP Request: POST", None, None)
    h.handle(rec)
    ev = logging.LogRecord("engine.run.scheduler", logging.INFO, __file__, 1, "dataset paused", None, None, func="event")
    h.handle(ev)
    other = logging.LogRecord("engine.run.ingest", logging.WARNING, __file__, 1, "rejected row 3", None, None)
    h.handle(other)
    lines = h.drain()
    assert len(lines) == 2 and "HTTP 500" in lines[0] and "rejected row 3" in lines[1]
    assert h.drain() == []


def test_quiet_terminal_logging_detaches_stderr_handlers_and_restores_them():
    root = logging.getLogger()
    stderr_handler = logging.StreamHandler(sys.stderr)
    file_like = logging.NullHandler()
    root.addHandler(stderr_handler)
    root.addHandler(file_like)
    pane = PaneLogHandler()
    try:
        with quiet_terminal_logging(pane) as removed:
            assert stderr_handler in removed and stderr_handler not in root.handlers
            assert file_like in root.handlers and pane in root.handlers and logging.lastResort is None
        assert stderr_handler in root.handlers and pane not in root.handlers and logging.lastResort is not None
    finally:
        root.removeHandler(stderr_handler)
        root.removeHandler(file_like)


async def test_bindings_can_be_remapped_by_id():
    ctl = FakeController()
    app = DashboardApp(snapshot_source=fixed_snapshot, controller=ctl, gpu_source=lambda: FIXED_GPUS,
                       keymap={"dashboard.pause_all": "f5"})
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(0.1)
        await pilot.press("f5")
        await pilot.pause(0.2)
        assert ("pause", (None,)) in ctl.calls


TUI = Path(__file__).resolve().parents[2] / "tui"
ENGINE_INTERNALS = {"engine.run.scheduler", "engine.run.controller", "engine.run.observe", "engine.run.supervisor"}


def test_tui_reaches_the_engine_only_through_tui_host():
    """Outside tui/host.py the dashboard reads snapshots and sends commands through the typed host
    (tui.host.DashboardHost): no scheduler, job or controller internals, so the run core can change
    behind the host (issue 12). Before, app.py and terminal.py read ``host.scheduler``."""
    found = []
    for path in sorted(TUI.rglob("*.py")):
        if path.name == "host.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("scheduler", "job", "_s"):
                found.append(f"{path.name}:{node.lineno}: .{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module in ENGINE_INTERNALS:
                found.append(f"{path.name}:{node.lineno}: from {node.module}")
            if isinstance(node, ast.ImportFrom) and node.module == "engine.run.runner":
                found += [f"{path.name}:{node.lineno}: runner.{a.name}" for a in node.names
                          if a.name != "interrupt_action"]
    assert found == []


def test_the_dashboard_needs_no_attr_defined_ignores():
    """Manager objects typed by their constructors replaced the mixins (72 ``type: ignore[attr-defined]``
    before, 74 ignores in all)."""
    hits = [f"{p.name}:{i}" for p in sorted(TUI.rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if "type: ignore[attr-defined]" in line]
    assert hits == []
