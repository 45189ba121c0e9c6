"""B4: time from start to the first dispatched request when resuming a run with 80,000 stored
results, against a fresh run of the same config.

The config has one dataset of 90,000 prompts (``text`` format), concurrency 2,000, against a
``datagen sim`` process. Each measurement is a fresh ``datagen run CONFIG --headless`` process
(in-process ``datagen.cli.main``, with ``engine.stream.pool.StreamWorkerPool.send`` -- the run's side
of every request, handed to a stream-worker process from there -- wrapped to report the moment of
the first call and exit at once, so nothing is sent and the store is left as it was; the stream
workers' start-up, in ``prepare()``, is included):

- fresh: an empty run directory (the file is parsed and its 90,000 prompts ingested);
- resume: the store of the first fresh run, into which 80,000 results (+ one ``ok`` attempt each,
  completions of ~2,000 tokens / ~8,000 characters like B1's) were written directly with sqlite3
  (``executemany`` over the schema ``Store.open`` created); 10,000 prompts stay pending.

"start" is the parent's clock just before it starts the process, so interpreter start-up and
imports are included (the same for both); the JSON also splits off the in-process part.

Run alone: ``python -m bench.b4_resume [--reps 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import sys
import time
from pathlib import Path

from bench.common import (
    SimProcess,
    WorkerError,
    emit,
    log,
    make_row,
    placement,
    ratio_summary,
    run_worker,
    sim_args,
    summary,
    tempdir,
    write_prompts,
)

N_PROMPTS = 90_000
N_DONE = 80_000
MEAN_CHARS = 8000


def worker(a: argparse.Namespace) -> None:
    t0 = float(a.t0)
    import engine.stream.pool as pool
    from datagen.cli import main

    t_main = time.time()

    async def first_send(self, endpoint, req, progress=None):  # stands in for StreamWorkerPool.send
        t = time.time()
        emit({"first_dispatch_s": t - t0, "in_process_s": t - t_main, "startup_s": t_main - t0,
              "stream_workers": self.n})
        os._exit(0)  # the stream workers die with the run (PR_SET_PDEATHSIG)

    # Every request leaves the run's process through the pool's send (``complete`` calls it too); the
    # HTTP call itself happens in a stream-worker process, out of reach of a patch here.
    pool.StreamWorkerPool.send = first_send
    code = main(["run", a.config, "--headless", "--run-dir", a.run_dir])
    print(f"run ended with code {code} before any dispatch", file=sys.stderr)
    os._exit(1)


def write_config(tmp: Path, base_url: str, prompts: Path) -> Path:
    cfg = tmp / "config.toml"
    cfg.write_text(f"""
