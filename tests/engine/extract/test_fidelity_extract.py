"""Phase-two fidelity scoring in the transformers extraction worker (issue 35 item 2).

A real tiny DeepSeek-V3 model (its LM head scaled so its distribution is peaked: entropy ~2 nats, like a
trained model's) writes completions token by token at T=1, top_p=0.95 (an honest provider) and at 1.5x
that temperature (a provider misapplying it). The worker scores them from its own forward; the stored
scores equal a direct computation from ``model(...).logits``, the honest ones look like samples of the
target and the hot ones do not, and an interrupted extraction, restarted, scores each sample exactly once.
"""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.config import parse_config
from engine.extract import scorefiles
from engine.extract.fidelity import EMPTY, Scorer, add_scores, record_seed
from engine.extract.job import resolve_job
from engine.extract.shards import OutDir
from engine.extract.worker import run_worker
from engine.fidelity.dist import sampling_distribution
from engine.fidelity.score import RecordScore, score_record
from engine.storage.fidelity import load_scores, load_scores_by_dataset, open_scores, score_count
from engine.tokens.records import TokenRecord, write_parquet

TINY_LAYERS = 4
SKIP = {0, 1}  # the tiny model's bos / eos ids (its config): never scored
HEAD_SCALE = 20.0


@pytest.fixture(scope="module")
def peaked(tiny: Path):
    """The tiny model with its LM head scaled (a peaked next-token distribution), fp32, eval."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(HEAD_SCALE)
    return m


def sample(model, n: int, prompt_len: int, new: int, temperature: float, seed: int, provider: str,
           dataset: str) -> list[TokenRecord]:
    """``n`` records: random prompts, completions sampled token by token from ``model`` at ``temperature``,
    top_p 0.95 (batched: one forward per step)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 1000, (n, prompt_len), generator=g)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        for _ in range(new):
            p = sampling_distribution(out.logits[:, -1], temperature, 0.95)
            nxt = torch.multinomial(p, 1, generator=g)
            ids = torch.cat([ids, nxt], dim=1)
            out = model(input_ids=nxt, cache=out.cache, use_cache=True)
    return [TokenRecord(id=f"{dataset}:{provider}-{seed}-{i:03d}", dataset=dataset, input_ids=row.tolist(),
                        loss_mask=[0] * prompt_len + [1] * new, prompt_len=prompt_len, completion_len=new,
                        provider=provider, finish_reason="length") for i, row in enumerate(ids)]


