"""Benchmark hidden-state extraction: how much of the wall time is the model's forward pass.

Builds a random-weight model, writes synthetic token records of realistic lengths (default
1,000-4,000 tokens, like reasoning completions), then:

1. runs one extraction worker in process over them (batching, forward, slicing, shard writing in a
   background thread, manifest commits) and reports forward time / loop wall time;
2. times a baseline over the same batches, same order, and reports extraction tokens/s against it:

   - ``--engine transformers`` (default): a bare forward loop of the same model (no slicing, no I/O);
   - ``--engine vllm``: vLLM's BARE prefill: the same ``vllm.LLM`` (same dtype, ``max_model_len``,
     ``skip_tokenizer_init``, prefix caching off) with NO ``speculative_config`` and NO
     ``kv_transfer_config``, ``generate([{"prompt_token_ids": ...}], SamplingParams(max_tokens=1))``
     per batch. It runs in a subprocess (this script with a hidden flag) before the extraction, so
     the two vLLM engines never share a process or a GPU.

It prints extraction tokens/s, baseline tokens/s, their ratio ``extract_vs_bare`` (goal: >= 0.9x, and
whether it is met), peak GPU memory (``torch.cuda.max_memory_allocated`` of the process and, with
``nvidia-ml-py``, the device's peak used memory; ``n/a`` on CPU; vLLM pre-allocates its KV cache up to
``gpu_memory_utilization``, so on vLLM these mostly show that setting) and bytes/s written.

Presets: ``tiny`` (DeepSeek-V3 family, H=64, 6 layers, head_dim 16: CPU, transformers only; vLLM's
CPU backend needs head_dim 64), ``tiny-vllm`` (Llama-style, H=128, head_dim 64, 4 layers: CPU smoke
run of either engine; ``--family qwen3_moe`` for the MoE one), ``1b`` (DeepSeek-V3 / Kimi-K2.5
architecture, MLA latent 576 = kv_lora_rank 512 + qk_rope_head_dim 64, H=2048, 16 layers, ~1B
parameters, ``noaux_tc`` sigmoid routing: a GPU, either engine).

Usage: ``python bench/bench_extract.py [--engine transformers|vllm] [--preset tiny|tiny-vllm|1b]
[--family llama|qwen3_moe] [--samples 48] [--min-len 1000] [--max-len 4000] [--max-tokens 16384]
[--threads 1] [--device cpu|cuda] [--dtype ...] [--json]``

On a GPU (vLLM, then transformers for comparison)::

    python bench/bench_extract.py --engine vllm --preset 1b --device cuda
    python bench/bench_extract.py --engine transformers --preset 1b --device cuda

CPU smoke runs::

    python bench/bench_extract.py --engine vllm --preset tiny-vllm --device cpu --samples 8 --min-len 50 --max-len 200
    python bench/bench_extract.py --engine transformers --preset tiny --device cpu --samples 8 --min-len 50 --max-len 200
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: extraction tokens/s over baseline tokens/s that the extraction should reach
GOAL = 0.9
#: marks the bare-prefill subprocess's result line on its stdout (vLLM logs there too)
BARE_TAG = "BENCH_BARE_VLLM_RESULT "

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(layers=6, hidden=64, vocab=1000),
    "tiny-vllm": dict(family="llama", layers=4, vocab=1000),  # H=128, head_dim 64 (tiny_family_config)
    # topk_method / scoring_func / norm_topk_prob: vLLM's DeepSeek-V3 loads e_score_correction_bias only
    # with noaux_tc; transformers' DeepseekV3 always routes this way (sigmoid + bias), so harmless there
    "1b": dict(layers=16, hidden=2048, vocab=32000, intermediate_size=5632, moe_intermediate_size=1408,
               num_attention_heads=16, num_key_value_heads=16, n_routed_experts=8, num_experts_per_tok=2,
               n_group=1, topk_group=1, q_lora_rank=768, kv_lora_rank=512, qk_rope_head_dim=64,
               qk_nope_head_dim=128, v_head_dim=128, topk_method="noaux_tc", scoring_func="sigmoid",
               norm_topk_prob=True),
}


def build_model(path: Path, preset: dict[str, Any], family: str | None) -> tuple[Path, int, int, int]:
    """Build the preset's model; returns ``(dir, layers, hidden, vocab)``."""
    from engine.extract.tiny import build_tiny_model

    preset = dict(preset)
    fam = family or preset.pop("family", None)
    preset.pop("family", None)
    if fam:
        d = build_tiny_model(path, seed=0, family=fam, layers=preset["layers"], vocab=preset["vocab"])
    else:
        d = build_tiny_model(path, seed=0, **preset)
    cfg = json.loads((d / "config.json").read_text())
    return d, int(cfg["num_hidden_layers"]), int(cfg["hidden_size"]), int(cfg["vocab_size"])


