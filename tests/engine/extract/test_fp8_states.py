"""Half the disk: ``[extract] save_dtype = "fp8"`` stores the states as ``float8_e4m3fn`` with one float32
scale per token, speculators' fp8 convention (hs-connectors 0.9.0 ``fp8_utils.py``, vllm-project/speculators
PR 1028): ``hidden_states`` ``[T, n_aux + 1, H]`` + ``hidden_states_scales`` ``[T, 1, 1]``, in the
``speculators`` layout (read by its ``FP8Transfer``) and in ``shards`` (dequantized by ``ExtractedDataset``
and ``--convert``). Real values from the tiny model: the quantization is speculators' own bit for bit, the
dequantized states are within 0.08 per-token relative error of a direct forward pass, the files take at
most 0.55x the bytes of bf16 ones, and the disk projection, ``status`` and conversion follow the dtype.
Where speculators 0.9.0 installs (``.venv-train``) its ``FP8Transfer``, ``ArrowDataset`` and a short
EAGLE-3 training run on fp8 vs bf16 files run too.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from test_extract import direct

from engine.config import parse_config
from engine.extract.convert import convert
from engine.extract.job import ExtractError, ModelShape, resolve_job
from engine.extract.layouts.base import quantize_fp8, quantize_rows
from engine.extract.loader import ExtractedDataset
from engine.extract.plan import per_token_bytes, project
from engine.extract.prepare import prepare
from engine.extract.shards import OutDir
from engine.extract.status import collect, format_line
from engine.extract.tiny import synth_records
from engine.extract.worker import run_worker
from engine.tokens.records import write_parquet

LAYERS = 6
TINY_LAYERS = LAYERS  # the shared `tiny` fixture (tests/conftest.py) builds this many layers
AUX = [0, 2, 4]
N = 20


def spec_quantize_tensor_to_fp8(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """hs-connectors 0.9.0 ``hs_connectors/fp8_utils.py`` ``quantize_tensor_to_fp8`` (verbatim body)."""
    fp8_dtype = torch.float8_e4m3fn
    fp8_max = torch.finfo(fp8_dtype).max
    fp32 = tensor.float()
    reduce_dims = tuple(range(1, fp32.dim()))
    amax = fp32.abs().amax(dim=reduce_dims, keepdim=True)
    scale = (amax / fp8_max).clamp(min=1e-12)
    fp8_tensor = (fp32 / scale).to(fp8_dtype)
    return fp8_tensor, scale


def spec_quantizer():
    """speculators' own quantizer where hs-connectors installs (.venv-train), else the quoted one."""
    try:
        from hs_connectors.fp8_utils import quantize_tensor_to_fp8
    except ImportError:
        return spec_quantize_tensor_to_fp8
    return quantize_tensor_to_fp8


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_quantization_is_speculators_own_bit_for_bit() -> None:
    torch.manual_seed(0)
    q_of = spec_quantizer()
    x = torch.randn(50, 4, 64) * torch.logspace(-3, 3, 50).view(50, 1, 1)
    x[3] = 0.0  # an all-zero token: the 1e-12 floor
    x[7, 2, 5] = 1e4  # an outlier
    for t in (x, x.to(torch.bfloat16)):
        q, s = quantize_fp8(t)
        q_ref, s_ref = q_of(t)
        assert same_bits(q, q_ref) and torch.equal(s, s_ref) and s.shape == (50, 1, 1) and s.dtype == torch.float32
    # the worker's batched form: [B, T, 3H] + [B, T, H] in chunks == per token over the 4 layers
    aux, last = torch.randn(3, 11, 3 * 64) * 5, torch.randn(3, 11, 64)
    q, s = quantize_rows(aux, last, chunk=7)
    for b in range(3):
        q_ref, s_ref = q_of(torch.cat([aux[b].reshape(11, 3, 64), last[b].reshape(11, 1, 64)], dim=1))
        assert same_bits(q[b], q_ref) and torch.equal(s[b], s_ref)


# --- extractions on the tiny model ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tiny: Path) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    return {d: AutoModelForCausalLM.from_pretrained(tiny, dtype=getattr(torch, d)).eval() for d in ("float32", "bfloat16")}


