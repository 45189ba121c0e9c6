"""The detail view (``i``): what the table and panes cut is readable in full, for the selected
dataset, with the current limits; remappable through the keymap; live on the real engine."""

from __future__ import annotations

import dataclasses
import re
import time

from tui.app import DashboardApp
from tui.detail import DetailScreen, dataset_log_lines, detail_text, run_problem_lines
from tui.testing import FIXED_GPUS, FakeController, fixed_snapshot, screen_text, sim_config

LONG_REASON = ("anomaly guard (validation): 7 of the last 20 records failed validation (35% > 20%): "
               "token ids differ from the tokenizer's at position 412")
LONG_ERROR = "Provider returned error [503]: " + "upstream overloaded, please retry later; " * 5 + "END-OF-MESSAGE"


def snap_with_long_texts():
    snap = fixed_snapshot()
    ds = list(snap.datasets)
    ds[1] = dataclasses.replace(ds[1], state_reason=LONG_REASON)
    return dataclasses.replace(
        snap, datasets=tuple(ds), latest_errors={**snap.latest_errors, "midstream": LONG_ERROR},
        events=snap.events + (f"12:20:00 WARNING [b1_glaive] dataset paused: {LONG_REASON}",))


def app_for(snap, **kw) -> DashboardApp:
    return DashboardApp(snapshot_source=lambda: snap, controller=FakeController(), gpu_source=lambda: FIXED_GPUS,
                        refresh_hz=20, **kw)


def flat(text: str) -> str:
    """The modal's text on screen with its wrapping undone: the rows between the modal's thick
    top and bottom borders, cut at its left and right borders, joined, whitespace squeezed."""
    lines = text.split("\n")
    top = next(i for i, line in enumerate(lines) if "█▀▀▀" in line)
    left, right = lines[top].index("█▀"), lines[top].rindex("▀█") + 1
    bottom = next(i for i in range(top + 1, len(lines)) if "▄▄▄" in lines[i][left:right + 1])
    return " ".join(" ".join(line[left + 1:right].split()) for line in lines[top + 1:bottom]).strip()


async def test_i_opens_the_selected_datasets_details_in_full_and_escape_closes():
    app = app_for(snap_with_long_texts())
    async with app.run_test(size=(120, 48)) as pilot:
        await pilot.pause(0.2)
        await pilot.press("down")  # b1_glaive, paused by the guard
        assert app.selected_dataset == "b1_glaive"
        table_text = screen_text(app)
        assert "anomaly guard" in table_text and LONG_REASON not in table_text.replace("\n", " ")  # cut
        await pilot.press("i")
        await pilot.pause(0.2)
        assert isinstance(app.screen, DetailScreen) and app.screen.dataset == "b1_glaive"
        shown = flat(screen_text(app))
        assert LONG_REASON in shown
        assert "120 done, 41 failed, 0 skipped, 339 pending, 0 in flight (32% finished)" in shown
        assert LONG_ERROR in shown  # an error message by class, not cut
        assert "timeout" in shown and "no bytes for 30s (stalled stream)" in shown
        assert "short concurrency 200, 200 in flight, max_tokens 10,240" in shown  # current limits
        assert "long concurrency 50, 0 in flight, max_tokens 16,384" in shown
        assert f"[b1_glaive] dataset paused: {LONG_REASON}" in shown  # its latest log lines
        assert "[b8_swe_agent]" not in shown  # only this dataset's
        await pilot.press("p")  # dashboard keys are off while the view is open
        assert app.controller.calls == []
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, DetailScreen)
        await pilot.press("p")
        await pilot.pause(0.2)
        assert app.controller.calls == [("resume", ("b1_glaive",))]


async def test_details_fit_80_columns_and_scroll():
    app = app_for(snap_with_long_texts())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        await pilot.press("down", "i")
        await pilot.pause(0.2)
        text = screen_text(app)
        assert all(len(line) <= 80 for line in text.split("\n"))
        assert LONG_REASON in flat(text)
        await pilot.press("end")
        await pilot.pause(0.2)
        assert "[b1_glaive] dataset paused" in flat(screen_text(app))