def bench_batches(job: Any) -> tuple[Any, list[Any], list[Any]]:
    """``(table, batches, order)``: the job's input, its batches, and the one worker's order of them
    (longest first), exactly as the worker makes them."""
    from engine.extract.plan import make_batches, split
    from engine.extract.source import load_table

    table = load_table(job)
    batches = make_batches(table.lengths, table.ids, job.max_tokens_per_batch)
    return table, batches, split(batches, 1)[0]


class GpuPeak:
    """Peak GPU memory: ``torch.cuda.max_memory_allocated`` of this process and, with ``nvidia-ml-py``,
    the device's used memory sampled every 0.1 s (device-wide, every process)."""

    def __init__(self, device: str, gpu: int = 0) -> None:
        self.cuda = device == "cuda"
        self.peak_used = None
        self._stop = threading.Event()
        self._thread = None
        if not self.cuda:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
        except Exception:  # nvidia-ml-py absent or no NVML
            return
        self.peak_used = 0

        def poll() -> None:
            while True:
                self.peak_used = max(self.peak_used, int(pynvml.nvmlDeviceGetMemoryInfo(h).used))
                if self._stop.wait(0.1):
                    return

        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()

    def result(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if not self.cuda:
            return {"gpu_max_memory_allocated_bytes": "n/a", "gpu_device_peak_used_bytes": "n/a"}
        import torch

        return {"gpu_max_memory_allocated_bytes": int(torch.cuda.max_memory_allocated()),
                "gpu_device_peak_used_bytes": self.peak_used if self.peak_used is not None else "n/a (no nvidia-ml-py)"}


def bare_vllm_main(job_path: str) -> int:
    """The hidden ``--bare-vllm JOB`` mode: time vLLM's bare prefill of the job's batches (no
    speculative_config, no kv_transfer_config); print one ``BARE_TAG`` + JSON line."""
    from engine.extract.job import ExtractJob
    from engine.extract.onvllm.hidden import llm_kwargs

    job = ExtractJob.from_json(Path(job_path).read_text())
    if job.gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in job.gpus)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # as VllmHiddenStates does
    if job.device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    kw = llm_kwargs(job, "")
    del kw["speculative_config"], kw["kv_transfer_config"]
    table, batches, order = bench_batches(job)
    peak = GpuPeak(job.device, job.gpus[0] if job.gpus else 0)
    t0 = time.perf_counter()
    llm = LLM(**kw)
    load = time.perf_counter() - t0
    params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)

    def prefill(b: Any) -> None:
        prompts = [{"prompt_token_ids": [int(t) for t in table.tokens(r)[0]]} for r in b.rows]
        llm.generate(prompts, params, use_tqdm=False)

    prefill(batches[-1])  # warm-up, the same batch as the extraction's
    t0 = time.perf_counter()
    for b in order:
        prefill(b)
    bare = time.perf_counter() - t0
    out = {"bare_s": bare, "load_s": load, "kwargs": {k: v for k, v in kw.items() if k != "model"}, **peak.result()}
    print(BARE_TAG + json.dumps(out), flush=True)
    return 0


