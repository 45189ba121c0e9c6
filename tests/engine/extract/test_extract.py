"""Hidden-state extraction, in process: a real tiny DeepSeek-V3 model, real token records.

Saved tensors are compared with an independent direct forward pass (hooks on the decoder layers and
the final norm), batch by batch padding included; plus planning, resume, disk guard, recovery,
status and config units. The process-level tests (kill -9, two workers) are in
test_extract_procs.py.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.config import ConfigError, parse_config
from engine.extract.disk import DiskGuard
from engine.extract.job import ExtractError, check_aux_layers, default_aux_layers, resolve_job
from engine.extract.loader import ExtractedDataset
from engine.extract.plan import make_batches, pending, project, split
from engine.extract.shards import OutDir, shard_name
from engine.extract.source import TokenTable
from engine.extract.status import collect, gpus_json, read_workers
from engine.extract.tiny import build_tiny_model, synth_records
from engine.extract.worker import run_worker
from engine.tokens.records import read_parquet_dir, write_parquet

torch.set_num_threads(1)

LAYERS = 6
TINY_LAYERS = LAYERS  # the shared `tiny` fixture (tests/conftest.py) builds this many layers
AUX = [0, 2, 4]  # 0-based layer outputs; the default for 6 layers ([1, 2, 2]) repeats a layer


def make_cfg(tmp: Path, tiny: Path, **extract):
    data = {"run": {"dir": str(tmp / "run")}, "datasets": [{"name": "a", "path": "a.jsonl"}],
            "extract": {"model": str(tiny), "aux_layers": AUX, "max_tokens_per_batch": 1024, "disk_margin_gb": 0,
                        **extract}}
    return parse_config(data, tmp / "config.toml", check_files=False)


def direct(model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unbatched forward with hooks: (outputs of every decoder layer [L, T, H], final-norm output [T, H], logits)."""
    layer_out: list[torch.Tensor] = []
    norm_out: list[torch.Tensor] = []
    hooks = [layer.register_forward_hook(lambda m, a, o: layer_out.append((o[0] if isinstance(o, tuple) else o)[0]))
             for layer in model.model.layers]
    hooks.append(model.model.norm.register_forward_hook(lambda m, a, o: norm_out.append(o[0])))
    try:
        with torch.no_grad():
            logits = model(torch.tensor([ids]), use_cache=False).logits[0]
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(layer_out), norm_out[0], logits


def test_layer_convention_matches_direct_forward(hf) -> None:
    from engine.extract.model import HiddenStates

    ids = synth_records(1, 37, 37, seed=5)[0].input_ids
    layers, normed, logits = direct(hf, ids)
    hs = HiddenStates(hf, AUX, LAYERS)
    aux, last = hs.forward(*hs.collate([np.asarray(ids)]))
    H = hf.config.hidden_size
    assert aux.shape == (1, 37, 3 * H) and last.shape == (1, 37, H)
    for k, i in enumerate(AUX):  # aux block k is the OUTPUT of 0-based layer AUX[k]
        torch.testing.assert_close(aux[0, :, k * H:(k + 1) * H], layers[i], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last[0], normed, rtol=1e-5, atol=1e-5)  # after the final norm...
    with torch.inference_mode():
        torch.testing.assert_close(hf.lm_head(last[0]), logits, rtol=1e-4, atol=1e-4)  # ...what the LM head reads
    assert not torch.allclose(last[0], layers[-1], atol=1e-3)  # not the raw last-layer output
    assert default_aux_layers(61) == [1, 29, 57]  # published Kimi-K2.5 drafters
    with pytest.raises(ExtractError, match="outside 0..4"):
        check_aux_layers([1, 5], LAYERS)  # layer L-1 is last_hidden_state, not an aux layer


@pytest.fixture(scope="module")
def extracted(tmp_path_factory: pytest.TempPathFactory, tiny: Path, hf):
    tmp = tmp_path_factory.mktemp("ex")
    recs = synth_records(30, 5, 160, seed=1)
    recs.append(recs[3])  # a duplicate id is extracted once
    write_parquet(tmp / "data" / "a.parquet", recs[:20])
    write_parquet(tmp / "data" / "b.parquet", recs[20:])
    cfg = make_cfg(tmp, tiny, max_tokens_per_batch=400)
    job = resolve_job(cfg, data=tmp / "data")
    res = run_worker(job, model=hf)
    return tmp, job, res