def make_job(tmp: Path, tiny: Path, layout: str, out: str, **extract: Any):
    data = {"run": {"dir": str(tmp / "run")}, "datasets": [{"name": "a", "path": "a.jsonl"}],
            "extract": {"model": str(tiny), "aux_layers": AUX, "max_tokens_per_batch": 512, "disk_margin_gb": 0,
                        "layout": layout, "out_dir": str(tmp / out), **extract}}
    return resolve_job(parse_config(data, tmp / "config.toml", check_files=False), data=tmp / "data")


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, tiny: Path, models):
    """The same 20 samples in shards and speculators: bf16 and fp8 from the bf16 model (bytes, training),
    fp8 from the fp32 model (errors against the fp32 forward)."""
    tmp = tmp_path_factory.mktemp("fp8")
    recs = synth_records(N, 20, 160, seed=7)
    write_parquet(tmp / "data" / "a.parquet", recs)
    jobs, res = {}, {}
    for layout in ("shards", "speculators"):
        for dtype, sd in (("bfloat16", "model"), ("bfloat16", "fp8"), ("float32", "fp8")):
            key = f"{layout}-{dtype}-{sd}"
            job = jobs[key] = make_job(tmp, tiny, layout, key, dtype=dtype, save_dtype=sd)
            Path(job.out_dir).mkdir(parents=True)
            job.save(Path(job.out_dir) / "job.json")
            res[key] = run_worker(job, model=models[dtype])
            assert res[key].state == "done" and res[key].samples == N
    return tmp, {r.id: r for r in recs}, jobs, res


def on_disk(job) -> int:
    out = Path(job.out_dir)
    files = list(out.glob("shard-*.safetensors")) + list(out.glob("hidden_states/hs_*")) + list(out.glob("data-*.arrow"))
    return sum(f.stat().st_size for f in files)


def test_fp8_takes_at_most_055x_the_bytes_of_bf16(work) -> None:
    tmp, rows, jobs, res = work
    for layout in ("shards", "speculators"):
        fp8, bf16 = (on_disk(jobs[f"{layout}-{d}"]) for d in ("bfloat16-fp8", "bfloat16-model"))
        print(f"\n{layout}: fp8 {fp8} B, bf16 {bf16} B: {fp8 / bf16:.3f}x (hidden states + ids, masks, headers)")
        assert fp8 <= 0.55 * bf16
        assert jobs[f"{layout}-bfloat16-fp8"].dtype_bytes == 1