def run_bare_vllm(job: Any, work: Path, say: Any) -> dict[str, Any]:
    """Run :func:`bare_vllm_main` in a subprocess; its result."""
    path = work / "bare-job.json"
    path.write_text(job.to_json())
    say("vLLM bare prefill (subprocess): starting")
    p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--bare-vllm", str(path)],
                       capture_output=True, text=True)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(BARE_TAG)]
    if p.returncode != 0 or not lines:
        sys.stderr.write(p.stdout[-4000:] + p.stderr[-8000:])
        raise SystemExit(f"the vLLM bare-prefill subprocess failed (exit {p.returncode})")
    return json.loads(lines[-1][len(BARE_TAG):])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--family", choices=["llama", "qwen3_moe"], default=None,
                    help="tiny-vllm's model family (default llama)")
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--min-len", type=int, default=1000)
    ap.add_argument("--max-len", type=int, default=4000)
    ap.add_argument("--max-tokens", type=int, default=16384, help="max_tokens_per_batch (padded)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if available")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--out", help="work directory (default: a temp dir, removed)")
    ap.add_argument("--json", action="store_true", help="print only the JSON summary")
    ap.add_argument("--bare-vllm", help=argparse.SUPPRESS)  # the baseline subprocess: a job file
    a = ap.parse_args()
    if a.bare_vllm:
        return bare_vllm_main(a.bare_vllm)
    if a.family and a.preset != "tiny-vllm":
        ap.error("--family applies to --preset tiny-vllm")

    import torch

    torch.set_num_threads(a.threads)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = a.dtype or ("bfloat16" if device == "cuda" else "float32")
    if a.engine == "vllm" and device == "cpu" and a.preset == "tiny":
        ap.error("--preset tiny has head_dim 16, which vLLM's CPU backend does not run: use --preset tiny-vllm")
    from engine.extract.job import DTYPE_BYTES, ExtractJob
    from engine.extract.plan import project
    from engine.extract.tiny import synth_records
    from engine.extract.worker import _sync, run_worker
    from engine.tokens.records import write_parquet

    work_ctx = tempfile.TemporaryDirectory(prefix="bench_extract_") if a.out is None else None
    work = Path(a.out or work_ctx.name)  # type: ignore[union-attr]
    say = (lambda *_: None) if a.json else (lambda *x: print(*x, file=sys.stderr, flush=True))
    say(f"building {a.preset} model in {work}")
    model_dir, layers, hidden, vocab = build_model(work / "model", PRESETS[a.preset], a.family)
    write_parquet(work / "data" / "a.parquet", synth_records(a.samples, a.min_len, a.max_len, vocab=vocab, seed=7))
    aux = (1, layers // 2 - 1, layers - 4) if layers >= 6 else (0, layers // 2 - 1, layers - 2)
    job = ExtractJob(model=str(model_dir), dtype=dtype, hidden_size=hidden, num_layers=layers, aux_layers=aux,
                     source_kind="parquet", source_path=str(work / "data"), out_dir=str(work / "out"),
                     max_tokens_per_batch=a.max_tokens, device=device, gpus=(0,) if device == "cuda" else (),
                     disk_margin_bytes=0, engine=a.engine,
                     # vLLM: max_model_len = the longest sample + 1 (else max_position_embeddings)
                     max_seq_len=a.max_len if a.engine == "vllm" else None)
    table, batches, order = bench_batches(job)
    tokens = int(table.lengths.sum())
    say(f"{len(table)} samples, {tokens} tokens, {len(batches)} batches; engine {a.engine}")

    if a.engine == "vllm":
        bare_res = run_bare_vllm(job, work, say)  # first, while this process holds no vLLM engine
        bare = bare_res["bare_s"]
        say(f"vLLM bare prefill: {bare:.3f} s ({tokens / bare:.1f} tokens/s); extraction: loading vLLM")
        from unittest import mock

        from engine.extract.onvllm.hidden import VllmHiddenStates

        peak = GpuPeak(device, job.gpus[0] if job.gpus else 0)
        hs = VllmHiddenStates(job, job.gpus)  # shards layout: the normed last state
        say("warming up")
        hs.forward(*hs.collate([table.tokens(r)[0] for r in batches[-1].rows]))
        # the worker closes its engine inside its timed loop; vLLM's shutdown (seconds) is no extraction
        # throughput, so it is deferred to here and reported apart (engine_close_s)
        t0 = time.perf_counter()
        with mock.patch("engine.extract.worker._hidden_states", lambda *_a, **_k: hs), \
                mock.patch.object(hs, "close", lambda: None):
            res = run_worker(job, table=table)
        wall = time.perf_counter() - t0
        mem = peak.result()
        c0 = time.perf_counter()
        hs.close()
        close_s = time.perf_counter() - c0
    else:
        from engine.extract.model import HiddenStates, load_model

        peak = GpuPeak(device)
        model = load_model(job, job.gpus)
        hs = HiddenStates(model, aux, layers)
        say("warming up")
        ids, mask = hs.collate([table.tokens(r)[0] for r in batches[-1].rows])
        hs.forward(ids, mask)
        _sync(hs.device)
        t0 = time.perf_counter()
        res = run_worker(job, table=table, model=model)
        wall = time.perf_counter() - t0
        # bare forward loop over the same batches, same order (longest first), no I/O
        bare0 = time.perf_counter()
        for b in order:
            ids, mask = hs.collate([table.tokens(r)[0] for r in b.rows])
            hs.forward(ids, mask)
            _sync(hs.device)
        bare = time.perf_counter() - bare0
        mem = peak.result()
    tm = res.timings
    on_disk = sum(p.stat().st_size for p in Path(job.out_dir).glob("shard-*.safetensors"))
    proj = project(table.lengths, hidden, len(aux), DTYPE_BYTES[dtype])
    ratio = bare / tm["loop"]
    summary = {
        "engine": a.engine, "preset": a.preset, "device": device, "dtype": dtype, "threads": a.threads,
        "samples": len(table), "tokens": tokens, "batches": res.batches, "max_tokens_per_batch": a.max_tokens,
        "loop_s": round(tm["loop"], 3), "forward_s": round(tm["forward"], 3), "prep_s": round(tm["prep"], 3),
        "blocked_on_writer_s": round(tm["blocked"], 3), "writer_thread_s": round(tm["write"], 3),
        "forward_fraction": round(tm["forward"] / tm["loop"], 4),
        "worker_wall_s": round(wall, 3), "read_plan_s": round(tm["read"], 3),
        "extract_tokens_per_s": round(tokens / tm["loop"], 1),
        ("bare_prefill_tokens_per_s" if a.engine == "vllm" else "bare_forward_tokens_per_s"): round(tokens / bare, 1),
        "extract_vs_bare": round(ratio, 4), "goal": GOAL, "goal_met": ratio >= GOAL,
        "bytes_written": on_disk, "bytes_per_s": round(on_disk / tm["loop"], 1),
        "projected_bytes": proj.total, "projected_hidden_bytes": proj.hidden_bytes,
        "written_vs_projected": round(on_disk / proj.total, 4), **mem,
    }
    if a.engine == "vllm":
        summary["engine_close_s"] = round(close_s, 3)
        summary["bare_load_s"] = round(bare_res["load_s"], 3)
        summary["bare_gpu_max_memory_allocated_bytes"] = bare_res["gpu_max_memory_allocated_bytes"]
        summary["bare_gpu_device_peak_used_bytes"] = bare_res["gpu_device_peak_used_bytes"]
    print(json.dumps(summary, indent=None if a.json else 1))
    base = "vLLM bare prefill" if a.engine == "vllm" else "bare forward"
    say(f"extraction {tokens / tm['loop']:.1f} tokens/s vs {base} {tokens / bare:.1f} tokens/s = {ratio:.3f}x "
        f"(goal >= {GOAL}x: {'met' if ratio >= GOAL else 'NOT met'}); written {on_disk / tm['loop'] / 1e6:.2f} MB/s; "
        f"GPU memory: {mem['gpu_max_memory_allocated_bytes']} (max allocated), {mem['gpu_device_peak_used_bytes']} "
        "(device peak used)")
    if work_ctx is not None:
        work_ctx.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
