"""``datagen run CONFIG`` in a real terminal (tmux) resized 160 -> 80 -> 120 -> 100 -> 160 -> 80
columns: after every resize the datasets table has the columns of the NEW size (no row cut
mid-cell, no narrow set of columns in a wide terminal) and the footer keeps ``? Help`` and ``q Quit``."""

from __future__ import annotations

import sys

from test_tui_tmux import CONFIG, DATAGEN, REPO, pytestmark  # noqa: F401 - pytestmark: skip without tmux
from tmuxterm import Tmux
from waiting import wait_for

from tui.testing import SAMPLES

SIZES = [(80, 24), (120, 40), (100, 30), (160, 48), (80, 24)]


def table_rows(screen: str) -> list[str]:
    lines = screen.split("\n")
    top = next(i for i, line in enumerate(lines) if "─ datasets ─" in line)
    bottom = next(i for i in range(top + 1, len(lines)) if lines[i].startswith("╰"))
    return lines[top + 1:bottom]


def fits(screen: str, width: int) -> str | None:
    """Why ``screen`` is not laid out for ``width`` columns (None when it is)."""
    try:
        rows = table_rows(screen)
    except StopIteration:
        return "no datasets table"
    footer = screen.rstrip("\n").split("\n")[-1]
    if "? Help" not in footer or "q Quit" not in footer:
        return f"footer {footer!r}"
    if len(rows) < 2:
        return "the table has no rows yet"
    header = rows[0]
    if len(header) != width or not header.endswith("│"):
        return f"header row {len(header)} wide: {header!r}"
    want = {80: ("cost",), 100: ("reason",), 120: ("fail", "tok/budget", "reason"),
            160: ("tok/budget (+rsv)", "avg now/all", "reason")}[width]
    missing = [label for label in want if label not in header]
    if missing:
        return f"columns {missing} missing at {width}: {header!r}"
    if width < 100 and ("tok/budget" in header or "cost / cap" in header):
        return f"wide columns at {width}: {header!r}"
    if any(not row.endswith(" │") for row in rows):
        return f"a row is cut at the border at {width}: {rows!r}"
    return None


def test_datagen_run_follows_every_resize_in_tmux(tmp_path):
    run_dir = tmp_path / "run"
    cfg = tmp_path / "config.toml"
    cfg.write_text(CONFIG.format(run_dir=run_dir, samples=SAMPLES))
    cmd = f"{DATAGEN} run {cfg}" if DATAGEN.exists() else f"{sys.executable} -m datagen run {cfg}"
    tmux = Tmux()
    tmux("new-session", "-d", "-s", "dash", "-x", "160", "-y", "48", "-c", str(REPO),
         f"env TERM=xterm-256color {cmd}; sleep 30")
    try:
        wait_for(lambda: fits(tmux.screen(), 160) is None, 30, "the dashboard at 160x48", show=tmux.screen)
        for w, h in SIZES:
            tmux("resize-window", "-t", "dash", "-x", str(w), "-y", str(h))
            wait_for(lambda w=w: fits(tmux.screen(), w) is None, 10, f"the layout for {w}x{h}",
                     show=lambda w=w: f"{fits(tmux.screen(), w)}\n{tmux.screen()}")
        tmux("send-keys", "-t", "dash", "i")
        wait_for(lambda: "dataset sharegpt" in tmux.screen() and "limits" in tmux.screen(), 10, "the detail view",
             show=tmux.screen)
        tmux("send-keys", "-t", "dash", "Escape")
        wait_for(lambda: "limits" not in tmux.screen(), 10, "the detail view closed", show=tmux.screen)
        tmux("send-keys", "-t", "dash", "a")  # abort in-flight (confirm) keeps the test short
        tmux("send-keys", "-t", "dash", "y")
    finally:
        tmux("kill-server", check=False)