def per_token_rel_error(deq: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``||deq_t - ref_t|| / ||ref_t||`` per token over all its layers (one scale per token)."""
    d = (deq.float() - ref.float()).reshape(deq.shape[0], -1)
    return d.norm(dim=1) / ref.float().reshape(ref.shape[0], -1).norm(dim=1)


def reference(hf, ids: list[int], prenorm: bool) -> torch.Tensor:
    """The direct forward's states ``[T, n_aux + 1, H]``: aux layer outputs, then the final state (before
    the norm for speculators, after it for shards)."""
    layers, normed, _ = direct(hf, ids)
    return torch.stack([layers[i] for i in AUX] + [layers[-1] if prenorm else normed], dim=1)


def test_speculators_fp8_files_dequantize_within_008_of_a_direct_forward(work, models) -> None:
    """hs_{i}.safetensors: ``hidden_states`` fp8 ``[T, 4, H]``, ``hidden_states_scales`` float32 ``[T, 1, 1]``,
    ``token_ids``; ``q * scale`` against the direct forward; read back by speculators' ``FP8Transfer`` where
    hs-connectors installs."""
    from safetensors.torch import load_file

    tmp, rows, jobs, _ = work
    out = Path(jobs["speculators-float32-fp8"].out_dir)
    worst, layer_worst = 0.0, [0.0] * (len(AUX) + 1)
    H = jobs["speculators-float32-fp8"].hidden_size
    for e in OutDir(out).read_manifest():
        rec = rows[e["id"]]
        t = load_file(out / e["file"])
        assert set(t) == {"hidden_states", "hidden_states_scales", "token_ids"}
        T = len(rec.input_ids)
        assert t["hidden_states"].dtype == torch.float8_e4m3fn and t["hidden_states"].shape == (T, len(AUX) + 1, H)
        assert t["hidden_states_scales"].dtype == torch.float32 and t["hidden_states_scales"].shape == (T, 1, 1)
        assert t["token_ids"].tolist() == rec.input_ids
        deq = t["hidden_states"].float() * t["hidden_states_scales"]
        ref = reference(models["float32"], rec.input_ids, prenorm=True)
        worst = max(worst, per_token_rel_error(deq, ref).max().item())
        for k in range(len(AUX) + 1):
            layer_worst[k] = max(layer_worst[k], per_token_rel_error(deq[:, k], ref[:, k]).max().item())
    print(f"\nspeculators fp8: per-token relative error vs a direct forward, max {worst:.4f}; per layer "
          + ", ".join(f"{x:.4f}" for x in layer_worst))
    assert 0 < worst <= 0.08 and max(layer_worst) <= 0.08
    try:
        from hs_connectors import FP8Transfer
    except ImportError:
        return
    tr = FP8Transfer(out / "hidden_states", dequantize_dtype=torch.float32)
    got = tr.get_cached(0)
    t = load_file(out / "hidden_states" / "hs_0.safetensors")
    assert "hidden_states_scales" not in got
    assert torch.equal(got["hidden_states"], t["hidden_states"].float() * t["hidden_states_scales"])


def test_fp8_shards_dequantize_within_008_through_the_loader(work, models) -> None:
    """``{id}/hidden_states`` + ``{id}/hidden_states_scales`` in the shards; ``ExtractedDataset`` gives the
    usual four tensors, dequantized (float32), the final state after the norm."""
    from safetensors import safe_open

    tmp, rows, jobs, _ = work
    out = Path(jobs["shards-float32-fp8"].out_dir)
    e = OutDir(out).read_manifest()[0]
    with safe_open(out / e["shard"], framework="pt") as st:
        keys = {k.split("/", 1)[1] for k in st.keys() if k.startswith(e["id"] + "/")}
    assert keys == {"input_ids", "loss_mask", "hidden_states", "hidden_states_scales"}
    ds = ExtractedDataset(out)
    worst = 0.0
    for i in range(len(ds)):
        s = ds[i]
        rec = rows[s["id"]]
        assert s["input_ids"].tolist() == rec.input_ids and s["loss_mask"].tolist() == rec.loss_mask
        assert s["aux_hidden_states"].dtype == s["last_hidden_state"].dtype == torch.float32
        T = len(rec.input_ids)
        deq = torch.cat([s["aux_hidden_states"].reshape(T, len(AUX), -1), s["last_hidden_state"].reshape(T, 1, -1)], 1)
        worst = max(worst, per_token_rel_error(deq, reference(models["float32"], rec.input_ids, prenorm=False)).max().item())
    print(f"\nshards fp8: per-token relative error vs a direct forward, max {worst:.4f}")
    assert 0 < worst <= 0.08


@pytest.mark.parametrize("layout", ["shards", "speculators"])
def test_projection_guard_and_status_follow_the_dtype(work, layout: str) -> None:
    tmp, rows, jobs, res = work
    job = jobs[f"{layout}-bfloat16-fp8"]
    p = project([len(r.input_ids) for r in rows.values()], job.hidden_size, len(AUX), job.dtype_bytes, layout)
    disk = on_disk(job)
    print(f"\n{layout} fp8: projected {p.total} vs on disk {disk}: {disk / p.total:.4f}x")
    assert abs(disk - p.total) <= 0.03 * p.total
    assert per_token_bytes(job.hidden_size, len(AUX), 1, layout) == (len(AUX) + 1) * job.hidden_size + \
        per_token_bytes(job.hidden_size, len(AUX), 2, layout) - 2 * (len(AUX) + 1) * job.hidden_size + 4
    doc = collect(job.out_dir)
    assert doc["save_dtype"] == "fp8" and doc["bytes_written"] == res[f"{layout}-bfloat16-fp8"].bytes_written
    assert " fp8 |" in format_line(doc) and collect(jobs[f"{layout}-bfloat16-model"].out_dir)["save_dtype"] == "model"


# --- the projection, the disk guard, `status` and `make train-check` follow the dtype (no model run) ---------


def test_projection_counts_one_byte_per_element_and_a_float32_scale_per_token() -> None:
    """Hand-computed: 157 tokens, 4 state layers (3 aux + the final), H = 64. fp8: 1 byte per element and
    4 per token (``hidden_states_scales``), plus speculators' extra header entry per ``hs_i`` file."""
    lengths, H = [100, 50, 7], 64
    for layout, tok, sample, fp8_header in (("shards", 8 + 1, 4 * 110, 0), ("speculators", 24, 2 * 110 + 16, 110)):
        bf16, fp8 = project(lengths, H, 3, 2, layout), project(lengths, H, 3, 1, layout)
        assert (bf16.hidden_bytes, fp8.hidden_bytes) == (157 * 4 * 64 * 2, 157 * 4 * 64)
        assert bf16.overhead_bytes == 157 * tok + 3 * sample
        assert fp8.overhead_bytes == 157 * (tok + 4) + 3 * (sample + fp8_header)
        assert (bf16.samples, bf16.tokens) == (fp8.samples, fp8.tokens) == (3, 157)
        assert per_token_bytes(H, 3, 2, layout) == 4 * 64 * 2 + tok
        assert per_token_bytes(H, 3, 1, layout) == 4 * 64 + tok + 4  # the worker's free-space wait per token
    # Kimi-K2.5's shape: fp8 is half of bf16 to within the scale and the ids
    big = [project([4096] * 1000, 7168, 3, b, "speculators").total for b in (2, 1)]
    assert 0.5 < big[1] / big[0] < 0.501


