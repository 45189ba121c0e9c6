"""The stream workers (engine/stream): requests in worker processes, journals, a worker's death, recovery.

Real parts: worker processes started by the pool, the simulator on loopback, a real SQLite store,
``kill -9``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest
from helpers import completion, make_config, seeded_store

from engine.client.accumulate import StreamProgress
from engine.client.types import ChatRequest, ErrorClass, RequestError
from engine.sim import SimConfig, SimThread
from engine.stream import journal
from engine.stream.pool import StreamWorkerPool, default_stream_workers
from engine.stream.recover import KILLED_MESSAGE, prune, recover_cut_streams, recover_results
from engine.stream.wire import StreamWorkerLost


def _req(i: int, max_tokens: int = 200) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": f"question {i}"}], max_tokens=max_tokens,
                       body={"model": "m"}, ref=(i, "a", f"a-{i:06d}"))


@pytest.fixture
def sim():
    s = SimThread(SimConfig(seed=3, latency_ms=5, tokens_per_s=100, mean_completion_tokens=60))
    url = s.start()
    yield s, url
    s.stop()


async def test_completions_come_back_journaled_with_batched_progress(sim, tmp_path):
    s, url = sim
    pool = StreamWorkerPool(2, [url], "k", {"max_connections": 64}, run_dir=tmp_path)
    await pool.start()
    try:
        assert pool.figures().alive == 2
        progs = [StreamProgress() for _ in range(20)]
        done = await asyncio.gather(*(pool.complete(_req(i), p) for i, p in enumerate(progs)))
        assert len(done) == 20 and all(c.finish_reason in ("stop", "length") for c in done)
        # the caller's progress holds what the worker last reported (figures of the finished stream)
        assert all(p.status == 200 and p.generation_id.startswith("gen-") for p in progs)
        # every completion is in a journal, under its prompt's key, before it was returned
        recs = [r for seg in journal.segments(tmp_path / "journal") for r in journal.read_records(seg)]
        assert sorted(r["k"] for r in recs) == sorted(f"a-{i:06d}" for i in range(20))
        by_key = {r["k"]: journal.completion_from_dict(r["c"]) for r in recs}
        assert all(by_key[f"a-{i:06d}"] == done[i] for i in range(20))
        # both workers took a share
        assert len({seg.name.split("-")[0] for seg in journal.segments(tmp_path / "journal")}) == 2
    finally:
        await pool.aclose()
    assert pool.figures().alive == 0
    assert not list((tmp_path / "journal").glob("inflight-*"))  # a clean end leaves no ledger


async def test_cancel_closes_the_stream_in_the_worker():
    s = SimThread(SimConfig(seed=3, latency_ms=5, tokens_per_s=100, mean_completion_tokens=3000))
    url = s.start()
    pool = StreamWorkerPool(1, [url], "k", {"max_connections": 16})
    await pool.start()
    try:
        p = StreamProgress()
        t = asyncio.create_task(pool.complete(_req(1, max_tokens=5000), p))
        await asyncio.sleep(0.5)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        assert p.tokens_received > 0  # what had streamed before the cancel
        for _ in range(50):
            if s.ledger.outcomes.get("client_dropped"):
                break
            await asyncio.sleep(0.05)
        assert s.ledger.outcomes.get("client_dropped") == 1  # the server saw the disconnect
        assert pool.figures().workers[0].in_flight == 0 and pool._reqs == {}  # the worker's `gone` was heard
    finally:
        await pool.aclose()
        s.stop()


async def test_a_killed_worker_returns_its_requests_and_is_replaced(tmp_path):
    s = SimThread(SimConfig(seed=3, latency_ms=5, tokens_per_s=100, mean_completion_tokens=3000))
    url = s.start()
    events = []
    pool = StreamWorkerPool(2, [url], "k", {"max_connections": 64}, run_dir=tmp_path,
                            on_event=lambda level, msg: events.append((level, msg)))
    await pool.start()
    try:
        progs = [StreamProgress() for _ in range(30)]
        tasks = [asyncio.create_task(pool.complete(_req(i, max_tokens=4000), p)) for i, p in enumerate(progs)]
        for _ in range(200):  # every stream has reported tokens
            await asyncio.sleep(0.05)
            if all(p.chars_received for p in progs):
                break
        victim = pool.figures().workers[0]
        assert victim.in_flight > 0
        os.kill(victim.pid, signal.SIGKILL)
        for _ in range(200):
            await asyncio.sleep(0.05)
            if sum(t.done() for t in tasks) >= victim.in_flight:
                break
        await asyncio.sleep(0.2)
        assert sum(t.done() for t in tasks) == victim.in_flight  # the other worker's streams go on
        for t in tasks:
            t.cancel()
        out = await asyncio.gather(*tasks, return_exceptions=True)
        lost = [e for e in out if isinstance(e, StreamWorkerLost)]
        assert len(lost) == victim.in_flight
        assert all(e.error_class is ErrorClass.DISCONNECT and f"pid {victim.pid}" in e.message for e in lost)
        assert all(e.tokens_received > 0 for e in lost)  # their streamed spend is known
        assert sum(1 for e in out if isinstance(e, asyncio.CancelledError)) == 30 - len(lost)
        for _ in range(100):
            if pool.figures().alive == 2:
                break
            await asyncio.sleep(0.05)
        f = pool.figures()
        assert (f.alive, f.restarts, f.lost_requests) == (2, 1, len(lost))
        assert f.workers[0].pid != victim.pid
        assert events and events[-1][0] == "warning" and "killed by signal 9" in events[-1][1]
        assert f"{len(lost)} in-flight request(s) returned to pending" in events[-1][1]
        assert not (tmp_path / "journal" / f"inflight-w0-{victim.pid}.json").exists()  # accounted, removed
        # the new worker serves
        p = StreamProgress()
        t = asyncio.create_task(pool.complete(_req(99), p))
        for _ in range(200):
            await asyncio.sleep(0.05)
            if p.chars_received:
                break
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)
        assert s.ledger.requests == 31 and p.chars_received > 0  # 30 before the kill, 1 after
    finally:
        await pool.aclose()
        s.stop()


async def _silent_server():
    """A server that accepts connections and never answers (a stream that never finishes)."""
    conns = []

    async def handle(reader, writer):
        conns.append(writer)
        await reader.read(1 << 20)
        await asyncio.sleep(3600)

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}/v1"


async def test_a_completion_journaled_before_the_worker_died_is_delivered(tmp_path):
    """A worker killed between its journal's fsync and sending the result: the run takes the
    completion from the journal instead of returning the prompt to pending (it was paid)."""
    srv, url = await _silent_server()
    pool = StreamWorkerPool(1, [url], "k", {"max_connections": 16}, run_dir=tmp_path)
    await pool.start()
    try:
        tasks = [asyncio.create_task(pool.complete(_req(i))) for i in range(3)]
        await asyncio.sleep(0.3)
        w = pool.figures().workers[0]
        rids = sorted(pool._reqs)  # the request ids the worker holds
        seg = journal.segments(tmp_path / "journal", f"w0-{w.pid}-")[0]
        c = completion("journaled answer")
        with open(seg, "ab") as f:  # what the worker writes and fsyncs before it sends "done"
            f.write(journal.record_line(rids[1], (1, "a", "a-000001"), 1.0, 2.0, c))
        os.kill(w.pid, signal.SIGKILL)
        out = await asyncio.gather(*tasks, return_exceptions=True)
        assert out[1] == c
        assert isinstance(out[0], StreamWorkerLost) and isinstance(out[2], StreamWorkerLost)
        assert pool.figures().recovered == 1 and pool.lost_requests == 2
    finally:
        await pool.aclose()
        srv.close()


async def test_recover_stores_journaled_results_once_and_counts_cut_streams(tmp_path):
    cfg = make_config(tmp_path)
    store = await seeded_store(cfg, {"a": 5})
    try:
        states = await store.prompt_states([("a", f"a-{i:06d}") for i in range(5)])
        jdir = tmp_path / "run" / "journal"
        w = journal.JournalWriter(jdir, 0, 4242)
        done = completion("stored from the journal", completion_tokens=33, cost=0.25)
        ids = {i: states[("a", f"a-{i:06d}")][0] for i in range(5)}
        w.write([journal.record_line(7, (ids[0], "a", "a-000000"), 10.0, 11.0, done),
                 journal.record_line(8, (ids[0], "a", "a-000000"), 10.0, 11.5, done),  # twice: stored once
                 b'{"rid": 9, "p": 1, "d": "a", "k": "a-0000'])  # a line cut by the kill
        w.close()
        journal.write_ledger(journal.ledger_path(jdir, 0, 4242), [
            [ids[0], "a", "a-000000", 30, "gen-x", "P", 10.0],  # finished and journaled: not lost
            [ids[1], "a", "a-000001", 400, "gen-y", "P", 10.0],  # cut by the kill
        ])
        price = lambda p, c: (p + c) * 1e-3  # noqa: E731
        rec = await recover_results(cfg.run.dir, store, price)
        assert (rec.stored, rec.lost_streams) == (1, 0) and "1 completion(s)" in rec.line()
        cut, streams = await recover_cut_streams(cfg.run.dir, store, price)
        assert (cut.stored, cut.lost_streams) == (0, 1) and "1 stream(s)" in cut.line()
        assert cut.lost_usd == pytest.approx((10 + 400) * 1e-3)
        assert streams == [("a", 400, pytest.approx(0.41), "short")]
        cur = await store.conn.execute("SELECT key, content, completion_tokens, cost_usd, usage_source FROM results")
        assert await cur.fetchall() == [("a-000000", "stored from the journal", 33, 0.25, "reported")]
        cur = await store.conn.execute("SELECT prompt_id, outcome, tokens_received, cost_usd, message, generation_id "
                                       "FROM attempts ORDER BY id")
        rows = await cur.fetchall()
        assert [(r[0], r[1]) for r in rows] == [(ids[0], "ok"), (ids[1], "aborted")]
        assert rows[1][2:] == (400, pytest.approx(0.41), KILLED_MESSAGE, "gen-y")
        assert (await store.prompt_states([("a", "a-000000")]))[("a", "a-000000")][1] == "done"
        assert list(jdir.iterdir()) == []  # ingested: journals and ledgers removed
        assert (await recover_results(cfg.run.dir, store, price)).line() is None  # nothing twice
        assert (await recover_cut_streams(cfg.run.dir, store, price))[0].line() is None
    finally:
        await store.close()


async def test_prune_keeps_a_segment_while_one_of_its_prompts_is_pending(tmp_path):
    cfg = make_config(tmp_path)
    store = await seeded_store(cfg, {"a": 2})
    try:
        jdir = tmp_path / "run" / "journal"
        w = journal.JournalWriter(jdir, 0, 1, segment_bytes=1)  # one line per segment
        states = await store.prompt_states([("a", "a-000000"), ("a", "a-000001")])
        for i in range(2):
            w.write([journal.record_line(i, (states[("a", f"a-{i:06d}")][0], "a", f"a-{i:06d}"), 1.0, 2.0,
                                         completion())])
        w.close()
        await store.conn.execute("UPDATE prompts SET state='done' WHERE key='a-000000'")
        await store.conn.commit()
        assert len(journal.segments(jdir)) == 3  # each full after one line, and the empty one opened last
        assert await prune(cfg.run.dir, store) == 2  # the stored one's and the empty one
        left = [r["k"] for s in journal.segments(jdir) for r in journal.read_records(s)]
        assert left == ["a-000001"]
        assert await prune(cfg.run.dir, store, keep=lambda p: True) == 0
    finally:
        await store.close()


def test_default_workers_leave_the_first_core_to_the_control_plane():
    assert default_stream_workers() == max(1, len(os.sched_getaffinity(0)) - 1)


def test_worker_init_never_shows_the_key():
    from engine.stream.wire import WorkerInit, error_fields, error_from_fields

    assert "sk-secret" not in repr(WorkerInit(0, ("http://x",), "sk-secret"))
    e = RequestError(ErrorClass.RATE_LIMIT, "slow down", status=429, retry_after_s=2.5, provider="P",
                     generation_id="g", tokens_received=7, partial_cost_usd=0.1)
    back = error_from_fields(json.loads(json.dumps(error_fields(e))))
    assert (back.error_class, back.status, back.retry_after_s, back.tokens_received, back.partial_cost_usd) == (
        ErrorClass.RATE_LIMIT, 429, 2.5, 7, 0.1)


async def test_a_completion_that_finished_as_its_caller_was_cancelled_is_returned_not_dropped(sim, tmp_path,
                                                                                              monkeypatch):
    """Issue 33: completions that finished during an abort were discarded and bought again. The
    completion's ``done`` arrived in the same step of the loop as the abort that cancelled the
    awaiting task (an abort queued just before the worker's frame was read): the task raised
    CancelledError and the paid completion was dropped (its prompt back to pending, bought again).
    Now the cancelled task returns it."""
    import engine.stream.pool as pool_mod

    s, url = sim
    pool = StreamWorkerPool(1, [url], "k", {"max_connections": 16}, run_dir=tmp_path)
    await pool.start()
    tasks: list[asyncio.Task] = []
    finished = pool_mod._finished

    def abort_as_it_finishes(p, c):  # runs as the `done` frame is handled, just before the result is set
        finished(p, c)
        asyncio.get_running_loop().call_soon(tasks[0].cancel)

    monkeypatch.setattr(pool_mod, "_finished", abort_as_it_finishes)
    try:
        tasks.append(asyncio.create_task(pool.complete(_req(1))))
        c = await asyncio.wait_for(tasks[0], 10)
        assert c.finish_reason in ("stop", "length") and c.generation_id.startswith("gen-")
        assert not tasks[0].cancelled() and s.ledger.outcomes.get("completed") == 1
        assert pool._reqs == {} and pool.late_results == 0
    finally:
        await pool.aclose()

