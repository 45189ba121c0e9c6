"""The results of ``bench/gpu_check.sh``: ``OUT/results.md`` (tables) and ``OUT/results.json``.

Reads what the steps left in ``OUT``: ``steps.tsv`` (one line per step: name, exit status, seconds,
written by the shell script), ``mla.json`` (``bench/gpu_check_mla.py``) and ``extract.json``
(``bench/gpu_check_extract.py``); a step that wrote nothing shows as missing. :func:`render` and
:func:`verdict` are pure; :func:`main` does the reading and writing.

Usage: ``python bench/gpu_check_report.py OUT`` ; exit status 0 when every step exited 0 and its
results say ok, 1 otherwise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

#: the steps every run has, in order
STEPS = ("mla", "extract")


def read_steps(text: str) -> list[dict[str, Any]]:
    """``steps.tsv``'s lines ``name<TAB>exit status<TAB>seconds`` as ``[{"step", "rc", "seconds"}]``."""
    rows = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[1].lstrip("-").isdigit():
            rows.append({"step": parts[0], "rc": int(parts[1]), "seconds": float(parts[2])})
    return rows


def verdict(steps: list[dict[str, Any]], results: dict[str, Any]) -> list[str]:
    """What failed (empty: every step of :data:`STEPS` ran, exited 0 and its results say ok)."""
    bad = []
    by = {s["step"]: s for s in steps}
    for name in STEPS:
        s, r = by.get(name), results.get(name)
        if s is None:
            bad.append(f"{name}: did not run")
        elif s["rc"] != 0:
            bad.append(f"{name}: exit status {s['rc']}" + (" (timed out)" if s["rc"] in (124, 137) else ""))
        if r is None:
            bad.append(f"{name}: no results written")
        elif not r.get("ok"):
            bad.append(f"{name}: results not ok" + (f" ({'; '.join(r['failures'])})" if r.get("failures") else ""))
    return bad


def _gb(n: Any) -> str:
    return f"{n / 1e9:.2f} GB" if isinstance(n, (int, float)) else str(n)


def _mla_table(m: dict[str, Any]) -> list[str]:
    out = ["| case | dtype | layer | max abs diff, position 0 | positions >= 1 | max abs ref | tolerance | ok |",
           "|---|---|---|---|---|---|---|---|"]
    for r in m.get("rows", []):
        out.append(f"| {r['case']} | {r['dtype']} | {r['layer']} | {r['pos0_max_abs_diff']:.2e} | "
                   f"{r['later_max_abs_diff']:.2e} | {r['max_abs_ref']:.3f} | {r['tol']:.2e} | "
                   f"{'yes' if r['ok'] else '**NO**'} |")
    return out


def _extract_table(e: dict[str, Any]) -> list[str]:
    out = [f"Model: DeepSeek-V3 at H {e['hidden_size']}, {e['layers']} layers, {e['routed_experts']} routed experts, "
           f"vocabulary {e['vocab']}, {e['params'] / 1e6:,.0f} M parameters, {e['dtype']}, attention "
           f"{e['attn_implementation']}; {e['samples']} samples of {e['min_len']}-{e['max_len']} tokens "
           f"({e['tokens']} tokens, completion share {e['completion_share']}), batches of <= "
           f"{e['max_tokens_per_batch']} padded tokens, aux layers {e['aux_layers']}.",
           "",
           f"Bare forward: {e.get('bare_forward_tokens_per_s', 'n/a')} tokens/s, {e['forward_gflop_per_token']} "
           f"GFLOP/token, {e.get('bare_forward_tflop_per_s', 'n/a')} TFLOP/s. Model built in {e['build_s']} s, loaded "
           f"in {e['load_s']} s. GPU memory: {_gb(e.get('gpu_max_memory_allocated_bytes', 'n/a'))} max allocated, "
           f"{_gb(e.get('gpu_device_peak_used_bytes', 'n/a'))} device peak used.",
           "",
           "| states | tokens/s | forward share | vs bare forward | loop s | forward s | fidelity s | prep s | "
           "blocked on writer s | bytes written | bytes/token | written / projected | MB/s |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in e.get("runs", []):
        out.append(f"| {r['states']} | {r['extract_tokens_per_s']} | {r['forward_share']} | {r.get('extract_vs_bare')} | "
                   f"{r['loop_s']} | {r['forward_s']} | {r['fidelity_s']} | {r['prep_s']} | {r['blocked_on_writer_s']} | "
                   f"{r['bytes_written']} | {r['bytes_per_token']} | {r['written_vs_projected']} | {r['write_mb_per_s']} |")
    return out


def render(steps: list[dict[str, Any]], results: dict[str, Any], meta: dict[str, Any]) -> str:
    """``results.md``: the verdict, the steps, the MLA agreement and the extraction benchmark tables."""
    bad = verdict(steps, results)
    lines = ["# GPU check results", "",
             f"**{'PASS' if not bad else 'FAIL'}**" + ("" if not bad else ": " + "; ".join(bad)), ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", "| step | exit status | seconds |", "|---|---|---|"]
    lines += [f"| {s['step']} | {s['rc']} | {s['seconds']:.1f} |" for s in steps]
    m, e = results.get("mla"), results.get("extract")
    lines += ["", "## MLA agreement: the transformers engine against the plain-PyTorch reference", ""]
    lines += _mla_table(m) if m else ["(no results)"]
    lines += ["", "## Extraction benchmark", ""]
    lines += _extract_table(e) if e else ["(no results)"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: gpu_check_report.py OUT", file=sys.stderr)
        return 2
    out = Path(argv[0])
    steps = read_steps((out / "steps.tsv").read_text()) if (out / "steps.tsv").is_file() else []
    results: dict[str, Any] = {}
    for name in STEPS:
        p = out / f"{name}.json"
        if p.is_file():
            try:
                results[name] = json.loads(p.read_text())
            except ValueError:
                pass
    meta: dict[str, Any] = {}
    if (out / "meta.json").is_file():
        meta = json.loads((out / "meta.json").read_text())
    bad = verdict(steps, results)
    (out / "results.md").write_text(render(steps, results, meta))
    (out / "results.json").write_text(json.dumps({"ok": not bad, "failures": bad, "meta": meta, "steps": steps,
                                                  **results}, indent=1))
    print((out / "results.md").read_text())
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
