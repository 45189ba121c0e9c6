"""The run's side of a hold (issue 37): the scheduler hands the stream workers the hold state in the
step that pauses, resumes or skips, and a request held back unsent goes back to pending with no
attempt counted (engine.run.attempt), then is sent once the run goes on.

Engine-level, on a real SQLite store with a scripted provider (``scheduling.Fake``).
"""

from __future__ import annotations

import sqlite3

from scheduling import Fake, build, run_all

from engine.run.controller import Controller
from engine.stream.wire import StreamHeld


async def test_pause_resume_and_skip_hand_the_workers_the_hold_state_at_once(tmp_path):
    fake = Fake()
    cfg, store, writer, sched = await build(tmp_path, {"a": 2, "b": 2}, fake)
    seen: list[tuple[bool, frozenset[str], str]] = []
    sched.hold = lambda run, datasets: seen.append((run, datasets, str(sched.state)))
    ctl = Controller(sched)
    await ctl.pause()
    assert seen[-1][:2] == (True, frozenset())
    await ctl.skip("b")
    assert seen[-1][:2] == (True, frozenset({"b"}))
    await ctl.resume()
    assert seen[-1][:2] == (False, frozenset({"b"}))  # the skipped dataset stays held
    await ctl.pause("a")
    assert seen[-1][:2] == (False, frozenset({"a", "b"}))
    await ctl.resume("a")
    assert seen[-1][:2] == (False, frozenset({"b"}))
    await store.close()


async def test_a_request_held_unsent_returns_to_pending_without_an_attempt_and_is_sent_later(tmp_path):
    held: set[str] = set()

    class Holding(Fake):
        async def complete(self, req, progress=None):
            text = req.messages[-1]["content"]
            if text not in held:  # the first time: a pause reached the worker before it was sent
                held.add(text)
                raise StreamHeld("held in the stream worker before it was sent")
            return await super().complete(req, progress)

    fake = Holding()
    cfg, store, writer, sched = await build(tmp_path, {"a": 5}, fake)
    assert await run_all(sched, writer) == 0
    await store.close()
    db = sqlite3.connect(cfg.run.dir / "store.sqlite")
    try:
        attempts = [n for (n,) in db.execute("SELECT attempts FROM results")]
        rows = sorted(db.execute("SELECT n, outcome FROM attempts"))
    finally:
        db.close()
    assert len(held) == 5 and len(fake.calls) == 5  # each held once, then sent once
    assert attempts == [1] * 5  # a held request is no attempt: each result took its first
    assert {r[0] for r in rows} == {1} and len(rows) == 5 and "error" not in {r[1] for r in rows}, rows


async def test_a_stop_or_drain_holds_what_the_workers_have_not_sent(tmp_path):
    # a drain waits for the streams in flight; what was handed to a worker and not sent yet must not
    # leave after the stop shows (before: no hold was sent at a stop, those requests went out)
    fake = Fake()
    cfg, store, writer, sched = await build(tmp_path, {"a": 2}, fake)
    seen: list[tuple[bool, frozenset[str]]] = []
    sched.hold = lambda run, datasets: seen.append((run, datasets))
    sched.ending.stop("drain requested", abort=False)
    assert seen == [(True, frozenset())]
    await store.close()


def test_status_json_shows_the_requests_held_back_and_waiting_unsent():
    from types import SimpleNamespace

    from engine.run.observe import _workers_live
    from engine.stream.figures import PoolFigures, WorkerFigures

    figs = PoolFigures(2, 2, 0, 0, 0, (WorkerFigures(0, 11, True, 40, unsent=7), WorkerFigures(1, 12, True, 38)),
                       held_back=310, unsent_peak=123)
    doc = _workers_live(SimpleNamespace(workers=lambda: figs))
    assert (doc["held_back"], doc["unsent_peak"]) == (310, 123)
    assert [w["unsent"] for w in doc["workers"]] == [7, 0]
