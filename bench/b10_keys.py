"""B10: key press -> new state on the screen, under the dashboard at 2,000 streams.

From the dashboard hold runs (``bench/hold.py`` with ``--keys``): after the load phase, still with the
2,000 streams open (simulator paced at 20 tokens/s per stream, 8 datasets), ``P`` (pause all) then
``R`` (resume all) are pressed through Textual's pilot five times, a second apart; per press, the
time from the press until the compositor has drawn the header with the new state (``PAUSED`` /
``RUNNING``). The engine's HTTP streams run in its stream-worker processes, so the dashboard's loop
only carries the control plane (scheduler, budgets, store writer) and the UI.

The row's figure is the median over runs of each run's p50 over its 10 presses (goal <= 250 ms); a
second row gives the max. The note splits the time: the app's snapshot has the state (the command
ran and the app polled), the header's text was set, the header was painted.

Run alone: ``python -m bench.b10_keys [--reps 3]`` (dashboard hold runs only).
"""

from __future__ import annotations

import argparse
import json
import sys

from bench import hold
from bench.common import make_row, summary

WHAT = (f"key press -> new run state drawn on the dashboard (P pause all / R resume all, "
        f"{hold.KEY_CYCLES} each), {hold.CONCURRENCY:,} streams in flight at {hold.TOKENS_PER_S:g} tok/s (8 datasets)")
GOAL_MS = 250.0


def _stat(runs: list[dict], key: str, q: str) -> dict:
    return summary([r["keys"][key][q] if r.get("keys", {}).get(key, {}).get(q) is not None else None for r in runs])


def rows(res: dict[str, list[dict]]) -> list[dict]:
    runs = [r for r in res.get("dashboard", []) if "keys" in r]
    if not runs:
        return []
    p50, mx = _stat(runs, "painted_ms", "p50"), _stat(runs, "painted_ms", "max")
    snap, head = _stat(runs, "snapshot_ms", "p50"), _stat(runs, "header_ms", "p50")
    missed = sum(r["keys"]["painted_ms"]["missed"] for r in runs)
    presses = sum(len(r["keys"]["presses"]) for r in runs)
    in_flight = summary([p["in_flight"] for r in runs for p in r["keys"]["presses"]])
    lag = summary([r["keys"].get("lag_p99_ms") for r in runs])
    parts = []
    if snap["median"] is not None and head["median"] is not None:
        parts.append(f"p50 of the steps: snapshot has the state {snap['median']:.0f} ms, header text set "
                     f"{head['median']:.0f} ms, drawn {p50['median']:.0f} ms")
    if in_flight["median"] is not None:
        parts.append(f"{in_flight['median']:,.0f} in flight at the presses")
    if lag["median"] is not None:
        parts.append(f"loop lag p99 during the presses {lag['median']:.0f} ms")
    if missed:
        parts.append(f"{missed} of {presses} presses not drawn within {hold.KEY_TIMEOUT_S:g} s (left out)")
    met = None if p50["median"] is None else (p50["median"] <= GOAL_MS and not missed)
    return [
        make_row("B10", f"{WHAT}; p50 of the presses", ours=p50, baseline="-", unit="ms",
                 goal=f"<= {GOAL_MS:.0f} ms", met=met, note="; ".join(parts),
                 details={"keys": [r["keys"] for r in runs]}),
        make_row("B10", f"{WHAT}; max of the presses", ours=mx, baseline="-", unit="ms", goal="(report)", met=None),
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="B10 key press -> state visible under load")
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args(argv)
    print(json.dumps(rows(hold.run(a.reps, ("dashboard",))), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
