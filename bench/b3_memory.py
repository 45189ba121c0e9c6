"""B3: resident memory per in-flight request at 2,000 concurrency, beyond the completion text.

From the headless hold runs (``bench/hold.py``): RSS with the job prepared and paused (nothing in
flight) vs RSS after the 2,000 streams have been open for a while;
``(RSS_load - RSS_idle - text) / in_flight`` where ``text`` is the characters the in-flight
requests have received so far (kept as ``str`` pieces until the completion is assembled).

RSS is summed over the engine process AND its stream-worker processes (``engine.stream``: they hold
the connections and the text; their pids from ``job.pool.figures()``, each read from
``/proc/PID/status`` VmRSS); the note splits the per-request figure between the two.

Run alone: ``python -m bench.b3_memory [--reps 3]`` (headless runs only).
"""

from __future__ import annotations

import argparse
import json
import sys

from bench import hold
from bench.common import make_row, summary


def per_request_kb(r: dict) -> float | None:
    try:
        ld, idle = r["load"], r["idle"]
        return (ld["rss"] - idle["rss"] - ld["text_chars"]) / ld["in_flight"] / 1024
    except (KeyError, ZeroDivisionError, TypeError):
        return None


def part_kb(r: dict, key: str) -> float | None:
    """Growth of one part's RSS (``rss_main``: the engine process, ``rss_workers``: its stream workers)
    per in-flight request (KB), text not subtracted."""
    try:
        return (r["load"][key] - r["idle"][key]) / r["load"]["in_flight"] / 1024
    except (KeyError, ZeroDivisionError, TypeError):
        return None


def rows(res: dict[str, list[dict]]) -> list[dict]:
    runs = res.get("headless", [])
    ours = summary([per_request_kb(r) for r in runs])
    before = summary([r["idle"]["rss"] / 2**20 if "idle" in r else None for r in runs])
    text = summary([r["load"]["text_chars"] / r["load"]["in_flight"] / 1024 if "load" in r else None for r in runs])
    main, workers = summary([part_kb(r, "rss_main") for r in runs]), summary([part_kb(r, "rss_workers") for r in runs])
    n_workers = summary([r.get("stream_workers", {}).get("stream_workers") for r in runs])
    dash = summary([per_request_kb(r) for r in res.get("dashboard", [])])
    note = (f"RSS summed over the engine process and its {n_workers['median']:.0f} stream worker(s); baseline = "
            f"that sum before the load (MB); completion text held per request {text['median']:.1f} KB (subtracted)"
            if text["median"] is not None and n_workers["median"] is not None else "")
    if main["median"] is not None and workers["median"] is not None:
        note += (f"; growth per request before subtracting the text: engine process {main['median']:.1f} KB, "
                 f"stream workers {workers['median']:.1f} KB")
    if dash["median"] is not None:
        note += f"; under the dashboard {dash['median']:.1f} KB/request"
    return [make_row("B3", f"resident memory per in-flight request, {hold.CONCURRENCY:,} streams, headless engine "
                           f"(engine + stream-worker processes)",
                     ours=ours, baseline=before, unit="KB/req (baseline: MB)", goal="<= 100 KB",
                     met=None if ours["median"] is None else ours["median"] <= 100, note=note)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="B3 memory per in-flight request")
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args(argv)
    print(json.dumps(rows(hold.run(a.reps, ("headless",))), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