def test_saved_tensors_equal_direct_forward(extracted, hf) -> None:
    tmp, job, res = extracted
    rows = {r.id: r for r in read_parquet_dir(tmp / "data")}
    man = OutDir(job.out_dir).read_manifest()
    assert res.state == "done" and res.samples == 30 == len(man) == len({e["id"] for e in man}) == len(rows)
    mixed = 0
    for shard in sorted({e["shard"] for e in man}):
        lens = {e["length"] for e in man if e["shard"] == shard}
        mixed += len(lens) > 1  # this shard's batch was padded
    assert mixed >= 2
    from safetensors.torch import load_file

    H = job.hidden_size
    for shard in sorted({e["shard"] for e in man}):
        t = load_file(Path(job.out_dir) / shard)
        for e in (e for e in man if e["shard"] == shard):
            sid, row = e["id"], rows[e["id"]]
            assert e["length"] == len(row.input_ids) and e["dataset"] == row.dataset
            assert t[f"{sid}/input_ids"].tolist() == row.input_ids  # exactly the export row
            assert t[f"{sid}/loss_mask"].tolist() == row.loss_mask
            layers, normed, _ = direct(hf, row.input_ids)
            aux = t[f"{sid}/aux_hidden_states"]
            assert aux.shape == (len(row.input_ids), 3 * H) and aux.dtype == torch.float32
            torch.testing.assert_close(aux, torch.cat([layers[i] for i in AUX], dim=-1), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(t[f"{sid}/last_hidden_state"], normed, rtol=1e-5, atol=1e-5)


def test_projection_matches_bytes_written(extracted) -> None:
    tmp, job, res = extracted
    lengths = [e["length"] for e in OutDir(job.out_dir).read_manifest()]
    p = project(lengths, job.hidden_size, len(job.aux_layers), job.dtype_bytes)
    on_disk = sum(f.stat().st_size for f in Path(job.out_dir).glob("shard-*.safetensors"))
    assert on_disk == res.bytes_written
    print(f"\nprojected {p.total} bytes (hidden {p.hidden_bytes}) vs written {on_disk}: {on_disk / p.total:.4f}x")
    assert abs(on_disk - p.total) <= 0.05 * p.total
    assert abs(on_disk - p.hidden_bytes) <= 0.05 * p.hidden_bytes  # the formula alone, too


def test_loader_reads_back_lazily(extracted) -> None:
    tmp, job, _ = extracted
    ds = ExtractedDataset(job.out_dir, max_open=2)
    assert len(ds) == 30
    for i in (0, 7, 29, 3):
        s = ds[i]
        T = s["input_ids"].shape[0]
        assert s["loss_mask"].shape == (T,) and s["aux_hidden_states"].shape == (T, 3 * job.hidden_size)
        assert s["last_hidden_state"].shape == (T, job.hidden_size) and ds.index(s["id"]) == i
    assert len(ds._open) <= 2
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=None)))
    assert batch["id"] == ds.entries[0]["id"]


def test_resume_sends_nothing_when_done(extracted) -> None:
    tmp, job, _ = extracted

    class Exploding:
        def __getattr__(self, name):
            raise AssertionError("the model must not be touched when everything is done")

    res = run_worker(job, model=Exploding())
    assert res.state == "done" and res.batches == 0 and res.skipped_done == 30
    assert json.loads((Path(job.out_dir) / "status" / "worker-0.json").read_text())["samples_done"] == 30