def _shaped_job(tmp: Path, layout: str, save_dtype: str, free_bytes: int | None = None):
    """A bf16 job of an H = 64, 6-layer model (its shape given: no model is read), on ``tmp/data``."""
    data = {"run": {"dir": str(tmp / "run")}, "datasets": [{"name": "a", "path": "a.jsonl"}],
            "extract": {"model": "org/tiny", "aux_layers": AUX, "dtype": "bfloat16", "disk_margin_gb": 0,
                        "layout": layout, "save_dtype": save_dtype, "out_dir": str(tmp / f"{layout}-{save_dtype}")}}
    return resolve_job(parse_config(data, tmp / "config.toml", check_files=False), data=tmp / "data",
                       shape=ModelShape(64, LAYERS), device="cpu", free_bytes=free_bytes)


@pytest.mark.parametrize("layout", ["shards", "speculators"])
def test_the_disk_guard_takes_the_fp8_projection(tmp_path: Path, layout: str) -> None:
    """``prepare`` (what ``datagen extract`` runs before any worker) projects the fp8 bytes and the guard
    checks those: a disk with room for the fp8 files but not the bf16 ones starts the fp8 job only."""
    recs = synth_records(N, 20, 160, seed=7)
    write_parquet(tmp_path / "data" / "a.parquet", recs)
    tokens = sum(len(r.input_ids) for r in recs)
    info, said = {}, {}
    for sd in ("model", "fp8"):
        said[sd] = []
        info[sd] = prepare(_shaped_job(tmp_path, layout, sd), said[sd].append, check_disk=False)
        assert info[sd]["projected_bytes"] == project([len(r.input_ids) for r in recs], 64, 3, 1 if sd == "fp8" else 2,
                                                      layout).total
    assert info["fp8"]["projected_hidden_bytes"] == tokens * 4 * 64 == info["model"]["projected_hidden_bytes"] // 2
    assert "states saved as fp8 (float8_e4m3fn); per token 4 x 64 x 1 B + a 4 B scale" in said["fp8"][1]
    assert "bfloat16; per token 4 x 64 x 2 B; engine" in said["model"][1]
    room = (info["fp8"]["projected_bytes"] + info["model"]["projected_bytes"]) // 2
    lines: list[str] = []
    prepare(_shaped_job(tmp_path, layout, "fp8", free_bytes=room), lines.append)
    assert "ids/masks/scales/headers" in lines[-1]
    with pytest.raises(ExtractError, match="not enough disk space"):
        prepare(_shaped_job(tmp_path, layout, "model", free_bytes=room), lines.append)
    prepare(_shaped_job(tmp_path, layout, "fp8", free_bytes=info["fp8"]["projected_bytes"]), lines.append)
    with pytest.raises(ExtractError, match="not enough disk space"):
        prepare(_shaped_job(tmp_path, layout, "fp8", free_bytes=info["fp8"]["projected_bytes"] - 1), lines.append)


