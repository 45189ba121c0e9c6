"""B5: budget overshoot at 500 and 2,000 concurrency, against a naive scheduler.

One dataset with a completion-token budget (200,000 at 500 concurrency, 800,000 at 2,000), the
simulator (own process) streaming completions of mean 2,000 tokens (``max_tokens`` 8,000) at
4,000 tokens/s per stream after 50 ms (as ``tests/e2e/test_spend_e2e.py``). Each run is a full headless
engine run in a fresh process until the dataset is ``budget_met`` and in-flight requests drained.
Used = completion tokens of stored results + tokens streamed by failed/aborted attempts.

- ours: ``[spend] reservation = "expected"`` (the default: reserve at dispatch);
- baseline: ``reservation = "none"`` (dispatch until the budget is reached, reserve nothing),
  on the same prompts and simulator settings. Its overshoot is reported (no goal); it is run fewer
  times because it streams 5-7x the budget.

Run alone: ``python -m bench.b5_budget [--reps 3] [--naive-reps 1]``.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sqlite3
import sys
import time
from pathlib import Path

from bench.common import (
    SimProcess,
    WorkerError,
    emit,
    engine_config,
    log,
    make_row,
    placement,
    raise_fd_limit,
    run_worker,
    sim_args,
    summary,
    tempdir,
    write_prompts,
)

CASES = ((500, 200_000, 1500), (2000, 800_000, 6000))  # (concurrency, budget, prompts)
SIM = dict(tokens_per_s=4000, latency_ms=50, mean_tokens=2000)


def used_tokens(run_dir: Path) -> int:
    db = sqlite3.connect(run_dir / "store.sqlite")
    (n,) = db.execute("SELECT COALESCE(SUM(completion_tokens), 0) FROM results").fetchone()
    (partial,) = db.execute("SELECT COALESCE(SUM(tokens_received), 0) FROM attempts WHERE outcome != 'ok'").fetchone()
    db.close()
    return n + partial


async def worker(a: argparse.Namespace) -> dict:
    raise_fd_limit()
    from engine.report.status import collect_status
    from engine.run.headless import run_headless

    tmp = Path(a.tmp)
    cfg = engine_config(tmp, a.base_url, [{"name": "b5", "path": a.prompts, "format": "text",
                                           "token_budget": a.budget}],
                        concurrency=a.concurrency, max_tokens=8000, spend={"reservation": a.mode},
                        run={"commit_interval_s": 0.5})
    t = time.monotonic()
    code = await run_headless(cfg, io.StringIO(), install_signals=False)
    elapsed = time.monotonic() - t
    used = used_tokens(cfg.run.dir)
    ds = collect_status(cfg.run.dir)["datasets"][0]
    return {"used": used, "budget": a.budget, "over": used / a.budget - 1, "code": code, "elapsed_s": elapsed,
            "state": ds["state"], "done": ds["done"], "skipped": ds["skipped"], "failed": ds["failed"]}


def run(reps: int, naive_reps: int) -> list[dict]:
    client_cpu, sim_cpu = placement()
    out = []
    with tempdir("b5") as tmp, SimProcess(*sim_args(**SIM), cpu=sim_cpu) as sim:
        for conc, budget, n in CASES:
            prompts = write_prompts(tmp / f"prompts-{conc}.jsonl", n, tag=f"b5-{conc} ")
            res: dict[str, list[dict]] = {"expected": [], "none": []}
            for rep in range(max(reps, naive_reps)):
                for mode, k in (("expected", reps), ("none", naive_reps)):
                    if rep >= k:
                        continue
                    d = tmp / f"{conc}-{mode}-{rep}"
                    d.mkdir()
                    try:
                        r = run_worker("b5_budget", ["--base-url", sim.base_url, "--prompts", str(prompts),
                                                     "--tmp", str(d), "--budget", str(budget), "--concurrency",
                                                     str(conc), "--mode", mode], cpu=client_cpu, timeout=300)
                    except WorkerError as e:
                        log(f"B5 {conc} {mode} run {rep + 1}: FAILED: {e}")
                        r = {"used": None, "over": None}
                    res[mode].append(r)
                    log(f"B5 conc {conc} {mode} run {rep + 1}/{k}: used {r.get('used')} of {budget:,} "
                        f"({'-' if r.get('over') is None else format(r['over'], '+.2%')}) in "
                        f"{r.get('elapsed_s', 0):.1f}s")
            ours = summary([(r["used"] / budget) if r.get("used") is not None else None for r in res["expected"]])
            naive = summary([(r["used"] / budget) if r.get("used") is not None else None for r in res["none"]])
            met = None if ours["median"] is None else ours["max"] <= 1.02
            out.append(make_row(
                "B5", f"completion tokens used / budget ({budget:,}) at {conc:,} concurrency; mean 2,000, "
                      f"max_tokens 8,000; baseline: naive scheduler (reserve nothing)",
                ours=ours, baseline=naive, unit="x budget", goal="<= 1.02x (every run)", met=met,
                ratio=None, details={"runs": res, "sim": SIM, "prompts": n}))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="B5 budget overshoot")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--base-url")
    p.add_argument("--prompts")
    p.add_argument("--tmp")
    p.add_argument("--budget", type=int)
    p.add_argument("--concurrency", type=int)
    p.add_argument("--mode", choices=["expected", "none"])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--naive-reps", type=int, default=1)
    a = p.parse_args(argv)
    if a.worker:
        emit(asyncio.run(worker(a)))
        sys.stdout.flush()
        os._exit(0)
    print(json.dumps(run(a.reps, a.naive_reps), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
