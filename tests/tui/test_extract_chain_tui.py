"""Chained extraction in the generation dashboard (``[extract] after_run = "dataset"``), Textual's
pilot over the real engine (simulator on 127.0.0.1, real tokenizer) and real extraction workers on
the tiny model: the extraction view opens when the first extraction starts, ``e`` switches between
the views, a generation pause leaves extraction running, and a quit drains both."""

from __future__ import annotations

from pathlib import Path

import pytest
from extract_jobs import chain_config
from waiting import until

from engine.extract.control import read_control
from engine.extract.shards import OutDir
from engine.extract.snapshot import DatasetExtractView, ExtractSnapshot
from engine.run.chain import ExtractChain
from tui.app import DashboardApp
from tui.extract.cells import header_lines
from tui.extract.screen import ExtractScreen
from tui.modals import QuitScreen
from tui.testing import FIXED_GPUS

pytestmark = pytest.mark.usefixtures("one_thread")  # the workers: the machine is shared

TINY_VOCAB = 4200  # the shared `tiny` fixture's vocabulary


class EndedRun:
    """A chained extraction run that has ended (what the chain keeps in ``runs``): its snapshot,
    its commands and the interrupts it got."""

    def __init__(self) -> None:
        from tui.extract.host import RecordingCommands

        self.commands = RecordingCommands()
        self.interrupts: list[str] = []

    def snapshot(self) -> ExtractSnapshot:
        return ExtractSnapshot(state="done", datasets=(DatasetExtractView("b1", 5, 5, 50, 50),), quit_mode=None)

    def interrupt(self, name: str) -> None:
        self.interrupts.append(name)


def test_between_chained_extractions_the_view_reads_waiting_with_why(tmp_path: Path):
    """Before: ``NOT_STARTED (extraction finished; waiting for the next datasets)`` and, after a quit,
    ``NOT_STARTED (quit: drain) (...)``; once the chain ended on that quit, ``DONE``."""
    chain = ExtractChain(chain_config(tmp_path, tmp_path, "dataset"))
    first = chain.snapshot()
    assert first.state == "not_started" and first.reason == "waiting for generation and validation of b1, b7"
    chain.runs, chain.starts, chain.handed = [EndedRun()], [(0.0, ("b1",))], ("b1",)
    s = chain.snapshot()
    assert s.state == "waiting" and s.reason == "extraction of b1 finished; waiting for generation and validation of b7"
    assert s.workers == () and s.datasets[0].name == "b1"
    chain.paused = True
    assert chain.snapshot().state == "paused" and "no extraction starts until resumed" in chain.snapshot().reason
    chain.paused = False
    chain.request_quit("drain")
    s = chain.snapshot()
    assert (s.state, s.quit_mode, s.reason) == ("waiting", "drain",
                                                "extraction of b1 finished; quitting: no other extraction starts")
    header = header_lines(s)[0].plain
    assert "WAITING (quit: drain) (extraction of b1 finished; quitting" in header and "NOT_STARTED" not in header
    chain.exit_code = 0  # the chain returned on the quit: b7 was never extracted
    s = chain.snapshot()
    assert s.state == "stopped" and s.reason == "quit (drain): b7 not extracted; a rerun extracts them"


def test_an_interrupt_from_the_dashboard_reaches_the_extraction_in_hand(tmp_path: Path):
    """Ctrl-C (or SIGINT) in the chained dashboard stops the chain by the dashboard's rule and counts
    as the run's interrupt, so it exits 130 with samples left (before: a quit's drain, exit 0)."""
    chain = ExtractChain(chain_config(tmp_path, tmp_path, "dataset"))
    run = EndedRun()
    chain.current = run  # type: ignore[assignment]
    chain.interrupt("Ctrl-C", "drain")
    assert chain.quit_mode == "drain" and run.commands.calls == [("quit", ())] and run.interrupts == ["Ctrl-C"]
    chain.interrupt("Ctrl-C", "abort")
    assert chain.quit_mode == "abort" and run.commands.calls == [("quit", ())] * 2
    assert run.interrupts == ["Ctrl-C", "Ctrl-C"]


