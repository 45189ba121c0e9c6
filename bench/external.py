"""B6 and B8 come from scripts other engineers own: ``bench/bench_reconstruct.py`` (token
reconstruction) and ``bench/bench_extract.py`` (hidden-state extraction). This module runs them
(pinned to the measured core, ``BENCH_REPS`` in the environment) and turns what they print into
table rows.

Contract (see bench/README.md): the script's last line is ``RESULT {json}`` with

- ``ours``: the figure (B6: reconstruction tokens/s; B8: share of wall time in the forward, 0..1),
- ``baseline``: the baseline's figure (B6: bare tiktoken encode tokens/s; B8: 1.0 or omitted),
- optional ``runs``: ``{"ours": [..], "baseline": [..]}`` per repetition (gives medians and spread;
  without it the script is run ``reps`` times),
- optional ``unit``, ``what``, ``note``.

Today's scripts are read as they are: ``bench_reconstruct.py`` prints ``RESULT`` with
``recon_tok_per_s`` / ``bare_tok_per_s``; ``bench_extract.py --json`` prints one JSON line with
``forward_fraction`` (and ``extract_vs_bare``). A script with neither is still run; figures are
then picked from its output as well as possible (lines with ``tokens/s``; a percentage for B8) and
the raw tail is kept in the JSON.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any

from bench.common import BENCH, PY, REPO, log, make_row, parse_result, placement, ratio_summary, summary, unavailable

#: Figures of the scripts as they print them today (RESULT keys or their plain JSON line).
KEYS = {
    "B6": {"ours": "recon_tok_per_s", "baseline": "bare_tok_per_s"},
    "B8": {"ours": "forward_fraction"},
}

SPECS = {
    "B6": dict(script="bench_reconstruct.py", args=[], what="reconstruction tokens/s on one core, Kimi-layout tokenizer; "
                                                    "baseline: bare tiktoken encode of the same text",
               goal=">= 0.5x", unit="tokens/s", threshold=0.5),
    "B8": dict(script="bench_extract.py", args=["--json"], what="extraction: share of wall time in the model forward, tiny model; "
                                                "baseline: forward alone over the same batches",
               goal=">= 85%", unit="share of wall", threshold=0.85),
}


def _numbers(line: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(r"(?<![\w.])(\d[\d,]*\.?\d*)", line)]


def scrape(bid: str, text: str) -> dict[str, Any] | None:
    """Best-effort figures from a script that prints no RESULT line."""
    lines = text.splitlines()
    if bid == "B6":
        rate = [(ln, _numbers(ln.split("tok")[0])) for ln in lines if re.search(r"tok(en)?s?/s", ln)]
        base = [n[-1] for ln, n in rate if n and re.search(r"tiktoken|bare|baseline", ln, re.I)]
        ours = [n[-1] for ln, n in rate if n and not re.search(r"tiktoken|bare|baseline", ln, re.I)]
        if ours and base:
            return {"ours": ours[-1], "baseline": base[-1]}
        return None
    pct = [float(m) / 100 for ln in lines if re.search(r"forward", ln, re.I)
           for m in re.findall(r"(\d+\.?\d*)\s*%", ln)]
    return {"ours": pct[-1], "baseline": 1.0} if pct else None


def last_json(text: str) -> dict[str, Any] | None:
    """The last line of ``text`` that is a JSON object."""
    import json

    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def normalise(bid: str, res: dict[str, Any]) -> dict[str, Any]:
    """Map a script's own keys onto ``ours``/``baseline``."""
    out = dict(res)
    for k, src in KEYS[bid].items():
        if out.get(k) is None and res.get(src) is not None:
            out[k] = res[src]
    if bid == "B8" and res.get("extract_vs_bare") is not None:
        out.setdefault("note", f"extraction runs at {100 * res['extract_vs_bare']:.0f}% of the bare forward loop's "
                               f"tokens/s ({res.get('extract_tokens_per_s')} vs {res.get('bare_forward_tokens_per_s')}; "
                               f"{res.get('preset')} model on {res.get('device')})")
    return out


def run_one(bid: str, reps: int, timeout: float = 240) -> dict:
    spec = SPECS[bid]
    path = BENCH / spec["script"]
    if not path.exists():
        return unavailable(bid, spec["what"], spec["goal"], f"bench/{spec['script']} not present")
    client_cpu, _ = placement()
    base = [PY, str(path), *spec["args"]]
    cmd = ["taskset", "-c", str(client_cpu), *base] if client_cpu is not None else base
    env = {**os.environ, "BENCH_REPS": str(reps), "PYTHONPATH": str(REPO)}
    runs: dict[str, list] = {"ours": [], "baseline": []}
    res: dict[str, Any] | None = None
    scraped = False
    r = None
    for i in range(reps):
        log(f"{bid}: running bench/{spec['script']} ({i + 1}/{reps})")
        try:
            try:
                r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
            except FileNotFoundError:  # no taskset
                r = subprocess.run(base, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return unavailable(bid, spec["what"], spec["goal"], f"bench/{spec['script']} timed out after {timeout:.0f}s")
        one = parse_result(r.stdout) or last_json(r.stdout)
        if one is None:
            one = scrape(bid, r.stdout)
            scraped = one is not None
        if one is None:
            break
        res = normalise(bid, one)
        if res.get("runs"):  # the script repeated itself
            runs = res["runs"]
            break
        runs["ours"].append(res.get("ours"))
        runs["baseline"].append(res.get("baseline"))
    if r is None:
        return unavailable(bid, spec["what"], spec["goal"], f"bench/{spec['script']} did not run")
    tail = (r.stdout + r.stderr)[-1500:]
    if not res or res.get("ours") is None:
        return unavailable(bid, spec["what"], spec["goal"],
                           f"bench/{spec['script']} exited {r.returncode} without usable figures")  \
            | {"details": {"output_tail": tail}}
    ours = summary(runs.get("ours") or [res["ours"]])
    bvals = [x for x in (runs.get("baseline") or []) if x is not None]
    base: Any = summary(bvals) if bvals else "forward alone (see note)" if bid == "B8" else "-"
    if bid == "B6":
        rat = ratio_summary(runs.get("ours") or [res["ours"]], runs.get("baseline") or [res.get("baseline")])
        met = None if rat["median"] is None else rat["median"] >= spec["threshold"]
    else:
        rat = None
        met = ours["median"] >= spec["threshold"]
    note = res.get("note", "") + (" (figures scraped from its output: no RESULT line)" if scraped else "")
    return make_row(bid, res.get("what") or spec["what"], ours=ours, baseline=base, unit=res.get("unit", spec["unit"]),
                    ratio=rat, goal=spec["goal"], met=met, note=note.strip(), details={"result": res, "output_tail": tail})
