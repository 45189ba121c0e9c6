"""The extraction view (tui/extract) driven with Textual's pilot: every key calls the commands
object (recorded) and toasts its answer, the footer follows the job's state, the app exits with
the job's code after a quit; the pure cells; the scripted demo job."""

from __future__ import annotations

import dataclasses

import pytest
from tui_helpers import footer, toasts

from engine.extract.snapshot import ExtractSnapshot
from tui.extract.app import ExtractApp
from tui.extract.cells import exit_code, gpu_columns, header_lines
from tui.extract.demo import DemoExtraction, fixed_extract_snapshot, with_state
from tui.extract.host import RecordingCommands, StaticExtractHost
from tui.extract.panes import ExtractDatasetsTable, GpuWorkerTable
from tui.extract.screen import ExtractScreen
from tui.modals import ConfirmScreen
from tui.testing import screen_text

DATASETS = ("b3_oss_instruct", "b7_sharegpt", "b1_glaive")


class Box:
    """A mutable snapshot source: tests change ``snap`` under the running app."""

    def __init__(self, snap: ExtractSnapshot | None) -> None:
        self.snap = snap

    def __call__(self) -> ExtractSnapshot | None:
        return self.snap


def make_app(snap: ExtractSnapshot | None = None, datasets=DATASETS):
    box = Box(snap if snap is not None else fixed_extract_snapshot())
    cmds = RecordingCommands(datasets)
    return ExtractApp(StaticExtractHost(box, cmds), refresh_hz=20), box, cmds


async def settle(pilot, s: float = 0.15) -> None:
    await pilot.pause(s)


async def until_footer(app, pilot, text: str, timeout: float = 5.0) -> None:
    """Wait for the footer to show ``text`` (the first app of a loaded test process starts slowly)."""
    for _ in range(int(timeout / 0.05)):
        if text in footer(app):
            return
        await pilot.pause(0.05)


async def test_p_pauses_then_resumes_and_the_footer_follows_the_state():
    app, box, cmds = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await until_footer(app, pilot, "p Pause")
        assert "p Pause" in footer(app) and "Resume" not in footer(app)
        await pilot.press("p")
        await settle(pilot)
        assert cmds.calls == [("pause", ())]
        assert any("extraction pausing" in t for t in toasts(app))
        box.snap = with_state(box.snap, "paused")
        await settle(pilot)
        assert "p Resume" in footer(app)
        await pilot.press("p")
        await settle(pilot)
        assert cmds.calls == [("pause", ()), ("resume", ())]
        assert any(t == "extraction resumed" for t in toasts(app))
        assert "PAUSED" in screen_text(app)


async def test_s_asks_then_skips_the_highlighted_dataset():
    app, box, cmds = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("s")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmScreen)
        assert "Skip dataset b3_oss_instruct?" in screen_text(app)
        await pilot.press("n")  # cancelled: nothing sent
        await settle(pilot)
        assert isinstance(app.screen, ExtractScreen) and cmds.calls == []
        await pilot.press("down")
        await settle(pilot)
        assert app.screen.query_one(ExtractDatasetsTable).selected == "b7_sharegpt"
        await pilot.press("s")
        await settle(pilot)
        assert "50 samples not extracted yet" in screen_text(app)
        await pilot.press("y")
        await settle(pilot)
        assert cmds.calls == [("skip", ("b7_sharegpt",))]
        assert any(t == "b7_sharegpt skipped: no more batches of it" for t in toasts(app))


async def test_skip_refused_by_the_engine_toasts_its_error():
    app, box, cmds = make_app(datasets=("other",))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("s", "y")
        await settle(pilot)
        assert cmds.calls == [("skip", ("b3_oss_instruct",))]
        errors = [str(n.message) for n in app._notifications if n.severity == "error"]
        assert errors == ["unknown dataset 'b3_oss_instruct'; the datasets are: other"]


async def test_q_drains_then_aborts_and_exits_with_the_jobs_code():
    app, box, cmds = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("q")
        await settle(pilot)
        assert cmds.calls == [("quit", ())]
        assert any(t.startswith("draining:") for t in toasts(app))
        box.snap = with_state(box.snap, "draining", quit_mode="drain")
        await settle(pilot)
        assert "DRAINING (quit: drain)" in screen_text(app)
        assert app.screen.check_action("pause", ()) is None and "p Pause" in footer(app)  # greyed, not gone
        await pilot.press("p")  # nothing to pause while draining
        await settle(pilot)
        assert cmds.calls == [("quit", ())]
        await pilot.press("q")
        await settle(pilot)
        assert cmds.calls == [("quit", ()), ("quit", ())]
        assert any(t == "aborting after the current write" for t in toasts(app))
        assert app.is_running  # the app waits for the job to stop
        box.snap = with_state(box.snap, "stopped", quit_mode="abort")
        await settle(pilot, 0.3)
    assert app.return_code == 130 and app.return_value == 130


