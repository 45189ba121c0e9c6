"""B7: CPU the dashboard adds (share of one core) at 2 Hz with 8 datasets, with the engine idle
(run paused, nothing in flight) and under full load (2,000 streams), against the same engine
headless. From the hold runs (``bench/hold.py``); runs are paired by repetition.

The dashboard's own CPU is measured in the process (:class:`bench.common.UICpuMeter`): the
loop's task factory wraps every task whose coroutine is defined in textual, rich or tui and adds
the thread CPU time of each of its steps (snapshot polls, rendering, compositing, message pumps). Under full load the client core is
saturated (see B2) and the dashboard draws far fewer than 2 frames/s, so the figure is also scaled
to 2 frames/s (cost per frame x 2), and the goal is judged on that.

Run alone: ``python -m bench.b7_dashboard_cpu [--reps 3]`` (headless and dashboard runs).
"""

from __future__ import annotations

import argparse
import json
import sys

from bench import hold
from bench.common import make_row, summary


def rows(res: dict[str, list[dict]]) -> list[dict]:
    head, dash = res.get("headless", []), res.get("dashboard", [])
    if not dash:
        return []
    out = []
    for phase, label in (("idle", "engine idle (run paused)"), ("load", f"full load ({hold.CONCURRENCY:,} streams)")):
        h = [100 * r[phase]["cpu_share"] if phase in r else None for r in head]
        d = [100 * r[phase]["cpu_share"] if phase in r else None for r in dash]
        added = summary([b - a for a, b in zip(h, d, strict=False) if a is not None and b is not None])
        ui = [100 * r[phase]["dashboard_cpu_share"] if r.get(phase, {}).get("dashboard_cpu_share") is not None
              else None for r in dash]
        fps = [r[phase].get("renders_per_s") if phase in r else None for r in dash]
        at2 = [u * 2.0 / f if u is not None and f else None for u, f in zip(ui, fps, strict=True)]
        s_ui, s_fps, s_at2 = summary(ui), summary(fps), summary(at2)
        met = None if s_at2["median"] is None else s_at2["median"] <= 5.0
        note = (f"dashboard tasks (textual/rich/tui) measured at the {s_fps['median']:.2f} frames/s it drew; "
                f"scaled to 2 frames/s: {s_at2['median']:.1f}% of a core; process CPU with the dashboard minus "
                f"headless: {added['median']:+.1f} points" if s_at2["median"] is not None else "")
        if phase == "load":
            hl = summary([r["load"].get("cpu_share") if "load" in r else None for r in head])
            if hl["median"] is not None and hl["median"] >= 0.9:
                note += "; the client core is saturated under this load (B2), so process CPU shares are capped"
            note += "; the HTTP streams run in the stream-worker processes, not counted here"
        out.append(make_row(
            "B7", f"CPU of the dashboard, % of one core, 2 Hz with 8 datasets, {label}; "
                  f"baseline: the whole engine process headless", ours=s_ui, baseline=summary(h), unit="% of a core",
            goal="<= 5% of a core added", met=met, ratio=None, note=note))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="B7 dashboard CPU")
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args(argv)
    print(json.dumps(rows(hold.run(a.reps, ("headless", "dashboard"))), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
