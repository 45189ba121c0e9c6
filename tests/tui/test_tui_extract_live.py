"""The live extraction view (:class:`tui.extract.run_app.RunExtractApp`, what ``datagen extract``
opens on a terminal), Textual's pilot: ``q`` is never a no-op (a job that reads ended while the
launcher still supervises its workers gets drained), Ctrl-C is the run's interrupt (like SIGINT:
exit 130 with samples left), and a worker killed with -9 shows ``restarting``, never ``failed``,
while its restart is pending, with ``q`` then draining (the restart cancelled) and exiting 0.

The first tests drive a scripted stand-in for :class:`engine.extract.run.ExtractRun` (its
``run``/``snapshot``/``commands``/``interrupt``); the last one real CPU workers on the tiny model."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

from tui_helpers import toasts

from engine.extract.snapshot import ExtractSnapshot
from tui.extract.demo import fixed_extract_snapshot, with_state
from tui.extract.host import RecordingCommands
from tui.extract.run_app import RunExtractApp
from tui.testing import screen_text


class ScriptedRun:
    """What RunExtractApp uses of an ExtractRun: ``run()`` returns ``code`` once ``end`` is set;
    ``interrupt`` records its calls; the snapshot is whatever the test puts in ``snap``."""

    def __init__(self, snap: ExtractSnapshot) -> None:
        self.cfg = SimpleNamespace(run=SimpleNamespace(metrics_port=None))
        self.snap = snap
        self.commands = RecordingCommands()
        self.interrupts: list[str] = []
        self.events: list[str] = []
        self.exit_code: int | None = None
        self.code = 0
        self.end = asyncio.Event()

    def say(self, line: str) -> None:
        self.events.append(line)

    def snapshot(self) -> ExtractSnapshot:
        return self.snap

    def interrupt(self, name: str = "SIGINT") -> None:
        self.interrupts.append(name)
        if name == "exit":  # the app closing with the run alive (on_unmount): it stops
            self.code = 130
            self.end.set()

    async def run(self) -> int:
        await self.end.wait()
        self.exit_code = self.code
        return self.code


async def test_q_on_a_failed_looking_job_whose_launcher_still_runs_drains_it():
    """Before: the first ``q`` set a silent "exit when done" flag and later ones did nothing; no quit
    reached the control file, so workers the launcher restarted ran on."""
    run = ScriptedRun(with_state(fixed_extract_snapshot(), "failed", reason="worker 5: boom"))
    app = RunExtractApp(run, refresh_hz=20, install_signals=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        await pilot.press("q")
        await pilot.pause(0.2)
        assert run.commands.calls == [("quit", ())] and app.is_running
        assert any(t.startswith("draining:") for t in toasts(app))
        run.snap = with_state(run.snap, "draining", quit_mode="drain")
        await pilot.pause(0.2)
        await pilot.press("q")  # draining: a second quit aborts, as always
        await pilot.pause(0.2)
        assert run.commands.calls == [("quit", ()), ("quit", ())]
        run.snap = with_state(run.snap, "stopped", quit_mode="abort")
        await pilot.pause(0.2)
        await pilot.press("q")  # reads ended, launcher not returned: said, not swallowed
        await pilot.pause(0.2)
        assert run.commands.calls == [("quit", ()), ("quit", ())]
        assert any(t.startswith("extraction is stopping") for t in toasts(app))
        run.code = 130
        run.end.set()
        await pilot.pause(0.3)
    assert app.return_code == 130


async def test_ctrl_c_is_the_runs_interrupt_like_sigint():
    """Before: Ctrl-C was the quit key's drain, and a drain exits 0 with samples left."""
    run = ScriptedRun(fixed_extract_snapshot())
    app = RunExtractApp(run, refresh_hz=20, install_signals=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        await pilot.press("ctrl+c")
        await pilot.pause(0.2)
        assert run.interrupts == ["Ctrl-C"] and run.commands.calls == []
        await pilot.press("ctrl+c")  # the second: the run's own count makes it the kill
        await pilot.pause(0.2)
        assert run.interrupts == ["Ctrl-C", "Ctrl-C"] and app.is_running
        run.code = 130
        run.end.set()
        await pilot.pause(0.3)
    assert app.return_code == 130


# ------------------------------------------------------------------------------- real workers

def _tiny_job(tmp_path: Path, tiny: Path, seed: int):
    """A 600-sample tiny-model job (64-token batches) over ``tmp_path/data``: ``(config, records)``."""
    from engine.config import parse_config
    from engine.extract.tiny import synth_records
    from engine.tokens.records import write_parquet

    recs = synth_records(600, 8, 96, seed=seed)
    write_parquet(tmp_path / "data" / "a.parquet", recs)
    cfg = parse_config({"run": {"dir": str(tmp_path / "run")}, "datasets": [{"name": "a", "path": "a.jsonl"}],
                        "extract": {"model": str(tiny), "aux_layers": [0, 1, 2], "max_tokens_per_batch": 64,
                                    "disk_margin_gb": 0}}, tmp_path / "config.toml", check_files=False)
    return cfg, recs


async def test_q_while_a_killed_worker_waits_for_its_restart_drains_and_exits_0(tmp_path, tiny, monkeypatch):
    """The trial's case: ``kill -9`` the only worker, ``q`` half a second later. Before: ``FAILED ...
    press q to exit``, ``q`` ignored, ``control.json`` kept ``"quit": null``, the worker restarted and
    the job ran on."""
    from engine.extract.run import ExtractRun
    from engine.extract.shards import OutDir
    from engine.extract.status import read_workers

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg, recs = _tiny_job(tmp_path, tiny, seed=5)
    run = ExtractRun(cfg, data=tmp_path / "data", workers=1, say=lambda _l: None, progress_s=None,
                     worker_output="file", restart_delay_s=30.0)
    out = Path(run.job.out_dir)
    app = RunExtractApp(run, refresh_hz=10, install_signals=False)

    async def until(cond, timeout: float, what: str):
        end = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < end, f"timed out waiting for {what}: {screen_text(app)}"
            await pilot.pause(0.05)

    async with app.run_test(size=(160, 48)) as pilot:
        await until(lambda: any(w.get("samples_done", 0) > 0 for w in read_workers(out)), 90, "the first batch")
        pid = read_workers(out)[0]["pid"]
        os.kill(pid, signal.SIGKILL)
        await until(lambda: run.snapshot().state == "restarting", 10, "the launcher to see it die")
        app.view.poll()
        await pilot.pause(0.1)
        text = screen_text(app)
        assert "RESTARTING" in text and "FAILED" not in text and "press q to exit" not in text, text
        assert "ended by SIGKILL" in text
        await pilot.press("q")
        await until(lambda: not app.is_running, 30, "the app to exit")
    assert json.loads((out / "control.json").read_text())["quit"] == "drain"
    assert app.return_code == 0 and run.exit_code == 0 and run.final_state == "stopped"
    assert run.snapshot().workers[0].state == "stopped"
    assert any("not restarted: quitting" in e for e in run.events)
    got = [e["id"] for e in OutDir(out).read_manifest()]
    assert 0 < len(got) == len(set(got)) < len(recs)


async def test_a_worker_killed_right_after_q_is_stopped_not_failed(tmp_path, tiny, monkeypatch):
    """The re-check's race: ``q`` lands, then the worker is killed before the launcher saw either (0.1 s
    apart). Before: ``worker 0 failed: ... not restarted (quitting)``, ``extract failed``, exit 1; a
    quit in force makes a killed worker ``stopped`` like the drain (exit 0; a rerun resumes its share)."""
    from engine.extract.run import ExtractRun
    from engine.extract.shards import OutDir
    from engine.extract.status import read_workers

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg, recs = _tiny_job(tmp_path, tiny, seed=6)
    said: list[str] = []
    run = ExtractRun(cfg, data=tmp_path / "data", workers=1, say=said.append, progress_s=None,
                     worker_output="file", restart_delay_s=30.0)
    out = Path(run.job.out_dir)
    task = asyncio.create_task(run.run())
    end = time.monotonic() + 90
    while not any(w.get("samples_done", 0) > 0 for w in read_workers(out)):
        assert time.monotonic() < end and not task.done(), said
        await asyncio.sleep(0.05)
    pid = read_workers(out)[0]["pid"]
    run.commands.quit()
    os.kill(pid, signal.SIGKILL)
    rc = await asyncio.wait_for(task, 60)
    assert rc == 0 and run.final_state == "stopped", said
    assert run.snapshot().workers[0].state == "stopped"
    assert not any("failed" in e for e in said), said
    got = [e["id"] for e in OutDir(out).read_manifest()]
    assert 0 < len(got) == len(set(got)) < len(recs)