async def test_a_drain_that_finishes_exits_0():
    app, box, cmds = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("q")
        box.snap = with_state(box.snap, "stopped", quit_mode="drain")
        await settle(pilot, 0.3)
    assert cmds.calls == [("quit", ())] and app.return_code == 0


async def test_q_after_the_job_ended_exits_at_once_without_a_command():
    app, box, cmds = make_app(with_state(fixed_extract_snapshot(), "done", eta_s=0.0))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert "extraction done: press q to exit" in screen_text(app)
        assert app.is_running  # a job that ends on its own leaves the view up
        await pilot.press("q")
        await settle(pilot)
    assert cmds.calls == [] and app.return_code == 0


async def test_a_failed_job_exits_1_and_keys_are_remappable(monkeypatch):
    monkeypatch.setenv("DATAGEN_KEYS", "extract.quit=x")
    app, box, cmds = make_app(with_state(fixed_extract_snapshot(), "failed", reason="worker 5 failed 3 times"))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert "FAILED (worker 5 failed 3 times)" in screen_text(app)
        await pilot.press("q")
        await settle(pilot)
        assert app.is_running
        await pilot.press("x")
        await settle(pilot)
    assert app.return_code == 1


async def test_starting_host_without_commands_says_so():
    app = ExtractApp(StaticExtractHost(lambda: None, None), refresh_hz=20)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "STARTING" in text and "planning the job" in text
        await pilot.press("p")
        await settle(pilot)
        assert "p Pause" in footer(app)
        await pilot.press("q")  # nothing started: exit at once
        await settle(pilot)
    assert app.return_code == 130


async def test_80x24_keeps_header_every_gpu_and_the_footer():
    app, _, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, 0.3)
        lines = screen_text(app).split("\n")
        assert lines[0].startswith(" extract  RUNNING")
        assert "samples 9.82k/9.88k (99%)" in lines[1] and "tokens 17.5M/17.7M" in lines[1] and "ETA 2s" in lines[1]
        assert "written 1.01 TB / projected 1.02 TB" in lines[2] and "disk free 6.40 TB" in lines[2]
        gpu_rows = [ln for ln in lines if ln.startswith("│ ") and "/140.4" in ln]
        assert [r.split()[1] for r in gpu_rows] == [str(i) for i in range(8)]
        assert "restarting" in gpu_rows[5] and "w5" in gpu_rows[5]
        assert all(len(ln) <= 80 for ln in lines)
        assert "p Pause" in lines[-1] and "s Skip dataset" in lines[-1] and "q Quit" in lines[-1]


async def test_160_columns_show_every_worker_field_and_the_last_error():
    app, _, _ = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, 0.3)
        keys = app.screen.query_one(GpuWorkerTable).column_keys
        assert keys == ("gpu", "util", "mem", "temp", "power", "rank", "state", "samples", "tokens", "tps",
                        "batch", "written", "error")
        text = screen_text(app)
        row5 = next(ln for ln in text.split("\n") if ln.startswith("│ 5 "))
        assert "torch.OutOfMemoryError: CUDA out o" in row5 and row5.rstrip(" │").endswith("…")
        row0 = next(ln for ln in text.split("\n") if ln.startswith("│ 0 "))
        for cell in ("91%", "118.0/140.4", "66°C", "640/700W", "w0", "running", "1.23k/1.24k", "2.17M/2.22M",
                     "11.8k", "16×4.1k", "124.72 GB"):
            assert cell in row0, cell
        assert "worker 5 restarting (1st restart)" in text  # the log pane


async def test_cells_change_in_place_and_the_cursor_stays():
    app, box, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("down", "down")
        table = app.screen.query_one(ExtractDatasetsTable)
        assert table.selected == "b1_glaive"
        ds = list(box.snap.datasets)
        ds[1] = dataclasses.replace(ds[1], samples_done=9_800, tokens_done=17_640_000)
        box.snap = dataclasses.replace(box.snap, datasets=tuple(ds))
        await settle(pilot)
        assert table.selected == "b1_glaive"
        assert "9.8k/9.8k" in screen_text(app)


