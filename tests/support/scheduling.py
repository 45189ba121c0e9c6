"""The scheduler on a real SQLite store with a scripted provider: :class:`Fake` (per-prompt outcomes,
calls and concurrency recorded), :func:`build` (config, seeded store, writer, scheduler) and
:func:`run_all` (the scheduler to its end with the writer committing)."""

from __future__ import annotations

import asyncio

from helpers import completion, make_config, seeded_store

from engine.client.retry import RetryPolicy
from engine.run.scheduler import Scheduler
from engine.storage.writer import StoreWriter


class Fake:
    """Scripted provider: per prompt text, a list of outcomes; records calls and concurrency."""

    def __init__(self, delay: float = 0.0, script: dict | None = None):
        self.delay = delay
        self.script = script or {}
        self.calls: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.gate: asyncio.Event | None = None

    async def complete(self, req, progress=None):
        text = req.messages[-1]["content"]
        self.calls.append(text)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(self.delay)
            outs = self.script.get(text)
            if outs:
                out = outs.pop(0)
                if isinstance(out, BaseException):
                    raise out
            return completion(text=f"answer to {text}", completion_tokens=len(text))
        finally:
            self.in_flight -= 1


async def build(tmp_path, counts, fake, long_every=0, **cfgkw):
    cfg = make_config(tmp_path, **cfgkw)
    store = await seeded_store(cfg, counts, long_every=long_every)
    writer = StoreWriter(store, 0.05, live=lambda: sched.live())
    sched = Scheduler(cfg, store, writer, fake.complete, policy=RetryPolicy(max_attempts=3, base_s=0.001, max_s=0.002))
    await sched.load()
    return cfg, store, writer, sched


async def run_all(sched, writer):
    stop = asyncio.Event()
    wt = asyncio.create_task(writer.run(stop))
    code = await asyncio.wait_for(sched.run(), 30)
    stop.set()
    await wt
    return code
