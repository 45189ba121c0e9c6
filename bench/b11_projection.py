"""B11: projected cost and ETA at the real workload's stream shape, time-compressed (issue 33).

The real run: 2,000 streams at ~4 tokens/s each, mean 2,000 completion tokens (``max_tokens`` 8,000),
so a stream lasts minutes (mean ~8 min, longest ~33 min) and is a sizeable fraction of a dataset's
duration. Here the same shape is compressed in time on the simulator (``datagen sim`` in its own
process): ``COMPRESS`` times the per-stream rate and ``CONC_SCALE`` of the concurrency, with every
token budget and dollar cap scaled with the concurrency (tokens per slot as in the real run), so
the ratio of a stream's duration to a dataset's and to the run's is kept (several waves per run)
while 2 cores carry the load.

Three datasets in one request class, in config order: ``alpha`` (a token budget), ``beta`` (a dollar
cap), ``gamma`` (ends with its prompts), plus a run-wide dollar cap that should not bind. Each
repetition is one full headless engine run (``run_headless``, a fresh process, as B5) against a fresh
simulator with ``--log`` (the ledger: one line per billed request). While it runs the worker samples
``controller.snapshot()`` every ``SAMPLE_S`` s. At 10%, 25% and 50% of the run's wall time the
sample is compared with the end:

- projected total cost (and each dataset's) vs what the simulator billed in the end (the ledger),
- the run's ETA (and each dataset's) vs the true time left (the run's end, the dataset's last stream
  ended, minus the sample's time),
- the header's tok/s vs the tokens being streamed (in flight x the simulator's per-stream rate).

At the end: the most streams in flight vs the configured concurrency, the token budget's and the
dollar caps' overshoot, and the ledger's dollars vs the store's (results + lost) + the reported
credits drift.

Run alone: ``python -m bench.b11_projection [--reps 1] [--save-before bench/results.b11-before.json]``
(``--save-before``: keep the figures as the "before" entry that later runs show in their baseline column).
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
from typing import Any

from bench.common import (
    BENCH,
    SimProcess,
    WorkerError,
    emit,
    log,
    machine_info,
    make_row,
    placement,
    raise_fd_limit,
    read_prompt_messages,
    run_worker,
    sim_args,
    summary,
    tempdir,
    write_prompts,
)

# ---- the shape ------------------------------------------------------------------------------------
REAL_TOK_S, REAL_CONC = 4, 2000  # the real run: tokens/s per stream, streams
COMPRESS = 20  # time compression: the simulator streams COMPRESS x REAL_TOK_S per stream
CONC_SCALE = 0.25  # concurrency (and budgets, caps, prompts) x this, so 2 cores carry the load
TOK_S = REAL_TOK_S * COMPRESS
CONC = int(REAL_CONC * CONC_SCALE)
MEAN, MAX_TOKENS = 2000, 8000
LATENCY_MS = 2000 / COMPRESS  # ~2 s to the first token in reality
PRICE_IN, PRICE_OUT = 0.4, 1.9  # the simulator's defaults, USD per million tokens
FAULTS = "midstream:0.005"  # a few streams cut by the provider: lost spend, retries
#: datasets (config order): real-run sizes x CONC_SCALE. alpha: token budget 6M (3,000 tokens per
#: slot of 2,000); beta: dollar cap $12 (~6M tokens); gamma: 2,000 prompts, no cap.
DATASETS = (
    {"name": "alpha", "prompts": 6000, "token_budget": 6_000_000},
    {"name": "beta", "prompts": 6000, "max_cost_usd": 12.0},
    {"name": "gamma", "prompts": 2000},
)
RUN_CAP_USD = 40.0  # run-wide cap (expected spend ~$30 at full size): should not bind
SAMPLE_S = 1.0
#: a run still going then is aborted (reported as such: its true time left is then a lower bound). A dataset
#: held by its token budget winds down over ~ln(its streams) x (reservation / mean) mean stream durations
#: as its streams end and fewer fit what is left, so a run can take long past its body.
DEADLINE_S = 450.0
CHECKPOINTS = (0.10, 0.25, 0.50)
BEFORE_FILE = BENCH / "results.b11-before.json"

SIM = dict(tokens_per_s=TOK_S, latency_ms=LATENCY_MS, mean_tokens=MEAN)


def sized(scale: float) -> list[dict[str, Any]]:
    """The datasets with budgets, caps and prompts x ``CONC_SCALE * scale``."""
    k = CONC_SCALE * scale
    out = []
    for d in DATASETS:
        e = {"name": d["name"], "prompts": max(1, int(d["prompts"] * k))}
        if "token_budget" in d:
            e["token_budget"] = int(d["token_budget"] * k)
        if "max_cost_usd" in d:
            e["max_cost_usd"] = round(d["max_cost_usd"] * k, 2)
        out.append(e)
    return out


def compression_note(scale: float) -> str:
    ds = sized(scale)
    return (f"time x{COMPRESS} ({TOK_S} tok/s per stream for the real {REAL_TOK_S}; mean stream "
            f"{MEAN / TOK_S:.0f} s, longest {MAX_TOKENS / TOK_S:.0f} s, for {MEAN / REAL_TOK_S / 60:.0f} and "
            f"{MAX_TOKENS / REAL_TOK_S / 60:.0f} min), concurrency {CONC:,} (x{CONC_SCALE} of {REAL_CONC:,}) with the "
            f"budgets, caps and prompts scaled alike: alpha token_budget {ds[0]['token_budget']:,}, beta "
            f"max_cost_usd ${ds[1]['max_cost_usd']:.2f}, gamma {ds[2]['prompts']:,} prompts, run max_cost_usd "
            f"${RUN_CAP_USD * CONC_SCALE * scale:.2f}; mean {MEAN:,}, max_tokens {MAX_TOKENS:,}, first token after "
            f"{LATENCY_MS:.0f} ms, faults {FAULTS}; a calibration-gate pause is resumed at once (the user accepts "
            f"spending up to the cap); the engine's rate windows (tok/s: 180 s) are wall-clock, not compressed, so "
            f"figures from recent rates lag ~{COMPRESS}x more than in the real run")


# ---- the worker: one headless run, sampled --------------------------------------------------------
def _ds_sample(d: Any) -> dict[str, Any]:
    g = lambda k: getattr(d, k, None)  # noqa: E731 - fields differ between versions of the snapshot
    return {"state": g("state"), "reason": g("state_reason"), "in_flight": g("in_flight"), "done": g("done"), "cost": g("cost_usd"),
            "ctok": g("completion_tokens"), "proj": g("projected_cost_usd"), "proj_lo": g("projected_cost_low_usd"),
            "proj_hi": g("projected_cost_high_usd"), "eta": g("eta_s"), "eta_lo": g("eta_s_low"),
            "eta_hi": g("eta_s_high"), "reserved": g("reserved_tokens"), "capped": g("projection_capped"),
            "limit": g("limit_reason"), "tok_s": g("tok_per_s")}


def _sample(snap: Any, t: float) -> dict[str, Any]:
    g = lambda k: getattr(snap, k, None)  # noqa: E731
    return {"t": round(t, 2), "state": g("state"), "in_flight": g("in_flight"), "tok_s": g("tok_per_s"),
            "cost": g("cost_usd"), "cif": g("cost_in_flight_usd"), "proj": g("projected_total_cost_usd"),
            "proj_lo": g("projected_cost_low_usd"), "proj_hi": g("projected_cost_high_usd"), "eta": g("eta_s"),
            "eta_lo": g("eta_s_low"), "eta_hi": g("eta_s_high"), "eta_reason": g("eta_reason"),
            "capped": g("projection_capped"), "calib": g("calibration"),
            "ds": {d.name: _ds_sample(d) for d in snap.datasets}}


def used_tokens(run_dir: Path) -> dict[str, int]:
    """Completion tokens per dataset: stored results + tokens streamed by failed/aborted attempts (B5's)."""
    db = sqlite3.connect(run_dir / "store.sqlite")
    out: dict[str, int] = {}
    for q in ("SELECT dataset, COALESCE(SUM(completion_tokens), 0) FROM results GROUP BY dataset",
              "SELECT dataset, COALESCE(SUM(tokens_received), 0) FROM attempts WHERE outcome != 'ok' GROUP BY dataset"):
        for name, n in db.execute(q):
            out[name] = out.get(name, 0) + int(n)
    db.close()
    return out


async def worker(a: argparse.Namespace) -> dict:
    raise_fd_limit()
    import engine
    from engine.config import parse_config
    from engine.report.status import collect_status
    from engine.run.headless import run_headless

    tmp = Path(a.tmp)
    os.environ.setdefault("DATAGEN_BENCH_KEY", "sk-bench-local")
    spec = json.loads(a.spec)
    data = {
        "run": {"name": "b11", "dir": str(tmp / "run"), "commit_interval_s": 1.0, "progress_interval_s": 3600},
        "provider": {"kind": "openai", "base_url": a.base_url, "api_key_env": "DATAGEN_BENCH_KEY",
                     "timeouts": {"stall_s": 120, "total_s": 1800}},
        "pricing": {"prompt_usd_per_m": PRICE_IN, "completion_usd_per_m": PRICE_OUT},
        "classes": {"short": {"max_tokens": MAX_TOKENS, "concurrency": CONC}},
        "spend": {"max_cost_usd": spec["run_cap"], "credits_poll_s": 60 / COMPRESS},
        "datasets": [{k: v for k, v in d.items() if k != "prompts"} | {"format": "text"} for d in spec["datasets"]],
    }
    cfg = parse_config(data, tmp / "config.toml")
    samples: list[dict] = []
    jobs: list[Any] = []
    t0 = [0.0]
    hit_deadline = [False]

    resumed: list[dict] = []

    async def sampler(job: Any) -> None:
        while True:
            t = time.monotonic() - t0[0]
            try:
                snap = job.controller.snapshot()
                samples.append(_sample(snap, t))
                for d in snap.datasets:  # the user's answer to the calibration gate: "yes, spend up to the cap"
                    if d.state == "paused" and d.state_reason.startswith("calibration gate"):
                        resumed.append({"t": round(t, 2), "dataset": d.name, "reason": d.state_reason})
                        await job.controller.resume(d.name)
            except Exception as e:  # a sample must not end the run
                samples.append({"t": t, "error": f"{type(e).__name__}: {e}"})
            if t > a.deadline and not hit_deadline[0]:
                hit_deadline[0] = True
                job.scheduler.ending.stop("bench deadline", exit_code=0, abort=True)
            await asyncio.sleep(SAMPLE_S)

    tasks: list[asyncio.Task] = []

    def ready(job: Any) -> None:
        jobs.append(job)
        t0[0] = time.monotonic()
        tasks.append(asyncio.get_running_loop().create_task(sampler(job)))

    code = await run_headless(cfg, io.StringIO(), install_signals=False, on_ready=ready, metrics=False)
    wall = time.monotonic() - t0[0]
    for t in tasks:
        t.cancel()
    job = jobs[0]
    samples.append(_sample(job.controller.snapshot(), wall))
    try:
        drift = job.scheduler.spend.drift_usd()
    except Exception:  # an older engine
        drift = None
    st = collect_status(cfg.run.dir)
    ds_final = {d["name"]: {"cost": d["cost_usd"], "lost": d.get("lost_cost_usd"), "state": d["state"],
                            "done": d["done"], "skipped": d["skipped"], "failed": d["failed"],
                            "ctok": d["completion_tokens"]} for d in st["datasets"]}
    return {"code": code, "wall_s": wall, "deadline_hit": hit_deadline[0], "engine_file": engine.__file__,
            "samples": samples, "final": ds_final, "used": used_tokens(cfg.run.dir),
            "store_cost": st["totals"]["cost_usd"], "store_lost": st["totals"].get("lost_cost_usd", 0.0),
            "drift": drift, "status_drift": st.get("credits_drift_usd"), "run_state": st["run"]["state"],
            "resumed": resumed}


# ---- the orchestrator -----------------------------------------------------------------------------
def ledger(path: Path, keys: dict[str, str]) -> dict[str, Any]:
    """The simulator's bills: total USD, per dataset (by prompt key), per outcome."""
    tot, per, outcomes, unmatched, n = 0.0, {}, {}, 0, 0
    if path.exists():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            n += 1
            c = float(r.get("cost_usd") or 0.0)
            tot += c
            ds = keys.get(r.get("prompt_key", ""))
            if ds is None:
                unmatched += 1
            else:
                per[ds] = per.get(ds, 0.0) + c
            o = r.get("outcome", "?")
            outcomes[o] = outcomes.get(o, 0) + 1
    return {"usd": tot, "per_dataset": per, "outcomes": outcomes, "unmatched": unmatched, "requests": n}


def _at(samples: list[dict], t: float) -> dict:
    ok = [s for s in samples if "error" not in s]
    return min(ok, key=lambda s: abs(s["t"] - t))


def _ds_end(samples: list[dict], name: str, wall: float) -> float:
    """When the dataset's last stream ended: the first sample from which its in-flight count stays 0
    (having done something); the run's end if never."""
    end = None
    for s in samples:
        d = s.get("ds", {}).get(name)
        if d is None:
            continue
        if (d["in_flight"] or 0) == 0 and (d["done"] or 0) > 0:
            end = s["t"] if end is None else end
        else:
            end = None
    return wall if end is None else end


def _err(proj: float | None, true: float | None) -> float | None:
    """Signed error in percent of the truth (``proj`` None: no figure shown)."""
    if proj is None or not true:
        return None
    return 100.0 * (proj / true - 1.0)


def figures(res: dict, led: dict, spec: dict) -> dict[str, Any]:
    """One repetition's figures from the worker's samples, its final store and the ledger."""
    samples, wall = res["samples"], res["wall_s"]
    true_total = led["usd"]
    ends = {d["name"]: _ds_end(samples, d["name"], wall) for d in spec["datasets"]}
    out: dict[str, Any] = {"wall_s": wall, "ledger_usd": true_total, "ds_end_s": ends, "checkpoints": {}}
    for f in CHECKPOINTS:
        s = _at(samples, f * wall)
        left = wall - s["t"]
        cp = {"t": s["t"], "proj": s["proj"], "proj_lo": s["proj_lo"], "proj_hi": s["proj_hi"],
              "spent": s["cost"], "in_flight_usd": s["cif"], "floor": (s["cost"] or 0) + (s["cif"] or 0),
              "cost_err_pct": _err(s["proj"], true_total), "eta": s["eta"], "eta_reason": s["eta_reason"],
              "true_left_s": left, "eta_err_pct": _err(s["eta"], left), "in_flight": s["in_flight"],
              "tok_s": s["tok_s"], "streamed_tok_s": (s["in_flight"] or 0) * TOK_S,
              "calib": s["calib"], "capped": s["capped"], "ds": {}}
        cp["below_floor"] = s["proj"] is not None and s["proj"] < cp["floor"] - 1e-9
        for name, d in s["ds"].items():
            dleft = ends[name] - s["t"]
            cp["ds"][name] = {"proj": d["proj"], "true_usd": led["per_dataset"].get(name),
                              "store_usd": res["final"][name]["cost"],
                              "cost_err_pct": _err(d["proj"], led["per_dataset"].get(name)), "eta": d["eta"],
                              "true_left_s": dleft if dleft > 0 else 0.0,
                              "eta_err_pct": _err(d["eta"], dleft) if dleft > 0 else None,
                              "in_flight": d["in_flight"], "state": d["state"], "limit": d["limit"]}
        out["checkpoints"][f"{int(f * 100)}"] = cp
    inflight = [s["in_flight"] or 0 for s in samples if "error" not in s]
    out["max_in_flight"] = max(inflight) if inflight else 0
    # in flight over the middle of the run (10%..50%), while all datasets still had prompts to send
    mid = [s["in_flight"] or 0 for s in samples if "error" not in s and 0.1 * wall <= s["t"] <= 0.5 * wall]
    out["mean_in_flight_10_50"] = sum(mid) / len(mid) if mid else None
    ds = {d["name"]: d for d in spec["datasets"]}
    a = ds["alpha"]
    out["alpha_used"] = res["used"].get("alpha", 0)
    out["alpha_over"] = out["alpha_used"] / a["token_budget"]
    out["beta_usd"] = res["final"]["beta"]["cost"]
    out["beta_over"] = out["beta_usd"] / ds["beta"]["max_cost_usd"]
    out["beta_ledger_over"] = led["per_dataset"].get("beta", 0.0) / ds["beta"]["max_cost_usd"]
    out["run_over"] = res["store_cost"] / spec["run_cap"]
    stored, lost = res["store_cost"] - res["store_lost"], res["store_lost"]
    drift = res.get("drift")
    out["dollars"] = {"ledger": true_total, "stored_results": stored, "lost": lost, "drift": drift,
                      "status_drift": res.get("status_drift"),
                      "gap_usd": true_total - (stored + lost + (drift or 0.0)),
                      "gap_pct": 100.0 * (true_total - (stored + lost + (drift or 0.0))) / true_total if true_total else None,
                      "unaccounted_without_drift_usd": true_total - (stored + lost)}
    out["final"] = res["final"]
    out["ledger"] = {k: v for k, v in led.items()}
    out["code"], out["deadline_hit"], out["run_state"] = res["code"], res["deadline_hit"], res.get("run_state")
    out["resumed"] = res.get("resumed", [])
    return out


def one_rep(tmp: Path, rep: int, scale: float, client_cpu: int | None, sim_cpu: int | None) -> dict[str, Any]:
    spec = {"datasets": sized(scale), "run_cap": round(RUN_CAP_USD * CONC_SCALE * scale, 2)}
    d = tmp / f"rep{rep}"
    d.mkdir()
    keys: dict[str, str] = {}
    from engine.prompts import prompt_key

    for ds in spec["datasets"]:
        p = write_prompts(d / f"{ds['name']}.jsonl", ds["prompts"], tag=f"b11-{ds['name']}-{rep} ")
        ds["path"] = str(p)
        for m in read_prompt_messages(p):
            keys[prompt_key(m)] = ds["name"]
    ledger_path = d / "ledger.jsonl"
    with SimProcess(*sim_args(**SIM, seed=rep + 1, extra=["--log", str(ledger_path), "--faults", FAULTS,
                                                           "--credits", "100000", "--price-in", str(PRICE_IN),
                                                           "--price-out", str(PRICE_OUT)]), cpu=sim_cpu) as sim:
        t = time.monotonic()
        res = run_worker("b11_projection", ["--base-url", sim.base_url, "--tmp", str(d), "--spec", json.dumps(spec),
                                            "--deadline", str(DEADLINE_S)], cpu=client_cpu,
                         timeout=DEADLINE_S + 240)
        log(f"B11 run {rep + 1}: engine ended in {res['wall_s']:.0f}s (code {res['code']}, "
            f"{'DEADLINE, aborted' if res['deadline_hit'] else res.get('run_state')}; worker "
            f"{time.monotonic() - t:.0f}s; engine {res['engine_file']})")
        time.sleep(3)  # the simulator logs a dropped stream once it notices the client gone
    led = ledger(ledger_path, keys)
    fig = figures(res, led, spec)
    fig["engine_file"] = res["engine_file"]
    fig["samples"] = res["samples"][:: max(1, len(res["samples"]) // 150)]  # thinned for results.json
    return fig


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.0f}%"


def describe(fig: dict) -> str:
    """One repetition in a few lines (progress log and the row notes)."""
    parts = [f"ran {fig['wall_s']:.0f}s" + (" (aborted at the deadline: times left are lower bounds)"
                                              if fig["deadline_hit"] else "")]
    for k, cp in fig["checkpoints"].items():
        ds = ", ".join(f"{n} ${(c['proj'] or 0):.2f} vs ${(c['true_usd'] or 0):.2f} ({_pct(c['cost_err_pct'])}), "
                       f"ETA {('-' if c['eta'] is None else format(c['eta'], '.0f'))}s vs {c['true_left_s']:.0f}s"
                       for n, c in cp["ds"].items())
        parts.append(f"at {k}% (t={cp['t']:.0f}s): projected ${(cp['proj'] or 0):.2f} vs billed "
                     f"${fig['ledger_usd']:.2f} ({_pct(cp['cost_err_pct'])}; spent+in flight ${cp['floor']:.2f}), "
                     f"ETA {('-' if cp['eta'] is None else format(cp['eta'], '.0f'))}s vs {cp['true_left_s']:.0f}s left "
                     f"({_pct(cp['eta_err_pct'])}), tok/s {cp['tok_s'] or 0:,.0f} vs ~{cp['streamed_tok_s']:,} streamed, "
                     f"in flight {cp['in_flight']}; {ds}")
    return "; ".join(parts)


ROWS = (  # (key, what, unit, goal)
    ("cost10", "projected total cost at 10% of the run's wall time vs the final bill (ledger)", "% error", "(report)"),
    ("cost25", "projected total cost at 25% of the run's wall time vs the final bill", "% error", "within +-20%"),
    ("cost50", "projected total cost at 50% of the run's wall time vs the final bill", "% error", "within +-20%"),
    ("dscost25", "worst dataset's projected cost at 25% vs its final bill", "% error", "within +-20%"),
    ("dscost50", "worst dataset's projected cost at 50% vs its final bill", "% error", "within +-20%"),
    ("eta10", "run ETA at 10% of the wall time vs the true time left", "% error", "(report)"),
    ("eta25", "run ETA at 25% vs the true time left", "% error", "(report)"),
    ("eta50", "run ETA at 50% vs the true time left", "% error", "(report)"),
    ("etatail", "worst run ETA shown between 50% and 90% of the run / the true time left then", "x", "(report)"),
    ("floor", "share of the samples whose projected total is below spent + in flight", "share", "0"),
    ("toks10", "header tok/s at 10% / tokens being streamed (in flight x per-stream rate)", "x", "(report)"),
    ("wall", f"run wall time, start to the last stream's end (x{COMPRESS}: the real run's)", "s", "(report)"),
    ("inflight", "most streams in flight / configured concurrency", "x", "1.0"),
    ("alphaflight", "most streams in flight of the budget-held dataset (alpha) / concurrency (its budget at "
     "max_tokens reservations: 0.375)", "x", "(report)"),
    ("alpha", "token budget: completion tokens used / token_budget (alpha)", "x budget", "<= 1.02x"),
    ("beta", "dataset dollar cap: spend / max_cost_usd (beta)", "x cap", "<= 1.02x"),
    ("run", "run dollar cap: spend / max_cost_usd (should not bind)", "x cap", "(report)"),
    ("dollars", "simulator's bill (ledger) minus stored results + reported lost + credits drift", "% of bill",
     "within +-1%"),
    ("dollars_nodrift", "the same without the credits drift: ledger minus (stored results + reported lost)",
     "% of bill", "(report)"),
)


def _worst_ds(cp: dict) -> float | None:
    errs = [c["cost_err_pct"] for c in cp["ds"].values() if c["true_usd"]]
    if not errs or any(e is None for e in errs):
        return None
    return max(errs, key=abs)


def values(fig: dict) -> dict[str, float | None]:
    cps = fig["checkpoints"]
    tk = cps["10"]
    return {"cost10": cps["10"]["cost_err_pct"], "cost25": cps["25"]["cost_err_pct"],
            "cost50": cps["50"]["cost_err_pct"], "dscost25": _worst_ds(cps["25"]), "dscost50": _worst_ds(cps["50"]),
            "eta10": cps["10"]["eta_err_pct"], "eta25": cps["25"]["eta_err_pct"], "eta50": cps["50"]["eta_err_pct"],
            "toks10": (tk["tok_s"] or 0) / tk["streamed_tok_s"] if tk["streamed_tok_s"] else None,
            "inflight": fig["max_in_flight"] / CONC, "wall": fig["wall_s"],
            "alphaflight": max((s["ds"]["alpha"]["in_flight"] or 0 for s in fig["samples"] if "ds" in s),
                               default=0) / CONC,
            "alpha": fig["alpha_over"], "beta": fig["beta_over"],
            "run": fig["run_over"], "dollars": fig["dollars"]["gap_pct"], "etatail": eta_tail(fig),
            "dollars_nodrift": (100.0 * fig["dollars"]["unaccounted_without_drift_usd"] / fig["ledger_usd"]
                                if fig["ledger_usd"] else None), "floor": below_floor_share(fig)}


def eta_tail(fig: dict) -> float | None:
    """The largest run ETA / true time left over the (thinned) samples from 50% to 90% of the run."""
    w = fig["wall_s"]
    r = [s["eta"] / (w - s["t"]) for s in fig["samples"]
         if "error" not in s and s.get("eta") is not None and w / 2 <= s["t"] <= 0.9 * w]
    return max(r) if r else None


def below_floor_share(fig: dict) -> float | None:
    """Share of the (thinned) samples with a projected total below spent + dollars in flight."""
    ss = [s for s in fig["samples"] if "error" not in s and s.get("proj") is not None and s["t"] > 0]
    if not ss:
        return None
    return sum(1 for s in ss if s["proj"] < (s["cost"] or 0) + (s["cif"] or 0) - 1e-9) / len(ss)


def _met(key: str, s: dict) -> bool | None:
    if s.get("median") is None:
        return None
    lo, hi = s["min"], s["max"]
    if key in ("cost25", "cost50", "dscost25", "dscost50"):
        return max(abs(lo), abs(hi)) <= 20.0
    if key in ("alpha", "beta"):
        return hi <= 1.02
    if key == "dollars":
        return max(abs(lo), abs(hi)) <= 1.0
    if key == "inflight":
        return lo >= 0.99
    if key == "floor":
        return hi == 0
    return None


def load_before() -> dict | None:
    try:
        return json.loads(BEFORE_FILE.read_text())
    except (OSError, ValueError):
        return None


def rows_from(figs: list[dict], scale: float, before: dict | None) -> list[dict]:
    vals = [values(f) for f in figs]
    bvals = {r["key"]: r["ours"] for r in (before or {}).get("rows", [])}
    bcommit = (before or {}).get("machine", {}).get("commit", "?")
    out = []
    for key, what, unit, goal in ROWS:
        s = summary([v[key] for v in vals])
        note = ""
        if key.startswith("eta") and any(f["deadline_hit"] for f in figs):
            note = (f"{sum(f['deadline_hit'] for f in figs)} of {len(figs)} run(s) did not end within "
                    f"{DEADLINE_S:.0f} s and were aborted there: the true time left is a lower bound, the error an "
                    f"upper bound")
        if key == "cost10":
            note = (compression_note(scale) + f"; baseline = before (commit {bcommit})" if before else
                    compression_note(scale))
        out.append(make_row("B11", what, ours=s, baseline=bvals.get(key, "not measured"), unit=unit, goal=goal,
                            met=_met(key, s), note=note, details={"key": key}))
        out[-1]["key"] = key
    out[0]["details"] = {"key": "cost10", "runs": figs, "sim": SIM, "conc": CONC, "compress": COMPRESS,
                         "conc_scale": CONC_SCALE, "scale": scale, "faults": FAULTS,
                         "before": ({"file": str(BEFORE_FILE.relative_to(BENCH.parent)), "commit": bcommit}
                                    if before else None),
                         "per_run": [describe(f) for f in figs]}
    return out


def run(reps: int, scale: float = 1.0, save_before: Path | None = None) -> list[dict]:
    client_cpu, sim_cpu = placement()
    figs = []
    with tempdir("b11") as tmp:
        for rep in range(reps):
            try:
                fig = one_rep(tmp, rep, scale, client_cpu, sim_cpu)
            except WorkerError as e:
                log(f"B11 run {rep + 1}: FAILED: {e}")
                continue
            log(f"B11 run {rep + 1}: {describe(fig)}; max in flight {fig['max_in_flight']}/{CONC}; alpha "
                f"{fig['alpha_over']:.3f}x budget, beta {fig['beta_over']:.3f}x cap, run {fig['run_over']:.3f}x cap; "
                f"dollars {fig['dollars']}")
            figs.append(fig)
    if not figs:
        raise RuntimeError("every B11 repetition failed")
    before = None if save_before else load_before()
    rows = rows_from(figs, scale, before)
    if save_before:
        doc = {"machine": machine_info(), "rows": [{"key": r["key"], "ours": r["ours"], "what": r["what"]}
                                                   for r in rows], "details": rows[0]["details"]}
        Path(save_before).write_text(json.dumps(doc, indent=1, default=str) + "\n")
        log(f"B11: 'before' figures written to {save_before}")
    return rows


def recompute(path: Path) -> None:
    """Rewrite a saved 'before' file's rows from its runs (after a change to how figures are summarised)."""
    doc = json.loads(Path(path).read_text())
    rows = rows_from(doc["details"]["runs"], doc["details"].get("scale", 1.0), None)
    doc["rows"] = [{"key": r["key"], "ours": r["ours"], "what": r["what"]} for r in rows]
    Path(path).write_text(json.dumps(doc, indent=1, default=str) + "\n")


def recompute_results(path: Path) -> None:
    """Rebuild the B11 rows of a ``bench.run`` results.json (and its results.md) from their runs."""
    from bench import run as runner

    doc = json.loads(Path(path).read_text())
    b11 = [r for r in doc["rows"] if r["id"] == "B11"]
    d = b11[0]["details"]
    rows = rows_from(d["runs"], d.get("scale", 1.0), load_before())
    doc["rows"] = [r for r in doc["rows"] if r["id"] != "B11"] + rows
    runner.write(Path(path).parent, doc["machine"], doc["rows"], doc["timings_s"], doc["total_s"], doc["reps"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="B11 projected cost and ETA at the real stream shape")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--base-url")
    p.add_argument("--tmp")
    p.add_argument("--spec")
    p.add_argument("--deadline", type=float, default=DEADLINE_S)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--scale", type=float, default=1.0, help="budgets, caps and prompts x this (development)")
    p.add_argument("--save-before", type=Path, default=None,
                   help=f"write the figures as the 'before' entry (normally {BEFORE_FILE})")
    p.add_argument("--recompute", type=Path, default=None, help="recompute a saved 'before' file's rows (or a results.json's B11 rows, its "
                        "results.md) and exit")
    a = p.parse_args(argv)
    if a.recompute:
        if a.recompute.name == "results.json":
            recompute_results(a.recompute)
        else:
            recompute(a.recompute)
        return 0
    if a.worker:
        emit(asyncio.run(worker(a)))
        sys.stdout.flush()
        os._exit(0)
    print(json.dumps(run(a.reps, a.scale, a.save_before), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