def test_pending_drops_done_batches_and_never_empty() -> None:
    ids = [f"s{i}" for i in range(10)]
    lengths = np.array([5, 50, 7, 9, 100, 3, 3, 60, 8, 1])
    batches = make_batches(lengths, ids, 64)
    assert all(b.padded <= 64 or len(b.rows) == 1 for b in batches)
    assert sorted(i for b in batches for i in b.rows) == list(range(10))
    first = batches[0]
    left = pending(batches, ids, lengths, {ids[i] for i in first.rows} | {"s4"})
    assert all(b.rows for b in left) and len(left) == len(batches) - 2  # s4 (100 tokens) was alone
    shares = split(batches, 3)
    assert sorted(i for s in shares for b in s for i in b.rows) == list(range(10))
    assert shares == split(list(batches), 3)  # deterministic
    loads = [sum(b.padded for b in s) for s in split(make_batches(np.arange(1, 200), [str(i) for i in range(199)], 256), 4)]
    assert max(loads) - min(loads) <= 256


def test_disk_guard_refuses_a_job_that_does_not_fit(tmp_path: Path, tiny: Path, capsys) -> None:
    from datagen.cli import main

    write_parquet(tmp_path / "data" / "a.parquet", synth_records(10, 100, 200, seed=2))
    (tmp_path / "config.toml").write_text(
        f'[run]\ndir = "run"\n[[datasets]]\nname = "a"\npath = "a.jsonl"\n'
        f'[extract]\nmodel = "{tiny}"\naux_layers = [0, 2, 4]\ndisk_margin_gb = 0.000001\n')
    rc = main(["extract", str(tmp_path / "config.toml"), "--data", str(tmp_path / "data"), "--free-bytes", "1000000"])
    err = capsys.readouterr().err
    assert rc == 1 and "not enough disk space" in err and "projected output" in err
    out = tmp_path / "run" / "extract"
    assert not list(out.glob("shard-*")) and not (out / "status").exists()


def test_worker_pauses_on_low_disk_and_resumes(tmp_path: Path, tiny: Path, hf) -> None:
    write_parquet(tmp_path / "data" / "a.parquet", synth_records(6, 20, 40, seed=3))
    job = resolve_job(make_cfg(tmp_path, tiny, max_tokens_per_batch=128), data=tmp_path / "data")
    guard = DiskGuard(job.out_dir, margin_bytes=10, stated_free=1000, poll_s=0.05)  # too little for any shard
    seen: list[str] = []
    result: list = []
    t = threading.Thread(target=lambda: result.append(run_worker(job, model=hf, guard=guard)))
    t.start()
    status = Path(job.out_dir) / "status" / "worker-0.json"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "paused" not in seen:
        if status.exists():
            seen.append(json.loads(status.read_text())["state"])
        time.sleep(0.05)
    assert "paused" in seen and "low disk space" in json.loads(status.read_text())["reason"]
    assert not list(Path(job.out_dir).glob("shard-*")) and not list(Path(job.out_dir).glob(".tmp-shard*"))
    guard.stated_free = 10**12  # space comes back: the worker resumes by itself
    t.join(60)
    assert result and result[0].state == "done" and result[0].samples == 6
    assert json.loads(status.read_text())["state"] == "done"


def test_recover_removes_partial_output(tmp_path: Path) -> None:
    out = OutDir(tmp_path)
    from safetensors.torch import save_file

    tmp = out.tmp_path()
    save_file({"x/input_ids": torch.arange(3)}, tmp)
    out.commit(tmp, [{"id": "x", "length": 3, "dataset": "a"}])
    (tmp_path / shard_name(1)).write_bytes(b"renamed but never listed")
    with open(out.manifest, "ab") as f:
        f.write(b'{"id": "y", "sha')  # torn last line
    dead = tmp_path / f".tmp-shard@{out.host}@999999999@1.safetensors"
    dead.write_bytes(b"half a shard")
    assert out.done_ids() == {"x"}
    assert out.recover() == {"torn_lines": 1, "orphan_shards": 1, "temp_files": 1}
    assert not dead.exists() and not (tmp_path / shard_name(1)).exists()
    assert out.manifest.read_bytes().endswith(b"\n") and len(out.read_manifest()) == 1
    tmp2 = OutDir(tmp_path).tmp_path()
    save_file({"z/input_ids": torch.arange(2)}, tmp2)
    assert OutDir(tmp_path).commit(tmp2, [{"id": "z", "length": 2, "dataset": "a"}]) == shard_name(1)


