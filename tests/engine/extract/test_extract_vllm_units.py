"""The parts of extraction on vLLM that need no vLLM: the capture channel, the final norm read from a
checkpoint, the ``[extract.vllm]`` config, the ``vllm.LLM`` arguments and the vLLM version check (with a
faked ``vllm`` package). tests/engine/extract/test_extract_vllm.py runs vLLM itself, in ``make vllm-check``."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import struct
from pathlib import Path

import pytest
import torch

from engine.config import ConfigError, parse_config
from engine.extract.job import ExtractError, resolve_job
from engine.extract.onvllm.channel import CaptureClient, CaptureServer, ChannelError
from engine.extract.onvllm.hidden import llm_kwargs, vllm_layer_ids
from engine.extract.onvllm.norm import FinalNorm
from engine.extract.onvllm.version import check_vllm_version, release
from engine.extract.tiny import build_tiny_model


def cfg(tmp: Path, model: str = "m", **extract):
    data = {"run": {"dir": str(tmp / "run")}, "datasets": [{"name": "a", "path": "a.jsonl"}],
            "extract": {"model": model, "aux_layers": [0, 1, 2], **extract}}
    return parse_config(data, tmp / "config.toml", check_files=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_channel_round_trip_is_bit_exact(dtype) -> None:
    server = CaptureServer()
    try:
        client = CaptureClient(server.path)
        g = torch.Generator().manual_seed(1)
        sent = {f"k{i}": torch.randn(n, 4, 16, generator=g).to(dtype) for i, n in enumerate([1, 7, 300])}
        for key, t in sent.items():
            client.send(key, list(range(t.shape[0])), t)
        assert server.wait(list(sent), 10)
        for key, t in sent.items():
            ids, got = server.take(key)
            assert ids.tolist() == list(range(t.shape[0])) and got.dtype == dtype and torch.equal(got, t)
        assert not server.has(["k0"])  # taken
        assert server.wait(["never"], 0.05) is False
        client.close()
    finally:
        server.close()
    assert not Path(server.path).exists()


def test_channel_reports_a_malformed_capture() -> None:
    server = CaptureServer()
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(server.path)
        head = json.dumps({"key": "x", "shape": [2, 1, 4], "dtype": "not_a_dtype", "token_ids": [1, 2]}).encode()
        s.sendall(struct.pack(">Q", len(head)) + head)
        with pytest.raises(ChannelError, match="malformed capture"):
            server.wait(["x"], 5)
        s.close()
    finally:
        server.close()


def test_channel_socket_is_private(tmp_path: Path) -> None:
    server = CaptureServer()
    try:
        assert Path(server.path).parent.stat().st_mode & 0o077 == 0
    finally:
        server.close()


@pytest.mark.parametrize("family", ["llama", "qwen3_moe", "deepseek_mla"])
def test_final_norm_from_the_checkpoint_equals_the_models(tmp_path: Path, family: str) -> None:
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path / "m", family=family, layers=2)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():  # a non-trivial weight, so that a wrong key or eps shows
        model.model.norm.weight.copy_(torch.linspace(0.5, 1.5, model.config.hidden_size))
    model.save_pretrained(path)
    norm = FinalNorm.from_checkpoint(str(path))
    x = torch.randn(3, 11, model.config.hidden_size) * 3
    with torch.no_grad():
        assert torch.allclose(norm(x), model.model.norm(x), atol=1e-6)
        xb = x.to(torch.bfloat16)
        assert torch.equal(norm(xb), model.model.norm.to(torch.bfloat16)(xb))
    assert norm.to_dict() == {"hidden_size": 128, "eps": model.config.rms_norm_eps}


def test_final_norm_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "config.json").write_text(json.dumps({"model_type": "gemma2", "rms_norm_eps": 1e-6}))
    with pytest.raises(ExtractError, match="gemma2's final norm"):
        FinalNorm.from_checkpoint(str(tmp_path / "g"))
    (tmp_path / "n").mkdir()
    (tmp_path / "n" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ExtractError, match="no rms_norm_eps"):
        FinalNorm.from_checkpoint(str(tmp_path / "n"))


def test_extract_vllm_config_keys(tmp_path: Path) -> None:
    c = cfg(tmp_path, engine="vllm", vllm={"tensor_parallel_size": 8, "max_num_batched_tokens": 32768,
                                          "gpu_memory_utilization": 0.9, "distributed_executor_backend": "mp"})
    assert c.extract.engine == "vllm" and c.extract.vllm.llm_kwargs() == {
        "tensor_parallel_size": 8, "pipeline_parallel_size": 1, "data_parallel_size": 1,
        "max_num_batched_tokens": 32768, "gpu_memory_utilization": 0.9, "distributed_executor_backend": "mp"}
    with pytest.raises(ConfigError, match=r"extract\.vllm\.tensor_paralel_size"):
        cfg(tmp_path, engine="vllm", vllm={"tensor_paralel_size": 2})
    with pytest.raises(ConfigError, match=r"extract\.engine"):
        cfg(tmp_path, engine="sglang")
    with pytest.raises(ConfigError, match=r"extract\.vllm\.gpu_memory_utilization"):
        cfg(tmp_path, engine="vllm", vllm={"gpu_memory_utilization": 1.5})


def test_vllm_job_and_llm_arguments(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "m", family="llama", layers=4)
    c = cfg(tmp_path, str(model), engine="vllm", max_seq_len=2048, vllm={"max_num_seqs": 64})
    job = resolve_job(c, data=tmp_path, device="cpu")
    assert job.engine == "vllm" and job.vllm["max_num_seqs"] == 64
    kw = llm_kwargs(job, "/tmp/x.sock")
    assert kw["skip_tokenizer_init"] is True and kw["enable_prefix_caching"] is False
    assert kw["max_model_len"] == 2049 and kw["max_num_seqs"] == 64 and kw["dtype"] == "float32"
    spec = kw["speculative_config"]
    assert spec["method"] == "extract_hidden_states" and spec["num_speculative_tokens"] == 1
    # 0-based layer outputs [0, 1, 2] are vLLM ids [1, 2, 3]; id L = 4 is the final (pre-norm) state
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3, 4]
    assert vllm_layer_ids([1, 29, 57], 61) == [2, 30, 58, 61]  # Kimi-K2.5's default aux layers
    conn = kw["kv_transfer_config"]
    assert conn["kv_connector_module_path"] == "engine.extract.onvllm.connector"
    assert conn["kv_connector_extra_config"] == {"datagen_socket": "/tmp/x.sock"}
    assert json.loads(job.to_json())["vllm"] == job.vllm  # the job file carries them to the workers
    with pytest.raises(ExtractError, match="gpus_per_worker = 1"):
        resolve_job(cfg(tmp_path, str(model), engine="vllm", vllm={"tensor_parallel_size": 2}), data=tmp_path,
                    device="cuda", gpus=[0, 1])
    ok = resolve_job(cfg(tmp_path, str(model), engine="vllm", gpus_per_worker=2, vllm={"tensor_parallel_size": 2}),
                     data=tmp_path, device="cuda", gpus=[0, 1, 2, 3])
    assert ok.workers == 2  # two replicas, TP=2 each


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_engine_without_vllm_says_how_to_install(tmp_path: Path) -> None:
    from engine.extract.onvllm.hidden import VllmHiddenStates

    model = build_tiny_model(tmp_path / "m", family="llama", layers=4)
    job = resolve_job(cfg(tmp_path, str(model), engine="vllm"), data=tmp_path, device="cpu")
    with pytest.raises(ExtractError, match=r'engine = "vllm" needs vLLM: pip install -e "\.\[vllm\]"'):
        VllmHiddenStates(job)


def test_llm_arguments_turn_off_the_cpu_rotary_kernel(tmp_path: Path) -> None:
    """On CPU datagen sets ``compilation_config.custom_ops = ["-rotary_embedding"]``: vLLM's CPU rotary kernel
    mis-rotates MLA's 3-D q/k_pe views (docs/vllm-extraction.md section 6), its PyTorch-native forward does not.
    Not on CUDA, whose kernel takes the views' strides."""
    model = build_tiny_model(tmp_path / "m", family="llama", layers=4)
    job = resolve_job(cfg(tmp_path, str(model), engine="vllm"), data=tmp_path, device="cpu")
    assert llm_kwargs(job, "/tmp/x.sock")["compilation_config"] == {"custom_ops": ["-rotary_embedding"]}
    gpu = resolve_job(cfg(tmp_path, str(model), engine="vllm"), data=tmp_path, device="cuda", gpus=[0])
    assert "compilation_config" not in llm_kwargs(gpu, "/tmp/x.sock")


