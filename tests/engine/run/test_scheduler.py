"""The scheduler and controller on a real SQLite store with a scripted `complete` function."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from helpers import completion
from scheduling import Fake, build, run_all

from engine.client.types import ErrorClass, RequestError
from engine.report.status import collect_status
from engine.run.controller import Controller


def db(cfg):
    return sqlite3.connect(cfg.run.dir / "store.sqlite")


async def test_every_prompt_done_once_with_class_concurrency(tmp_path):
    fake = Fake(delay=0.01)
    cfg, store, writer, sched = await build(tmp_path, {"a": 30, "b": 20}, fake, long_every=5)
    code = await run_all(sched, writer)
    assert code == 0 and sched.state == "completed"
    assert sorted(fake.calls) == sorted({*fake.calls}) and len(fake.calls) == 50
    # short 4 + long 2 concurrent at most
    assert fake.max_in_flight <= 6
    c = db(cfg)
    assert c.execute("SELECT COUNT(*), COUNT(DISTINCT prompt_id) FROM results").fetchone() == (50, 50)
    assert c.execute("SELECT COUNT(*) FROM prompts WHERE state='done'").fetchone() == (50,)
    snap = sched.snapshot()
    assert [d.state for d in snap.datasets] == ["done", "done"]
    assert snap.dataset("a").done == 30 and snap.dataset("a").completion_tokens == sum(len(f"a prompt {i}") for i in range(30))
    await store.close()


async def test_next_dataset_starts_while_previous_drains(tmp_path):
    fake = Fake()
    fake.gate = asyncio.Event()
    cfg, store, writer, sched = await build(tmp_path, {"a": 2, "b": 5}, fake)
    task = asyncio.create_task(run_all(sched, writer))
    await asyncio.sleep(0.2)
    # a's two prompts are blocked in flight; b fills the other two short slots
    assert sorted(fake.calls)[:2] == ["a prompt 0", "a prompt 1"]
    assert sum(1 for c in fake.calls if c.startswith("b")) == 2
    fake.gate.set()
    assert await task == 0
    await store.close()


async def test_retry_then_fail_with_reason_and_errors_counted(tmp_path):
    err = lambda: RequestError(ErrorClass.SERVER, "upstream 502", status=502)  # noqa: E731
    fake = Fake(script={
        "a prompt 0": [err(), completion()],  # retried, then ok
        "a prompt 1": [err(), err(), err()],  # exhausts 3 attempts
        "a prompt 2": [RequestError(ErrorClass.BAD_REQUEST, "context_length_exceeded", status=400)],
    })
    cfg, store, writer, sched = await build(tmp_path, {"a": 4}, fake)
    assert await run_all(sched, writer) == 0
    c = db(cfg)
    assert c.execute("SELECT state, attempts FROM prompts WHERE key='a-000000'").fetchone() == ("done", 2)
    st, att, ec, msg = c.execute("SELECT state, attempts, error_class, error FROM prompts WHERE key='a-000001'").fetchone()
    assert (st, att, ec) == ("failed", 3, "server") and "upstream 502" in msg
    st, att, ec, msg = c.execute("SELECT state, attempts, error_class, error FROM prompts WHERE key='a-000002'").fetchone()
    assert (st, att, ec) == ("failed", 1, "bad_request") and "context_length_exceeded" in msg
    assert fake.calls.count("a prompt 2") == 1
    doc = collect_status(cfg.run.dir)
    a = doc["datasets"][0]
    assert (a["done"], a["failed"], a["pending"], a["in_flight"]) == (2, 2, 0, 0)
    assert a["errors"] == {"server": 4, "bad_request": 1}
    await store.close()


async def test_partial_spend_before_an_unexpected_error_is_counted_once_in_every_figure(tmp_path):
    """A prompt whose first attempt failed after $0.02 was billed, and whose retry then hit a bug
    (an unexpected exception), shows the same dollars in its dataset's snapshot as the spend ledger
    and the budgets (the generic-exception branch once dropped them from the dataset's figure)."""
    fake = Fake(script={
        "a prompt 0": [RequestError(ErrorClass.SERVER, "upstream 502", status=502, partial_cost_usd=0.02),
                       RuntimeError("a bug in the client")],
    })
    cfg, store, writer, sched = await build(tmp_path, {"a": 1}, fake)
    assert await run_all(sched, writer) == 0
    d = sched.snapshot().dataset("a")
    assert (d.done, d.failed) == (0, 1)
    assert d.cost_usd == pytest.approx(0.02)
    assert sched.spend.dataset_usd["a"] == pytest.approx(0.02)
    assert sched.spend.budgets["a"].cost.used == pytest.approx(0.02)
    assert sched.spend.run_cost.used == pytest.approx(0.02)
    assert sched.snapshot().cost_usd == pytest.approx(0.02)
    c = db(cfg)
    st, ec, msg = c.execute("SELECT state, error_class, error FROM prompts WHERE key='a-000000'").fetchone()
    assert (st, ec) == ("failed", "other") and "internal error: RuntimeError: a bug in the client" in msg
    assert collect_status(cfg.run.dir)["datasets"][0]["cost_usd"] == pytest.approx(0.02)
    await store.close()


async def test_402_pauses_everything_without_retry_loop(tmp_path):
    fake = Fake(script={"a prompt 0": [RequestError(ErrorClass.CREDITS, "insufficient credits", status=402)]})
    cfg, store, writer, sched = await build(tmp_path, {"a": 1, "b": 3}, fake,
                                            classes={"short": {"max_tokens": 10, "concurrency": 1}})
    stop = asyncio.Event()
    wt = asyncio.create_task(writer.run(stop))
    rt = asyncio.create_task(sched.run())
    for _ in range(100):
        await asyncio.sleep(0.02)
        if sched.state == "paused":
            break
    await asyncio.sleep(0.2)
    assert sched.state == "paused" and "402" in sched.state_reason
    assert fake.calls == ["a prompt 0"]  # not retried, nothing else dispatched
    snap = sched.snapshot()
    assert snap.dataset("a").pending == 1 and snap.dataset("a").in_flight == 0
    await Controller(sched).resume()
    assert await asyncio.wait_for(rt, 10) == 0
    assert fake.calls.count("a prompt 0") == 2
    stop.set()
    await wt
    await store.close()


async def test_401_pauses_the_run_and_keeps_prompts_pending(tmp_path):
    fake = Fake(script={"a prompt 0": [RequestError(ErrorClass.AUTH, "invalid key", status=401)]})
    cfg, store, writer, sched = await build(tmp_path, {"a": 1}, fake)
    stop = asyncio.Event()
    wt = asyncio.create_task(writer.run(stop))
    rt = asyncio.create_task(sched.run())
    for _ in range(200):
        await asyncio.sleep(0.02)
        if sched.state == "paused":
            break
    assert sched.state == "paused" and sched.pause_kind == "auth"
    assert sched.state_reason.startswith("API key rejected (HTTP 401): invalid key. Check the key in $")
    await asyncio.sleep(0.2)
    assert db(cfg).execute("SELECT state FROM prompts").fetchall() == [("pending",)]
    assert fake.calls == ["a prompt 0"]
    await Controller(sched).resume()  # e.g. the key was re-enabled on the provider's side
    assert await asyncio.wait_for(rt, 10) == 0 and sched.state == "completed"
    stop.set()
    await wt
    assert db(cfg).execute("SELECT state FROM prompts").fetchall() == [("done",)]
    await store.close()


async def test_controller_pause_resume_skip_and_concurrency(tmp_path):
    fake = Fake(delay=0.02)
    cfg, store, writer, sched = await build(tmp_path, {"a": 40, "b": 10}, fake)
    ctl = Controller(sched)
    stop = asyncio.Event()
    wt = asyncio.create_task(writer.run(stop))
    await ctl.pause("a")
    await ctl.skip("b")
    rt = asyncio.create_task(sched.run())
    await asyncio.sleep(0.3)
    assert fake.calls == []
    snap = ctl.snapshot()
    assert snap.dataset("a").state == "paused" and snap.dataset("b").state == "skipped"
    assert snap.dataset("b").skipped == 10 and snap.dataset("b").pending == 0
    await ctl.set_concurrency("short", 1)
    await ctl.resume("a")
    await asyncio.sleep(0.2)
    assert 0 < len(fake.calls) and fake.max_in_flight == 1
    await ctl.set_concurrency("short", 8)
    assert await asyncio.wait_for(rt, 20) == 0
    assert fake.max_in_flight > 1
    assert all(c.startswith("a") for c in fake.calls) and len(fake.calls) == 40
    stop.set()
    await wt
    doc = collect_status(cfg.run.dir)
    b = doc["datasets"][1]
    assert (b["state"], b["skipped"], b["done"]) == ("skipped", 10, 0)
    with pytest.raises(ValueError, match="unknown dataset 'zz'"):
        await ctl.pause("zz")
    with pytest.raises(ValueError, match="unknown class"):
        await ctl.set_concurrency("huge", 3)
    await store.close()


async def test_abort_returns_prompts_to_pending_and_they_complete_later(tmp_path):
    fake = Fake()
    fake.gate = asyncio.Event()
    cfg, store, writer, sched = await build(tmp_path, {"a": 3}, fake)
    stop = asyncio.Event()
    wt = asyncio.create_task(writer.run(stop))
    rt = asyncio.create_task(sched.run())
    await asyncio.sleep(0.2)
    assert sched.snapshot().in_flight == 3
    await Controller(sched).pause()
    assert Controller(sched).abort() == "3 in-flight request(s) aborted"
    await asyncio.sleep(0.1)
    snap = sched.snapshot()
    assert snap.in_flight == 0 and snap.dataset("a").pending == 3
    fake.gate.set()
    await Controller(sched).resume()
    assert await asyncio.wait_for(rt, 10) == 0
    stop.set()
    await wt
    c = db(cfg)
    assert c.execute("SELECT COUNT(*) FROM results").fetchone() == (3,)
    assert c.execute("SELECT COUNT(*) FROM attempts WHERE outcome='aborted'").fetchone() == (3,)
    await store.close()


async def test_status_invariant_holds_while_running(tmp_path):
    fake = Fake(delay=0.03)
    cfg, store, writer, sched = await build(tmp_path, {"a": 60, "b": 30}, fake)
    stop = asyncio.Event()
    wt = asyncio.create_task(writer.run(stop))
    rt = asyncio.create_task(sched.run())
    seen_in_flight = 0
    while not rt.done():
        await asyncio.sleep(0.04)
        doc = collect_status(cfg.run.dir)
        for d in doc["datasets"]:
            assert d["done"] + d["failed"] + d["skipped"] + d["pending"] + d["in_flight"] == d["prompts"], d
            seen_in_flight = max(seen_in_flight, d["in_flight"])
    assert seen_in_flight > 0
    stop.set()
    await wt
    await store.close()