async def test_details_key_is_remappable_and_hinted_on_the_table():
    app = app_for(fixed_snapshot(), keymap={"dashboard.details": "f2"})
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        assert "f2 details" in screen_text(app)
        await pilot.press("i")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, DetailScreen)
        await pilot.press("f2")
        await pilot.pause(0.1)
        assert isinstance(app.screen, DetailScreen) and app.screen.dataset == "b7_sharegpt"


def test_detail_text_keeps_everything_and_picks_the_datasets_log_lines():
    snap = snap_with_long_texts()
    t = detail_text(snap.dataset("b1_glaive"), snap, "short", ["12:00:00 INFO    [b7_sharegpt] other",
                                                                "12:13:00 WARNING [b1_glaive] earlier line"])
    assert LONG_REASON in t.plain and LONG_ERROR in t.plain
    assert "<- this dataset's class" in t.plain.split("short", 1)[1].split("\n")[0]
    assert t.plain.index("earlier line") < t.plain.index("12:20:00")
    assert dataset_log_lines("a", ["[a] 1", "[b] 2", "[a] 1", "[a] 3"], limit=5) == ["[a] 1", "[a] 3"]
    assert "12:15:40 WARNING provider SimC excluded (routing ignore)" in t.plain.split("latest run warnings")[1]
    lines = ["1 INFO    run started", "2 WARNING [a] x", "3 ERROR   store fails", "4 WARNING provider P excluded"]
    assert run_problem_lines(lines) == ["3 ERROR   store fails", "4 WARNING provider P excluded"]
    assert dataset_log_lines("a", [f"[a] {i}" for i in range(30)], limit=3) == ["[a] 27", "[a] 28", "[a] 29"]


async def test_details_follow_the_real_engine(tmp_path):
    app = DashboardApp(sim_config(tmp_path, concurrency=3, tokens_per_s=200))
    async with app.run_test(size=(120, 40)) as pilot:
        end = time.monotonic() + 15
        while not (app.snapshot and app.snapshot.dataset("sharegpt").done >= 2):
            assert time.monotonic() < end, "no completion in 15 s"
            await pilot.pause(0.05)
        await pilot.press("i")
        await pilot.pause(0.1)
        assert isinstance(app.screen, DetailScreen)
        first = flat(screen_text(app))
        assert "short concurrency 3," in first and "max_tokens 2,000" in first
        done0 = app.snapshot.dataset("sharegpt").done
        end = time.monotonic() + 15
        while app.snapshot.dataset("sharegpt").done < done0 + 2:
            assert time.monotonic() < end
            await pilot.pause(0.05)
        # the view re-reads the snapshot every 0.5 s: it shows the new count soon (however loaded the machine)
        end = time.monotonic() + 15
        while True:
            shown = [int(n) for n in re.findall(r"(\d+) done", flat(screen_text(app)))]
            if shown and max(shown) >= done0 + 2:
                break
            assert time.monotonic() < end, (done0, shown)
            await pilot.pause(0.1)
        assert max(shown) <= app.snapshot.dataset("sharegpt").done
        await pilot.press("escape")
        app.begin_quit("abort")


def test_detail_progress_is_rounded_down_and_a_capped_projection_says_so():
    """The view agrees with the row: 199 of 200 finished with one in flight reads 99% (before: 100%,
    rounded), and a projection clamped at a cap reads "capped at"."""
    snap = fixed_snapshot()
    d = dataclasses.replace(snap.datasets[0], prompts=200, done=199, failed=0, skipped=0, pending=0, in_flight=1,
                            max_cost_usd=0.16, projected_cost_usd=0.16, projection_capped=True)
    plain = detail_text(d, snap).plain
    assert "1 in flight (99% finished)" in plain
    assert "of cap $0.16, projected capped at $0.16" in plain
    d = dataclasses.replace(d, done=77, pending=122, projection_capped=False, projected_cost_usd=0.12)
    plain = detail_text(d, snap).plain
    assert "(38% finished)" in plain and "projected capped" not in plain  # 77/200 = 38.5%: 38, not 39
