"""The dashboard's ``f`` (retry failed prompts) driven by Textual's pilot against the REAL engine on
the built-in simulator, checked in the engine's snapshot and in the store."""

from __future__ import annotations

import sqlite3

from test_tui import SIZE
from waiting import until

from tui.app import DashboardApp
from tui.modals import PickScreen
from tui.testing import screen_text, sim_config


def failed_by_class(run_dir, dataset: str) -> dict[str, int]:
    with sqlite3.connect(run_dir / "store.sqlite") as c:
        return dict(c.execute("SELECT error_class, COUNT(*) FROM prompts WHERE dataset=? AND state='failed' "
                              "GROUP BY 1", (dataset,)).fetchall())


async def test_f_returns_the_picked_class_of_failed_prompts_to_pending(tmp_path):
    # One attempt per prompt: simulated 500s fail as `server`, 429s as `rate_limit`.
    cfg = sim_config(tmp_path, faults="500:0.3,429:0.3", max_attempts=1)
    app = DashboardApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.dataset("sharegpt").failed >= 6, 20,
                    what="failures")
        sched = app.host.scheduler
        await pilot.press("P")  # pause (drain) so the counts hold still
        await until(pilot, lambda: sched.snapshot().state == "paused" and sched.snapshot().in_flight == 0, 20,
                    what="paused and drained")
        await until(pilot, lambda: sum(failed_by_class(cfg.run.dir, "sharegpt").values())
                    == sched.snapshot().dataset("sharegpt").failed, 5, what="failures committed")
        before = failed_by_class(cfg.run.dir, "sharegpt")
        assert set(before) == {"server", "rate_limit"}, before
        pending0 = sched.snapshot().dataset("sharegpt").pending

        await pilot.press("f")
        await until(pilot, lambda: isinstance(app.screen, PickScreen), 5, what="the pick")
        text = screen_text(app)
        total = sum(before.values())
        assert "Retry failed prompts of sharegpt?" in text and f"all {total} failed prompts" in text
        assert f"server: {before['server']}" in text and f"rate_limit: {before['rate_limit']}" in text
        values = app.screen._values
        await pilot.press(*["down"] * values.index("server"), "enter")
        await until(pilot, lambda: sched.snapshot().dataset("sharegpt").failed == before["rate_limit"], 5,
                    what="server failures back to pending")
        assert sched.snapshot().dataset("sharegpt").pending == pending0 + before["server"]
        assert failed_by_class(cfg.run.dir, "sharegpt") == {"rate_limit": before["rate_limit"]}

        said: list[str] = []
        notify = app.notify
        app.notify = lambda message, **kw: (said.append(message), notify(message, **kw))[1]
        await pilot.press("down", "f")  # glaive has not failed anything
        await until(pilot, lambda: "glaive has no failed prompts" in said, 5, what="the refusal")
        assert not isinstance(app.screen, PickScreen)
