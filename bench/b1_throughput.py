"""B1: CPU-seconds per 1,000 completed requests (the headline) and completed streaming requests/s at
2,000 concurrency.

The simulator (own process, own core) streams ~2,000-token completions (mean 2,000, exponential,
``max_tokens`` 8,000) with zero latency and no rate limit, so the client side is the bottleneck.
Contenders, each in a fresh process pinned to the other core, over the SAME prompts in the SAME
order (the simulator's lengths are a function of the prompt, so every contender gets the same
completions):

- ``ours``: the engine's full headless run (``engine.run.headless.run_headless``: ingest, store, batched
  commits, spend accounting, telemetry, supervisor); reconstruction is not in the engine yet. Its HTTP
  streams run in ``[run] stream_workers`` processes (``engine.stream``), set explicitly to
  :func:`bench.common.default_stream_workers` and pinned to the CPUs neither the engine nor the
  simulator uses (unpinned on a 2-core machine, where none is left): :func:`bench.common.stream_cpus`.
  Its CPU is the engine process's plus its stream workers'.
- ``ours-wN`` (the scaling rows): the same with N stream workers, N in :func:`scale_counts` (1, 2; 4 and
  8 with more than 8 cores), each against the bare loop; the count equal to the default reuses ``ours``.
- ``httpx``: the minimal httpx loop (``bench/baseline_httpx.py``) with one connection pool sized to
  the concurrency.
- ``httpx-sharded``: the same loop over the engine's ``ShardedTransport``.
- ``openai``: ``AsyncOpenAI`` (``bench/baseline_openai.py``).

The headline row is CPU-s per 1,000 completed requests of the engine (its process and its stream
workers) vs the bare loop over ``ShardedTransport`` in the same runs, goal <= 1.2x: it does not
depend on how many cores each side had (on 2 cores the bare loop has one to itself, the engine shares
two). The req/s rows and the scaling rows (:func:`scaling_rows`) stay for many-core hosts.

Each process measures a steady-state window (after ``start_after`` completions, for ``seconds`` s)
of completions/s and its own CPU time (all threads; the engine adds its stream workers'). Runs are
interleaved (ours, ours-wN, httpx, httpx-sharded, openai, then again) so drifting machine load hits
them alike.

Run alone: ``python -m bench.b1_throughput [--reps 3] [--seconds 15]``.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import statistics
import sys
import time
from pathlib import Path

from bench.common import (
    PROFILE,
    SimProcess,
    StreamWorkers,
    Window,
    WorkerError,
    cpus,
    default_stream_workers,
    emit,
    engine_config,
    log,
    make_row,
    placement,
    raise_fd_limit,
    ratio_summary,
    run_worker,
    sim_args,
    stream_env,
    stream_note,
    stream_settings,
    summary,
    tempdir,
    write_prompts,
)

CONCURRENCY = 2000
MEAN_TOKENS = 2000
MAX_TOKENS = 8000
N_PROMPTS = 12000
#: The SDK completes only the shortest requests in the first minutes at 2,000 streams, so its window
#: opens at a fixed time and its req/s is estimated from SSE events/s (see :func:`rows`).
OPENAI_OPEN_AT_S = 6.0
OPENAI_WINDOW_S = 6.0  # its starved loop stretches the window anyway (each check waits a loop iteration)
WINDOW_S = 10.0 if PROFILE == "full" else 6.0
START_AFTER = 500 if PROFILE == "full" else 400
#: The simulator's account credits (USD): every run of every contender draws on one account, and its
#: default ($100) ran out in the last repetitions (HTTP 402 in the window) once the runs got faster.
SIM_EXTRA = ["--credits", "1000000000"]
#: The SDK is run at most this many times (each run costs ~35 s of a 15-minute budget; it is a reference).
OPENAI_REPS = 2

CONTENDERS = {
    "ours": ("b1_throughput", []),  # [run] stream_workers = bench.common.default_stream_workers()
    "httpx": ("baseline_httpx", ["--transport", "default"]),
    "httpx-sharded": ("baseline_httpx", ["--transport", "sharded"]),
    "openai": ("baseline_openai", []),
}
#: The scaling rows' contenders (``ours-w1``, ``ours-w2``, ...): the engine with that many stream workers.
SCALE_PREFIX = "ours-w"


def scale_counts() -> list[int]:
    """Stream-worker counts of the scaling rows: 1 and 2, and 4 and 8 on a machine with more than 8
    usable cores."""
    return [1, 2] + ([4, 8] if len(cpus()) > 8 else [])


def contenders() -> dict[str, tuple[str, list[str], int | None]]:
    """``name -> (module, extra args, stream workers)`` in the order each repetition runs them: the
    engine at the bench's default count of stream workers, then each scaling count that differs from
    it, then the baselines (stream workers None)."""
    default = default_stream_workers()
    out: dict[str, tuple[str, list[str], int | None]] = {"ours": (*CONTENDERS["ours"], default)}
    for n in scale_counts():
        if n != default:
            out[f"{SCALE_PREFIX}{n}"] = (*CONTENDERS["ours"], n)
    for k, v in CONTENDERS.items():
        if k != "ours":
            out[k] = (*v, None)
    return out


LABELS = {
    "httpx": "bare httpx loop, one pool (limits=2,000)",
    "httpx-sharded": "bare httpx loop over ShardedTransport",
    "openai": "openai AsyncOpenAI (pool limits=2,000)",
}


# ---- worker: the engine -----------------------------------------------------------------------------
async def engine_worker(a: argparse.Namespace) -> dict:
    raise_fd_limit()
    from engine.run.headless import run_headless, setup_file_logging

    tmp = Path(a.tmp)
    # The anomaly guard is off: the burst of 2,000 connects on a saturated loop gives ~10% ConnectTimeouts
    # (client-side, retried), which would pause the dataset mid-window (see the errors in results.json).
    n_workers, worker_cpus = stream_settings()  # [run] stream_workers and their CPUs, from the orchestrator
    cfg = engine_config(tmp, a.base_url, [{"name": "b1", "path": a.prompts, "format": "text"}],
                        concurrency=a.concurrency, max_tokens=a.max_tokens, spend={"anomaly_error_rate": 0},
                        run={"stream_workers": n_workers} if n_workers else None)
    from engine.storage.store import make_run_dir

    make_run_dir(cfg.run.dir)
    setup_file_logging(cfg.run.dir, stderr_level=None)  # as `datagen run` does
    holder: dict = {}
    t_start = time.monotonic()
    run = asyncio.create_task(run_headless(cfg, io.StringIO(), install_signals=False,
                                           on_ready=lambda job: holder.setdefault("job", job)))
    while "job" not in holder:
        if run.done():
            run.result()
            raise RuntimeError("engine ended before it was ready")
        await asyncio.sleep(0.01)
    job = holder["job"]
    sched = job.scheduler
    workers = StreamWorkers(job.pool, worker_cpus).start()  # off the engine's CPU (see bench.common.stream_cpus)
    rts = list(sched.datasets.values())
    parts: list[tuple[float, float]] = []

    def cpu() -> float:  # the engine's CPU: its own process and its stream workers
        m, w = time.process_time(), workers.cpu_s()
        parts.append((m, w))
        return m + w

    win = Window(a.start_after, 10**9, a.seconds, cpu=cpu)
    await win.watch(lambda: sum(rt.done for rt in rts), in_flight=lambda: sum(rt.in_flight for rt in rts))
    res = win.result()
    if len(parts) >= 2 and win.t1 and win.t0:
        wall = win.t1 - win.t0
        res.update(main_cpu_share=(parts[-1][0] - parts[0][0]) / wall,
                   workers_cpu_share=(parts[-1][1] - parts[0][1]) / wall)
    res["stream_workers"] = workers.figures()
    snap = sched.snapshot()
    res.update(completed=snap.datasets[0].done, errors=sum(snap.errors.values()), error_classes=snap.errors,
               failed=snap.datasets[0].failed, writer_queue=snap.writer_queue,
               elapsed_s=time.monotonic() - t_start, in_flight=snap.in_flight,
               latest_errors={k: v[:200] for k, v in snap.latest_errors.items()})
    emit(res)
    os._exit(0)  # the window is closed: do not drain 2,000 streams


# ---- orchestration ----------------------------------------------------------------------------------
def run(reps: int, seconds: float, start_after: int) -> list[dict]:
    client_cpu, sim_cpu = placement()
    plan = contenders()
    scaled = ", ".join(k for k in plan if k.startswith(SCALE_PREFIX)) or "none"
    log(f"B1: engine with {stream_note()}; scaling runs with {scaled}")
    results: dict[str, list[dict]] = {k: [] for k in plan}
    sim_share: dict[str, list[float]] = {k: [] for k in plan}
    with tempdir("b1") as tmp:
        prompts = write_prompts(tmp / "prompts.jsonl", N_PROMPTS)
        with SimProcess(*sim_args(tokens_per_s=0, latency_ms=0, mean_tokens=MEAN_TOKENS, extra=SIM_EXTRA),
                        cpu=sim_cpu) as sim:
            for rep in range(reps):
                for name, (module, extra, workers) in plan.items():
                    if name == "openai" and rep >= OPENAI_REPS:
                        continue
                    work = tmp / f"{name}-{rep}"
                    work.mkdir()
                    args = ["--base-url", sim.base_url, "--prompts", str(prompts), "--concurrency", str(CONCURRENCY),
                            "--max-tokens", str(MAX_TOKENS), *extra]
                    if name == "openai":  # never reaches steady state at 2,000 streams: fixed-time window
                        args += ["--start-after", str(10**9), "--open-at-s", str(OPENAI_OPEN_AT_S),
                                 "--seconds", str(min(seconds, OPENAI_WINDOW_S))]
                    else:
                        args += ["--start-after", str(start_after), "--seconds", str(seconds)]
                    if module == "b1_throughput":
                        args += ["--tmp", str(work)]
                    s0, t0 = sim.cpu_s(), time.monotonic()
                    try:
                        r = run_worker(module, args, cpu=client_cpu, timeout=seconds + 150,
                                       env=stream_env(workers) if workers else None)
                    except WorkerError as e:
                        log(f"B1 {name} run {rep + 1}: FAILED: {e}")
                        r = {"req_per_s": None, "cpu_s_per_1000": None, "error": str(e)[:500]}
                    sim_share[name].append((sim.cpu_s() - s0) / (time.monotonic() - t0))
                    results[name].append(r)
                    of = reps if name != 'openai' else min(reps, OPENAI_REPS)
                    log(f"B1 {name} run {rep + 1}/{of}: {_fmt(r.get('req_per_s'))} req/s, "
                        f"{_fmt(r.get('cpu_s_per_1000'))} CPU-s/1k req, window {r.get('window_requests')} req"
                        f"{', errors ' + str(r.get('errors')) if r.get('errors') else ''}"
                        + (f", CPU engine {_pct(r.get('main_cpu_share'))} + {workers} stream worker(s) "
                           f"{_pct(r.get('workers_cpu_share'))}" if workers else ""))
                    time.sleep(1.0)  # let the simulator drop the previous client's streams
    return rows(results, sim_share, reps, seconds)


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _openai_equivalent(results: dict[str, list[dict]]) -> tuple[list, list, float | None]:
    """The SDK's req/s and CPU-s/1k req estimated from its SSE events/s and CPU per event, with the
    events per request measured in the httpx loops' steady windows (the same prompts)."""
    epr = [r.get("events_per_request") for k in ("httpx", "httpx-sharded") for r in results[k]]
    epr = [x for x in epr if x]
    if not epr:
        return [None] * len(results["openai"]), [None] * len(results["openai"]), None
    e = statistics.median(epr)
    rps = [(r["events_per_s"] / e) if r.get("events_per_s") else None for r in results["openai"]]
    cpu = [(r["cpu_us_per_event"] * e / 1000) if r.get("cpu_us_per_event") else None for r in results["openai"]]
    return rps, cpu, e


