"""The "hold" runs behind B2 (event-loop lag), B3 (memory per in-flight request) and B7 (dashboard
CPU): the engine with 8 datasets holding 2,000 long-lived streams open against the simulator (own
process, paced at ``TOKENS_PER_S`` tokens/s per stream), headless or under the dashboard
(``tui.app.DashboardApp`` in Textual's headless ``run_test``, 160x48, refreshing at 2 Hz).

One worker process per run, in phases:

1. ``probe`` (headless runs only): the lag probe alone on an idle event loop, before anything is
   imported or opened: B2's baseline.
2. ``idle``: the job prepared (store, ingest, client) with the whole run paused (nothing in
   flight); CPU share and lag measured, RSS at the end = B3's "before".
3. ramp: resume; wait until 98% of the 2,000 slots are in flight and their responses' headers
   arrived (the stream workers' progress reports the status), then ``SETTLE_S``.
4. ``load``: CPU share, lag, completions; RSS and the text held by in-flight requests (characters
   received so far, from each request's ``StreamProgress``) at the end.
5. ``keys`` (dashboard runs with ``--keys``: B10): still under full load, ``P`` then ``R`` pressed
   through the pilot five times, and the time until the header shows the new state (:func:`key_phase`).

The lag probe is a coroutine on the same loop that sleeps 10 ms and records how late it woke.

The HTTP streams run in the engine's stream-worker processes (``engine.stream``): ``[run]
stream_workers`` is set to :func:`bench.common.default_stream_workers` and the workers are pinned to
:func:`bench.common.stream_cpus` (the CPUs neither the engine nor the simulator uses; unpinned when
none is left, as on 2 cores). ``cpu_share`` is the engine process's; ``workers_cpu_share`` the
workers' (summed); ``rss`` the engine process's plus its workers' (``rss_main``, ``rss_workers``).
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
    PROFILE,
    LagProbe,
    SimProcess,
    StreamWorkers,
    UICpuMeter,
    WorkerError,
    emit,
    engine_config,
    lag_stats,
    log,
    percentile,
    placement,
    raise_fd_limit,
    rss_bytes,
    run_worker,
    sim_args,
    stream_env,
    stream_note,
    stream_settings,
    tempdir,
    write_prompts,
)

CONCURRENCY = 2000
TOKENS_PER_S = 20
MEAN_TOKENS = 2000
N_DATASETS = 8
PROBE_S, IDLE_S, SETTLE_S = (3.0, 5.0, 3.0) if PROFILE == "full" else (2.0, 3.0, 2.0)
LOAD_S = 10.0 if PROFILE == "full" else 6.0
HTTPX_OPEN_AT_S = 10.0  # the bare loop has its 2,000 streams up within a few seconds
SIZE = (160, 48)
#: B10: cycles of ``P`` (pause all) then ``R`` (resume all) pressed under full load, the pause between
#: two presses, and how long one press may take to show.
KEY_CYCLES = 5
KEY_GAP_S = 1.0
KEY_TIMEOUT_S = 10.0


METER: UICpuMeter | None = None
WORKERS: StreamWorkers | None = None


async def phase(probe: LagProbe, seconds: float, count=None) -> dict[str, Any]:
    """Measure CPU share, lag, where the main thread is (sampled) and (optionally) completions."""
    probe.take()
    u0, g0 = (METER.cpu_s, METER.gc_s) if METER else (0.0, 0.0)
    w0 = WORKERS.cpu_s() if WORKERS else 0.0
    c0, t0 = time.process_time(), time.perf_counter()
    n0 = count() if count else 0
    await asyncio.sleep(seconds)
    c1, t1 = time.process_time(), time.perf_counter()
    out = {"cpu_share": (c1 - c0) / (t1 - t0), "wall_s": t1 - t0, **lag_stats(probe.take())}
    if WORKERS:  # the stream workers' CPU (summed over them; not in cpu_share, the engine process's)
        out["workers_cpu_share"] = (WORKERS.cpu_s() - w0) / (t1 - t0)
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


def rss_now() -> dict[str, int]:
    """RSS of the engine process, of its stream workers (summed) and both (bytes)."""
    main = rss_bytes()
    workers = WORKERS.rss() if WORKERS else 0
    return {"rss": main + workers, "rss_main": main, "rss_workers": workers}


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
    n_workers, worker_cpus = stream_settings()  # [run] stream_workers and their CPUs, from the orchestrator
    cfg = engine_config(tmp, a.base_url, datasets(tmp), concurrency=a.concurrency, max_tokens=8000, stall_s=600,
                        run={"stream_workers": n_workers} if n_workers else None)
    holder: dict[str, Any] = {}
    live: set = set()
    orig_prepare = runner.prepare

    async def prepare(cfg_, out=sys.stdout):  # pause the run before the first dispatch
        job = await orig_prepare(cfg_, out)
        sched = job.scheduler
        sched.pause_all("bench: idle phase")
        orig = sched.complete

        async def tracked(req, progress=None):
            live.add(progress)
            try:
                return await orig(req, progress=progress)
            finally:
                live.discard(progress)

        sched.complete = tracked
        global WORKERS
        WORKERS = StreamWorkers(job.pool, worker_cpus).start()  # off the engine's CPU (bench.common.stream_cpus)
        holder["job"] = job
        return job

    headless.prepare = prepare  # run_headless calls the name it imported
    if a.mode == "dashboard":
        import tui.host

        tui.host.prepare_job = prepare  # the name tui.host imported from engine.api
        from tui.app import DashboardApp

        app = DashboardApp(cfg, refresh_hz=2.0, install_signals=False)
        async with app.run_test(size=SIZE) as pilot:
            await phases(res, probe, holder, live, a, app, pilot)
    else:
        asyncio.get_running_loop().create_task(headless.run_headless(cfg, io.StringIO(), install_signals=False))
        await phases(res, probe, holder, live, a, None, None)
    return res


async def phases(res: dict, probe: LagProbe, holder: dict, live: set, a: argparse.Namespace, app: Any,
                 pilot: Any) -> None:
    t_end = time.monotonic() + 60
    while "job" not in holder:
        if time.monotonic() > t_end:
            raise RuntimeError("the engine did not start")
        await asyncio.sleep(0.02)
    sched = holder["job"].scheduler
    await asyncio.sleep(1.0)
    renders0 = app.renders if app else 0
    res["idle"] = await phase(probe, IDLE_S)
    res["idle"].update(rss_now())
    if app:
        res["idle"]["renders_per_s"] = (app.renders - renders0) / res["idle"]["wall_s"]
    rts = list(sched.datasets.values())
    sched.resume_all()
    t_ramp = time.monotonic()
    while sum(rt.in_flight for rt in rts) < 0.98 * a.concurrency and time.monotonic() - t_ramp < 60:
        await asyncio.sleep(0.05)
    res["ramp_dispatch_s"] = time.monotonic() - t_ramp
    # Dispatched is not streaming: a request handed to a stream worker is in flight at once, its
    # connection and response headers come later (seconds for 2,000 on a busy worker). Wait for the
    # headers (the status the worker's batched progress reports) of 98% of the slots.
    while (sum(1 for p in list(live) if p.status) < 0.98 * a.concurrency
           and time.monotonic() - t_ramp < 90):
        await asyncio.sleep(0.05)
    res["ramp_s"] = time.monotonic() - t_ramp
    await asyncio.sleep(SETTLE_S)
    renders0 = app.renders if app else 0
    res["load"] = await phase(probe, LOAD_S, lambda: sum(rt.done for rt in rts))
    in_flight = sum(rt.in_flight for rt in rts)
    progs = list(live)
    text = sum(p.chars_received for p in progs)
    res["load"].update(**rss_now(), in_flight=in_flight, text_chars=text, live_requests=len(progs),
                       live_with_headers=sum(1 for p in progs if p.status),
                       live_with_text=sum(1 for p in progs if p.chars_received),
                       errors=dict(sched.snapshot().errors))
    if app:
        res["load"]["renders_per_s"] = (app.renders - renders0) / res["load"]["wall_s"]
    if WORKERS:
        res["stream_workers"] = WORKERS.figures()
    if app and a.keys:
        res["keys"] = await key_phase(app, pilot, probe, lambda: sum(rt.in_flight for rt in rts))
    emit(res)
    sys.stdout.flush()
    os._exit(0)  # do not drain 2,000 streams


async def key_phase(app: Any, pilot: Any, probe: LagProbe, in_flight) -> dict[str, Any]:
    """B10: under full load, press ``P`` (pause all) then ``R`` (resume all) :data:`KEY_CYCLES` times
    through the pilot, :data:`KEY_GAP_S` apart; per press, the milliseconds from the press until

    - ``snapshot_ms``: the app pulled a snapshot with the new run state (``app.host.snapshot()``);
    - ``header_ms``: the header's text says it (``PAUSED`` / ``RUNNING``: ``HeaderPane.update`` called);
    - ``painted_ms``: the compositor drew the header after that update (its ``render_lines``): the
      state is on the screen. This is the figure.

    The press starts a task (``pilot.press`` also waits for the screen to process its events) and a
    2 ms polling loop on the same event loop watches; a press that does not show within
    :data:`KEY_TIMEOUT_S` counts as None."""
    from tui.panes.header import HeaderPane

    header = app.main_screen.query_one(HeaderPane)
    paints: list[float] = []
    updates: list[tuple[float, str]] = []
    orig_render, orig_update = header.render_lines, header.update

    def render_lines(crop):  # the compositor's call
        paints.append(time.perf_counter())
        return orig_render(crop)

    def update(content="", *args, **kw):  # Static.update
        updates.append((time.perf_counter(), getattr(content, "plain", str(content))))
        return orig_update(content, *args, **kw)

    host = app.host
    pulls: list[tuple[float, str | None]] = []
    orig_snapshot = host.snapshot

    def snapshot():
        snap = orig_snapshot()
        pulls.append((time.perf_counter(), snap.state if snap is not None else None))
        return snap

    header.render_lines, header.update, host.snapshot = render_lines, update, snapshot
    presses: list[dict[str, Any]] = []
    probe.take()
    try:
        for _ in range(KEY_CYCLES):
            for key, state in (("P", "paused"), ("R", "running")):
                await asyncio.sleep(KEY_GAP_S)
                presses.append(await _press(pilot, key, state, paints, updates, pulls, in_flight))
    finally:
        del header.render_lines, header.update, host.snapshot  # back to the class's methods
    lag = lag_stats(probe.take())
    out: dict[str, Any] = {"presses": presses, "lag_p99_ms": lag["p99_ms"], "lag_p50_ms": lag["p50_ms"]}
    for k in ("snapshot_ms", "header_ms", "painted_ms"):
        v = [p[k] for p in presses if p.get(k) is not None]
        out[k] = {"p50": percentile(v, 50) if v else None, "max": max(v) if v else None, "n": len(v),
                  "missed": len(presses) - len(v)}
    return out


async def _press(pilot: Any, key: str, state: str, paints: list[float], updates: list[tuple[float, str]],
                 pulls: list[tuple[float, str | None]], in_flight) -> dict[str, Any]:
    word = state.upper()
    n_upd, n_pull = len(updates), len(pulls)
    r: dict[str, Any] = {"key": key, "state": state, "in_flight": in_flight(), "snapshot_ms": None,
                         "header_ms": None, "painted_ms": None}
    t0 = time.perf_counter()
    task = asyncio.get_running_loop().create_task(pilot.press(key))
    t_upd = None
    while time.perf_counter() - t0 < KEY_TIMEOUT_S:
        if r["snapshot_ms"] is None:
            t_pull = next((t for t, st in pulls[n_pull:] if st == state), None)
            if t_pull is not None:
                r["snapshot_ms"] = 1000 * (t_pull - t0)
        if t_upd is None:
            t_upd = next((t for t, text in updates[n_upd:] if word in text), None)
            if t_upd is not None:
                r["header_ms"] = 1000 * (t_upd - t0)
        if t_upd is not None:
            t_paint = next((t for t in paints if t >= t_upd), None)  # the first paint after the update
            if t_paint is not None:
                r["painted_ms"] = 1000 * (t_paint - t0)
                break
        await asyncio.sleep(0.002)
    try:
        await asyncio.wait_for(task, KEY_TIMEOUT_S)
    except Exception as e:  # a press that fails is reported, the run goes on
        r["press_error"] = f"{type(e).__name__}: {e}"[:200]
    return r


def run(reps: int, modes: tuple[str, ...] = ("headless", "dashboard", "httpx"),
        keys: bool = True) -> dict[str, list[dict]]:
    """Run the hold workers ``reps`` times per mode (interleaved); returns ``{mode: [results]}``.

    Mode ``httpx`` is the bare httpx loop (``bench/baseline_httpx.py``, ShardedTransport) under the
    same load with the same lag probe: the floor set by the HTTP stack, for context. The engine runs
    with :func:`bench.common.default_stream_workers` stream workers on :func:`bench.common.stream_cpus`.
    ``keys``: the dashboard runs end with B10's key presses (:func:`key_phase`), after the load phase."""
    client_cpu, sim_cpu = placement()
    log(f"hold: engine with {stream_note()}")
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
                    if mode == "dashboard" and keys:
                        args.append("--keys")
                s0, t0 = sim.cpu_s(), time.monotonic()
                try:
                    r = run_worker(module, args, cpu=client_cpu, timeout=240,
                                   env=stream_env() if module == "hold" else None)
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
                    + (f", stream workers CPU {_f(100 * ld['workers_cpu_share'])}%" if ld.get("workers_cpu_share")
                       is not None else "")
                    + (f"; idle CPU {_f(100 * r['idle']['cpu_share'])}%" if "idle" in r else "")
                    + (f"; keys: painted p50 {_f(r['keys']['painted_ms']['p50'])} ms max "
                       f"{_f(r['keys']['painted_ms']['max'])} ms" if "keys" in r else ""))
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
    p.add_argument("--keys", action="store_true", help="dashboard: end with B10's key presses")
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
