"""``make bench``: run every benchmark, write ``bench/results.md`` and ``bench/results.json``.

Usage::

    python -m bench.run                 # everything (about 30 minutes on 2 cores, B11 ~14 of them)
    python -m bench.run --only B4,B5    # a subset (B2, B3, B7 and B10 share their runs)
    python -m bench.run --quick         # shorter windows, one repetition (development)
    python -m bench.run --reps 5        # more repetitions than the default 3
    python -m bench.run --only B8 --merge   # rerun one, keep the other rows of results.json

Every figure is the median of several runs with its spread; the simulator runs in its own
process on its own core, each measured process on the other (see bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ALL = ("B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8", "B9", "B10", "B11")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="eagle-datagen benchmarks")
    p.add_argument("--only", default=",".join(ALL), help="comma-separated ids (default: all)")
    p.add_argument("--reps", type=int, default=None, help="repetitions per benchmark (default 3; --quick: 1)")
    p.add_argument("--quick", action="store_true", help="development settings: short windows, 1 repetition")
    p.add_argument("--out", default=None, help="output directory (default: bench/)")
    p.add_argument("--merge", action="store_true",
                   help="keep the other benchmarks' rows of the existing results.json (replace only --only's)")
    a = p.parse_args(argv)
    if a.quick:
        os.environ["BENCH_PROFILE"] = "quick"
    from bench import common  # reads BENCH_PROFILE

    reps = a.reps or (1 if a.quick else 3)
    only = [x.strip().upper() for x in a.only.split(",") if x.strip()]
    out_dir = Path(a.out) if a.out else common.BENCH
    t0 = time.monotonic()
    machine = common.machine_info()
    common.log(f"machine: {machine['cpu']}, {machine['cores']} cores, {machine['ram_gib']} GiB, "
               f"Python {machine['python']}; load average {machine['loadavg_at_start']}; {reps} repetition(s)")
    rows: list[dict] = []
    timings: dict[str, float] = {}
    if a.merge and (out_dir / "results.json").exists():
        old = json.loads((out_dir / "results.json").read_text())
        rows = [r for r in old.get("rows", []) if r["id"] not in only]
        timings = {k: v for k, v in old.get("timings_s", {}).items() if not any(k.startswith(i) for i in only)}
        machine["merged_with_run_of"] = old.get("machine", {}).get("date")

    def step(name: str, fn) -> None:
        t = time.monotonic()
        common.log(f"== {name} (elapsed {time.monotonic() - t0:.0f}s)")
        try:
            rows.extend(fn())
        except Exception as e:  # one broken benchmark must not lose the others
            common.log(f"{name} FAILED: {type(e).__name__}: {e}")
            rows.append(common.unavailable(name.split()[0], name, "", f"benchmark failed: {type(e).__name__}: {e}"))
        timings[name] = time.monotonic() - t
        write(out_dir, machine, rows, timings, time.monotonic() - t0, reps)  # partial results survive a crash

    if "B4" in only:
        from bench import b4_resume

        step("B4 resume", lambda: b4_resume.run(reps))
    if "B5" in only:
        from bench import b5_budget

        step("B5 budget", lambda: b5_budget.run(reps, 1))
    if "B9" in only:
        from bench import b9_hard_cap

        step("B9 hard_cap", lambda: b9_hard_cap.run(reps))
    if "B11" in only:
        from bench import b11_projection

        # one full run is ~5-8 minutes: at most 2 repetitions unless --reps asks for more
        step("B11 projection", lambda: b11_projection.run(a.reps or min(reps, 2)))
    hold_ids = [x for x in ("B2", "B3", "B7", "B10") if x in only]
    if hold_ids:
        from bench import b2_loop_lag, b3_memory, b7_dashboard_cpu, b10_keys, hold

        modes = (("headless",) if {"B2", "B3", "B7"} & set(hold_ids) else ()) + \
            (("dashboard",) if {"B2", "B7", "B10"} & set(hold_ids) else ()) + \
            (("httpx",) if "B2" in hold_ids else ())

        def holds() -> list[dict]:
            res = hold.run(reps, modes, keys="B10" in hold_ids)
            out = []
            if "B2" in hold_ids:
                out += b2_loop_lag.rows(res)
            if "B3" in hold_ids:
                out += b3_memory.rows(res)
            if "B7" in hold_ids:
                out += b7_dashboard_cpu.rows(res)
            if "B10" in hold_ids:
                out += b10_keys.rows(res)
            if out:
                out[0]["details"] = {**out[0].get("details", {}), "hold_runs": res}
            return out

        step(f"{'/'.join(hold_ids)} hold runs", holds)
    if "B1" in only:
        from bench import b1_throughput

        step("B1 throughput", lambda: b1_throughput.run(reps, b1_throughput.WINDOW_S, b1_throughput.START_AFTER))
    for bid in ("B6", "B8"):
        if bid in only:
            from bench import external

            # bench_extract.py times a forward loop twice (~45 s a run on 2 cores): run it once
            step(f"{bid} external", lambda bid=bid: [external.run_one(bid, reps if bid == "B6" else 1)])
    total = time.monotonic() - t0
    write(out_dir, machine, rows, timings, total, reps)
    common.log(f"done in {total:.0f}s: {out_dir / 'results.md'}")
    print((out_dir / "results.md").read_text())
    return 0


# ---- report -------------------------------------------------------------------------------------
ORDER = {k: i for i, k in enumerate(ALL)}


def fmt_num(v: float | None) -> str:
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def fmt_cell(s) -> str:
    """``median [min–max]`` of a summary, a plain number, or a string."""
    if isinstance(s, str):
        return s
    if isinstance(s, (int, float)):
        return fmt_num(s)
    if not s or s.get("median") is None:
        return "-"
    if s.get("n", 0) <= 1:
        return fmt_num(s["median"])
    return f"{fmt_num(s['median'])} [{fmt_num(s['min'])}–{fmt_num(s['max'])}]"


def fmt_ratio(r) -> str:
    if not r:
        return ""
    if "delta" in r:
        d = r["delta"]
        if d.get("median") is None:
            return "-"
        sp = f" [{d['min']:+.1f}–{d['max']:+.1f}]" if d.get("n", 0) > 1 else ""
        return f"{d['median']:+.1f} pts{sp}"
    if r.get("median") is None:
        return "-"
    sp = f" [{r['min']:.2f}–{r['max']:.2f}]" if r.get("n", 0) > 1 else ""
    return f"{r['median']:.2f}x{sp}"


def fmt_met(m) -> str:
    return {True: "yes", False: "**no**", None: "-"}[m]


def table(rows: list[dict]) -> str:
    lines = ["| id | what | ours | baseline | ratio | unit | goal | met? |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: ORDER.get(r["id"], 99)):
        what = r["what"] + (f" *({r['note']})*" if r.get("note") else "")
        lines.append(f"| {r['id']} | {what} | {fmt_cell(r['ours'])} | {fmt_cell(r['baseline'])} | "
                     f"{fmt_ratio(r.get('ratio'))} | {r.get('unit', '')} | {r.get('goal', '')} | {fmt_met(r.get('met'))} |")
    return "\n".join(lines)


def write(out_dir: Path, machine: dict, rows: list[dict], timings: dict, total: float, reps: int) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    total = max(total, sum(timings.values()))
    doc = {"machine": machine, "reps": reps, "total_s": total, "timings_s": timings, "rows": rows}
    (out_dir / "results.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    pk = ", ".join(f"{k} {v}" for k, v in machine["packages"].items() if v)
    merged = f"; rows not rerun are from the run of {machine['merged_with_run_of']}" \
        if machine.get("merged_with_run_of") else ""
    load = ", ".join(f"{x:.2f}" for x in machine["loadavg_at_start"])
    md = f"""# eagle-datagen benchmarks

Machine: {machine['cpu']}, {machine['cores']} cores ({machine['cores_allowed']} usable), {machine['ram_gib']} GiB RAM,
{machine['os']}, Python {machine['python']}; {pk}.
Run {machine['date']} at commit {machine['commit'] or '?'}{merged}; load average at start {load};
profile `{machine['profile']}`, {reps} repetition(s) per figure (the naive scheduler of B5 and B8: 1, the openai SDK
of B1: at most 2), {total:.0f} s of benchmarks in all.

Cells: median [min–max] over the repetitions; "ratio" is the median of the per-run ratios ours/baseline
(runs interleaved, so each ratio compares runs made side by side). The simulator (`datagen sim`) runs in its own
process pinned to one core, each measured process is pinned to another; the engine's stream workers (B1, B2/B3/B7/B10)
run on the cores left, unpinned when none is (2 cores). Absolute figures depend on the machine
and on what else runs on it: compare ratios, and rerun `make bench` on a quiet machine before quoting any.

{table(rows)}

Details of every run (per-run values, error counts, in-flight levels, simulator CPU share): `bench/results.json`.
How each figure is measured: `bench/README.md`.
"""
    (out_dir / "results.md").write_text(md)


if __name__ == "__main__":
    sys.exit(main())