def _mean_inflight(runs: list[dict]) -> str:
    v = [r["in_flight_mean"] for r in runs if r.get("in_flight_mean") is not None]
    return f"{statistics.median(v):,.0f}" if v else "-"


def rows(results: dict[str, list[dict]], sim_share: dict[str, list[float]], reps: int, seconds: float) -> list[dict]:
    rps = {k: [r.get("req_per_s") for r in v] for k, v in results.items()}
    cpu = {k: [r.get("cpu_s_per_1000") for r in v] for k, v in results.items()}
    rps["openai"], cpu["openai"], epr = _openai_equivalent(results)
    details = {"runs": results, "simulator_cpu_share": sim_share, "concurrency": CONCURRENCY,
               "mean_completion_tokens": MEAN_TOKENS, "max_tokens": MAX_TOKENS, "window_s": seconds, "reps": reps,
               "events_per_request": epr}
    errs = [r.get("errors") for r in results["ours"] if r.get("errors") is not None]
    ours_note = (f"engine with the anomaly guard off; {statistics.median(errs):.0f} retried errors per run "
                 f"({', '.join(sorted({k for r in results['ours'] for k in (r.get('error_classes') or {})})) or 'none'}); "
                 f"in flight in the window: ours {_mean_inflight(results['ours'])}, bare loop "
                 f"{_mean_inflight(results['httpx-sharded'])}" if errs else "")
    oa_note = (f"SDK: estimated from its SSE events/s / {epr:.0f} events per request (steady windows of the "
               f"httpx loops); at 2,000 streams it completes almost nothing in the window" if epr else "")
    default = default_stream_workers()
    where = stream_note(default)
    ours_note = f"{where}; {ours_note}" if ours_note else where
    out = [headline_row(cpu, ours_note, details)]
    ours = summary(rps["ours"])
    for k in ("httpx-sharded", "httpx", "openai"):
        base = summary(rps[k])
        rat = ratio_summary(rps["ours"], rps[k])
        goal = ">= 1.0x" if k.startswith("httpx") else "(report)"
        met = (rat["median"] >= 1.0) if (rat["median"] is not None and k.startswith("httpx")) else None
        out.append(make_row("B1", f"completed streaming req/s, 2,000 conc., ~2,000-tok completions; vs {LABELS[k]}",
                            ours=ours, baseline=base, unit="req/s", ratio=rat, goal=goal, met=met,
                            note=oa_note if k == "openai" else ""))
    out += scaling_rows(results, rps, default)
    for k in ("httpx", "openai"):
        out.append(make_row("B1", "CPU-seconds per 1,000 requests (client processes, all threads: the engine and its "
                                  f"stream workers; a baseline's one process); vs {LABELS[k]}",
                            ours=summary(cpu["ours"]), baseline=summary(cpu[k]), unit="CPU-s/1k req",
                            ratio=ratio_summary(cpu["ours"], cpu[k]), goal="(report; lower is better)", met=None,
                            note=oa_note if k == "openai" else ""))
    return out


