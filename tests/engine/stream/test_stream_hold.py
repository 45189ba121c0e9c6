"""A pause or skip reaches the stream workers at once (issue 37): the requests handed to a worker and
not sent yet are held back (``unsent``), never reach the provider, and go back to the run.

Real parts: a worker process started by the pool, the simulator on loopback counting the requests it
receives. A worker's connections are capped (32), so the requests past them wait unsent in its
connection pool: those are what a hold must cut.
"""

from __future__ import annotations

import asyncio

import pytest

from engine.client.types import ChatRequest
from engine.sim import SimConfig, SimThread
from engine.stream.pool import StreamWorkerPool
from engine.stream.wire import StreamHeld

#: Connections of the one worker: ``max_connections`` 16 -> 16 + 16 per worker (engine.stream.pool).
CONNS = 32


def _req(i: int, dataset: str = "a") -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": f"question {i}"}], max_tokens=4000,
                       body={"model": "m"}, ref=(i, dataset, f"{dataset}-{i:06d}"))


async def _until(cond, what: str, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def slow_sim():
    """Streams of ~3,000 tokens at 20 tokens/s: every stream lasts the whole test."""
    s = SimThread(SimConfig(seed=3, latency_ms=5, tokens_per_s=20, mean_completion_tokens=3000))
    s.start()
    yield s
    s.stop()


async def _cancel(tasks) -> list:
    for t in tasks:
        t.cancel()
    return await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_run_hold_cuts_what_the_worker_has_not_sent_and_none_of_it_ever_reaches_the_server(slow_sim):
    pool = StreamWorkerPool(1, [slow_sim.base_url], "k", {"max_connections": 16})
    await pool.start()
    try:
        sending = [asyncio.create_task(pool.complete(_req(i))) for i in range(CONNS)]
        await _until(lambda: slow_sim.ledger.requests == CONNS, "the first streams")
        queued = [asyncio.create_task(pool.complete(_req(100 + i))) for i in range(8)]
        await _until(lambda: pool.figures().workers[0].unsent == 8, "a heartbeat counting 8 unsent")
        assert slow_sim.ledger.requests == CONNS  # they wait for a connection in the worker

        pool.hold(True)
        out = await asyncio.wait_for(asyncio.gather(*queued, return_exceptions=True), 5)
        assert all(isinstance(e, StreamHeld) for e in out), out
        assert not any(t.done() for t in sending)  # the streams already sent go on
        with pytest.raises(StreamHeld):  # while held, a new request is refused before any frame
            await pool.complete(_req(200))
        await _cancel(sending)  # every connection is free now: a held request that was only waiting would go
        await asyncio.sleep(0.5)
        assert slow_sim.ledger.requests == CONNS
        f = pool.figures()
        assert (f.held_back, f.workers[0].in_flight) == (8, 0)

        pool.hold(False)  # released: requests leave again
        t = asyncio.create_task(pool.complete(_req(300)))
        await _until(lambda: slow_sim.ledger.requests == CONNS + 1, "the request after the release")
        await _cancel([t])
        await _until(lambda: pool.figures().unsent_peak >= 8, "the peak of unsent requests")
    finally:
        await pool.aclose()


async def test_a_dataset_hold_cuts_only_that_datasets_unsent_requests(slow_sim):
    pool = StreamWorkerPool(1, [slow_sim.base_url], "k", {"max_connections": 16})
    await pool.start()
    try:
        sending = [asyncio.create_task(pool.complete(_req(i, "b"))) for i in range(CONNS)]
        await _until(lambda: slow_sim.ledger.requests == CONNS, "the first streams")
        queued_a = [asyncio.create_task(pool.complete(_req(100 + i, "a"))) for i in range(4)]
        queued_b = [asyncio.create_task(pool.complete(_req(200 + i, "b"))) for i in range(4)]
        await asyncio.sleep(0.3)  # every request is in the worker, waiting for a connection

        pool.hold(False, {"a"})
        out = await asyncio.wait_for(asyncio.gather(*queued_a, return_exceptions=True), 5)
        assert all(isinstance(e, StreamHeld) for e in out), out
        assert not any(t.done() for t in queued_b)  # the other dataset's requests still wait to go
        with pytest.raises(StreamHeld):
            await pool.complete(_req(300, "a"))
        await _cancel(sending[:4])  # 4 connections free: b's queued requests take them, a's held ones never
        await _until(lambda: slow_sim.ledger.requests == CONNS + 4, "b's queued requests sent")
        await asyncio.sleep(0.5)
        assert slow_sim.ledger.requests == CONNS + 4 and pool.figures().held_back == 4
        await _cancel(sending[4:] + queued_b)
    finally:
        await pool.aclose()


async def test_the_clients_gate_runs_once_before_the_first_byte_and_what_it_raises_sends_nothing():
    from engine.client.chat import ChatClient

    s = SimThread(SimConfig(seed=3, latency_ms=5, tokens_per_s=0, mean_completion_tokens=20))
    s.start()
    calls = []

    async def refuse() -> None:
        calls.append("refused")
        raise StreamHeld("held")

    async def allow() -> None:
        calls.append("allowed")

    try:
        async with ChatClient(s.base_url, "k") as client:
            with pytest.raises(StreamHeld):
                await client.complete(_req(1), gate=refuse)
            assert s.ledger.requests == 0  # connected, not one byte of the request written
            c = await client.complete(_req(2), gate=allow)
            assert c.finish_reason in ("stop", "length") and s.ledger.requests == 1
        assert calls == ["refused", "allowed"]
    finally:
        s.stop()


async def test_a_hold_the_run_already_wrote_is_read_before_a_request_leaves():
    """The worker's loop has not read the ``hold`` frame yet as a request reaches its first byte: the
    gate lets the command loop read it first, and the request is held."""
    import socket

    from engine.stream.hold import Hold
    from engine.stream.wire import WorkerInit, encode, open_frames
    from engine.stream.worker import Worker, _Stream

    run_end, worker_end = socket.socketpair()
    reader, writer = await open_frames(worker_end, 2 ** 20)  # as the worker opens its socket
    w = Worker(WorkerInit(slot=0, endpoints=("http://127.0.0.1:9/api/v1",), api_key=None), reader, writer,
               worker_end)
    serving = asyncio.create_task(w.serve())
    try:
        await asyncio.sleep(0.05)  # serving: waiting for a frame
        run_end.sendall(encode(("hold", Hold(False, frozenset({"a"})))))  # written, not read yet
        assert not w.holding
        with pytest.raises(StreamHeld):
            await w._gate(_Stream(1, _req(1, "a")))
        assert w.holding == Hold(False, frozenset({"a"}))
        await w._gate(_Stream(2, _req(2, "b")))  # another dataset's request goes
    finally:
        run_end.sendall(encode(("close",)))
        await asyncio.wait_for(serving, 5)
        run_end.close()