def test_input_table_and_limits(tmp_path: Path) -> None:
    recs = synth_records(5, 3, 30, seed=4)
    t = TokenTable.from_records(recs + [recs[0]])
    assert len(t) == 5 and t.dropped["duplicate"] == 1
    ids, mask = t.tokens(2)
    assert ids.tolist() == recs[2].input_ids and mask.tolist() == recs[2].loss_mask
    cut = t.limit_length(10, "truncate")
    assert cut.lengths.max() <= 10 and cut.tokens(2)[0].tolist() == recs[2].input_ids[:10]
    skip = t.limit_length(10, "skip")
    assert all(len(r) <= 10 for r in [recs[i] for i in range(5) if recs[i].id in skip.ids])
    assert skip.dropped["over_length"] == sum(len(r) > 10 for r in recs)


def test_extract_straight_from_a_run_directory(tmp_path: Path) -> None:
    """A real generation run with [tokenizer] (the transformers-family fixture), then extraction reading
    the run's validated records with no export step: every record once, ids equal to the tokens export."""
    import asyncio
    import io

    from fixtures_tokens import HF_MARKERS, hf_dir
    from helpers import SAMPLES

    from engine.extract.launch import run_extract
    from engine.run.headless import run_headless
    from engine.tokens.exports import export_validated, iter_token_records

    tok = hf_dir()
    model = build_tiny_model(tmp_path / "tiny", seed=0, layers=LAYERS, vocab=4200)
    data = {
        "run": {"name": "x", "dir": str(tmp_path / "run"), "commit_interval_s": 0.1, "progress_interval_s": 30},
        "provider": {"kind": "simulated", "sim": {"tokenizer": str(tok), "mean_completion_tokens": 40}},
        "classes": {"short": {"max_tokens": 400, "concurrency": 8}},
        "tokenizer": {"path": str(tok), "executor": "thread", **HF_MARKERS},
        "datasets": [{"name": "b1", "path": str(SAMPLES / "b1_glaive.jsonl"), "format": "glaive"},
                     {"name": "b3", "path": str(SAMPLES / "b3_magicoder_evol_instruct.jsonl"), "format": "instruction"}],
        "extract": {"model": str(model), "aux_layers": AUX, "max_tokens_per_batch": 4096, "disk_margin_gb": 0},
    }
    cfg = parse_config(data, tmp_path / "config.toml")
    assert asyncio.run(run_headless(cfg, io.StringIO(), install_signals=False)) == 0
    recs = {r.id: r for r in iter_token_records(cfg.run.dir)}
    assert len(recs) == 6
    assert run_extract(cfg, say=lambda s: None) == 0
    out = tmp_path / "run" / "extract"
    listed = [e["id"] for e in OutDir(out).read_manifest()]
    assert sorted(listed) == sorted(recs)
    export_validated(cfg.run.dir, tmp_path / "tok", "tokens")
    exported = {r.id: r for r in read_parquet_dir(tmp_path / "tok")}
    ds = ExtractedDataset(out)
    for rid, r in exported.items():
        sample = ds[ds.index(rid)]
        assert sample["input_ids"].tolist() == r.input_ids == recs[rid].input_ids
        assert sample["loss_mask"].tolist() == r.loss_mask


def test_config_extract_section(tmp_path: Path) -> None:
    base = {"datasets": [{"name": "a", "path": "a.jsonl"}]}
    cfg = parse_config(base, tmp_path / "config.toml", check_files=False)
    assert cfg.extract.model is None and cfg.extract.dtype == "auto"
    (tmp_path / "m").mkdir()
    cfg = parse_config({**base, "extract": {"model": "m", "out_dir": "o"}}, tmp_path / "config.toml", check_files=False)
    assert cfg.extract.model == str(tmp_path / "m") and cfg.extract.out_dir == tmp_path / "o"
    cfg = parse_config({**base, "extract": {"model": "org/name"}}, tmp_path / "config.toml", check_files=False)
    assert cfg.extract.model == "org/name"  # a hub id stays as it is
    with pytest.raises(ConfigError, match="extract.aux_layer"):
        parse_config({**base, "extract": {"aux_layer": [1]}}, tmp_path / "config.toml", check_files=False)
    with pytest.raises(ConfigError, match="extract.aux_layers"):
        parse_config({**base, "extract": {"aux_layers": [-1, 2]}}, tmp_path / "config.toml", check_files=False)
    with pytest.raises(ExtractError, match="model is not set"):
        resolve_job(cfg.model_copy(update={"extract": cfg.extract.model_copy(update={"model": None})}))


