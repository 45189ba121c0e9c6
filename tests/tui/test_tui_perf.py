"""Measurements (printed, never asserted on time): the dashboard's CPU at 2 Hz with 8 idle datasets,
and key-to-engine-state latency with ~2,000 simulated streams in flight.

Run with ``pytest -m slow -s tests/tui/test_tui_perf.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time

import pytest
from waiting import until

from tui.app import DashboardApp
from tui.testing import sim_config

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # measurements: `make slow` runs them alone, with -s


@pytest.fixture(autouse=True)
def _only_when_asked(request):
    """These take minutes: run them with ``-m slow`` (or RUN_SLOW=1), not in the default suite."""
    if "slow" not in (request.config.option.markexpr or "") and os.environ.get("RUN_SLOW") != "1":
        pytest.skip("slow measurement: run with -m slow")


def prompts_file(path, n: int, tag: str) -> str:
    """Write ``n`` distinct short user prompts (format ``text``) to ``path``."""
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": f"[{tag} {i}] Write one sentence about the number {i * 7919 % 100003}."}) + "\n")
    return str(path)


async def test_cpu_at_2hz_with_8_idle_datasets(tmp_path):
    datasets = [{"name": f"ds{i}", "path": prompts_file(tmp_path / f"d{i}.jsonl", 40, f"d{i}"), "format": "text"}
                for i in range(8)]
    cfg = sim_config(tmp_path, datasets=datasets, concurrency=8, commit_interval_s=1.0)
    app = DashboardApp(cfg, refresh_hz=2.0)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.in_flight > 0, 15, "dispatch")
        await pilot.press("P")  # pause the run: the engine goes idle once in-flight requests drain
        await until(pilot, lambda: app.snapshot.state == "paused" and app.snapshot.in_flight == 0, 30, "idle")
        await pilot.pause(1.0)
        polls, renders = app.polls, app.renders
        c0, w0 = time.process_time(), time.perf_counter()
        await pilot.pause(10.0)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        n = app.polls - polls
        # the same idle engine with the dashboard (almost) not polling: the engine's own share
        app.refresh_hz = 0.05
        await pilot.pause(0.6)
        c0, w0 = time.process_time(), time.perf_counter()
        await pilot.pause(10.0)
        cpu_engine, wall_engine = time.process_time() - c0, time.perf_counter() - w0
        app.refresh_hz = 2.0
        # cost of one poll + render, measured directly
        t0 = time.perf_counter()
        for _ in range(20):
            app.request_poll()
        per_poll_ms = (time.perf_counter() - t0) / 20 * 1000
    print(f"\n[perf] 8 datasets, engine idle (paused), 2 Hz: process CPU {cpu:.3f}s over {wall:.1f}s = "
          f"{100 * cpu / wall:.2f}% of one core; {n} polls ({app.renders - renders} renders); "
          f"one snapshot+render {per_poll_ms:.2f} ms; same idle engine with polling off: "
          f"{100 * cpu_engine / wall_engine:.2f}% -> the dashboard's share at 2 Hz is about "
          f"{100 * (cpu / wall - cpu_engine / wall_engine):.2f}% of one core")
    assert n >= 15  # the timer really ran at ~2 Hz


@pytest.mark.parametrize("target", [500, 2000])
async def test_key_to_state_latency_with_many_streams_in_flight(tmp_path, target):
    """``target`` concurrent streams of ~20 s (20 tok/s) from the in-process simulator."""
    datasets = [{"name": "bulk", "path": prompts_file(tmp_path / "bulk.jsonl", 3 * target, "bulk"), "format": "text"},
                {"name": "other", "path": prompts_file(tmp_path / "other.jsonl", 50, "other"), "format": "text"}]
    cfg = sim_config(tmp_path, datasets=datasets, concurrency=target, tokens_per_s=20, mean_completion_tokens=400,
                     commit_interval_s=1.0)
    app = DashboardApp(cfg, refresh_hz=2.0)
    async with app.run_test(size=(160, 48)) as pilot:
        t_start = time.monotonic()
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.in_flight >= 0.95 * target, 120,
                    f"{target} in flight", step=0.2)
        ramp = time.monotonic() - t_start
        sched = app.host.scheduler
        await pilot.pause(2.0)
        in_flight = sched.snapshot().in_flight
        lat: dict[str, list[float]] = {"paused": [], "running": []}
        for i in range(6):
            want = "paused" if i % 2 == 0 else "running"
            seen = asyncio.get_running_loop().create_future()
            t0 = time.perf_counter()

            async def watch(want: str = want, seen: asyncio.Future = seen, t0: float = t0) -> None:
                while sched.snapshot().dataset("bulk").state != want:
                    await asyncio.sleep(0.002)
                seen.set_result(time.perf_counter() - t0)

            task = asyncio.create_task(watch())
            await pilot.press("p")
            lat[want].append(await asyncio.wait_for(seen, 60))
            await task
            await pilot.pause(0.7)
        # snapshot and render cost at this load
        t0 = time.perf_counter()
        for _ in range(20):
            sched.snapshot()
        snap_ms = (time.perf_counter() - t0) / 20 * 1000
        t0 = time.perf_counter()
        for _ in range(10):
            app.request_poll()
        poll_ms = (time.perf_counter() - t0) / 10 * 1000
        lag = app.snapshot.loop_lag_ms
        c0, w0 = time.process_time(), time.perf_counter()
        await pilot.pause(3.0)
        cpu = (time.process_time() - c0) / (time.perf_counter() - w0)
    all_ms = [x * 1000 for v in lat.values() for x in v]
    print(f"\n[perf] {in_flight} streams in flight (ramp {ramp:.1f}s): key p -> engine state "
          f"median {statistics.median(all_ms):.1f} ms, max {max(all_ms):.1f} ms "
          f"(pause {[round(x * 1000, 1) for x in lat['paused']]}, resume {[round(x * 1000, 1) for x in lat['running']]}); "
          f"snapshot() {snap_ms:.2f} ms; snapshot+render {poll_ms:.2f} ms; loop lag {lag:.0f} ms; "
          f"process CPU {100 * cpu:.0f}% (engine + in-process simulator + dashboard)")
    assert in_flight >= 0.9 * target