[run]
name = "b4"
dir = "{tmp / 'unused'}"
[provider]
kind = "openai"
base_url = "{base_url}"
api_key_env = "DATAGEN_BENCH_KEY"
[classes.short]
max_tokens = 8000
concurrency = 2000
[[datasets]]
name = "b4"
path = "{prompts}"
format = "text"
""")
    return cfg


def build_resume_store(db: Path, n_done: int, mean_chars: int = MEAN_CHARS, seed: int = 7) -> dict:
    """Write ``n_done`` results and attempts into the ingested store ``db`` and mark their prompts done."""
    t = time.monotonic()
    rng = random.Random(seed)
    words = "the of model token layer stream budget cache result answer reason step proof code test value".split()
    block = " ".join(rng.choice(words) for _ in range(mean_chars * 2 // 5))
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    rows = con.execute("SELECT id, dataset, key FROM prompts ORDER BY id LIMIT ?", (n_done,)).fetchall()
    now = time.time() - 3600
    results, attempts = [], []
    for i, (pid, ds, key) in enumerate(rows):
        n = min(len(block), 40 + int(rng.expovariate(1.0 / mean_chars)))
        half = n // 2
        tok = max(1, n // 4)
        cost = tok * 1.9e-6
        ts = now + i * 0.01
        results.append((pid, ds, key, block[:half], block[half:n], "[]", "stop", "stop", "SimA",
                        "moonshotai/kimi-k2.5-0127", f"gen-b4-{pid}", 20, tok, tok // 2, cost, 30.0, 1.0, 1, ts))
        attempts.append((pid, ds, 1, ts - 30, ts, "ok", None, None, None, "SimA", f"gen-b4-{pid}", 0, cost))
    con.execute("BEGIN")
    con.executemany("INSERT INTO results(prompt_id, dataset, key, reasoning, content, tool_calls, finish_reason, "
                    "native_finish_reason, provider, model, generation_id, prompt_tokens, completion_tokens, "
                    "reasoning_tokens, cost_usd, latency_s, ttft_s, attempts, created_at) "
                    "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", results)
    con.executemany("INSERT INTO attempts(prompt_id, dataset, n, started_at, ended_at, outcome, error_class, status, "
                    "message, provider, generation_id, tokens_received, cost_usd) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    attempts)
    con.executemany("UPDATE prompts SET state='done', attempts=1 WHERE id=?", [(r[0],) for r in rows])
    con.execute("COMMIT")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    (n_res,) = con.execute("SELECT COUNT(*) FROM results").fetchone()
    (n_pend,) = con.execute("SELECT COUNT(*) FROM prompts WHERE state='pending'").fetchone()
    con.close()
    return {"results": n_res, "pending": n_pend, "db_mb": round(db.stat().st_size / 2**20, 1),
            "build_s": round(time.monotonic() - t, 1)}


def run(reps: int) -> list[dict]:
    client_cpu, sim_cpu = placement()
    fresh, resume = [], []
    with tempdir("b4") as tmp:
        prompts = write_prompts(tmp / "prompts.jsonl", N_PROMPTS, tag="b4 ")
        with SimProcess(*sim_args(mean_tokens=50), cpu=sim_cpu) as sim:
            cfg = write_config(tmp, sim.base_url, prompts)
            env = {"DATAGEN_BENCH_KEY": "sk-bench-local"}

            def measure(run_dir: Path) -> dict:
                return run_worker("b4_resume", ["--config", str(cfg), "--run-dir", str(run_dir),
                                                "--t0", repr(time.time())], cpu=client_cpu, timeout=180, env=env)

            store_info: dict = {}
            for rep in range(reps):
                d = tmp / f"fresh{rep}"
                try:
                    r = measure(d)
                except WorkerError as e:
                    log(f"B4 fresh run {rep + 1}: FAILED: {e}")
                    r = {"first_dispatch_s": None}
                fresh.append(r)
                log(f"B4 fresh run {rep + 1}/{reps}: first dispatch after {_fmt(r.get('first_dispatch_s'))} s")
                if rep == 0:
                    store_info = build_resume_store(d / "store.sqlite", N_DONE)
                    log(f"B4 resume store: {store_info}")
                try:
                    r = measure(tmp / "fresh0")
                except WorkerError as e:
                    log(f"B4 resume run {rep + 1}: FAILED: {e}")
                    r = {"first_dispatch_s": None}
                resume.append(r)
                log(f"B4 resume run {rep + 1}/{reps}: first dispatch after {_fmt(r.get('first_dispatch_s'))} s")
    ours = [r.get("first_dispatch_s") for r in resume]
    base = [r.get("first_dispatch_s") for r in fresh]
    so, sb = summary(ours), summary(base)
    rat = ratio_summary(ours, base)
    met = None if so["median"] is None or rat["median"] is None else (so["median"] <= 2.0 and rat["median"] <= 2.0)
    return [make_row("B4", f"start -> first dispatched request, resuming {N_DONE:,} stored results "
                           f"(+{N_PROMPTS - N_DONE:,} pending); baseline: fresh run of the same config "
                           f"(ingests {N_PROMPTS:,} prompts)",
                     ours=so, baseline=sb, unit="s", ratio=rat, goal="<= 2 s and <= 2x fresh", met=met,
                     details={"resume": resume, "fresh": fresh, "store": store_info})]


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="B4 resume time")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--config")
    p.add_argument("--run-dir")
    p.add_argument("--t0")
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args(argv)
    if a.worker:
        worker(a)
        return 1
    print(json.dumps(run(a.reps), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
