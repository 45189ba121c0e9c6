"""B1 baseline: the ``openai`` SDK's ``AsyncOpenAI`` doing what the bare httpx loop does: a
semaphore of ``--concurrency``, ``chat.completions.create(stream=True)`` per prompt, chunks iterated
(the SDK parses each into a ``ChatCompletionChunk``) and nothing stored; ``max_retries=0``.

The SDK's default pool allows 1,000 connections (100 kept alive), which would cap the test below
2,000 concurrent streams, so its HTTP client gets limits equal to the concurrency (as a user
running 2,000 streams would have to configure it).

Run alone (with a simulator already listening)::

    python -m bench.baseline_openai --worker --base-url http://127.0.0.1:PORT/api/v1 --prompts p.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from bench.common import Window, emit, raise_fd_limit, read_prompt_messages


async def main(a: argparse.Namespace) -> dict:
    import openai

    try:
        import httpx2 as hx  # openai >= 3 is built on httpx2
    except ImportError:  # pragma: no cover - older SDKs use httpx
        import httpx as hx
    raise_fd_limit()
    prompts = read_prompt_messages(a.prompts, a.n)
    http = openai.DefaultAsyncHttpxClient(
        limits=hx.Limits(max_connections=a.concurrency, max_keepalive_connections=a.concurrency), timeout=None)
    client = openai.AsyncOpenAI(base_url=a.base_url, api_key="sk-bench-local", max_retries=0, http_client=http,
                                timeout=None)
    sem = asyncio.Semaphore(a.concurrency)
    done = errors = events = 0
    last_error = ""
    win = Window(a.start_after, len(prompts) - a.concurrency, a.seconds, a.open_at_s)

    async def run(msgs) -> None:
        nonlocal done, errors, events, last_error
        try:
            stream = await client.chat.completions.create(
                model="moonshotai/kimi-k2.5", messages=msgs, max_tokens=a.max_tokens, stream=True,
                temperature=1.0, top_p=0.95)
            async for _chunk in stream:
                events += 1
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
    _feed = asyncio.create_task(feeder())  # held: the event loop keeps only a weak reference to a task
    await win.watch(lambda: done, lambda: events, lambda: a.concurrency - sem._value)
    res = win.result()
    res.update(errors=errors, completed=done, elapsed_s=time.monotonic() - t_start, last_error=last_error,
               sdk=f"openai {openai.__version__}")
    emit(res)
    os._exit(0)  # do not wait for the streams still open (the window is closed)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true")
    p.add_argument("--base-url", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--concurrency", type=int, default=2000)
    p.add_argument("--n", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=8000)
    p.add_argument("--start-after", type=int, default=500)
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--open-at-s", type=float, default=None, help="open the window after this many seconds at the latest")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))  # emits its RESULT and exits