@pytest.mark.parametrize(("family", "dtype", "backend"), [
    ("deepseek_mla", "float32", "CPU_MLA"), ("deepseek_mla", "bfloat16", None), ("llama", "float32", None)])
def test_mla_on_cpu_pins_the_reference_backend_outside_bfloat16(tmp_path: Path, family: str, dtype: str,
                                                                backend: str | None) -> None:
    """vLLM 0.32.0 picks ``AMX_MLA`` (bfloat16 only) for MLA on any CPU with AMX tiles, which refuses a float32
    model at start; datagen pins ``CPU_MLA`` there (CI failed on an AMX host, passed on one without)."""
    model = build_tiny_model(tmp_path / "m", family=family, layers=4)
    job = resolve_job(cfg(tmp_path, str(model), engine="vllm", dtype=dtype), data=tmp_path, device="cpu")
    kw = llm_kwargs(job, "/tmp/x.sock")
    assert kw.get("attention_config") == (None if backend is None else {"backend": backend})
    gpu = resolve_job(cfg(tmp_path, str(model), engine="vllm", dtype=dtype), data=tmp_path, device="cuda", gpus=[0])
    assert "attention_config" not in llm_kwargs(gpu, "/tmp/x.sock")


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.32.1rc1.dev7+g1234", "0.33.0", "1.0.0"])
def test_vllm_version_accepted(version: str) -> None:
    check_vllm_version(version)


