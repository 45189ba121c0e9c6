"""MLA agreement, step 1 of ``bench/gpu_check.sh``: datagen's transformers extraction engine
(``engine.extract.model.HiddenStates``, as ``datagen extract`` loads it) against a plain-PyTorch MLA
forward, every layer and every position, in float32 and bfloat16.

The reference is ``tests/engine/extract/test_mla_reference.py``'s (``mla_attention``: MLA with q/kv LoRA,
the decoupled rope part, yarn; the dense MLP), chained over all layers from the checkpoint's weights
in float32 on the same device. Every model here is dense in every layer (``first_k_dense_replace`` =
layers), so every layer has a reference; the MoE layers are the benchmark's (step 2).

Models (``CASES``): the tiny DeepSeek-V3 of ``bench/mla_check_gpu.py`` (H 128, 2 heads, kv_lora 512,
rope 64) with its default rope and with Kimi-K2.5's yarn rope, 4 layers; and ``kimi-width``: Kimi-K2.5's
MLA widths (H 7168, 64 heads, q_lora 1536, kv_lora 512, rope 64 + nope 128, v 128, dense MLP 18432) with
the yarn rope, 3 layers (``--small``: the same family at H 256). The samples are one padded batch of
several lengths (the attention mask is part of what is checked).

Pass: per layer, the largest abs difference over all positions <= ``1e-4 x max(1, max |ref|)`` in
float32 and ``<= 3e-2 x max |ref|`` in bfloat16 (``bench/mla_check_gpu.py``'s tolerances). Position 0
(which attends to itself only) and positions >= 1 are reported apart: a rope, softmax-scale or mask
error shows at positions >= 1 alone.

Usage: ``python bench/gpu_check_mla.py --out DIR [--device cuda|cpu] [--small]`` writes ``DIR/mla.json``
(``{"rows": [...], "ok": bool}``); exit status 0 when every row passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "engine" / "extract"))
if importlib.util.find_spec("pytest") is None:  # the reference's test module decorates with pytest (dev extra)
    _stub = types.ModuleType("pytest")
    _stub.mark = types.SimpleNamespace(parametrize=lambda *a, **k: (lambda f: f))  # type: ignore[attr-defined]
    sys.modules["pytest"] = _stub

#: float32: abs tolerance per unit of max(1, max |ref|); bfloat16: relative to max |ref|
TOL = {"float32": 1e-4, "bfloat16": 3e-2}


def load_weights(model: Path, device: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(config.json as a dict, every tensor of the checkpoint in float32 on device)``; sharded or not."""
    import torch
    from safetensors.torch import load_file

    cfg = json.loads((model / "config.json").read_text())
    w: dict[str, Any] = {}
    for f in sorted(model.glob("*.safetensors")):
        w.update({k: v.to(device, torch.float32) for k, v in load_file(str(f)).items()})
    return cfg.get("text_config") or cfg, w


def reference_layers(cfg: dict[str, Any], w: dict[str, Any], ids: Any, device: str) -> tuple[list[Any], Any]:
    """Every dense decoder layer's output for one sequence, computed from the weights alone in float32.

    Args:
        cfg / w: :func:`load_weights`'s; ids: ``[T]`` token ids (numpy or list).

    Returns:
        ``([layer 0 output [T, H], ..., layer L-1 output], final normed state [T, H])`` on ``device``.

    Raises:
        NotImplementedError: a layer is a MoE layer.
    """
    import numpy as np
    import torch
    import torch.nn.functional as F
    from test_mla_reference import mla_attention, rms_norm

    layers = int(cfg["num_hidden_layers"])
    if int(cfg.get("first_k_dense_replace", 0)) < layers:
        raise NotImplementedError("the reference covers dense layers only")
    eps = float(cfg["rms_norm_eps"])
    outs = []
    with torch.no_grad(), torch.device(device):  # the reference's own tensors (mask, positions) there too
        h = w["model.embed_tokens.weight"][torch.as_tensor(np.asarray(ids, dtype=np.int64), device=device)]
        pos = torch.arange(h.shape[0])
        for i in range(layers):
            p = f"model.layers.{i}."
            h = h + mla_attention(cfg, w, p + "self_attn.", rms_norm(h, w[p + "input_layernorm.weight"], eps), pos)
            y = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
            h = h + F.linear(F.silu(F.linear(y, w[p + "mlp.gate_proj.weight"])) * F.linear(y, w[p + "mlp.up_proj.weight"]),
                             w[p + "mlp.down_proj.weight"])
            outs.append(h)
        return outs, rms_norm(h, w["model.norm.weight"], eps)