def test_the_extraction_view_is_told_the_save_dtype_of_the_job(tmp_path: Path) -> None:
    """``ExtractRun.snapshot`` (what the extraction view and the chained run's view draw) carries the
    job's stored dtype: ``fp8``, or the model dtype's short name."""
    from engine.extract.run import ExtractRun

    write_parquet(tmp_path / "data" / "a.parquet", synth_records(4, 20, 40, seed=1))
    for sd, shown in (("fp8", "fp8"), ("model", "bf16")):
        job = _shaped_job(tmp_path, "speculators", sd)
        run = ExtractRun(None, job=job, say=lambda _line: None, progress_s=None, poller=object())  # not started
        assert run.snapshot().states_dtype == shown


def test_status_text_and_json_show_the_save_dtype(tmp_path: Path) -> None:
    """``datagen status``: the extraction line says how the states are saved after the bytes written
    (``fp8``, or the model dtype: ``bf16``, ``fp32``); ``--json``'s ``extract`` has ``save_dtype``,
    ``dtype`` and ``states_dtype``."""
    from engine.extract.status import status_fields
    from engine.report.status import format_status

    worker = {"worker": 0, "state": "done", "host": "h", "pid": 1, "samples_total": 20, "samples_done": 20,
              "tokens_total": 2000, "tokens_done": 2000, "bytes_written": 123_000_000, "updated_at": 0.0}
    for sd, dtype, shown in (("fp8", "bfloat16", "fp8"), ("model", "bfloat16", "bf16"), ("model", "float32", "fp32")):
        run = tmp_path / f"{sd}-{dtype}"
        out = run / "extract"
        (out / "status").mkdir(parents=True)
        (out / "job.json").write_text(json.dumps({"dtype": dtype, "save_dtype": sd, "layout": "speculators"}))
        (out / "status" / "worker-0.json").write_text(json.dumps(worker))
        doc = json.loads(json.dumps(status_fields(run)))["extract"]  # as `datagen status --json` prints it
        assert (doc["save_dtype"], doc["dtype"], doc["states_dtype"]) == (sd, dtype, shown)
        assert f"| 123.00 MB {shown} |" in format_line(doc)
        text = format_status({
            "run": {"name": "r", "state": "completed", "state_reason": "", "elapsed_s": 1.0, "alive": False},
            "totals": {"cost_usd": 0.0, "errors": {}, "usage_sources": {}, "prompts": 0, "done": 0, "failed": 0,
                       "skipped": 0, "pending": 0, "in_flight": 0, "rejected": 0, "completion_tokens": 0},
            "datasets": [], "extract": doc})
        assert f"extract done | 20/20 samples | 2000/2000 tokens | 0 tok/s | 123.00 MB {shown} |" in text
    none = collect(tmp_path / "nothing")  # no job.json yet: nothing to show
    assert (none["save_dtype"], none["dtype"], none["states_dtype"]) == ("model", "", "")
    assert "MB  " not in format_line({**none, "bytes_written": 10**6})


def test_make_train_check_runs_the_fp8_training_comparison() -> None:
    """``make train-check`` runs this file in ``.venv-train`` too (speculators' ``FP8Transfer`` and the
    fp8-vs-bf16 training run below), with ``-s`` so the two loss curves print side by side."""
    make = (Path(__file__).resolve().parents[3] / "Makefile").read_text()
    recipe = make[make.index("\ntrain-check: train-venv") + 1:].split("\n\n")[0]
    runs = [line for line in recipe.splitlines()[1:] if "pytest" in line]
    assert any("tests/engine/extract/test_fp8_states.py" in line and " -s" in line for line in runs), recipe
    assert any("tests/engine/extract/test_train_check_speculators.py" in line for line in runs), recipe


