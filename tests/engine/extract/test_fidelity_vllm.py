"""Phase-two fidelity scores on the vLLM engine equal the transformers engine's (issue 35 item 2).

Runs only where vLLM is installed (``.venv-vllm``: ``VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python -m pytest -q
-m vllm tests/engine/extract/test_fidelity_vllm.py``). The vLLM engine scores from its captured final state
(before the final norm: normed here), the final norm and the LM head read from the checkpoint; the
transformers engine from ``model.get_output_embeddings()`` on its normed state. On a tiny fp32 Llama both
give the same per-record scores, in the layout that keeps the normed state (``shards``) and in the one that
keeps the pre-norm state (``speculators``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make vllm-check)")

from engine.config import parse_config
from engine.extract import scorefiles
from engine.extract.job import resolve_job
from engine.extract.onvllm.scoring import lm_head_weight
from engine.extract.tiny import build_tiny_model, synth_records
from engine.extract.worker import run_worker
from engine.tokens.records import write_parquet

pytestmark = pytest.mark.vllm


def scores(tmp: Path, model: Path, engine: str, layout: str) -> tuple[dict, dict]:
    data = {"run": {"dir": str(tmp / f"run-{engine}-{layout}")}, "datasets": [{"name": "a", "path": "a.jsonl"}],
            "extract": {"model": str(model), "aux_layers": [0, 1], "max_tokens_per_batch": 400, "disk_margin_gb": 0,
                        "engine": engine, "layout": layout}}
    job = resolve_job(parse_config(data, tmp / "config.toml", check_files=False), data=tmp / "data", device="cpu")
    res = run_worker(job)
    assert res.state == "done"
    return {r["id"]: r for r in scorefiles.read_rows(job.out_dir)}, res.timings


@pytest.mark.parametrize("layout", ["shards", "speculators"])
def test_vllm_scores_equal_transformers(tmp_path: Path, layout: str) -> None:
    model = build_tiny_model(tmp_path / "llama", seed=0, family="llama", layers=4)
    recs = synth_records(10, 20, 120, seed=3, datasets=("a",))
    write_parquet(tmp_path / "data" / "a.parquet", recs)
    want, _ = scores(tmp_path, model, "transformers", "shards")
    got, timings = scores(tmp_path, model, "vllm", layout)
    assert timings["fidelity"] > 0
    assert sorted(got) == sorted(want) == sorted(r.id for r in recs)
    same_pit = 0
    for sid, w in want.items():
        g = got[sid]
        assert (g["tokens"], g["outside"], g["top1"], g["provider"]) == (w["tokens"], w["outside"], w["top1"], "sim")
        assert g["tokens"] > 0
        for f in ("surprisal", "entropy", "variance", "top1_expected", "loglik"):
            assert g[f] == pytest.approx(w[f], rel=1e-4, abs=1e-4), (sid, f)
        same_pit += g["pit"] == w["pit"]
    assert same_pit >= len(want) - 1  # a randomized PIT value on a bin edge may fall either side


def test_lm_head_weight_read_from_the_checkpoint(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = build_tiny_model(tmp_path / "llama", seed=0, family="llama", layers=4)
    ref = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    assert torch.equal(lm_head_weight(str(model)), ref.lm_head.weight.detach())