@pytest.mark.parametrize("version, reason", [
    ("0.24.0", r"vLLM 0\.24\.0 predates vLLM PR 46973 \(first in vLLM 0\.25\.0\).*final layer's output.*61 on Kimi"),
    ("0.11.2+cpu", r"predates vLLM PR 46973"),
    ("0.25.0", r"older than 0\.32\.0, the version datagen's KV connector is built and tested on"),
    ("0.31.0", r"older than 0\.32\.0"),
    ("dev", r"cannot read vLLM's version 'dev'"),
])
def test_vllm_version_refused_with_the_reason(version: str, reason: str) -> None:
    with pytest.raises(ExtractError, match=reason):
        check_vllm_version(version)
    assert release("0.25.0rc1") == (0, 25, 0) and release("v0.32.0+cpu") == (0, 32, 0)


def fake_vllm(where: Path, version: str) -> Path:
    """A ``vllm`` package that only has a version and an ``LLM`` that must never be built."""
    pkg = where / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        f"__version__ = {version!r}\n"
        "class LLM:\n    def __init__(self, **kw):\n        raise AssertionError('vllm.LLM built despite the version')\n"
        "class SamplingParams:\n    pass\n")
    return where


def test_vllm_engine_refuses_an_old_vllm_before_it_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine checks vLLM's version before building ``vllm.LLM`` (so before any weights load): vLLM 0.24.0
    is refused with PR 46973 as the reason, and the capture socket is closed again."""
    import importlib
    import sys

    from engine.extract.onvllm.hidden import VllmHiddenStates

    for k in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE", "VLLM_LOGGING_LEVEL"):
        monkeypatch.setenv(k, "1" if k == "VLLM_CPU_KVCACHE_SPACE" else ("0" if "MULTI" in k else "ERROR"))
    monkeypatch.syspath_prepend(str(fake_vllm(tmp_path / "fake", "0.24.0")))
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    importlib.invalidate_caches()
    model = build_tiny_model(tmp_path / "m", family="llama", layers=4)
    job = resolve_job(cfg(tmp_path, str(model), engine="vllm"), data=tmp_path, device="cpu")
    closed = []
    real_close = CaptureServer.close
    monkeypatch.setattr(CaptureServer, "close", lambda self: (closed.append(self.path), real_close(self)))
    try:
        with pytest.raises(ExtractError, match=r"refuses this vLLM: vLLM 0\.24\.0 predates vLLM PR 46973"):
            VllmHiddenStates(job)
    finally:  # the fake package must not outlive this test (find_spec("vllm") would find it for later tests)
        for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
            del sys.modules[name]
    assert len(closed) == 1 and not Path(closed[0]).exists()


def test_datagen_extract_refuses_an_old_vllm_without_restarts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``datagen extract`` with ``engine = "vllm"`` and vLLM 0.24.0 installed (faked): the job fails at once with
    the reason (PR 46973, the final layer's capture) and the worker is not restarted."""
    from test_extract_procs import extract, setup_job

    fake = fake_vllm(tmp_path / "fake", "0.24.0")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    model = build_tiny_model(tmp_path / "model", family="llama", layers=4)
    setup_job(tmp_path, model, 6, 5, 30, 256)
    with open(tmp_path / "config.toml", "a") as f:
        f.write('engine = "vllm"\n')
    p = extract(tmp_path, "--headless")
    log = p.communicate(timeout=300)[0]
    assert p.returncode == 1, log
    assert "vLLM PR 46973" in log and "first in vLLM 0.25.0" in log and "not restarted" in log, log
    assert "restarting it" not in log and "vllm.LLM built" not in log, log
