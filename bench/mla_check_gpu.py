"""MLA check: datagen's vLLM engine against its transformers engine on a tiny DeepSeek-V3 (Kimi-K2.5's
MLA attention + MoE), layer by layer, and both against a plain-PyTorch MLA forward of layer 0.

Run it on the CUDA host BEFORE a Kimi-K2.5 extraction on vLLM (docs/vllm-extraction.md section 6):
vLLM's CUDA MLA path (its rotary kernel on MLA's strided q/k_pe views, the MLA prefill and decode
kernels, the yarn rope) is not what ``make vllm-check`` runs on CPU.

For each rope setting (``default``: the tiny model of ``make vllm-check``; ``kimi_yarn``: Kimi-K2.5's
``rope_scaling``, yarn factor 64, mscale = mscale_all_dim = 1, theta 50000) it:

1. builds the tiny ``deepseek_mla`` model (``engine.extract.tiny.tiny_family_config``, 4 layers, H = 128,
   2 heads, q_lora 64, kv_lora 512, rope 64, nope 32, v 64; seeded weights, fp32 checkpoint);
2. runs datagen's transformers engine (``HiddenStates``) and then its vLLM engine (``VllmHiddenStates``,
   the same ``vllm.LLM`` arguments ``datagen extract`` uses) on the same token ids (lengths 1 and 2 go
   through vLLM's MLA decode path, the others through its prefill path), capturing every layer;
3. prints, per layer, the max abs diff between the engines and the largest value, and for layer 0 each
   engine against the reference (``tests/engine/extract/test_mla_reference.py``, computed on the CPU in fp32), split into
   position 0 and the later positions: position 0 attends to itself only, so a rope / softmax-scale / mask
   error shows at positions >= 1 alone.

Exit status 0 when every layer is within ``--tol`` (default 1e-4 in float32; in bfloat16 ``--tol`` is relative
to the layer's largest value, default 3e-2), 1 otherwise, 2 when an engine could not start.

Usage (from the repository root, with ``pip install -e '.[vllm]'``)::

    python bench/mla_check_gpu.py --device cuda                    # float32
    python bench/mla_check_gpu.py --device cuda --dtype bfloat16   # what a Kimi-K2.5 run uses
    python bench/mla_check_gpu.py --device cuda --vllm-arg 'attention_config={"backend": "TRITON_MLA"}'
    python bench/mla_check_gpu.py --device cpu                     # the same on vLLM's CPU backend
    python bench/mla_check_gpu.py --device cpu --no-workaround     # CPU, vLLM's rotary kernel left on
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import traceback
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

if importlib.util.find_spec("pytest") is None:  # the reference's test module decorates with pytest (dev extra)
    _stub = types.ModuleType("pytest")
    _stub.mark = types.SimpleNamespace(parametrize=lambda *a, **k: (lambda f: f))  # type: ignore[attr-defined]
    sys.modules["pytest"] = _stub

AUX = (0, 1, 2)  # with 4 layers: every layer's output (vLLM ids 1, 2, 3) plus the final state (id 4)


def engines(model: Path, seqs: list[Any], a: argparse.Namespace) -> dict[str, tuple[Any, Any]]:
    """``{"transformers": (aux, last), "vllm": (aux, last)}`` on the CPU, float32."""
    import torch

    from engine.extract.job import ExtractJob
    from engine.extract.model import HiddenStates, load_model
    from engine.extract.onvllm import hidden

    cfg = json.loads((model / "config.json").read_text())
    gpus = (0,) if a.device == "cuda" else ()
    job = ExtractJob(model=str(model), dtype=a.dtype, hidden_size=int(cfg["hidden_size"]),
                     num_layers=int(cfg["num_hidden_layers"]), aux_layers=AUX, source_kind="parquet",
                     source_path=str(model), out_dir=str(model / "out"), device=a.device, gpus=gpus,
                     disk_margin_bytes=0, max_seq_len=max(len(s) for s in seqs) + 8)
    out = {}
    tf = HiddenStates(load_model(job, gpus), job.aux_layers, job.num_layers)
    aux, last = tf.forward(*tf.collate(seqs))
    out["transformers"] = (aux.float().cpu(), last.float().cpu())
    del tf, aux, last
    if a.device == "cuda":
        torch.cuda.empty_cache()
    extra: dict[str, Any] = {"gpu_memory_utilization": 0.3, "enforce_eager": True} if a.device == "cuda" else {}
    for kv in a.vllm_arg:
        k, _, v = kv.partition("=")
        extra[k] = json.loads(v)
    if a.no_workaround:
        hidden.CPU_CUSTOM_OPS = ()
    vl = hidden.VllmHiddenStates(replace(job, engine="vllm", vllm=extra), gpus)
    try:
        aux, last = vl.forward(seqs)
    finally:
        vl.close()
    out["vllm"] = (aux.float().cpu(), last.float().cpu())
    return out


def check(rope: str, work: Path, a: argparse.Namespace) -> bool:
    import numpy as np
    from test_mla_reference import KIMI_ROPE, build_mla_model, load_checkpoint, reference_layer0, samples

    model = build_mla_model(work / f"model-{rope}", **({} if rope == "default" else KIMI_ROPE))
    lengths = tuple(a.lengths)
    seqs = samples(lengths)
    res = engines(model, seqs, a)
    ck = load_checkpoint(model)
    h = int(ck[0]["hidden_size"])
    names = [f"layer {i} (vLLM id {i + 1})" for i in AUX] + ["final, normed (vLLM id 4 + norm)"]
    relative = a.dtype != "float32"
    tol = a.tol if a.tol is not None else (3e-2 if relative else 1e-4)
    print(f"\n== rope {rope}, dtype {a.dtype}, device {a.device}, lengths {list(lengths)} ==")
    ok = True
    for li, name in enumerate(names):
        worst, later, big = 0.0, 0.0, 0.0
        for b, s in enumerate(seqs):
            t = len(s)
            x, y = ((res[e][1][b, :t] if li == len(AUX) else res[e][0][b, :t, li * h:(li + 1) * h])
                    for e in ("transformers", "vllm"))
            d = (x - y).abs().amax(-1)
            worst, big = max(worst, d.max().item()), max(big, x.abs().max().item())
            later = max(later, d[1:].max().item() if t > 1 else 0.0)
        bad = worst > (tol * big if relative else tol)
        ok &= not bad
        print(f"{name:34s} vLLM vs transformers max abs diff {worst:.3e} (positions >= 1: {later:.3e}; "
              f"max |x| {big:.3f}){'  <-- FAIL' if bad else ''}")
    for e in ("transformers", "vllm"):
        p0, rest = 0.0, 0.0
        for b, s in enumerate(seqs):
            ref = reference_layer0(model, np.asarray(s), checkpoint=ck)
            d = (res[e][0][b, :len(s), :h] - ref).abs().amax(-1)
            p0, rest = max(p0, d[0].item()), max(rest, d[1:].max().item() if len(s) > 1 else 0.0)
        print(f"layer 0, {e:12s} vs reference: position 0 {p0:.3e}, positions >= 1 {rest:.3e}")
    print("RESULT", rope, "ok" if ok else "FAIL")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    ap.add_argument("--rope", choices=["default", "kimi_yarn", "both"], default="both")
    ap.add_argument("--lengths", type=int, nargs="+", default=None,
                    help="sample lengths (default: 1 2 17 40 96 333 1000 on cuda, 1 2 17 40 96 on cpu)")
    ap.add_argument("--tol", type=float, default=None)
    ap.add_argument("--vllm-arg", action="append", default=[], metavar="KEY=JSON",
                    help="an extra vllm.LLM keyword argument (repeatable), e.g. 'attention_config={\"backend\": ...}'")
    ap.add_argument("--no-workaround", action="store_true",
                    help="leave vLLM's rotary_embedding custom op on (datagen turns it off on CPU)")
    ap.add_argument("--out", help="work directory (default: a temporary one)")
    a = ap.parse_args()
    if a.lengths is None:
        a.lengths = [1, 2, 17, 40, 96, 333, 1000] if a.device == "cuda" else [1, 2, 17, 40, 96]
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device here (use --device cpu)")
    print(f"torch {torch.__version__}", end="")
    try:
        import vllm

        print(f", vllm {vllm.__version__}", end="")
    except ImportError:
        print()
        ap.error("vLLM is not installed: pip install -e '.[vllm]'")
    import transformers

    print(f", transformers {transformers.__version__}")
    ctx = tempfile.TemporaryDirectory(prefix="mla_check_") if a.out is None else None
    work = Path(a.out or ctx.name)  # type: ignore[union-attr]
    work.mkdir(parents=True, exist_ok=True)
    results = {}
    for rope in (["default", "kimi_yarn"] if a.rope == "both" else [a.rope]):
        try:
            results[rope] = check(rope, work, a)
        except Exception:  # report and go on to the other rope setting
            traceback.print_exc()
            print("RESULT", rope, "ERROR (an engine could not start or run: see above)")
            results[rope] = None
    print("\nSUMMARY", json.dumps({k: ("ok" if v else "FAIL" if v is False else "ERROR") for k, v in results.items()}))
    if any(v is None for v in results.values()):
        return 2
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