def test_status_collect_and_gpus(tmp_path: Path) -> None:
    from engine.extract.gpu import GpuReading, GpuSnapshot

    sd = tmp_path / "status"
    sd.mkdir()
    base = {"host": os.uname().nodename, "gpus": [1], "reason": "", "samples_total": 10, "samples_done": 4,
            "tokens_total": 100, "tokens_done": 40, "tokens_per_s": 20.0, "bytes_written": 5, "eta_s": 3.0,
            "updated_at": time.time()}
    (sd / "worker-0.json").write_text(json.dumps({**base, "worker": 0, "pid": os.getpid(), "state": "running"}))
    (sd / "worker-1.json").write_text(json.dumps({**base, "worker": 1, "pid": 999999999, "state": "running", "gpus": [0]}))
    doc = collect(tmp_path)
    assert doc["state"] == "running" and doc["samples_done"] == 8 and doc["tokens_total"] == 200
    assert [w["state"] for w in read_workers(tmp_path)] == ["running", "failed"]
    assert "is gone" in doc["reason"]
    snap = dict(name="G", util_pct=50.0, mem_used_bytes=1, mem_total_bytes=2, temp_c=40.0, power_w=100.0, power_limit_w=300.0)
    g = gpus_json(GpuReading(True, "", (GpuSnapshot(0, **snap), GpuSnapshot(1, **snap))), doc)
    assert [x["worker"] for x in g["gpus"]] == ["", "worker-0"] and g["available"]
    assert gpus_json(GpuReading(False, "no NVIDIA GPU (NVML: x)"), doc) == {
        "available": False, "reason": "no NVIDIA GPU (NVML: x)", "gpus": []}
    assert collect(tmp_path / "nothing")["state"] == "not_started"
    from engine.extract.status import gpu_line, status_fields

    f = status_fields(tmp_path / "run")  # the lead's `datagen status --json` keys
    assert f["extract"]["state"] == "not_started" and set(f["gpus"]) == {"available", "reason", "gpus"}
    assert gpu_line(GpuReading(True, "", (GpuSnapshot(0, **snap),))) == "GPU0 50% 0.0/0.0 GB 40C 100W"


def test_disk_guard_numbers(tmp_path: Path) -> None:
    g = DiskGuard(tmp_path, margin_bytes=100, stated_free=1000)
    assert "projected output" in g.check_start(900)
    with pytest.raises(ExtractError, match="not enough disk space"):
        g.check_start(901)
    g.note_written(850)
    assert g.free() == 150 and g.fits(50) and not g.fits(51)


def test_torchrun_ranks_split_one_job(tmp_path: Path, tiny: Path, monkeypatch) -> None:
    from engine.extract.launch import run_extract

    recs = synth_records(12, 5, 60, seed=6)
    write_parquet(tmp_path / "data" / "a.parquet", recs)
    cfg = make_cfg(tmp_path, tiny, max_tokens_per_batch=128)
    said: list[str] = []
    for rank in (1, 0):  # each rank takes its share, in any order (hosts share out_dir)
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("LOCAL_RANK", "0")
        assert run_extract(cfg, data=tmp_path / "data", say=said.append) == 0
    out = tmp_path / "run" / "extract"
    ws = read_workers(out)
    assert [(w["worker"], w["world"], w["state"]) for w in ws] == [(0, 2, "done"), (1, 2, "done")]
    assert all(w["samples_done"] > 0 for w in ws)
    listed = [e["id"] for e in OutDir(out).read_manifest()]
    assert sorted(listed) == sorted(r.id for r in recs)
    assert any("projected output" in s for s in said)