def direct_score(model, rec: TokenRecord, temperature: float = 1.0, top_p: float = 0.95) -> RecordScore:
    """The record's score from an unbatched ``model(...).logits`` (no extraction code)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([rec.input_ids]), use_cache=False).logits[0]
    y = torch.tensor(rec.input_ids[rec.prompt_len:])
    return score_record(logits[rec.prompt_len - 1:-1], y, temperature, top_p, seed=record_seed(rec.id),
                        skip=torch.isin(y, torch.tensor(sorted(SKIP))), exclude_ids=torch.tensor(sorted(SKIP)))


def cfg_for(tmp: Path, tiny: Path, **extract):
    data = {"run": {"dir": str(tmp / "run")}, "datasets": [{"name": "a", "path": "a.jsonl"}, {"name": "b", "path": "b.jsonl"}],
            "extract": {"model": str(tiny), "aux_layers": [0, 1], "max_tokens_per_batch": 600, "disk_margin_gb": 0,
                        "out_dir": str(tmp / "out"), **extract}}
    return parse_config(data, tmp / "config.toml", check_files=False)


@pytest.fixture(scope="module")
def records(peaked) -> dict[str, list[TokenRecord]]:
    return {"honest": sample(peaked, 12, 12, 40, 1.0, 1, "honest", "a"),
            "hot": sample(peaked, 12, 12, 40, 1.5, 2, "hot", "b")}


@pytest.fixture(scope="module")
def extracted(tmp_path_factory: pytest.TempPathFactory, tiny: Path, peaked, records):
    tmp = tmp_path_factory.mktemp("fid")
    write_parquet(tmp / "data" / "a.parquet", records["honest"])
    write_parquet(tmp / "data" / "b.parquet", records["hot"])
    job = resolve_job(cfg_for(tmp, tiny), data=tmp / "data")
    res = run_worker(job, model=peaked)
    return tmp, job, res


def test_job_takes_generation_settings(extracted) -> None:
    _, job, res = extracted
    assert job.fidelity and job.temperature == 1.0 and job.top_p == 0.95  # [generation]'s defaults
    assert res.state == "done" and res.timings["fidelity"] > 0


def test_stored_scores_equal_direct_computation(extracted, peaked, records) -> None:
    _, job, _ = extracted
    got = {sid: (ds, prov, s) for sid, ds, prov, s in scorefiles.read_scores(job.out_dir)}
    recs = records["honest"] + records["hot"]
    assert sorted(got) == sorted(r.id for r in recs)
    for r in recs:
        ds, prov, s = got[r.id]
        want = direct_score(peaked, r)  # both bought at the job's T=1, top_p=0.95 (the hot one claims so)
        assert (ds, prov) == (r.dataset, r.provider)
        assert s.tokens == want.tokens == 40 - sum(t in SKIP for t in r.input_ids[12:])
        assert (s.outside, s.top1, s.pit) == (want.outside, want.top1, want.pit)
        for f in ("surprisal", "entropy", "variance", "top1_expected", "top1_variance", "loglik"):
            assert getattr(s, f) == pytest.approx(getattr(want, f), rel=1e-4, abs=1e-4), f


def _z(scores: list[RecordScore]) -> tuple[float, float, int, int]:
    """(surprisal z, PIT chi-square over 10 bins, outside, tokens) of summed scores."""
    tot = EMPTY
    for s in scores:
        tot = add_scores(tot, s)
    z = (tot.surprisal - tot.entropy) / math.sqrt(tot.variance)
    n = sum(tot.pit)
    chi2 = sum((c - n / 10) ** 2 / (n / 10) for c in tot.pit)
    return z, chi2, tot.outside, tot.tokens


def test_honest_looks_like_the_target_and_hot_does_not(extracted) -> None:
    _, job, _ = extracted
    by = {"honest": [], "hot": []}
    for _, _, prov, s in scorefiles.read_scores(job.out_dir):
        by[prov].append(s)
    z, chi2, outside, tokens = _z(by["honest"])
    assert tokens > 400
    assert abs(z) < 4 and chi2 < 30 and outside == 0  # chi2(9) > 30: p ~ 4e-4
    z_hot, chi2_hot, outside_hot, _ = _z(by["hot"])
    assert z_hot > 8 and outside_hot > 0, (z_hot, chi2_hot, outside_hot)


def test_scores_in_the_run_store(extracted, tmp_path: Path) -> None:
    _, job, _ = extracted
    run = tmp_path / "run"
    run.mkdir()
    sqlite3.connect(run / "store.sqlite").close()
    assert scorefiles.import_scores(job.out_dir, run) == 24
    assert scorefiles.import_scores(job.out_dir, run) == 24  # again: replaced by sample id, not added
    with open_scores(run) as h:
        assert score_count(h) == 24
        per = load_scores(h)
        assert {k: len(v) for k, v in per.items()} == {"honest": 12, "hot": 12}
        assert load_scores(h, dataset="b") == {"hot": per["hot"]}
        assert set(load_scores_by_dataset(h)) == {"a", "b"}
    want = {s for _, _, _, s in scorefiles.read_scores(job.out_dir)}
    assert set(per["honest"]) | set(per["hot"]) == want


def test_record_settings_override_the_job(tmp_path: Path, tiny: Path, peaked, records) -> None:
    """A record that says what it was bought with is scored at that (the hot records declared at T=1.5)."""
    from dataclasses import replace

    hot = [replace(r, temperature=1.5, top_p=0.95) for r in records["hot"][:4]]
    if not hasattr(hot[0], "temperature"):
        pytest.skip("TokenRecord has no temperature column in this tree")
    write_parquet(tmp_path / "data" / "b.parquet", hot)
    job = resolve_job(cfg_for(tmp_path, tiny), data=tmp_path / "data")
    run_worker(job, model=peaked)
    rows = {r["id"]: r for r in scorefiles.read_rows(job.out_dir)}
    for r in hot:
        assert rows[r.id]["temperature"] == 1.5
        want = direct_score(peaked, r, temperature=1.5)
        assert rows[r.id]["surprisal"] == pytest.approx(want.surprisal, rel=1e-4) and rows[r.id]["outside"] == 0


def test_fidelity_off(tmp_path: Path, tiny: Path, peaked, records) -> None:
    write_parquet(tmp_path / "data" / "a.parquet", records["honest"][:3])
    job = resolve_job(cfg_for(tmp_path, tiny, fidelity=False), data=tmp_path / "data")
    res = run_worker(job, model=peaked)
    assert res.state == "done" and res.timings["fidelity"] == 0
    assert scorefiles.read_scores(job.out_dir) == []
    assert not any(scorefiles.MANIFEST_KEY in e for e in OutDir(job.out_dir).read_manifest())


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_resume_scores_each_sample_once(tmp_path: Path, tiny: Path, peaked, records) -> None:
    recs = records["honest"] + records["hot"]
    write_parquet(tmp_path / "data" / "a.parquet", records["honest"])
    write_parquet(tmp_path / "data" / "b.parquet", records["hot"])
    job = resolve_job(cfg_for(tmp_path, tiny, max_tokens_per_batch=200), data=tmp_path / "data")

    drain = threading.Event()
    calls = {"n": 0}
    orig = peaked.forward

    def counting(*a, **k):  # drain once two batches went through the model
        calls["n"] += 1
        if calls["n"] == 2:
            drain.set()
        return orig(*a, **k)

    peaked.forward = counting
    try:
        first = run_worker(job, model=peaked, drain=drain)
    finally:
        del peaked.forward
    assert first.state == "stopped" and 0 < first.samples < len(recs)
    done_first = {sid for sid, *_ in scorefiles.read_scores(job.out_dir)}
    assert len(done_first) == first.samples
    # what a worker killed between its score file and its commit leaves: a file no manifest line names,
    # holding a pending sample and a listed one (a second score of it)
    pending = next(r.id for r in recs if r.id not in done_first)
    listed = next(iter(done_first))
    row = next(r for r in scorefiles.read_rows(job.out_dir) if r["id"] == listed)
    orphan = Path(job.out_dir) / scorefiles.SCORES_DIR / f"{scorefiles.ScoreFiles(job.out_dir).host}@{_dead_pid()}@1.jsonl"
    orphan.write_text(json.dumps({**row, "id": pending}) + "\n" + json.dumps({**row, "surprisal": -1.0}) + "\n")
    assert {r["id"] for r in scorefiles.read_rows(job.out_dir)} == done_first  # unlisted: not counted

    second = run_worker(job, model=peaked)
    assert second.state == "done" and second.samples == len(recs) - first.samples
    assert not orphan.exists()  # removed by the worker's recovery
    rows = scorefiles.read_rows(job.out_dir)
    assert sorted(r["id"] for r in rows) == sorted(r.id for r in recs)  # each sample once
    on_disk = [json.loads(line)["id"] for f in (Path(job.out_dir) / scorefiles.SCORES_DIR).glob("*.jsonl")
               for line in f.read_text().splitlines()]
    assert sorted(on_disk) == sorted(r.id for r in recs)  # and no second line of any
    assert all(r["surprisal"] >= 0 for r in rows)


def test_chunks_add_up_to_one_call() -> None:
    torch.manual_seed(0)
    w = torch.randn(50, 8) * 0.5
    head = lambda h: h @ w.T  # noqa: E731
    final = torch.randn(30, 8)
    ids = torch.randint(8, 50, (30,))
    ids[15] = 7
    mask = torch.tensor([0] * 5 + [1] * 25)
    whole = Scorer(head, 50, skip_ids=[7]).score(final, ids, mask, "a:1", 1.0, 0.9)
    parts = Scorer(head, 50, skip_ids=[7], chunk=4).score(final, ids, mask, "a:1", 1.0, 0.9)
    assert whole.tokens == parts.tokens == 24 and sum(whole.pit) == sum(parts.pit)
    assert (whole.outside, whole.top1) == (parts.outside, parts.top1) and 0 < whole.outside < whole.tokens
    assert parts.surprisal == pytest.approx(whole.surprisal) and parts.loglik == pytest.approx(whole.loglik)
    y = ids[5:]
    want = score_record(head(final[4:29]), y, 1.0, 0.9, seed=record_seed("a:1"), skip=y == 7,
                        exclude_ids=torch.tensor([7]))
    assert whole == want
    assert Scorer(head, 50).score(final, ids, torch.zeros(30, dtype=torch.int8), "a:2", 1.0, 0.9) == EMPTY
    with pytest.raises(ValueError, match="disagree"):
        Scorer(head, 50).score(final, ids[:-1], mask, "a:3", 1.0, 0.9)


def test_head_that_misses_the_logits_turns_scoring_off(tmp_path: Path) -> None:
    from engine.extract.fidelity import TransformersScoring

    class Inner:
        model = torch.nn.Module()

        def __init__(self) -> None:
            self.lm = torch.nn.Linear(8, 50, bias=False)
            self.final = torch.randn(2, 5, 8)
            self.logits_last = self.lm(self.final[:, -1]).detach() * 30  # a soft-capped / scaled model's logits

        def head(self):
            return self.lm

    class Job:
        skip_token_ids = (0,)
        model, temperature, top_p = str(tmp_path), 1.0, 1.0

    scoring = TransformersScoring(Job(), Inner())
    assert scoring.on
    assert scoring(None, [0, 1]) is None and not scoring.on


def test_special_ids_from_the_model_directory(tmp_path: Path) -> None:
    from engine.extract.specials import special_token_ids

    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": {
        "163584": {"content": "[BOS]", "special": True}, "163585": {"content": "x", "special": False},
        "163586": {"content": "<|im_end|>", "special": True}}}))
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"bos_token_id": 163584, "eos_token_id": [163585, 163586],
                                                                       "pad_token_id": None}}))
    assert special_token_ids(tmp_path) == {163584, 163585, 163586}
    assert special_token_ids(tmp_path / "missing") == set()
    assert np.array_equal(np.sort(list(special_token_ids(tmp_path))), [163584, 163585, 163586])


def test_prenorm_layout_scores_the_normed_state(extracted, tmp_path: Path, tiny: Path, peaked, records) -> None:
    """The speculators layout saves the state BEFORE the final norm; the scores still come from the normed one."""
    pytest.importorskip("datasets")
    _, job, _ = extracted
    write_parquet(tmp_path / "data" / "a.parquet", records["honest"][:5])
    spec = resolve_job(cfg_for(tmp_path, tiny, layout="speculators"), data=tmp_path / "data")
    run_worker(spec, model=peaked)
    want = {r["id"]: r for r in scorefiles.read_rows(job.out_dir)}
    got = scorefiles.read_rows(spec.out_dir)
    assert len(got) == 5
    for r in got:
        assert r["surprisal"] == pytest.approx(want[r["id"]]["surprisal"], rel=1e-5) and r["pit"] == want[r["id"]]["pit"]


def test_the_launcher_saves_scores_into_the_run_store(extracted, tmp_path: Path, tiny: Path) -> None:
    from engine.extract.run import ExtractRun

    _, job, _ = extracted
    cfg = cfg_for(tmp_path, tiny)
    said: list[str] = []
    launcher = ExtractRun(cfg, job=job, say=said.append, poller=object())
    launcher._import_scores()
    assert said == []  # no store in [run] dir: nothing to do
    (tmp_path / "run").mkdir()
    sqlite3.connect(tmp_path / "run" / "store.sqlite").close()
    launcher._import_scores()
    assert said == [f"fidelity: 24 sample score(s) in {tmp_path / 'run'}'s store"]
    with open_scores(tmp_path / "run") as h:
        assert score_count(h) == 24