def test_the_fixed_snapshot_adds_up():
    s = fixed_extract_snapshot()
    assert sum(w.samples_done for w in s.workers) == sum(d.samples_done for d in s.datasets) == s.samples_done
    assert sum(w.tokens_done for w in s.workers) == sum(d.tokens_done for d in s.datasets) == s.tokens_done
    assert sum(w.samples_total for w in s.workers) == s.samples_total == 75 + 9_800  # the skipped one left out


def test_exit_codes():
    s = fixed_extract_snapshot()
    assert [exit_code(with_state(s, st, quit_mode=q)) for st, q in
            (("done", None), ("stopped", "drain"), ("stopped", "abort"), ("failed", None))] == [0, 0, 130, 1]


def test_gpu_columns_fit_and_keep_the_essentials():
    for width in (60, 76, 116, 156, 250):
        cols = gpu_columns(width)
        keys = [c.key for c in cols]
        assert {"gpu", "util", "mem", "rank", "state"} <= set(keys)
        if width >= 76:
            assert sum(c.width + 2 for c in cols) <= width, width
    assert [c.key for c in gpu_columns(76)] == ["gpu", "util", "mem", "temp", "rank", "state", "samples", "tps"]
    assert gpu_columns(156)[-1].key == "error" and gpu_columns(156)[-1].width >= 12


def test_header_warns_under_the_disk_margin():
    s = dataclasses.replace(fixed_extract_snapshot(), disk_free_bytes=50_000_000_000)
    line3 = header_lines(s, width=160)[2]
    assert "disk free 50.00 GB (margin 200.00 GB) under margin!" in line3.plain
    assert any("red" in str(sp.style) for sp in line3.spans)


def test_header_shows_how_the_states_are_saved_from_120_columns():
    """``[extract] save_dtype``: ``saved as fp8`` or the model dtype (``saved as bf16``) on the header's
    second line, a low-priority segment: at 80 columns the essentials stay and it goes first; from
    120 columns (118 cells inside the header's padding) it shows, whatever the state."""
    from engine.extract.snapshot import build_snapshot, states_dtype

    assert [states_dtype("fp8", "bfloat16"), states_dtype("model", "bfloat16"), states_dtype("model", "float16"),
            states_dtype("model", "float32"), states_dtype("model", None)] == ["fp8", "bf16", "fp16", "fp32", ""]
    s = fixed_extract_snapshot()
    for dtype, style in (("fp8", "magenta"), ("bf16", "bold")):
        for st in ("running", "paused", "restarting", "done"):
            snap = with_state(s, st, states_dtype=dtype)
            for width in (118, 158):
                line2 = header_lines(snap, width=width)[1]
                assert line2.plain.endswith(f"saved as {dtype}"), (width, line2.plain)
                assert style in str([sp.style for sp in line2.spans if line2.plain[sp.start:sp.end] == dtype])
            small = [line.plain for line in header_lines(snap, width=78)]
            assert "saved as" not in "\n".join(small)  # 80 columns: dropped before any essential
            assert small[1].startswith("samples ") and "tokens " in small[1] and "ETA " in small[1]
            assert "written " in small[2] and "disk free " in small[2]
    assert "saved as" not in header_lines(dataclasses.replace(s, states_dtype=""), width=158)[1].plain  # unknown
    assert build_snapshot(workers=[], world=0, plan={}, states_dtype="fp8").states_dtype == "fp8"


def test_demo_job_obeys_its_commands():
    now = [0.0]
    demo = DemoExtraction(clock=lambda: now[0], tokens_per_s=1_000_000, fail_at_s=2.0, drain_s=1.0)
    s0 = demo.snapshot()
    assert s0.state == "running" and len(s0.gpus) == 8 and len(s0.workers) == 8
    now[0] = 1.0
    s1 = demo.snapshot()
    assert s1.tokens_done == 1_000_000
    demo.pause()
    now[0] = 5.0
    assert demo.snapshot().tokens_done == 1_000_000  # paused: no progress
    demo.resume()
    now[0] = 6.5  # elapsed 2.5 s: worker 5 is down
    s = demo.snapshot()
    assert s.workers[5].state == "restarting" and s.workers[5].last_error.startswith("torch.OutOfMemoryError")
    with pytest.raises(ValueError, match="the datasets are: b3_oss_instruct, b7_sharegpt, b1_glaive"):
        demo.skip("nope")
    demo.skip("b1_glaive")
    assert demo.snapshot().datasets[2].skipped
    assert demo.quit().startswith("draining")
    now[0] = 8.0
    s = demo.snapshot()
    assert s.state == "stopped" and s.quit_mode == "drain" and exit_code(s) == 0