@pytest.mark.slow  # issue 27: long e2e test (>9 s on 2 cores), run by `make slow`
async def test_views_switch_with_e_and_a_generation_pause_leaves_extraction_running(tmp_path: Path, tiny: Path):
    cfg = chain_config(tmp_path, tiny, "dataset", slow_prompts=80, latency_ms=250)
    app = DashboardApp(cfg, gpu_source=lambda: FIXED_GPUS, refresh_hz=10, install_signals=False)
    out = tmp_path / "run" / "extract"
    async with app.run_test(size=(160, 48)) as pilot:
        assert app.chain is not None and app.check_action("show_extract", ()) is True
        # b1 done and validated: its extraction starts and its view opens by itself
        await until(pilot, lambda: isinstance(app.screen, ExtractScreen), what="the extraction view", timeout=60.0)
        assert app.chain.starts[0][1] == ("b1",)
        assert app.check_action("show_generation", ()) is True and app.check_action("show_extract", ()) is False
        await pilot.press("e")
        await until(pilot, lambda: not isinstance(app.screen, ExtractScreen), 5, what="back to generation")
        assert app.screen is app.main_screen and app.check_action("show_extract", ()) is True
        # pause the whole generation run: extraction goes on to the end of b1
        await pilot.press("P")
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.state == "paused", 10,
                    what="generation paused")
        run = app.chain.runs[0]
        assert not read_control(run.job.out_dir).paused
        await until(pilot, lambda: run.exit_code is not None, 120, what="b1's extraction to end")
        assert run.exit_code == 0 and run.final_state == "done"
        assert len(OutDir(out).read_manifest()) == 5  # every b1 sample, written while generation was paused
        assert app.snapshot.state == "paused" and app.snapshot.datasets[1].state != "done"
        # the extraction view again, then back; generation resumes
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, ExtractScreen), 5, what="the extraction view again")
        snap = app.screen.snapshot
        assert snap is not None and snap.state == "waiting" and "b7" in snap.reason
        await pilot.press("e")
        await until(pilot, lambda: app.screen is app.main_screen, 5, what="generation view")
        await pilot.press("R")
        await until(pilot, lambda: app.snapshot.state == "running", 10, what="generation resumed")
        # quit drains both
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, QuitScreen) or not app.is_running, 5, what="quit dialog")
        if isinstance(app.screen, QuitScreen):
            await pilot.press("d")
        await until(pilot, lambda: not app.is_running, 120, what="app exit")
    assert app.chain.quit_mode == "drain" and app.chain.exit_code == 0
    assert app.return_code == app.host.exit_code
    ids = [e["id"] for e in OutDir(out).read_manifest()]
    assert len(ids) == len(set(ids)) >= 5


async def test_quit_in_the_extraction_view_drains_generation_too(tmp_path: Path, tiny: Path):
    cfg = chain_config(tmp_path, tiny, "dataset", slow_prompts=80, latency_ms=250)
    app = DashboardApp(cfg, gpu_source=lambda: FIXED_GPUS, refresh_hz=10, install_signals=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ExtractScreen), what="the extraction view", timeout=60.0)
        # past loading: a quit before the first batch stops the extraction (130, by design), not this test's drain
        await until(pilot, lambda: app.screen.snapshot is not None
                    and app.screen.snapshot.state not in ("not_started", "loading", "restarting"), 60,
                    what="the extraction past loading")
        assert app.engine is not None and not app.engine.finished  # b7 still generating
        await pilot.press("q")
        await until(pilot, lambda: app.engine.quit_mode is not None, 5, what="generation asked to stop")
        assert app.engine.quit_mode == "drain" and app.chain.quit_mode == "drain"
        await until(pilot, lambda: not app.is_running, 120, what="app exit")
    assert app.engine.finished and app.chain.exit_code == 0
    assert len(app.chain.runs) == 1  # no extraction started after the quit
    # generation was stopped with prompts left (130); extraction drained (0): the combined code is 130
    assert app.host.exit_code == 130 and app.return_code == 130


async def test_after_run_run_opens_the_extraction_view_once_generation_completed(tmp_path: Path, tiny: Path):
    cfg = chain_config(tmp_path, tiny, "run")
    app = DashboardApp(cfg, gpu_source=lambda: FIXED_GPUS, refresh_hz=10, install_signals=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ExtractScreen), what="the extraction view", timeout=60.0)
        assert app.engine.finished and app.engine.exit_code == 0  # generation completed first
        await until(pilot, lambda: app.chain.exit_code is not None, 120, what="extraction to end")
        await until(pilot, lambda: app.screen.snapshot is not None and app.screen.snapshot.state == "done", 5,
                    what="the view to show done")
        await pilot.press("q")  # the job has ended: exit at once
        await until(pilot, lambda: not app.is_running, 30, what="app exit")
    assert app.return_code == 0 and app.chain.exit_code == 0 and len(app.chain.runs) == 1
    assert len(OutDir(tmp_path / "run" / "extract").read_manifest()) == 9
