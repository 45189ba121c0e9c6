"""B1 baseline: the minimal httpx streaming loop. A semaphore of ``--concurrency``, one POST per
prompt with ``stream: true``, SSE lines parsed (``data:`` lines decoded with ``json.loads``) and
nothing stored, no retries, no accounting.

``--transport default``: one ``httpx.AsyncClient`` with one connection pool whose limits are raised
to the concurrency (the obvious way to write it). ``--transport sharded``: the same loop over the
engine's :class:`engine.client.pool.ShardedTransport` (many small pools), to separate the cost of
httpcore's pool bookkeeping at 2,000 connections from the cost of the engine itself.

Run alone (with a simulator already listening)::

    python -m bench.baseline_httpx --worker --base-url http://127.0.0.1:PORT/api/v1 --prompts p.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

from bench.common import LagProbe, Window, emit, lag_stats, raise_fd_limit, read_prompt_messages

HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-bench-local"}
BODY_EXTRA = {"model": "moonshotai/kimi-k2.5", "temperature": 1.0, "top_p": 0.95}


def make_client(kind: str, concurrency: int):
    import httpx

    if kind == "sharded":
        from engine.client.pool import ShardedTransport

        return httpx.AsyncClient(transport=ShardedTransport(max_connections=concurrency), timeout=None)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return httpx.AsyncClient(limits=limits, timeout=None)


events = 0
"""SSE data events received (all requests)."""


async def one(client, url: str, messages, max_tokens: int) -> None:
    global events
    body = {**BODY_EXTRA, "messages": messages, "max_tokens": max_tokens, "stream": True}
    async with client.stream("POST", url, content=json.dumps(body).encode(),
                             headers=HEADERS) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                json.loads(data)
                events += 1


async def main(a: argparse.Namespace) -> dict:
    raise_fd_limit()
    prompts = read_prompt_messages(a.prompts, a.n)
    url = a.base_url.rstrip("/") + "/chat/completions"
    client = make_client(a.transport, a.concurrency)
    sem = asyncio.Semaphore(a.concurrency)
    done = errors = 0
    last_error = ""
    win = Window(a.start_after, len(prompts) - a.concurrency, a.seconds, a.open_at_s)

    async def run(msgs) -> None:
        nonlocal done, errors, last_error
        try:
            await one(client, url, msgs, a.max_tokens)
            done += 1
        except Exception as e:  # a baseline counts, it does not retry
            errors += 1
            last_error = f"{type(e).__name__}: {e}"[:300]
        finally:
            sem.release()

    async def feeder() -> None:
        tasks = set()
        for msgs in prompts:
            await sem.acquire()
            t = asyncio.create_task(run(msgs))
            tasks.add(t)
            t.add_done_callback(tasks.discard)

    t_start = time.monotonic()
    probe = LagProbe().start() if a.lag else None
    _feed = asyncio.create_task(feeder())  # held: the event loop keeps only a weak reference to a task
    if probe:  # lag samples of the window only
        async def clear_at_open() -> None:
            while win.t0 is None:
                await asyncio.sleep(0.01)
            probe.take()

        asyncio.create_task(clear_at_open())
    await win.watch(lambda: done, lambda: events, lambda: a.concurrency - sem._value)
    res = win.result()
    if probe:
        res["lag"] = lag_stats(probe.take())
    res.update(errors=errors, completed=done, elapsed_s=time.monotonic() - t_start, transport=a.transport, last_error=last_error)
    emit(res)
    os._exit(0)  # do not wait for the streams still open (the window is closed)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true")
    p.add_argument("--base-url", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--concurrency", type=int, default=2000)
    p.add_argument("--n", type=int, default=None, help="prompts to read (default: all)")
    p.add_argument("--max-tokens", type=int, default=8000)
    p.add_argument("--start-after", type=int, default=500)
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--open-at-s", type=float, default=None, help="open the window after this many seconds at the latest")
    p.add_argument("--transport", choices=["default", "sharded"], default="default")
    p.add_argument("--lag", action="store_true", help="run an event-loop lag probe and report its window figures")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))  # emits its RESULT and exits