@pytest.mark.parametrize("key", ["ctrl+c", "ctrl+q"])
async def test_ctrl_c_and_ctrl_q_drain_like_q_instead_of_leaving_workers_behind(key):
    app, box, cmds = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press(key)
        await settle(pilot)
        assert cmds.calls == [("quit", ())] and app.is_running
        await pilot.press(key)
        await settle(pilot)
        assert cmds.calls == [("quit", ()), ("quit", ())]
        box.snap = with_state(box.snap, "stopped", quit_mode="abort")
        await settle(pilot, 0.3)
    assert app.return_code == 130


async def test_a_failed_worker_shows_failed_with_its_error():
    snap = fixed_extract_snapshot()
    ws = list(snap.workers)
    ws[5] = dataclasses.replace(ws[5], state="failed", last_error="RuntimeError: NCCL timeout\nrank 5", restarts=2)
    app, box, _ = make_app(dataclasses.replace(snap, workers=tuple(ws)))
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, 0.3)
        text = screen_text(app)
        assert "workers 7/8 running  1 failed" in text
        row5 = next(ln for ln in text.split("\n") if ln.startswith("│ 5 "))
        assert "failed ↻2" in row5 and "RuntimeError: NCCL timeout rank 5" in row5
        await pilot.resize_terminal(80, 24)
        await settle(pilot, 0.3)
        text = screen_text(app)
        row5 = next(ln for ln in text.split("\n") if ln.startswith("│ 5 "))
        assert "failed ↻2" in row5


async def test_the_screen_works_inside_the_generation_dashboard():
    """Chaining pushes the same screen onto the generation dashboard: its keys reach the extraction
    commands, not the generation controller, and popping it shows the generation view again."""
    from tui.app import DashboardApp
    from tui.testing import FIXED_GPUS, FakeController, fixed_snapshot

    ctl = FakeController()
    box = Box(fixed_extract_snapshot())
    cmds = RecordingCommands(DATASETS)
    app = DashboardApp(snapshot_source=fixed_snapshot, controller=ctl, gpu_source=lambda: FIXED_GPUS)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        screen = ExtractScreen(StaticExtractHost(box, cmds), refresh_hz=20)
        app.push_screen(screen)
        await settle(pilot)
        assert "GPUs · workers" in screen_text(app)
        await pilot.press("p")
        await settle(pilot)
        assert cmds.calls == [("pause", ())] and ctl.calls == []
        app.pop_screen()
        await settle(pilot)
        assert "b7_sharegpt" in screen_text(app) and "GPUs · workers" not in screen_text(app)


# ---- issue 13 follow-ups: restarts are not failures, q is never a no-op, Ctrl-C is SIGINT, labels

def restart_pending_snapshot() -> ExtractSnapshot:
    """One worker, SIGKILLed, its restart pending (what ExtractRun.snapshot builds then): the status
    file still says running (or failed: the pid is gone), the launcher knows it restarts it."""
    from engine.extract.snapshot import LauncherWorker, build_snapshot

    doc = {"worker": 0, "state": "failed", "host": "h", "pid": 17892, "samples_done": 1274, "samples_total": 1994,
           "reason": "worker process 17892 is gone (killed?); rerun to resume",
           "datasets": {"a": {"samples_done": 1274, "tokens_done": 9000}}}
    why = "worker process 17892 ended by SIGKILL"
    return build_snapshot(workers=[doc], world=1, plan={"a": {"samples": 1994, "tokens": 14000}},
                          launcher={0: LauncherWorker(0, pid=17892, last_error=why, failed_at=1.0)}, host="h")


