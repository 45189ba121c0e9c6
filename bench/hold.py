"""The "hold" runs behind B2 (event-loop lag), B3 (memory per in-flight request) and B7 (dashboard
CPU): the engine with 8 datasets holding 2,000 long-lived streams open against the simulator (own
process, paced at ``TOKENS_PER_S`` tokens/s per stream), headless or under the dashboard
(``tui.app.DashboardApp`` in Textual's headless ``run_test``, 160x48, refreshing at 2 Hz).

One worker process per run, in phases:

1. ``probe`` (headless runs only): the lag probe alone on an idle event loop, before anything is
   imported or opened: B2's baseline.
2. ``idle``: the job prepared (store, ingest, client) with the whole run paused (nothing in
   flight); CPU share and lag measured, RSS at the end = B3's "before".
3. ramp: resume; wait until all 2,000 slots are in flight, then ``SETTLE_S``.
4. ``load``: CPU share, lag, completions; RSS and the text held by in-flight requests (characters
   received so far, from each request's ``StreamProgress``) at the end.

The lag probe is a coroutine on the same loop that sleeps 10 ms and records how late it woke.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import (
    PROFILE, LagProbe, SimProcess, UICpuMeter, WorkerError, emit, engine_config, lag_stats, log, placement, raise_fd_limit,
    rss_bytes, run_worker, sim_args, tempdir, write_prompts,
)

CONCURRENCY = 2000
TOKENS_PER_S = 20
MEAN_TOKENS = 2000
N_DATASETS = 8
PROBE_S, IDLE_S, SETTLE_S = (3.0, 5.0, 3.0) if PROFILE == "full" else (2.0, 3.0, 2.0)
LOAD_S = 10.0 if PROFILE == "full" else 6.0
HTTPX_OPEN_AT_S = 10.0  # the bare loop has its 2,000 streams up within a few seconds
SIZE = (160, 48)


METER: UICpuMeter | None = None


async def phase(probe: LagProbe, seconds: float, count=None) -> dict[str, Any]:
    """Measure CPU share, lag, where the main thread is (sampled) and (optionally) completions."""
    probe.take()
    u0, g0 = (METER.cpu_s, METER.gc_s) if METER else (0.0, 0.0)
    c0, t0 = time.process_time(), time.perf_counter()
    n0 = count() if count else 0
    await asyncio.sleep(seconds)
    c1, t1 = time.process_time(), time.perf_counter()
    out = {"cpu_share": (c1 - c0) / (t1 - t0), "wall_s": t1 - t0, **lag_stats(probe.take())}
    if METER:
        out["dashboard_cpu_share"] = (METER.cpu_s - u0) / (t1 - t0)
        out["gc_share"] = (METER.gc_s - g0) / (t1 - t0)
    if count:
        out["req_per_s"] = (count() - n0) / (t1 - t0)
    return out


def datasets(tmp: Path) -> list[dict]:
    """8 datasets: the first large enough to keep 2,000 streams busy, the others small."""
    out = []
    for i in range(N_DATASETS):
        n = 4000 if i == 0 else 200
        out.append({"name": f"ds{i + 1}", "path": str(write_prompts(tmp / f"ds{i + 1}.jsonl", n, tag=f"hold{i} ")),
                    "format": "text"})
    return out


async def worker(a: argparse.Namespace) -> dict[str, Any]:
    global METER
    raise_fd_limit()
    probe = LagProbe().start()
    if a.mode == "dashboard":
        METER = UICpuMeter().install(asyncio.get_running_loop())
    res: dict[str, Any] = {"mode": a.mode}
    if a.probe_idle:
        res["probe"] = await phase(probe, PROBE_S)

    import engine.run.headless as headless
    import engine.run.runner as runner

    tmp = Path(a.tmp)
    cfg = engine_config(tmp, a.base_url, datasets(tmp), concurrency=a.concurrency, max_tokens=8000, stall_s=600)
    holder: dict[str, Any] = {}
    live: set = set()
    orig_prepare = runner.prepare

    async def prepare(cfg_, out=sys.stdout):  # pause the run before the first dispatch
        job = await orig_prepare(cfg_, out)
        sched = job.scheduler
        sched.pause_all("bench: idle phase")
        orig = sched._complete

        async def tracked(req, progress=None):
            live.add(progress)
            try:
                return await orig(req, progress=progress)
            finally:
                live.discard(progress)

        sched._complete = tracked
        holder["job"] = job
        return job

    headless.prepare = prepare  # run_headless calls the name it imported
    if a.mode == "dashboard":
        import tui.host

        tui.host.prepare = prepare
        from tui.app import DashboardApp

        app = DashboardApp(cfg, refresh_hz=2.0, install_signals=False)
        async with app.run_test(size=SIZE):
            await phases(res, probe, holder, live, a, app)
    else:
        asyncio.get_running_loop().create_task(headless.run_headless(cfg, io.StringIO(), install_signals=False))
        await phases(res, probe, holder, live, a, None)
    return res


async def phases(res: dict, probe: LagProbe, holder: dict, live: set, a: argparse.Namespace, app: Any) -> None:
    t_end = time.monotonic() + 60
    while "job" not in holder:
        if time.monotonic() > t_end:
            raise RuntimeError("the engine did not start")
        await asyncio.sleep(0.02)
    sched = holder["job"].scheduler
    await asyncio.sleep(1.0)
    renders0 = app.renders if app else 0
    res["idle"] = await phase(probe, IDLE_S)
    res["idle"]["rss"] = rss_bytes()
    if app:
        res["idle"]["renders_per_s"] = (app.renders - renders0) / res["idle"]["wall_s"]
    rts = list(sched.datasets.values())
    sched.resume_all()
    t_ramp = time.monotonic()
    while sum(rt.in_flight for rt in rts) < 0.98 * a.concurrency and time.monotonic() - t_ramp < 60:
        await asyncio.sleep(0.05)
    res["ramp_s"] = time.monotonic() - t_ramp
    await asyncio.sleep(SETTLE_S)
    renders0 = app.renders if app else 0
    res["load"] = await phase(probe, LOAD_S, lambda: sum(rt.done for rt in rts))
    in_flight = sum(rt.in_flight for rt in rts)
    text = sum(p.chars_received for p in list(live))
    res["load"].update(rss=rss_bytes(), in_flight=in_flight, text_chars=text, live_requests=len(live),
                       errors=dict(sched.snapshot().errors))
    if app:
        res["load"]["renders_per_s"] = (app.renders - renders0) / res["load"]["wall_s"]
    emit(res)
    sys.stdout.flush()
    os._exit(0)  # do not drain 2,000 streams


def run(reps: int, modes: tuple[str, ...] = ("headless", "dashboard", "httpx")) -> dict[str, list[dict]]:
    """Run the hold workers ``reps`` times per mode (interleaved); returns ``{mode: [results]}``.

    Mode ``httpx`` is the bare httpx loop (``bench/baseline_httpx.py``, ShardedTransport) under the
    same load with the same lag probe: the floor set by the HTTP stack, for context."""
    client_cpu, sim_cpu = placement()
    out: dict[str, list[dict]] = {m: [] for m in modes}
    with tempdir("hold") as tmp, SimProcess(*sim_args(tokens_per_s=TOKENS_PER_S, mean_tokens=MEAN_TOKENS),
                                            cpu=sim_cpu) as sim:
        prompts = write_prompts(tmp / "httpx-prompts.jsonl", 6000, tag="hold0 ")
        for rep in range(reps):
            for mode in modes:
                d = tmp / f"{mode}-{rep}"
                d.mkdir()
                if mode == "httpx":
                    module = "baseline_httpx"
                    args = ["--base-url", sim.base_url, "--prompts", str(prompts), "--transport", "sharded", "--lag",
                            "--concurrency", str(CONCURRENCY), "--start-after", str(10**9),
                            "--open-at-s", str(HTTPX_OPEN_AT_S), "--seconds", str(LOAD_S)]
                else:
                    module = "hold"
                    args = ["--base-url", sim.base_url, "--tmp", str(d), "--mode", mode,
                            "--concurrency", str(CONCURRENCY)]
                    if mode == "headless":
                        args.append("--probe-idle")
                s0, t0 = sim.cpu_s(), time.monotonic()
                try:
                    r = run_worker(module, args, cpu=client_cpu, timeout=180)
                except WorkerError as e:
                    log(f"hold {mode} run {rep + 1}: FAILED: {e}")
                    r = {"error": str(e)[:1000]}
                sim_share = (sim.cpu_s() - s0) / (time.monotonic() - t0)
                if mode == "httpx":  # same shape as the engine's results
                    r = {"load": {**r.get("lag", {}), "cpu_share": r.get("cpu_share"), "req_per_s": r.get("req_per_s"),
                                  "in_flight": r.get("in_flight_mean"), "events_per_s": r.get("events_per_s")},
                         "raw": r}
                r["sim_cpu_share"] = sim_share
                out[mode].append(r)
                ld = r.get("load", {})
                log(f"hold {mode} run {rep + 1}/{reps}: load lag p50 {_f(ld.get('p50_ms'))} ms p99 "
                    f"{_f(ld.get('p99_ms'))} ms, CPU {_f(100 * ld['cpu_share'] if ld.get('cpu_share') else None)}%, "
                    f"in flight {_f(ld.get('in_flight'))}, {_f(ld.get('req_per_s'))} req/s"
                    + (f"; idle CPU {_f(100 * r['idle']['cpu_share'])}%" if "idle" in r else ""))
                time.sleep(1.0)
    return out


def _f(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="hold worker (B2/B3/B7)")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--base-url")
    p.add_argument("--tmp")
    p.add_argument("--mode", choices=["headless", "dashboard"], default="headless")
    p.add_argument("--concurrency", type=int, default=CONCURRENCY)
    p.add_argument("--probe-idle", action="store_true")
    p.add_argument("--reps", type=int, default=1)
    a = p.parse_args(argv)
    if a.worker:
        emit(asyncio.run(worker(a)))
        os._exit(0)
    import json

    print(json.dumps(run(a.reps), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