def engine_states(model: Path, seqs: list[Any], dtype: str, device: str) -> tuple[Any, Any]:
    """datagen's transformers engine on ``seqs`` (one padded batch), capturing every layer:
    ``(aux [B, T, (L - 1) * H], last [B, T, H])`` in float32 on ``device``: the outputs of layers
    ``0..L-2`` and the final normed state (the engine's ``hidden_states[L]`` is the last layer's output
    after the final norm, module doc of ``engine.extract.model``)."""
    import torch

    from engine.extract.job import ExtractJob
    from engine.extract.model import HiddenStates, load_model

    cfg = json.loads((model / "config.json").read_text())
    layers = int(cfg["num_hidden_layers"])
    gpus = (0,) if device == "cuda" else ()
    job = ExtractJob(model=str(model), dtype=dtype, hidden_size=int(cfg["hidden_size"]), num_layers=layers,
                     aux_layers=tuple(range(layers - 1)), source_kind="parquet", source_path=str(model),
                     out_dir=str(model / "out"), device=device, gpus=gpus, disk_margin_bytes=0)
    hs = HiddenStates(load_model(job, gpus), job.aux_layers, layers)
    aux, last = hs.forward(*hs.collate(seqs))
    out = aux.float(), last.float()
    del hs
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def compare(model: Path, case: str, seqs: list[Any], dtypes: list[str], device: str) -> list[dict[str, Any]]:
    """One row per (dtype, layer 0..L-2) and per dtype for the final normed state: max abs difference at
    position 0 and at positions >= 1 over every sample, max |ref|, the tolerance, pass or not."""
    cfg, w = load_weights(model, device)
    h = int(cfg["hidden_size"])
    refs = [reference_layers(cfg, w, s, device) for s in seqs]
    del w
    rows = []
    for dtype in dtypes:
        t0 = time.perf_counter()
        aux, last = engine_states(model, seqs, dtype, device)
        secs = time.perf_counter() - t0
        n = len(refs[0][0]) - 1  # the last layer's output is seen through the final norm only
        for li in range(n + 1):
            p0 = later = big = 0.0
            for b, s in enumerate(seqs):
                t = len(s)
                ref = refs[b][1] if li == n else refs[b][0][li]
                got = last[b, :t] if li == n else aux[b, :t, li * h:(li + 1) * h]
                d = (got - ref).abs().amax(-1)
                p0 = max(p0, d[0].item())
                later = max(later, d[1:].max().item() if t > 1 else 0.0)
                big = max(big, ref.abs().max().item())
            tol = TOL[dtype] * (max(1.0, big) if dtype == "float32" else big)
            rows.append({"case": case, "dtype": dtype, "layer": "final (normed)" if li == n else str(li),
                         "pos0_max_abs_diff": p0, "later_max_abs_diff": later, "max_abs_ref": big, "tol": tol,
                         "ok": max(p0, later) <= tol, "engine_s": round(secs, 3)})
    return rows


def cases(small: bool) -> list[tuple[str, Any]]:
    """``[(name, model config)]``: tiny default rope, tiny Kimi yarn rope, Kimi-K2.5's MLA widths."""
    from test_mla_reference import KIMI_ROPE

    from bench.gpu_check_models import wide_config
    from engine.extract.tiny import tiny_family_config

    def tiny(**over: Any) -> Any:
        from transformers import DeepseekV3Config

        d = tiny_family_config("deepseek_mla").to_dict()
        if over:
            d.pop("rope_parameters", None)
        d.update(first_k_dense_replace=d["num_hidden_layers"], **over)
        return DeepseekV3Config(**d)

    return [("tiny, default rope", tiny()), ("tiny, Kimi yarn rope", tiny(**KIMI_ROPE)),
            ("Kimi width, yarn rope" + (" (small)" if small else ""),
             wide_config(3, 3, small=small, vocab=None if small else 32000, **KIMI_ROPE))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="writes OUT/mla.json")
    ap.add_argument("--work", default=None, help="where the models are built (default OUT/work/mla)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--small", action="store_true", help="CPU sizes: the Kimi-width case at H 256, short samples")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=sorted(TOL))
    a = ap.parse_args(argv)
    import numpy as np
    import torch

    from bench.gpu_check_models import build_random_model

    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device here (use --device cpu)")
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 (the default, made sure)
    torch.backends.cudnn.allow_tf32 = False
    out = Path(a.out)
    work = Path(a.work) if a.work else out / "work" / "mla"
    rows: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)
    for i, (name, cfg) in enumerate(cases(a.small)):
        wide = name.startswith("Kimi")
        lengths = ([1, 17, 64] if a.small else [1, 2, 17, 333, 2048]) if wide else \
            ([1, 2, 17, 40] if a.small else [1, 2, 17, 40, 96, 333, 1000])
        t0 = time.perf_counter()
        model = build_random_model(work / f"model-{i}", cfg, device=a.device if wide else "cpu",
                                   dtype="bfloat16" if wide else "float32")
        print(f"[mla] {name}: built in {time.perf_counter() - t0:.1f} s; lengths {lengths}", flush=True)
        seqs = [rng.integers(0, int(cfg.vocab_size), n).astype(np.int64) for n in lengths]
        got = compare(model, name, seqs, a.dtypes, a.device)
        for r in got:
            print(f"[mla] {name:28s} {r['dtype']:9s} layer {r['layer']:15s} pos 0 {r['pos0_max_abs_diff']:.2e}  "
                  f"pos >= 1 {r['later_max_abs_diff']:.2e}  max|ref| {r['max_abs_ref']:.3f}  tol {r['tol']:.2e}"
                  f"{'' if r['ok'] else '  <-- FAIL'}", flush=True)
        rows += got
    ok = bool(rows) and all(r["ok"] for r in rows)
    meta = {"device": a.device, "small": a.small, "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if a.device == "cuda" else None}
    (out / "mla.json").write_text(json.dumps({"rows": rows, "ok": ok, **meta}, indent=1))
    print(f"[mla] {'ok' if ok else 'FAIL'}: {sum(r['ok'] for r in rows)}/{len(rows)} rows within tolerance", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
