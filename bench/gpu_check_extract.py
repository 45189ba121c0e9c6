"""Extraction benchmark, step 2 of ``bench/gpu_check.sh``: datagen's transformers extraction worker on a
random-weight model of Kimi-K2.5's width, with the states stored in the model's dtype and in fp8.

The model (``bench/gpu_check_models.py``): DeepSeek-V3 at Kimi-K2.5's widths (H 7168, MLA 64 heads, dense
MLP 18432, experts of 2048 with 8 active + 1 shared, vocabulary 163,840), 4 layers (the first dense),
16 routed experts (Kimi: 384; the per-token work is the same, the memory is not). It measures, as
``bench/bench_extract.py`` does (its batches and GPU-memory probe are reused):

1. the worker (``engine.extract.worker.run_worker``: batching, forward, fidelity scoring, slicing,
   shard writing in a background thread, manifest commits) over synthetic records, once with
   ``save_dtype = "model"`` (bfloat16 states) and once with ``save_dtype = "fp8"``: forward share
   (forward seconds / loop seconds), extraction tokens/s, seconds of fidelity scoring, of collate + slicing
   (``prep_s``) and blocked on the writer, bytes written and per token against the projection
   (``engine.extract.plan.project``);
2. a bare forward loop of the same model over the same batches, same order (no scoring, slicing or
   I/O): the tokens/s the extraction is compared with, and the TFLOP/s it reaches
   (``gpu_check_models.flops_per_token``).

Each run's output is deleted after it is measured (bfloat16 states of 179,000 tokens at H 7168 take
10 GB). Pass: both runs completed every sample and wrote within 5% of the projected bytes; timings are
reported, never judged.

Usage: ``python bench/gpu_check_extract.py --out DIR [--device cuda|cpu] [--small]`` writes
``DIR/extract.json``; exit status 0 on a pass, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: written / projected bytes must lie within 1 +- this
BYTES_SLACK = 0.05
#: (layers, routed experts, samples, min length, max length, max tokens per batch)
SIZES = {"gpu": (4, 16, 32, 2000, 8000, 16384), "small": (4, 8, 6, 32, 160, 512)}


def run_once(job: Any, table: Any, model: Any, say: Any) -> dict[str, Any]:
    """One extraction worker over ``table`` with the loaded ``model``; its measures (seconds, tokens/s,
    bytes). The output directory is removed afterwards."""
    from engine.extract.job import DTYPE_BYTES
    from engine.extract.plan import project
    from engine.extract.worker import run_worker

    t0 = time.perf_counter()
    res = run_worker(job, table=table, model=model)
    wall = time.perf_counter() - t0
    tm = res.timings
    out = Path(job.out_dir)
    on_disk = sum(p.stat().st_size for p in out.glob("shard-*.safetensors"))
    tokens = int(table.lengths.sum())
    proj = project(table.lengths, job.hidden_size, len(job.aux_layers), job.dtype_bytes)
    label = "fp8" if job.save_dtype == "fp8" else {2: "bf16" if job.dtype == "bfloat16" else job.dtype,
                                                     4: "fp32"}[DTYPE_BYTES[job.dtype]]
    r = {"states": label, "state": str(getattr(res.state, "value", res.state)), "samples": res.samples,
         "tokens": res.tokens, "batches": res.batches, "loop_s": round(tm["loop"], 3),
         "forward_s": round(tm["forward"], 3), "fidelity_s": round(tm.get("fidelity", 0.0), 3),
         "prep_s": round(tm["prep"] - tm.get("fidelity", 0.0), 3), "blocked_on_writer_s": round(tm["blocked"], 3),
         "writer_thread_s": round(tm["write"], 3), "forward_share": round(tm["forward"] / tm["loop"], 4),
         "extract_tokens_per_s": round(tokens / tm["loop"], 1), "worker_wall_s": round(wall, 3),
         "bytes_written": on_disk, "bytes_per_token": round(on_disk / max(tokens, 1), 1),
         "write_mb_per_s": round(on_disk / tm["loop"] / 1e6, 1), "projected_bytes": proj.total,
         "written_vs_projected": round(on_disk / proj.total, 4)}
    say(f"[extract] {label}: {r['extract_tokens_per_s']} tokens/s, forward share {r['forward_share']}, "
        f"{on_disk / 1e9:.3f} GB written ({r['bytes_per_token']} B/token, {r['written_vs_projected']}x projected)")
    shutil.rmtree(out, ignore_errors=True)
    return r


def passed(summary: dict[str, Any]) -> list[str]:
    """What failed in a summary (empty: a pass): each run done with every sample, bytes within
    :data:`BYTES_SLACK` of the projection, fp8 smaller than the model dtype's states."""
    bad = []
    runs = summary.get("runs", [])
    if len(runs) != 2:
        bad.append(f"{len(runs)} extraction runs, expected 2")
    for r in runs:
        if r["state"] != "done" or r["samples"] != summary["samples"]:
            bad.append(f"{r['states']}: state {r['state']}, {r['samples']}/{summary['samples']} samples")
        if abs(r["written_vs_projected"] - 1) > BYTES_SLACK:
            bad.append(f"{r['states']}: wrote {r['written_vs_projected']}x the projected bytes")
    if len(runs) == 2 and not runs[1]["bytes_written"] < runs[0]["bytes_written"]:
        bad.append("fp8 states are not smaller than the model dtype's")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="writes OUT/extract.json")
    ap.add_argument("--work", default=None, help="model, input and output states (default OUT/work/extract)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--small", action="store_true", help="H 256 and short samples: a CPU runs it in seconds")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--min-len", type=int, default=None)
    ap.add_argument("--max-len", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=None, help="max_tokens_per_batch (padded)")
    ap.add_argument("--layers", type=int, default=None)
    a = ap.parse_args(argv)
    layers, experts, samples, lo, hi, max_tokens = SIZES["small" if a.small else "gpu"]
    layers, samples = a.layers or layers, a.samples or samples
    lo, hi, max_tokens = a.min_len or lo, a.max_len or hi, a.max_tokens or max_tokens
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device here (use --device cpu)")
    from bench.bench_extract import GpuPeak, bench_batches
    from bench.gpu_check_models import build_random_model, flops_per_token, param_count, wide_config
    from engine.extract.job import ExtractJob
    from engine.extract.model import HiddenStates, load_model
    from engine.extract.tiny import synth_records
    from engine.extract.worker import _sync
    from engine.tokens.records import write_parquet

    def say(*x: Any) -> None:
        print(*x, flush=True)

    out = Path(a.out)
    work = Path(a.work) if a.work else out / "work" / "extract"
    cfg = wide_config(layers, 1, small=a.small, experts=experts)
    t0 = time.perf_counter()
    model_dir = build_random_model(work / "model", cfg, device=a.device, dtype=a.dtype)
    build_s = time.perf_counter() - t0
    say(f"[extract] model: H {cfg.hidden_size}, {layers} layers, {param_count(cfg) / 1e6:.1f} M parameters, "
        f"built in {build_s:.1f} s")
    vocab, hidden = int(cfg.vocab_size), int(cfg.hidden_size)
    write_parquet(work / "data" / "a.parquet", synth_records(samples, lo, hi, vocab=vocab, seed=7))
    aux = (1, layers // 2 - 1, layers - 4) if layers >= 6 else (0, layers // 2 - 1, layers - 2)
    job = ExtractJob(model=str(model_dir), dtype=a.dtype, hidden_size=hidden, num_layers=layers, aux_layers=aux,
                     source_kind="parquet", source_path=str(work / "data"), out_dir=str(work / "out"),
                     max_tokens_per_batch=max_tokens, device=a.device, gpus=(0,) if a.device == "cuda" else (),
                     disk_margin_bytes=0)
    table, batches, order = bench_batches(job)
    tokens = int(table.lengths.sum())
    lengths = table.lengths.astype("float64")
    context = float((lengths ** 2).sum() / 2 / lengths.sum())  # mean causal context per token
    completion = float(sum(int(table.tokens(i)[1].sum()) for i in range(len(table)))) / tokens
    say(f"[extract] {len(table)} samples, {tokens} tokens, {len(batches)} batches of <= {max_tokens} padded tokens")
    peak = GpuPeak(a.device)
    t0 = time.perf_counter()
    model = load_model(job, job.gpus)
    load_s = time.perf_counter() - t0
    hs = HiddenStates(model, aux, layers)
    t0 = time.perf_counter()
    for b in (order[0], order[-1]):  # warm-up: the largest batch (allocator) and the last
        hs.forward(*hs.collate([table.tokens(r)[0] for r in b.rows]))
    _sync(hs.device)
    warm_s = time.perf_counter() - t0
    fwd_flops = flops_per_token(cfg, context)
    runs: list[dict[str, Any]] = []
    summary: dict[str, Any] = {
        "device": a.device, "gpu": torch.cuda.get_device_name(0) if a.device == "cuda" else None,
        "torch": torch.__version__, "dtype": a.dtype, "small": a.small, "hidden_size": hidden, "layers": layers,
        "routed_experts": experts, "vocab": vocab, "params": param_count(cfg), "aux_layers": list(aux),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "samples": len(table), "tokens": tokens, "min_len": lo, "max_len": hi, "max_tokens_per_batch": max_tokens,
        "completion_share": round(completion, 4), "mean_context": round(context, 1),
        "build_s": round(build_s, 2), "load_s": round(load_s, 2), "warmup_s": round(warm_s, 2),
        "forward_gflop_per_token": round(fwd_flops / 1e9, 3), "runs": runs,
    }

    def dump(final: bool) -> list[str]:
        bad = passed(summary) if final else ["partial: the step ended before the bare forward loop"]
        summary.update(failures=bad, ok=not bad)
        (out / "extract.json").write_text(json.dumps(summary, indent=1))
        return bad

    for s in ("model", "fp8"):  # extract.json after each run: a step cut by its time limit leaves what it measured
        runs.append(run_once(replace(job, out_dir=str(work / f"out-{s}"), save_dtype=s), table, model, say))
        dump(final=False)
    t0 = time.perf_counter()
    for b in order:  # bare forward loop: same batches, same order, no scoring, slicing or I/O
        hs.forward(*hs.collate([table.tokens(r)[0] for r in b.rows]))
        _sync(hs.device)
    bare = time.perf_counter() - t0
    for r in runs:
        r["extract_vs_bare"] = round(bare / r["loop_s"], 4)
    summary.update({"bare_forward_s": round(bare, 3), "bare_forward_tokens_per_s": round(tokens / bare, 1),
                    "bare_forward_tflop_per_s": round(fwd_flops * tokens / bare / 1e12, 2), **peak.result()})
    bad = dump(final=True)
    say(f"[extract] bare forward {summary['bare_forward_tokens_per_s']} tokens/s "
        f"({summary['bare_forward_tflop_per_s']} TFLOP/s); {'ok' if not bad else 'FAIL: ' + '; '.join(bad)}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