#: The headline's goal: the engine's CPU per completed request at most this multiple of the bare loop's.
CPU_GOAL_RATIO = 1.2


def headline_row(cpu: dict[str, list], note: str, details: dict) -> dict:
    """B1's headline: CPU-seconds per 1,000 completed requests of the engine (its process and its
    stream workers, summed user+sys; the simulator excluded) vs the bare loop over
    ``ShardedTransport`` in the same runs (paired by repetition), goal <= :data:`CPU_GOAL_RATIO` x.
    CPU per request does not depend on the core count, unlike req/s on a machine where the bare loop
    has a core to itself and the engine shares two (``cpu``: contender -> per-run figures)."""
    rat = ratio_summary(cpu["ours"], cpu["httpx-sharded"])
    return make_row("B1", "CPU-seconds per 1,000 completed requests, 2,000 conc., ~2,000-tok completions (the engine "
                          "process + its stream workers, all threads); vs " + LABELS["httpx-sharded"] + " (headline)",
                    ours=summary(cpu["ours"]), baseline=summary(cpu["httpx-sharded"]), unit="CPU-s/1k req", ratio=rat,
                    goal=f"<= {CPU_GOAL_RATIO:.1f}x",
                    met=None if rat["median"] is None else rat["median"] <= CPU_GOAL_RATIO,
                    note=note, details=details)


