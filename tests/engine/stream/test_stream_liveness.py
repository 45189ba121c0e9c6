"""A stream worker stopped (``SIGSTOP``) and continued: heartbeats, the frozen figure, stalls judged
by the time the worker ran (engine/stream/liveness.py, worker.py, pool.py).

Real parts: a worker process started by the pool, the simulator on loopback, real ``SIGSTOP`` /
``SIGCONT``. Before issue 34 a worker stopped longer than ``stall_s`` woke to find every stream's
stall timer overdue: each stream the provider had finished meanwhile (its bytes waiting in the
socket) was cut as ``stall: no bytes for 2s`` and bought again, and ``status`` showed the worker alive.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import time

import pytest
from waiting import async_wait_for

from engine.client.accumulate import StreamProgress
from engine.client.types import ChatRequest, Completion, ErrorClass, RequestError
from engine.sim import SimConfig, SimThread
from engine.stream import journal
from engine.stream.liveness import FREEZE_S, HEARTBEAT_S, SILENT_S, FreezeClock, is_silent
from engine.stream.pool import THAW_HEARTBEATS, StreamWorkerPool
from engine.stream.wire import encode

#: Seconds the worker is held stopped: over the stall timeout, and long enough to be shown frozen.
STOP_S = SILENT_S + 3.0
STALL_S = 2.0


def _req(i: int, max_tokens: int = 60) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": f"question {i}"}], max_tokens=max_tokens,
                       body={"model": "m"}, ref=(i, "a", f"a-{i:06d}"))


async def _silent_server():
    """Accepts connections, reads the request, never answers (a real stall)."""
    async def handle(reader, writer):
        try:
            await reader.read(1 << 20)
            await asyncio.sleep(3600)
        except asyncio.CancelledError:  # the test's loop closes
            writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}/v1"


async def test_a_stopped_worker_stores_what_finished_meanwhile_and_is_shown_frozen(tmp_path):
    # 20 streams of at most 80 tokens at 20 tokens/s (4 s at most): each is fully sent within the stop
    sim = SimThread(SimConfig(seed=3, latency_ms=5, tokens_per_s=20, mean_completion_tokens=60))
    url = sim.start()
    srv, silent_url = await _silent_server()
    events: list[tuple[str, str]] = []
    pool = StreamWorkerPool(1, [url, silent_url], "k", {"max_connections": 64, "stall_timeout_s": STALL_S},
                            run_dir=tmp_path, on_event=lambda level, msg: events.append((level, msg)))
    await pool.start()
    pid = pool.figures().workers[0].pid
    try:
        progs = [StreamProgress() for _ in range(20)]
        tasks = [asyncio.create_task(pool.complete(_req(i, max_tokens=80), p)) for i, p in enumerate(progs)]
        await async_wait_for(lambda: all(p.chars_received for p in progs), 20, what="every stream streaming")
        stalled = asyncio.create_task(pool.send(1, _req(99)))  # a server that never answers: a real stall
        await asyncio.sleep(0.3)  # the request reached the worker
        os.kill(pid, signal.SIGSTOP)
        try:
            await async_wait_for(lambda: pool.figures().frozen == 1, SILENT_S + 5, what="the worker shown frozen")
            w = pool.figures().workers[0]
            # streams the stop holds (the silent one included), read once the worker is stopped: a result
            # it sent just before the stop may still be read by the run after the signal
            held = w.in_flight
            assert held >= 5  # most of the 20 (under load some finish before the stop)
            assert (w.alive, w.frozen) == (True, True) and w.silent_s >= SILENT_S
            assert sum(not t.done() for t in tasks) == held - 1 and not stalled.done()
            await asyncio.sleep(max(0.0, STOP_S - SILENT_S - 1))
            assert sim.ledger.outcomes.get("completed") == 20  # the provider finished them all meanwhile
        finally:
            os.kill(pid, signal.SIGCONT)
        out = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        errors = [o for o in out if isinstance(o, BaseException)]
        assert errors == []  # before: 19-20 x "stall HTTP 200: no bytes for 2s (stall timeout)"
        assert all(isinstance(c, Completion) and sim.ledger.generation(c.generation_id) is not None for c in out)
        assert dict(sim.ledger.outcomes) == {"completed": 20}  # none cut, none bought again
        recs = [r for seg in journal.segments(tmp_path / "journal") for r in journal.read_records(seg)]
        assert sorted(r["k"] for r in recs) == sorted(f"a-{i:06d}" for i in range(20))
        # the silent stream is still judged stalled, by the time the worker ran
        with pytest.raises(RequestError) as e:
            await asyncio.wait_for(stalled, 30)
        assert e.value.error_class is ErrorClass.STALL
        f = pool.figures()
        assert (f.frozen, f.workers[0].frozen, f.workers[0].silent_s, f.restarts) == (0, False, 0.0, 0)
        assert [lv for lv, _ in events] == ["warning", "info"]  # one warning per silence, one line when back
        assert f"stream worker 0 (pid {pid}) has not answered for" in events[0][1]
        assert f"{held} stream(s) wait for it" in events[0][1]
        log = (tmp_path / "stream-workers.log").read_text()
        assert log.count("the loop did not run for") == 1
        # the line states the worker's own stopped time (as its log does) and the silence the run saw
        own = float(re.search(r"the loop did not run for ([0-9.]+)s", log).group(1))
        assert SILENT_S + 1.0 <= own <= STOP_S + 3.0  # held stopped about STOP_S - 1 s
        back = re.fullmatch(rf"stream worker 0 \(pid {pid}\) answers again after ([0-9.]+)s of silence; its own "
                            rf"loop did not run for {own:.1f}s \(the worker's figure\), which its streams' stall "
                            rf"and total timeouts leave out", events[1][1])
        assert back is not None, events[1][1]  # before: "... did not run for 0s in all" when a result came first
        assert own - 0.5 <= float(back.group(1)) <= own + HEARTBEAT_S + 1.0
    finally:
        await pool.aclose()
        srv.close()
        sim.stop()


async def test_a_frozen_worker_gets_no_new_request_while_another_answers(tmp_path):
    sim = SimThread(SimConfig(seed=3, latency_ms=5, tokens_per_s=200, mean_completion_tokens=20))
    url = sim.start()
    pool = StreamWorkerPool(2, [url], "k", {"max_connections": 64}, run_dir=tmp_path)
    await pool.start()
    victim = pool.figures().workers[0].pid
    try:
        os.kill(victim, signal.SIGSTOP)
        try:
            await async_wait_for(lambda: pool.figures().workers[0].frozen, SILENT_S + 5, what="worker 0 frozen")
            done = await asyncio.wait_for(asyncio.gather(*(pool.complete(_req(i)) for i in range(6))), 30)
            assert len(done) == 6  # all served by worker 1 (worker 0 would have held them until continued)
            assert pool.figures().workers[0].in_flight == 0
        finally:
            os.kill(victim, signal.SIGCONT)
        await async_wait_for(lambda: not pool.figures().workers[0].frozen, 10, what="worker 0 answering")
    finally:
        await pool.aclose()
        sim.stop()


async def _pool_reading_a_peer(events: list) -> tuple[StreamWorkerPool, socket.socket, asyncio.Task]:
    """A pool whose worker 0 is read from a socket this test writes frames into (no process): it was
    last heard 12 s ago, after a heartbeat saying its loop had not run for 5 s in all, and is frozen."""
    pool = StreamWorkerPool(1, ["http://127.0.0.1:9/v1"], None, {}, on_event=lambda lv, m: events.append((lv, m)))
    w = pool._workers[0]
    ours, peer = socket.socketpair()
    w.reader, w.writer = await asyncio.open_connection(sock=ours)
    w.alive, w.frozen, w.stopped_s, w.pid = True, True, 5.0, 4242
    w.heard = time.monotonic() - 12.0
    return pool, peer, asyncio.create_task(pool._read(w))


async def _close(pool: StreamWorkerPool, peer: socket.socket, reading: asyncio.Task) -> None:
    pool._closing = True  # the peer's end is no death to replace
    peer.close()
    await asyncio.wait_for(reading, 5)
    pool._workers[0].writer.close()


async def test_the_line_after_a_stop_waits_for_the_heartbeat_that_carries_it():
    # a worker stopped in the middle of its loop's callbacks sends their frames (a progress report,
    # a stale heartbeat) before the heartbeat that carries the stop: the line waits for that one
    events: list[tuple[str, str]] = []
    pool, peer, reading = await _pool_reading_a_peer(events)
    try:
        peer.sendall(encode(("prog", [])) + encode(("hb", 5.0)))
        await async_wait_for(lambda: pool._workers[0].thaw is not None and pool._workers[0].thaw[2] == 1, 5,
                             what="the stale heartbeat read")
        assert not pool._workers[0].frozen and events == []  # given requests again; no line yet
        peer.sendall(encode(("hb", 16.8)))  # stopped 11.8 s this time (16.8 s in all)
        await async_wait_for(lambda: events, 5, what="the line")
        assert len(events) == 1 and events[0][0] == "info"
        back = re.fullmatch(r"stream worker 0 \(pid 4242\) answers again after ([0-9.]+)s of silence; its own loop "
                            r"did not run for 11\.8s \(the worker's figure\), which its streams' stall and total "
                            r"timeouts leave out", events[0][1])
        assert back is not None, events[0][1]  # before: "after 12s; its loop did not run for 5s in all"
        assert 12.0 <= float(back.group(1)) < 14.0
        assert (pool._workers[0].stopped_s, pool._workers[0].thaw) == (16.8, None)
    finally:
        await _close(pool, peer, reading)


async def test_a_silence_without_a_stop_of_the_worker_says_its_loop_kept_running():
    events: list[tuple[str, str]] = []
    pool, peer, reading = await _pool_reading_a_peer(events)
    try:
        peer.sendall(b"".join(encode(("hb", 5.0)) for _ in range(THAW_HEARTBEATS - 1)))
        await asyncio.sleep(0.3)
        assert events == []
        peer.sendall(encode(("hb", 5.0)))
        await async_wait_for(lambda: events, 5, what="the line")
        assert "answers again after 12." in events[0][1] or "answers again after 13." in events[0][1]
        assert "; its own loop kept running (it was not stopped), which its streams' stall" in events[0][1]
    finally:
        await _close(pool, peer, reading)


def test_freeze_clock_leaves_out_only_gaps_the_loop_did_not_run():
    c = FreezeClock(threshold_s=FREEZE_S)
    assert c.observe(100.0, 100.1, 0.1) == 0.0  # the first wait: nothing to compare with
    assert c.observe(100.15, 100.25, 0.1) == 0.0  # 50 ms of callbacks, a wait as asked
    assert c.observe(100.3, 100.3, 5.0) == 0.0  # a wait cut short by I/O
    # stopped in a wait of 0.1 s for 30 s: the oversleep and the callbacks before it
    assert c.observe(100.35, 130.45, 0.1) == pytest.approx(30.05)
    # stopped while running callbacks (12 s between two waits)
    assert c.observe(142.45, 142.5, 0.05) == pytest.approx(12.0)
    assert c.observe(142.6, 142.6, None) == 0.0  # no timeout: only the callbacks' time can count
    assert (c.freezes, c.frozen_s, c.last_gap_s) == (2, pytest.approx(42.05), pytest.approx(12.0))
    assert not is_silent(10.0, 6.0) and is_silent(10.0, 10.0 - SILENT_S)
