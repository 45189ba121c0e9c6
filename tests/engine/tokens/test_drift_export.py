"""Records of a provider judged drifting (issue 35 item 5) are flagged ``provider_drift``, left out of every training
export by default and counted, exported with ``include_drifting`` (flag in the ``tokens`` rows), and count again
once the verdict is cleared."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from fixtures_tokens import kimi_dir, true_count
from helpers import REPO, completion, make_config, seeded_store

from engine.client.types import Usage
from engine.config import TokenizerSection
from engine.storage import verdicts
from engine.storage.handle import connect_rw
from engine.storage.writer import StoreWriter
from engine.tokens import vstore
from engine.tokens.exports import drift_left_out, export_validated, iter_token_records

R, C = "A one-word answer is enough here.", "Amber."
PROVIDERS = ["SimA", "SimQ", "SimA", "SimQ", "SimB", "SimQ"]


@pytest.fixture()
def run_dir(tmp_path):
    cfg = make_config(tmp_path, [{"name": "d", "path": "d.jsonl"}])

    async def build():
        store = await seeded_store(cfg, {"d": len(PROVIDERS)})
        try:
            w = StoreWriter(store)
            for i, prov in enumerate(PROVIDERS):
                c = dataclasses.replace(completion(C), reasoning=R, model="moonshotai/kimi-k2.5", provider=prov,
                                        usage=Usage(12, true_count(R, C), 0, 0.0001))
                w.add_result(i + 1, "d", f"d-{i:06d}", c, 1)
            await w.flush()
        finally:
            await store.close()

    asyncio.run(build())
    export_validated(cfg.run.dir, tmp_path / "warm", "tokens", tokenizer=TokenizerSection(path=str(kimi_dir())))
    return cfg.run.dir


def _drift(run_dir, acted="exclude"):
    with connect_rw(run_dir) as h:
        verdicts.save(h, "SimQ", "target", "drifting", 3, 300, "surprisal +0.05 nats/token", {}, 1.0)
        verdicts.set_acted(h, "SimQ", "target", acted, None)


def test_without_a_drift_everything_is_exported(run_dir, tmp_path):
    assert export_validated(run_dir, tmp_path, "tokens") == {"d": 6}


@pytest.mark.parametrize("fmt", ["tokens", "tokens-jsonl", "specforge", "openai"])
def test_a_drifting_providers_records_are_left_out_of_every_format(run_dir, tmp_path, fmt):
    _drift(run_dir)
    assert export_validated(run_dir, tmp_path, fmt, check_specforge=False) == {"d": 3}
    conn = vstore.connect(run_dir)
    try:
        assert drift_left_out(conn) == {"SimQ": (3, "target: surprisal +0.05 nats/token")}
    finally:
        conn.close()


def test_include_drifting_exports_them_flagged(run_dir, tmp_path):
    _drift(run_dir)
    assert export_validated(run_dir, tmp_path, "tokens", include_drifting=True) == {"d": 6}
    rows = pq.read_table(tmp_path / "d.parquet").to_pylist()
    assert [(r["provider"], r["flags"]) for r in rows] == [
        (p, ["provider_drift"] if p == "SimQ" else []) for p in PROVIDERS]


def test_a_reported_drift_flags_nothing_and_a_cleared_one_counts_again(run_dir, tmp_path):
    _drift(run_dir, acted="report")
    assert export_validated(run_dir, tmp_path / "r", "tokens") == {"d": 6}
    with connect_rw(run_dir) as h:
        verdicts.set_acted(h, "SimQ", "target", "flag", None)
    assert export_validated(run_dir, tmp_path / "f", "tokens") == {"d": 3}
    assert [r.provider for r in iter_token_records(run_dir)] == ["SimA", "SimA", "SimB"]  # extraction's source too
    with connect_rw(run_dir) as h:
        assert verdicts.clear(h, "SimQ", 2.0) == 1
    assert export_validated(run_dir, tmp_path / "c", "tokens") == {"d": 6}


def test_datagen_export_says_how_many_and_why(run_dir, tmp_path):
    _drift(run_dir)
    res = subprocess.run([sys.executable, "-m", "datagen", "export", str(run_dir), "--format", "tokens-jsonl",
                          "--out", str(tmp_path / "x")], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    assert ("left out: 3 record(s) of providers judged drifting (provider_drift): SimQ 3 (target: surprisal "
            "+0.05 nats/token); --include-drifting exports them") in res.stdout
    assert sum(1 for _ in open(tmp_path / "x" / "d.jsonl")) == 3
    assert all(json.loads(line)["id"].startswith("d:") for line in open(tmp_path / "x" / "d.jsonl"))