def scaling_rows(results: dict[str, list[dict]], rps: dict[str, list], default: int) -> list[dict]:
    """One row per count of :func:`scale_counts`: the engine with that many stream workers vs the
    bare single-process loop (ShardedTransport, the faster of the two bare loops in past runs); the
    note adds the ratio to the one-pool loop and where the CPU went."""
    out = []
    for n in scale_counts():
        name = "ours" if n == default else f"{SCALE_PREFIX}{n}"
        runs = results.get(name)
        if not runs:
            continue
        v = [r.get("req_per_s") for r in runs]
        rat = ratio_summary(v, rps["httpx-sharded"])
        rat1 = ratio_summary(v, rps["httpx"])
        main_cpu = summary([r.get("main_cpu_share") for r in runs])
        w_cpu = summary([r.get("workers_cpu_share") for r in runs])
        note = stream_note(n)
        if rat1["median"] is not None:
            note += f"; {rat1['median']:.2f}x the one-pool loop"
        if main_cpu["median"] is not None and w_cpu["median"] is not None:
            note += (f"; CPU in the window: engine process {100 * main_cpu['median']:.0f}% of a core, stream workers "
                     f"{100 * w_cpu['median']:.0f}% (summed)")
        if name == "ours":
            note += " (the same runs as the rows above)"
        out.append(make_row(
            "B1", f"scaling: completed streaming req/s with {n} stream worker{'s' if n != 1 else ''}, 2,000 conc.; "
                  f"vs {LABELS['httpx-sharded']} (one process)",
            ours=summary(v), baseline=summary(rps["httpx-sharded"]), unit="req/s", ratio=rat, goal=">= 1.0x",
            met=None if rat["median"] is None else rat["median"] >= 1.0, note=note,
            details={"stream_workers": n, "runs": runs} if name != "ours" else {"stream_workers": n}))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="B1 throughput")
    p.add_argument("--worker", action="store_true", help="(internal) run the engine contender")
    p.add_argument("--base-url")
    p.add_argument("--prompts")
    p.add_argument("--tmp")
    p.add_argument("--concurrency", type=int, default=CONCURRENCY)
    p.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seconds", type=float, default=WINDOW_S)
    p.add_argument("--start-after", type=int, default=START_AFTER)
    a = p.parse_args(argv)
    if a.worker:
        asyncio.run(engine_worker(a))  # emits its RESULT and exits
    import json

    print(json.dumps(run(a.reps, a.seconds, a.start_after), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
