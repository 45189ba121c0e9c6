"""Benchmark hidden-state extraction: how much of the wall time is the model's forward pass.

Builds a random-weight DeepSeek-V3-family model (``--preset tiny``: H=64, 6 layers, for CPU;
``--preset 1b``: H=2048, 16 layers, ~1B parameters, for a GPU), writes synthetic token records of
realistic lengths (default 1,000-4,000 tokens, like reasoning completions), then:

1. runs one extraction worker in process over them (batching, forward, slicing, shard writing in a
   background thread, manifest commits) and reports forward time / loop wall time;
2. runs a bare forward loop over the same batches (no slicing, no I/O) and reports extraction
   tokens/s against it.

Usage: ``python bench/bench_extract.py [--preset tiny|1b] [--samples 48] [--min-len 1000]
[--max-len 4000] [--max-tokens 16384] [--threads 1] [--device cpu|cuda] [--json]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PRESETS = {
    "tiny": dict(layers=6, hidden=64, vocab=1000),
    "1b": dict(layers=16, hidden=2048, vocab=32000, intermediate_size=5632, moe_intermediate_size=1408,
               num_attention_heads=16, num_key_value_heads=16, n_routed_experts=8, num_experts_per_tok=2,
               n_group=1, topk_group=1, q_lora_rank=768, kv_lora_rank=512, qk_rope_head_dim=64,
               qk_nope_head_dim=128, v_head_dim=128),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--min-len", type=int, default=1000)
    ap.add_argument("--max-len", type=int, default=4000)
    ap.add_argument("--max-tokens", type=int, default=16384, help="max_tokens_per_batch (padded)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if available")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--out", help="work directory (default: a temp dir, removed)")
    ap.add_argument("--json", action="store_true", help="print only the JSON summary")
    a = ap.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = a.dtype or ("bfloat16" if device == "cuda" else "float32")
    from engine.extract.job import DTYPE_BYTES, ExtractJob
    from engine.extract.model import HiddenStates, load_model
    from engine.extract.plan import make_batches, project
    from engine.extract.source import load_table
    from engine.extract.tiny import build_tiny_model, synth_records
    from engine.extract.worker import _sync, run_worker
    from engine.tokens.records import write_parquet

    preset = dict(PRESETS[a.preset])
    work_ctx = tempfile.TemporaryDirectory(prefix="bench_extract_") if a.out is None else None
    work = Path(a.out or work_ctx.name)  # type: ignore[union-attr]
    say = (lambda *_: None) if a.json else (lambda *x: print(*x, file=sys.stderr))
    say(f"building {a.preset} model in {work}")
    model_dir = build_tiny_model(work / "model", seed=0, **preset)
    layers, hidden = preset["layers"], preset["hidden"]
    write_parquet(work / "data" / "a.parquet", synth_records(a.samples, a.min_len, a.max_len, vocab=preset["vocab"], seed=7))
    aux = (1, layers // 2 - 1, layers - 4)
    job = ExtractJob(model=str(model_dir), dtype=dtype, hidden_size=hidden, num_layers=layers, aux_layers=aux,
                     source_kind="parquet", source_path=str(work / "data"), out_dir=str(work / "out"),
                     max_tokens_per_batch=a.max_tokens, device=device, gpus=(0,) if device == "cuda" else (),
                     disk_margin_bytes=0)
    table = load_table(job)
    model = load_model(job, job.gpus)
    hs = HiddenStates(model, aux, layers)
    batches = make_batches(table.lengths, table.ids, a.max_tokens)
    say(f"{len(table)} samples, {int(table.lengths.sum())} tokens, {len(batches)} batches; warming up")
    ids, mask = hs.collate([table.tokens(r)[0] for r in batches[-1].rows])
    hs.forward(ids, mask)
    _sync(hs.device)

    t0 = time.perf_counter()
    res = run_worker(job, table=table, model=model)
    wall = time.perf_counter() - t0
    tm = res.timings
    on_disk = sum(p.stat().st_size for p in Path(job.out_dir).glob("shard-*.safetensors"))
    proj = project(table.lengths, hidden, len(aux), DTYPE_BYTES[dtype])

    # bare forward loop over the same batches, same order (longest first), no I/O
    from engine.extract.plan import split

    bare0 = time.perf_counter()
    for b in split(batches, 1)[0]:
        ids, mask = hs.collate([table.tokens(r)[0] for r in b.rows])
        hs.forward(ids, mask)
        _sync(hs.device)
    bare = time.perf_counter() - bare0
    tokens = int(table.lengths.sum())
    summary = {
        "preset": a.preset, "device": device, "dtype": dtype, "threads": a.threads, "samples": len(table),
        "tokens": tokens, "batches": res.batches, "max_tokens_per_batch": a.max_tokens,
        "loop_s": round(tm["loop"], 3), "forward_s": round(tm["forward"], 3), "prep_s": round(tm["prep"], 3),
        "blocked_on_writer_s": round(tm["blocked"], 3), "writer_thread_s": round(tm["write"], 3),
        "forward_fraction": round(tm["forward"] / tm["loop"], 4),
        "worker_wall_s": round(wall, 3), "read_plan_s": round(tm["read"], 3),
        "extract_tokens_per_s": round(tokens / tm["loop"], 1), "bare_forward_tokens_per_s": round(tokens / bare, 1),
        "extract_vs_bare": round(bare / tm["loop"], 4),
        "bytes_written": on_disk, "projected_bytes": proj.total, "projected_hidden_bytes": proj.hidden_bytes,
        "written_vs_projected": round(on_disk / proj.total, 4),
    }
    print(json.dumps(summary, indent=None if a.json else 1))
    if work_ctx is not None:
        work_ctx.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
