"""The ``/generation`` true-ups of estimated bills end before the HTTP client closes, and a read of a
closed client is never a stray traceback (trial: ``Task exception was never retrieved ...
RuntimeError: Cannot send a request, as the client has been closed`` in datagen.log at abort exits).

Real parts: a real ``httpx.AsyncClient`` against the scripted server on 127.0.0.1 (its ``/generation``
slow, or the client closed under the true-up), the real :class:`engine.run.accounting.Accounting`
(its spend, telemetry and writer are not reached: no bill lands).
"""

from __future__ import annotations

import asyncio
import gc
import time

import httpx
import pytest
from casesrv import CaseServer, ok_reply

from engine.run.accounting import Accounting


def getter(http: httpx.AsyncClient, base: str):
    async def get_json(path: str, params: dict | None = None):
        r = await http.get(base + path, params=params)
        return r.json()
    return get_json


def accounting(get_json) -> Accounting:
    return Accounting(spend=None, telemetry=None, writer=None, clock=time.monotonic, get_json=get_json)  # type: ignore[arg-type]


async def test_settle_cancels_slow_true_ups_within_its_bound_and_starts_no_more():
    with CaseServer(ok_reply, generation_delay_s=5.0) as srv:
        async with httpx.AsyncClient() as http:
            acc = accounting(getter(http, srv.base_url))
            for i in range(20):
                acc._trueup("d", f"gen-{i}", 0.01, "P", first_wait_s=0.0)
            for _ in range(50):  # reads under way (the server holds each 5 s)
                if srv.generation_reads >= 5:
                    break
                await asyncio.sleep(0.05)
            assert srv.generation_reads >= 5 and len(acc.trueups) == 20
            t0 = time.monotonic()
            assert await acc.settle(0.5) == (20, 0)
            took = time.monotonic() - t0
            assert 0.5 <= took < 1.5, took
            assert not acc.trueups and acc.closed
            acc._trueup("d", "gen-late", 0.01, "P", first_wait_s=0.0)  # after settle: nothing starts
            assert not acc.trueups
            assert acc.settled == 0


async def test_a_true_up_reading_a_closed_client_leaves_no_task_exception():
    seen: list[dict] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
    try:
        with CaseServer(ok_reply) as srv:
            http = httpx.AsyncClient()
            acc = accounting(getter(http, srv.base_url))
            await http.aclose()  # the client closed under a true-up (what Job.close did at exit)
            acc._trueup("d", "gen-1", 0.01, "P", first_wait_s=0.0)
            task = next(iter(acc.trueups))
            await asyncio.wait([task], timeout=5)
            assert task.done() and not task.cancelled() and task.exception() is None
            with pytest.raises(RuntimeError, match="client has been closed"):
                await http.get(srv.base_url + "/generation")  # what the true-up met
            del task
            gc.collect()
            await asyncio.sleep(0)
        assert seen == []
        assert acc.settled == 0  # the estimate stays (the next start trues it up)
    finally:
        loop.set_exception_handler(None)
