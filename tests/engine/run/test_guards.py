"""engine.run.guards: every pause rule returns its decision with the exact reason and kind, and
apply() carries it out on a real Scheduler (run pause at once, dataset pause persisted)."""

from __future__ import annotations

import asyncio

from helpers import make_config, seeded_store

from engine.client.retry import RetryPolicy
from engine.money.creditsfloor import CreditsFloorReached
from engine.money.spend import CreditsReading
from engine.report.snapshot import DatasetSnapshot, RunSnapshot
from engine.run import guards
from engine.run.runstate import Control, DatasetRuntime, PauseKind, RunState
from engine.run.runwide import Condition
from engine.run.scheduler import Scheduler
from engine.storage.writer import StoreWriter


def _rt(control=Control.ACTIVE) -> DatasetRuntime:
    return DatasetRuntime("a", 0, 10, 0, None, control=control)


def test_dataset_rules_pause_only_an_active_dataset_with_the_guard_in_the_reason():
    assert guards.anomaly(_rt(), "error rate 60%") == guards.Pause("a", "anomaly guard: error rate 60%")
    assert guards.anomaly(_rt(), None) is None
    assert guards.anomaly(_rt(Control.PAUSED), "x") is None
    assert guards.validation(_rt(), "7 of 20 failed") == guards.Pause("a", "anomaly guard (validation): 7 of 20 failed")
    assert guards.validation(None, "x") is None and guards.validation(_rt(Control.SKIPPED), "x") is None
    rt = _rt()
    assert guards.calibration(rt, None) is None and not rt.gate_fired
    assert guards.calibration(rt, "projects $12 > cap $10") == guards.Pause("a", "calibration gate: projects $12 > cap $10")
    assert rt.gate_fired and guards.calibration(rt, "again") is None  # once per dataset
    assert guards.Pause("a", "r").scope == "dataset" and guards.Pause(None, "r").scope == "run"


def test_run_rules_name_their_kind_and_what_to_do():
    cr = CreditsReading(remaining_usd=5.0, usage_usd=1.0, source="key", at=3.0)
    running, paused = RunState(), RunState(pause=PauseKind("pause"))
    p = guards.credits_floor(cr, 4.0, 1.5, running)
    assert p == guards.Pause(None, "credits floor: $5.00 left minus $1.50 in flight is below credits_floor_usd $4.00",
                             kind="credits")
    assert guards.credits_floor(cr, 4.0, 0.5, running) is None
    assert guards.credits_floor(cr, 4.0, 1.5, paused) is None
    assert guards.credits_floor(None, 4.0, 1.5, running) is None
    assert guards.reserve_refused(CreditsFloorReached("credits at the floor")) == guards.Pause(
        None, "credits at the floor", kind="credits")
    assert guards.reserve_refused(ValueError("no price")) == guards.Pause(None, "cannot reserve: no price", kind="price")
    auth = guards.run_wide(Condition("auth", "the key was rejected (401)"), "OPENROUTER_API_KEY")
    assert auth == guards.Pause(None, "the key was rejected (401). Check the key in $OPENROUTER_API_KEY.", kind="auth")
    assert guards.run_wide(Condition("route", "no endpoints"), "K").reason.endswith(
        "resume when the provider serves it again.")
    e = OSError(28, "No space left on device")
    p = guards.store_failing(e, running)
    assert p is not None and p.kind == "store" and p.reason.startswith("store commits fail (OSError: ")
    store_paused = RunState(pause=PauseKind("store"))
    assert guards.store_failing(e, store_paused) is None
    assert guards.store_recovered(store_paused) and not guards.store_recovered(paused)
    assert not guards.store_recovered(running)


def _snap(state_reason, datasets, in_flight=0):
    return RunSnapshot(name="t", state="paused", state_reason=state_reason, elapsed_s=1.0, datasets=tuple(datasets),
                       classes=(), in_flight=in_flight, req_per_s=0.0, cost_usd=0.0, errors={}, writer_queue=0)


def _ds(name, state, reason=""):
    return DatasetSnapshot(name=name, state=state, state_reason=reason, prompts=5, rejected=0, done=0, failed=0,
                           skipped=0, pending=5, in_flight=0, prompt_tokens=0, completion_tokens=0,
                           reasoning_tokens=0, cost_usd=0.0, token_budget=None, errors={}, req_per_s=0.0,
                           tok_per_s=0.0, avg_completion_tokens=0.0, eta_s=None)


def test_exit_on_pause_decides_who_ends_the_run_and_with_which_code():
    snap = _snap("credits floor: ...", [_ds("a", "paused")])
    credits = RunState(pause=PauseKind("credits"))
    end = guards.exit_on_pause(snap, credits, exit_on_pause=True, stop_on_auth=False)
    assert end == guards.Stop("exit on pause: credits floor: ...", 3, "--exit-on-pause", "credits floor: ...")
    assert guards.exit_on_pause(snap, credits, exit_on_pause=False, stop_on_auth=True) is None
    user = RunState(pause=PauseKind("pause"))
    assert guards.exit_on_pause(snap, user, exit_on_pause=True, stop_on_auth=True) is None  # the user's
    auth = guards.exit_on_pause(_snap("key rejected", []), RunState(pause=PauseKind("auth")),
                                exit_on_pause=False, stop_on_auth=True)
    assert auth == guards.Stop("key rejected", 2, "the key comes from this process's environment", "key rejected")
    busy = _snap("credits", [], in_flight=2)
    assert guards.exit_on_pause(busy, credits, exit_on_pause=True, stop_on_auth=True) is None
    every = _snap("", [_ds("a", "paused", "anomaly guard: x"), _ds("b", "paused", "calibration gate: y"),
                       _ds("c", "done")])
    assert guards.guard_paused(every, RunState()) == "a: anomaly guard: x; b: calibration gate: y"
    some = _snap("", [_ds("a", "paused", "anomaly guard: x"), _ds("b", "running")])
    assert guards.guard_paused(some, RunState()) is None


async def test_apply_pauses_the_run_or_persists_the_dataset_pause(tmp_path):
    cfg = make_config(tmp_path)
    store = await seeded_store(cfg, {"a": 3, "b": 3})
    writer = StoreWriter(store, 0.05)

    async def complete(req, progress=None):  # never called: nothing is dispatched
        raise AssertionError("dispatched")

    sched = Scheduler(cfg, store, writer, complete, policy=RetryPolicy(max_attempts=1))
    await sched.load()
    assert guards.apply(sched, None) is None
    assert guards.apply(sched, guards.Pause(None, "cannot reserve: no price", kind="price")) is None
    assert (sched.run_paused, sched.pause_kind, sched.state, sched.state_reason) == (
        True, "price", "paused", "cannot reserve: no price")
    task = guards.apply(sched, guards.anomaly(sched.datasets["b"], "error rate 60%"))
    await asyncio.wait_for(task, 5)
    assert (sched.datasets["b"].control, sched.datasets["b"].reason) == ("paused", "anomaly guard: error rate 60%")
    assert (await store.datasets())["b"]["state"] == "paused"
    await writer.flush()
    await store.close()
