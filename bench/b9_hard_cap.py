"""B9: the throughput cost of ``[spend] hard_cap = true`` (never exceed a budget).

Same conditions as B5 (one dataset with a completion-token budget, the simulator in its own
process streaming completions of mean 2,000 tokens, ``max_tokens`` 8,000, 4,000 tokens/s per
stream after 50 ms): full headless engine runs in fresh processes until the dataset is
``budget_met`` and drained, interleaved (hard_cap, default, hard_cap, default, ...).

- ours: ``hard_cap = true`` (every request reserves ``max_tokens``);
- baseline: the default (reserve the observed percentile, growing with each stream's progress).

Figure: completed prompts / wall time of the run (prompts/s), and the ratio ours/baseline (the
median of per-run ratios); each run's used/budget is in the details (hard_cap must be <= 1.0).
A clock-free figure from :mod:`bench.budget_sim` (simulated time, 10 seeds) is in the note: it is
free of the machine's noise.

Run alone: ``python -m bench.b9_hard_cap [--reps 3]`` or ``python -m bench.run --only B9``;
``BENCH_PROFILE=quick`` runs only the 500-concurrency case.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sys
import time
from pathlib import Path

from bench.b5_budget import used_tokens
from bench.budget_sim import simulate
from bench.common import (
    PROFILE,
    SimProcess,
    WorkerError,
    emit,
    engine_config,
    log,
    make_row,
    placement,
    raise_fd_limit,
    ratio_summary,
    run_worker,
    sim_args,
    summary,
    tempdir,
    write_prompts,
)

CASES = ((500, 200_000, 1500), (2000, 800_000, 6000))  # (concurrency, budget, prompts), as B5
SIM = dict(tokens_per_s=4000, latency_ms=50, mean_tokens=2000)


async def worker(a: argparse.Namespace) -> dict:
    raise_fd_limit()
    from engine.report.status import collect_status
    from engine.run.headless import run_headless

    tmp = Path(a.tmp)
    cfg = engine_config(tmp, a.base_url, [{"name": "b9", "path": a.prompts, "format": "text",
                                           "token_budget": a.budget}],
                        concurrency=a.concurrency, max_tokens=8000,
                        spend={"hard_cap": a.mode == "hard_cap", "anomaly_error_rate": 0},
                        run={"commit_interval_s": 0.5})
    t = time.monotonic()
    code = await run_headless(cfg, io.StringIO(), install_signals=False)
    elapsed = time.monotonic() - t
    ds = collect_status(cfg.run.dir)["datasets"][0]
    used = used_tokens(cfg.run.dir)
    return {"used": used, "budget": a.budget, "ratio": used / a.budget, "code": code, "elapsed_s": elapsed,
            "done": ds["done"], "state": ds["state"], "prompts_per_s": ds["done"] / elapsed if elapsed else None}


def sim_figure(conc: int, budget: int, seeds: int = 10) -> dict:
    """Prompts per simulated second, hard_cap vs default, over ``seeds`` seeds of the pure simulation."""
    out = {}
    for mode in ("hard_cap", "default"):
        rs = [simulate(concurrency=conc, budget=budget, seed=s, hard_cap=mode == "hard_cap") for s in range(seeds)]
        out[mode] = {"prompts_per_s": sum(r.completed for r in rs) / sum(r.ended_at for r in rs),
                     "max_ratio": max(r.ratio for r in rs)}
    out["ratio"] = out["hard_cap"]["prompts_per_s"] / out["default"]["prompts_per_s"]
    return out


def run(reps: int) -> list[dict]:
    client_cpu, sim_cpu = placement()
    cases = CASES[:1] if PROFILE == "quick" else CASES
    out = []
    with tempdir("b9") as tmp, SimProcess(*sim_args(**SIM), cpu=sim_cpu) as sim:
        for conc, budget, n in cases:
            prompts = write_prompts(tmp / f"prompts-{conc}.jsonl", n, tag=f"b9-{conc} ")
            res: dict[str, list[dict]] = {"hard_cap": [], "default": []}
            for rep in range(reps):
                for mode in ("hard_cap", "default"):
                    d = tmp / f"{conc}-{mode}-{rep}"
                    d.mkdir()
                    try:
                        r = run_worker("b9_hard_cap", ["--base-url", sim.base_url, "--prompts", str(prompts),
                                                       "--tmp", str(d), "--budget", str(budget), "--concurrency",
                                                       str(conc), "--mode", mode], cpu=client_cpu, timeout=600)
                    except WorkerError as e:
                        log(f"B9 {conc} {mode} run {rep + 1}: FAILED: {e}")
                        r = {"prompts_per_s": None, "ratio": None}
                    res[mode].append(r)
                    log(f"B9 conc {conc} {mode} run {rep + 1}/{reps}: {r.get('done')} done in "
                        f"{r.get('elapsed_s', 0):.1f}s, used {r.get('ratio') or 0:.4f}x budget")
            ours = [r.get("prompts_per_s") for r in res["hard_cap"]]
            base = [r.get("prompts_per_s") for r in res["default"]]
            worst = max((r["ratio"] for r in res["hard_cap"] if r.get("ratio") is not None), default=None)
            simfig = sim_figure(conc, budget)
            out.append(make_row(
                "B9", f"prompts completed / wall time, budget {budget:,} at {conc:,} concurrency (as B5); "
                      f"ours: [spend] hard_cap = true; baseline: the default reservation",
                ours=summary(ours), baseline=summary(base), unit="prompts/s", ratio=ratio_summary(ours, base),
                goal="hard_cap never exceeds (used <= 1.0x budget); cost in throughput reported",
                met=None if worst is None else worst <= 1.0,
                note=f"hard_cap worst used/budget {worst if worst is None else round(worst, 4)}; pure simulation "
                     f"(10 seeds, simulated time): hard_cap/default prompts/s = {simfig['ratio']:.3f}",
                details={"runs": res, "sim": SIM, "prompts": n, "pure_simulation": simfig}))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="B9 hard_cap throughput cost")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--base-url")
    p.add_argument("--prompts")
    p.add_argument("--tmp")
    p.add_argument("--budget", type=int)
    p.add_argument("--concurrency", type=int)
    p.add_argument("--mode", choices=["hard_cap", "default"])
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args(argv)
    if a.worker:
        emit(asyncio.run(worker(a)))
        sys.stdout.flush()
        os._exit(0)
    print(json.dumps(run(a.reps), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
