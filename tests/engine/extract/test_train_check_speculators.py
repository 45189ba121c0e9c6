"""Trainer check (issue 13): vllm-project/speculators 0.9.0 trains its EAGLE-3 drafter on our ``speculators`` layout.

Runs only where speculators is importable: ``make train-check`` builds ``.venv-train`` (torch 2.13
CPU, speculators==0.9.0 with its transformers<=5.19, this project) and runs this file. Everything
that reads the data is speculators' own code: ``create_train_val_loaders`` (its ``ArrowDataset``
over ``load_from_disk(out_dir)`` + ``hs_connectors.FileTransfer(out_dir / "hidden_states")``, its
multipack sampler and ``CollateFn``), ``shift_batch`` (the EAGLE-3 preprocess its CLI installs),
``create_transformer_layer_config`` + ``Eagle3DraftModel.from_training_args`` (the drafter its
CLI builds, verifier weights loaded from the tiny verifier). Its ``Trainer`` insists on an
accelerator (``device_type = "cuda"`` without one), so the steps are its trainer's step body on
CPU: forward (loss) -> zero_grad -> backward -> clip_grad_norm_(1.0) -> AdamW step.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

spec = pytest.importorskip(
    "speculators.train.dataloader",
    reason="speculators==0.9.0 is not installed here: `make train-check` runs this test in its own venv (.venv-train)")

from engine.config import parse_config  # noqa: E402
from engine.extract.convert import convert  # noqa: E402
from engine.extract.job import resolve_job  # noqa: E402
from engine.extract.tiny import build_tiny_model, synth_records  # noqa: E402
from engine.extract.worker import run_worker  # noqa: E402
from engine.tokens.records import write_parquet  # noqa: E402

LAYERS = 6
AUX = [0, 2, 4]
SEQ = 512
LOSS_FN = "kl_div"


def _job(tmp: Path, tiny: Path, layout: str, out: str):
    data = {"run": {"dir": str(tmp / "run")}, "datasets": [{"name": "a", "path": "a.jsonl"}],
            "extract": {"model": str(tiny), "aux_layers": AUX, "max_tokens_per_batch": 1024, "disk_margin_gb": 0,
                        "dtype": "float32", "layout": layout, "out_dir": str(tmp / out)}}
    return resolve_job(parse_config(data, tmp / "config.toml", check_files=False), data=tmp / "data")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("train")
    tiny = build_tiny_model(tmp / "tiny", seed=0, layers=LAYERS)
    recs = synth_records(40, 40, 200, seed=3)
    write_parquet(tmp / "data" / "a.parquet", recs)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    job = _job(tmp, tiny, "speculators", "spec")
    assert run_worker(job, model=hf).state == "done"
    return tmp, tiny, hf, job, recs


def _loaders(out: Path, tiny: Path, hidden: int):
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.dataloader import create_train_val_loaders

    return create_train_val_loaders(
        data_path=str(out), total_seq_len=SEQ, hidden_states_dtype=torch.float32,
        vllm_endpoint="http://127.0.0.1:9/v1", on_missing="raise", verifier_name_or_path=str(tiny),
        request_timeout=5.0, max_retries=0, generation_validation_retries=0, max_consecutive_generation_failures=1,
        hidden_size=hidden, num_target_layers=len(AUX), num_workers=0, prefetch_factor=None,
        preprocess=shift_batch, train_data_ratio=0.8, seed=0)


def _drafter(tiny: Path):
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators.train.cli import create_transformer_layer_config

    torch.manual_seed(0)
    cfg = create_transformer_layer_config(verifier_name_or_path=str(tiny), num_layers=1, draft_arch="llama",
                                          hidden_act=None, sliding_window=4096, full_attention_indices=[0])
    return Eagle3DraftModel.from_training_args(
        verifier_config=cfg, t2d=None, d2t=None, draft_vocab_size=cfg.vocab_size, norm_before_residual=True,
        ttt_steps=3, verifier_name_or_path=str(tiny), target_layer_ids=[i + 1 for i in AUX],
        draft_attn_impl="sdpa")  # its option for non-CUDA devices (flex attention has no CPU backward)


def test_speculators_reads_our_files_and_its_targets_are_the_verifier_logits(setup) -> None:
    tmp, tiny, hf, job, recs = setup
    from speculators.train.data import ArrowDataset

    ds = ArrowDataset(max_len=SEQ, datapath=str(job.out_dir), on_missing="raise", hidden_states_dtype=torch.float32)
    assert len(ds) == len(recs)
    by_ids = {tuple(r.input_ids): r for r in recs}
    draft = _drafter(tiny)
    torch.testing.assert_close(draft.verifier_norm.weight, hf.model.norm.weight)
    H = job.hidden_size
    for i in (0, 17, len(ds) - 1):
        item = ds[i]  # not SampleUnavailable: token_ids == the dataset's input_ids
        rec = by_ids[tuple(item["input_ids"].tolist())]
        assert item["loss_mask"].tolist() == rec.loss_mask  # == the tokens export
        assert item["hidden_states"].shape == (len(rec.input_ids), 3 * H)
        with torch.no_grad():
            logits = hf(torch.tensor([rec.input_ids])).logits[0]
            targets = draft.verifier_lm_head(draft.verifier_norm(item["verifier_last_hidden_states"]))
        torch.testing.assert_close(targets, logits, rtol=1e-4, atol=1e-4)  # speculators' own target computation


def _train(loader, draft, steps: int) -> list[float]:
    from speculators.models.eagle3.core import Eagle3DraftModel

    # its trainer's call kwargs; the "fused" loss needs Triton, "eager" is its portable implementation
    kw, _ = Eagle3DraftModel.get_trainer_kwargs(loss_fn=LOSS_FN, loss_implementation="eager", ttt_steps=3,
                                                ttt_step_loss_decay=1.0)
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=3e-3)
    losses: list[float] = []
    draft.train()
    while len(losses) < steps:
        for batch in loader:
            b = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
            _draft_tokens, loss, metrics = draft(**b, **kw)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
            opt.step()
            losses.append(float(loss.detach()))
            if len(losses) == steps:
                break
    return losses


def test_eagle3_drafter_trains_on_cpu_loss_finite_and_falling(setup) -> None:
    tmp, tiny, hf, job, recs = setup
    train, val = _loaders(Path(job.out_dir), tiny, job.hidden_size)
    draft = _drafter(tiny)
    losses = _train(train, draft, 24)
    print(f"\nspeculators 0.9.0 EAGLE-3 drafter, {len(losses)} AdamW steps on CPU: first {losses[:3]} last {losses[-3:]}")
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-4:]) / 4 < 0.8 * sum(losses[:4]) / 4, losses


def test_converted_shards_train_too(setup) -> None:
    tmp, tiny, hf, job, recs = setup
    shards = _job(tmp, tiny, "shards", "shards")
    assert run_worker(shards, model=hf).state == "done"
    rep = convert(Path(shards.out_dir), tmp / "conv", "speculators", model=str(tiny))
    assert rep.converted == len(recs)
    train, _ = _loaders(tmp / "conv", tiny, job.hidden_size)
    losses = _train(train, _drafter(tiny), 4)
    assert all(math.isfinite(x) for x in losses), losses
