"""B2: event-loop lag p50/p99 with 2,000 in-flight long-lived streams, headless and under the
dashboard (Textual ``run_test``), against an idle loop probe; the bare httpx loop under the same
load gives the floor set by the HTTP stack. Measured by the hold runs (``bench/hold.py``).

The engine's HTTP streams run in its stream-worker processes (``engine.stream``), so the probe
shares the loop with the control plane (scheduler, budgets, store writer) and, in dashboard mode,
the UI; the bare httpx loop still holds its 2,000 streams on the probed loop.

Run alone: ``python -m bench.b2_loop_lag [--reps 3]`` (also prints B3, B7 and B10, which come from
the same runs).
"""

from __future__ import annotations

import argparse
import json
import sys

from bench import hold
from bench.common import make_row, stream_note, summary

WHAT = (f"event-loop lag {{q}}, {hold.CONCURRENCY:,} streams in flight at {hold.TOKENS_PER_S:g} tok/s each "
        f"(8 datasets); {{who}}")


def _vals(runs: list[dict], phase: str, key: str) -> list:
    return [r.get(phase, {}).get(key) for r in runs]


def rows(res: dict[str, list[dict]]) -> list[dict]:
    head, dash, bare = res.get("headless", []), res.get("dashboard", []), res.get("httpx", [])
    idle = {q: summary(_vals(head, "probe", f"{q}_ms")) for q in ("p50", "p99")}
    out = []
    if dash:
        d99 = summary(_vals(dash, "load", "p99_ms"))
        renders = summary(_vals(dash, "load", "renders_per_s"))
        out.append(make_row("B2", WHAT.format(q="p99", who="engine + dashboard; baseline: idle loop probe"),
                            ours=d99, baseline=idle["p99"], unit="ms", goal="<= 50 ms",
                            met=None if d99["median"] is None else d99["median"] <= 50,
                            note=f"dashboard drew {renders['median']:.2f} frames/s of the 2 asked"
                            if renders["median"] is not None else ""))
        out.append(make_row("B2", WHAT.format(q="p50", who="engine + dashboard; baseline: idle loop probe"),
                            ours=summary(_vals(dash, "load", "p50_ms")), baseline=idle["p50"], unit="ms",
                            goal="(report)", met=None))
    for q in ("p99", "p50"):
        out.append(make_row("B2", WHAT.format(q=q, who="engine headless; baseline: idle loop probe"),
                            ours=summary(_vals(head, "load", f"{q}_ms")), baseline=idle[q], unit="ms",
                            goal="(report)", met=None))
    if bare:
        out.append(make_row("B2", WHAT.format(q="p99", who="engine headless; baseline: bare httpx loop "
                                                       "(ShardedTransport) under the same load"),
                            ours=summary(_vals(head, "load", "p99_ms")), baseline=summary(_vals(bare, "load", "p99_ms")),
                            unit="ms", goal="(context)", met=None,
                            note="CPU share of the client core under load: engine process "
                                 f"{_pct(summary(_vals(head, 'load', 'cpu_share')))} (its stream workers "
                                 f"{_pct(summary(_vals(head, 'load', 'workers_cpu_share')))}, summed, elsewhere), "
                                 f"bare loop {_pct(summary(_vals(bare, 'load', 'cpu_share')))}; "
                                 f"{stream_note()}"))
    return out


def _pct(s: dict) -> str:
    return "-" if s["median"] is None else f"{100 * s['median']:.0f}%"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="B2 event-loop lag (with B3, B7 and B10 from the same runs)")
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args(argv)
    from bench import b3_memory, b7_dashboard_cpu, b10_keys

    res = hold.run(a.reps)
    print(json.dumps(rows(res) + b3_memory.rows(res) + b7_dashboard_cpu.rows(res) + b10_keys.rows(res), indent=1,
                     default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
