"""The log pane at a glance: per-prompt ingest lines and the tokenizer's marker ids are DEBUG (the
pane and the detail view's "latest log lines" show INFO and up), and warnings, errors and guard
decisions stand out by style in the pane and in the detail view."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from helpers import make_config
from rich.style import Style

from engine.run.ingest import ingest_all
from engine.storage.store import Store
from tui.app import DashboardApp
from tui.detail import detail_text
from tui.host import _LogLines
from tui.logbridge import PaneLogHandler
from tui.panes.log import LogPane, line_spans
from tui.testing import FIXED_GPUS, SAMPLES, FakeController, fixed_snapshot

GUARD_LINE = "12:14:09 WARNING [b1_glaive] dataset paused: anomaly guard: error rate 34% > 20%"


def test_ingest_logs_per_prompt_lines_at_debug(tmp_path: Path):
    cfg = make_config(tmp_path, datasets=[
        {"name": "swe", "path": str(SAMPLES / "b8_swe_agent_trajectories.jsonl"), "format": "swe_agent"},
        {"name": "share", "path": str(SAMPLES / "b7_sharegpt.json"), "format": "sharegpt"}])
    pane = PaneLogHandler()  # INFO and up, as the dashboard's
    file_log = PaneLogHandler()  # INFO and up, as datagen.log (no pane filters)
    file_log.PRINTED = ()
    logger = logging.getLogger("engine.run.ingest")
    level = logger.level
    logger.addHandler(pane)
    logger.addHandler(file_log)
    logger.setLevel(logging.DEBUG)

    async def go():
        store = await Store.open(cfg.run.dir)
        try:
            await ingest_all(cfg, store)
        finally:
            await store.close()

    try:
        asyncio.run(go())
    finally:
        logger.removeHandler(pane)
        logger.removeHandler(file_log)
        logger.setLevel(level)
    logged = file_log.drain()
    assert not [x for x in logged if ": whole conversation" in x or ": cut before the final" in x
                or "] normalised " in x], logged
    assert any("[swe] 2 prompt(s) whole" in x for x in logged)  # the summary stays (INFO)
    lines = pane.drain()  # the pane: the warnings; prepare prints the summaries (see the next test)
    assert lines and all(" WARNING " in x and "[share] rejected" in x for x in lines), lines


def test_indented_progress_lines_are_debug():
    """``prepare``'s lines in the dashboard: the tokenizer's marker ids (indented) go to DEBUG."""
    pane = PaneLogHandler()
    logger = logging.getLogger("test_glance_log.lines")
    logger.addHandler(pane)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        print("tokenizer: tiktoken demo (vocab 130,328)\n  <think> = 130094\n  </think> = 130095\n"
              "[b7] ingested 98 prompts (98 new), 2 rejected rows\n    rejected b7.json:29: empty",
              file=_LogLines(logger))
    finally:
        logger.removeHandler(pane)
    lines = pane.drain()
    assert len(lines) == 2 and "tokenizer: tiktoken" in lines[0] and "ingested 98 prompts" in lines[1], lines


def test_levels_and_guard_decisions_are_styled():
    assert dict((s, st) for s, _, st in line_spans("12:00:01 INFO    run started")) == {0: "dim"}
    warn = line_spans("12:15:40 WARNING provider SimC excluded (routing ignore)")
    assert (9, 16, "bold yellow") in warn and any(st == "yellow" for _, _, st in warn)
    guard = line_spans(GUARD_LINE)
    assert (9, 16, "bold reverse yellow") in guard and (16, len(GUARD_LINE), "bold yellow") in guard
    assert ("bold red" in {st for _, _, st in line_spans("12:00:02 ERROR   store commit failed")})
    snap = fixed_snapshot()
    text = detail_text(snap.datasets[1], snap)  # b1_glaive: its guard pause among its log lines
    start = text.plain.index(GUARD_LINE)
    assert any(sp.start >= start and "reverse" in str(sp.style) for sp in text.spans)


async def test_the_log_pane_draws_warnings_and_guard_decisions_in_colour():
    snap = fixed_snapshot()
    app = DashboardApp(snapshot_source=lambda: snap, controller=FakeController(), gpu_source=lambda: FIXED_GPUS,
                       refresh_hz=20)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.25)
        pane = app.query_one(LogPane)
        styles = {}
        for y, line in enumerate(pane.lines):
            strip = pane._render_line_strip(y, Style())
            styles[line] = {seg.text.strip(): seg.style for seg in strip if seg.text.strip()}
    guard = styles[GUARD_LINE]["WARNING"]
    assert guard.reverse and guard.bold and guard.color.name == "yellow"
    plain = next(v for k, v in styles.items() if "provider SimC excluded" in k)["WARNING"]
    assert plain.bold and plain.color.name == "yellow" and not plain.reverse
    info = next(v for k, v in styles.items() if "run started" in k)
    assert info["12:00:01"].dim
