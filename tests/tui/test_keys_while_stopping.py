"""Dataset keys are refused once the run is stopping (trial at 2,000 streams: after a second Ctrl-C the
dashboard still read text typed into its pane as keys and logged ``[a_budget] dataset paused``, then
``dataset skipped: skipped by user``, which was stored and carried into the next start).

Real parts: the dashboard (Textual pilot) on the REAL engine and the built-in simulator, a drain in
progress (requests at 4 tokens/s: ~30 s each, so the run stays ``stopping`` while the keys are
pressed), the real store read as ``datagen status`` reads it, and ``datagen ctl``'s own ``send``.
"""

from __future__ import annotations

from tui_helpers import toasts
from waiting import until

from engine.api import RunCommand
from engine.report.status import collect_status
from engine.run.ctl import send
from tui.app import DashboardApp
from tui.modals import ConfirmScreen
from tui.testing import sim_config

SIZE = (160, 48)


def states(run_dir) -> dict[str, tuple[str, str]]:
    """``{dataset: (state, state_reason)}`` as the store holds them."""
    return {d["name"]: (d["state"], d["state_reason"] or "") for d in collect_status(run_dir)["datasets"]}


async def test_dataset_keys_and_ctl_are_refused_while_the_run_stops(tmp_path):
    cfg = sim_config(tmp_path, tokens_per_s=4, mean_completion_tokens=120, drain_timeout_s=60)
    app = DashboardApp(cfg)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.in_flight >= 2, 15, what="in flight")
        sched = app.host.scheduler
        app.host.request_quit("drain", interrupted="Ctrl-C")
        await until(pilot, lambda: app.snapshot.state == "stopping", 3, what="dashboard sees stopping")
        await until(pilot, lambda: collect_status(cfg.run.dir)["run"]["state"] == "stopping", 5, what="store stopping")
        before = states(cfg.run.dir)
        assert before["sharegpt"][0] == "draining" and before["glaive"][0] not in ("paused", "skipped")

        for key in ("p", "s", "P", "R"):  # text typed into the pane: none of it changes a state
            await pilot.press(key)
            await pilot.pause(0.1)
            assert not isinstance(app.screen, ConfirmScreen), key  # no skip confirmation to answer with Enter
        shown = [t for t in toasts(app) if "refused" in t]
        assert shown == [
            "the run is stopping: pause sharegpt refused (dataset states no longer change while it ends)",
            "the run is stopping: skip sharegpt refused (dataset states no longer change while it ends)",
            "the run is stopping: pause of the run refused (dataset states no longer change while it ends)",
        ]  # R is inactive: nothing is paused

        # the engine's command path refuses them too (a modal answered late, datagen ctl)
        res = await app.host.controller.apply(RunCommand.skip("glaive"))
        assert not res.ok and res.error
        assert res.text.startswith("error: the run is stopping: skip glaive refused")
        res = await app.host.controller.apply(RunCommand.resume("sharegpt"))
        assert not res.ok and "resume sharegpt refused" in res.message
        ctl = send(cfg.run.dir, RunCommand.pause("glaive"), wait_s=2)
        assert not ctl.ok
        assert ctl.text.startswith("error: the run is stopping: pause glaive refused")

        await pilot.pause(0.5)  # a commit interval and more
        snap = sched.snapshot()
        assert snap.dataset("sharegpt").state == "draining" and snap.dataset("glaive").state not in ("paused", "skipped")
        assert states(cfg.run.dir) == before
        assert sched.runstate.pause is None

        app.host.request_quit("abort", interrupted="Ctrl-C")
        await until(pilot, lambda: app.host.finished, 20, what="run ended")
    after = states(cfg.run.dir)
    assert after["glaive"][0] != "skipped" and after["sharegpt"][0] != "paused"