def test_convert_fp8_shards(work, models, tiny: Path, tmp_path: Path) -> None:
    """To specforge: dequantized into the model dtype (what SpecForge reads); to speculators: fp8 again,
    and speculators' targets ``lm_head(norm(final))`` stay the verifier's logits to fp8 precision."""
    from safetensors.torch import load_file

    tmp, rows, jobs, _ = work
    src = jobs["shards-float32-fp8"].out_dir
    rep = convert(src, tmp_path / "sf", "specforge")
    assert rep.complete and rep.converted == N
    assert json.loads((tmp_path / "sf" / "job.json").read_text())["save_dtype"] == "model"
    hf = models["float32"]
    e = OutDir(tmp_path / "sf").read_manifest()[0]
    raw = torch.load(tmp_path / "sf" / e["file"], weights_only=True)
    assert raw["aux_hidden_state"].dtype == raw["hidden_state"].dtype == torch.float32
    rec = rows[e["id"]]
    ref = reference(hf, rec.input_ids, prenorm=False)
    T = len(rec.input_ids)
    deq = torch.cat([raw["aux_hidden_state"][0].reshape(T, len(AUX), -1), raw["hidden_state"][0, :, None]], 1)
    assert per_token_rel_error(deq, ref).max() <= 0.08
    rep = convert(src, tmp_path / "sp", "speculators", model=str(tiny))
    assert rep.complete and json.loads((tmp_path / "sp" / "job.json").read_text())["save_dtype"] == "fp8"
    for e in OutDir(tmp_path / "sp").read_manifest()[:5]:
        t = load_file(tmp_path / "sp" / e["file"])
        assert t["hidden_states"].dtype == torch.float8_e4m3fn
        deq = t["hidden_states"].float() * t["hidden_states_scales"]
        rec = rows[e["id"]]
        _, _, logits = direct(hf, rec.input_ids)
        with torch.no_grad():
            targets = hf.lm_head(hf.model.norm(deq[:, -1]))
        assert (per_token_rel_error(targets, logits) <= 0.1).all()


# --- speculators' own training on fp8 vs bf16 files (.venv-train) ---------------------------------------------


def test_speculators_trains_on_fp8_files_like_on_bf16(work, tiny: Path) -> None:
    """24 AdamW steps of speculators 0.9.0's EAGLE-3 drafter (its loaders, ``shift_batch``, drafter and
    trainer step body on CPU, as tests/engine/extract/test_train_check_speculators.py) on the bf16 files and on the fp8
    files (read through its ``FP8Transfer``), same seed: both losses finite and falling, side by side."""
    pytest.importorskip("speculators.train.dataloader", reason="speculators 0.9.0 is in .venv-train (make train-venv)")
    import test_train_check_speculators as tc
    from hs_connectors import FileTransfer, FP8Transfer
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.dataloader import create_train_val_loaders

    tmp, rows, jobs, _ = work
    curves = {}
    for sd in ("model", "fp8"):
        job = jobs[f"speculators-bfloat16-{sd}"]
        out = Path(job.out_dir)
        transfer = (FileTransfer(out / "hidden_states") if sd == "model"
                    else FP8Transfer(out / "hidden_states", dequantize_dtype=torch.float32))
        train, _ = create_train_val_loaders(
            data_path=str(out), total_seq_len=tc.SEQ, hidden_states_dtype=torch.float32,
            vllm_endpoint="http://127.0.0.1:9/v1", on_missing="raise", verifier_name_or_path=str(tiny),
            request_timeout=5.0, max_retries=0, generation_validation_retries=0, max_consecutive_generation_failures=1,
            hidden_size=job.hidden_size, num_target_layers=len(AUX), num_workers=0, prefetch_factor=None,
            preprocess=shift_batch, train_data_ratio=0.8, seed=0, transfer=transfer)
        torch.manual_seed(0)
        curves[sd] = tc._train(train, tc._drafter(tiny), 24)
    print("\nspeculators 0.9.0 EAGLE-3 drafter, same samples and seed: loss per AdamW step")
    print(f"{'step':>4}  {'bf16 files':>10}  {'fp8 files':>10}  {'fp8 - bf16':>10}")
    for i, (a, b) in enumerate(zip(curves["model"], curves["fp8"], strict=True)):
        print(f"{i:4d}  {a:10.5f}  {b:10.5f}  {b - a:+10.5f}")
    for c in curves.values():
        assert all(math.isfinite(x) for x in c) and sum(c[-4:]) / 4 < 0.8 * sum(c[:4]) / 4
    assert abs(sum(curves["fp8"][-4:]) - sum(curves["model"][-4:])) / sum(curves["model"][-4:]) < 0.05