def test_a_pending_restart_is_restarting_not_failed():
    """Before: ``FAILED (worker 0: worker process 17892 ended by SIGKILL)`` and "press q to exit"."""
    from engine.extract.snapshot import LauncherWorker, build_snapshot

    s = restart_pending_snapshot()
    assert (s.state, s.workers[0].state) == ("restarting", "restarting")
    assert "ended by SIGKILL" in s.reason and "ended by SIGKILL" in s.workers[0].last_error
    # the launcher has not reaped the dead process yet, but would restart it: restarting too
    doc = {"worker": 0, "state": "failed", "pid": 7, "reason": "worker process 7 is gone (killed?); rerun to resume"}
    live = build_snapshot(workers=[doc], world=1, plan={}, launcher={0: LauncherWorker(0, pid=7, restartable=True)})
    assert live.state == "restarting" and live.workers[0].state == "restarting"
    spent = build_snapshot(workers=[doc], world=1, plan={}, launcher={0: LauncherWorker(0, pid=7, gave_up=True,
                                                                                        last_error="boom")})
    assert spent.state == "failed" and spent.reason == "worker 0: boom"
    quit_ = build_snapshot(workers=[doc], world=1, plan={}, launcher={0: LauncherWorker(0, pid=7, stopped=True,
                                                                                        last_error="boom")})
    assert quit_.state == "stopped" and quit_.workers[0].state == "stopped"


async def test_q_during_a_restart_drains_instead_of_doing_nothing():
    app, box, cmds = make_app(restart_pending_snapshot(), datasets=("a",))
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "extract  RESTARTING (worker 0: worker process 17892 ended by SIGKILL)" in text
        assert "FAILED" not in text and "press q to exit" not in text and "1 restarting" in text
        row = next(ln for ln in text.split("\n") if "w0" in ln)
        assert "restarting" in row and "ended by SIGKILL" in row
        await pilot.press("q")
        await settle(pilot)
        assert cmds.calls == [("quit", ())] and any(t.startswith("draining:") for t in toasts(app))
        assert app.is_running


async def test_q_on_an_ended_looking_job_posts_done_every_time():
    """``q`` is never swallowed: each press once the job reads ended reaches the app (before, only the
    first did, and an app still waiting for its launcher ignored the rest)."""
    got: list[int] = []

    class Waiting(ExtractApp):  # an app whose launcher has not returned yet: it keeps running
        def on_extract_screen_done(self, message: ExtractScreen.Done) -> None:
            message.prevent_default()
            got.append(message.code)

    box = Box(with_state(fixed_extract_snapshot(), "failed", reason="worker 5: boom"))
    app = Waiting(StaticExtractHost(box, RecordingCommands(DATASETS)), refresh_hz=20)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("q", "q")
        await settle(pilot)
        assert got == [1, 1] and app.is_running


async def test_ctrl_c_is_an_interrupt_exit_130_while_q_drains_to_0():
    """Ctrl-C behaves as SIGINT: a drain it started ends in 130 (samples left); ``q``'s drain in 0."""
    app, box, cmds = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+c")
        await settle(pilot)
        assert cmds.calls == [("quit", ())] and app.view.interrupted
        box.snap = with_state(box.snap, "stopped", quit_mode="drain")
        await settle(pilot, 0.3)
    assert app.return_code == 130
    assert exit_code(with_state(fixed_extract_snapshot(), "done"), interrupted=True) == 0  # nothing left: 0


def test_dataset_rows_follow_the_jobs_state():
    from engine.extract.snapshot import DatasetExtractView
    from tui.extract.cells import dataset_state

    half, none = DatasetExtractView("a", 5, 10), DatasetExtractView("b", 0, 10)
    done, skipped = DatasetExtractView("c", 10, 10), DatasetExtractView("d", 2, 10, skipped=True)
    table = {st: [dataset_state(d, st) for d in (half, none, done, skipped)]
             for st in ("running", "restarting", "paused", "draining", "waiting", "stopped", "failed")}
    assert table == {
        "running": ["running", "waiting", "done", "skipped"],
        "restarting": ["running", "waiting", "done", "skipped"],
        "paused": ["paused", "waiting", "done", "skipped"],
        "draining": ["draining", "waiting", "done", "skipped"],
        "waiting": ["waiting", "waiting", "done", "skipped"],
        "stopped": ["stopped", "stopped", "done", "skipped"],
        "failed": ["stopped", "stopped", "done", "skipped"],
    }


async def test_a_paused_jobs_dataset_rows_read_paused():
    app, box, _ = make_app(with_state(fixed_extract_snapshot(), "paused", reason="paused by user"))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        row = next(ln for ln in screen_text(app).split("\n") if "b7_sharegpt" in ln)
        assert "paused" in row and "running" not in row
