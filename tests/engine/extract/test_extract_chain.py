"""Extraction chained after generation (``[extract] after_run``), headless: a real generation run on
the simulator (HTTP on 127.0.0.1) with a real tokenizer (validated records), then real extraction
workers on the tiny model (CPU). ``run``: every validated sample extracted once after the run;
``dataset``: the first dataset's extraction starts while generation of the last still goes on."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from extract_jobs import chain_config, manifest_ids
from helpers import SAMPLES

from engine.config import ConfigError, parse_config
from engine.extract.job import ExtractError, resolve_job
from engine.extract.source import iter_source
from engine.extract.tiny import synth_records
from engine.run.chain import ExtractChain, combined_exit_code, readiness, run_headless_chained
from engine.run.chainready import dataset_counts
from engine.tokens.exports import iter_token_records
from engine.tokens.records import write_parquet

pytestmark = pytest.mark.usefixtures("one_thread")  # the workers: the machine is shared

TINY_VOCAB = 4200  # the shared `tiny` fixture's vocabulary


# ------------------------------------------------------------------------------------------ pure parts

def test_readiness_rules_and_exit_codes() -> None:
    assert readiness(5, 4, 0, 4, 0, 0.2, 200) == ("wait", "1 result(s) not committed yet")
    assert readiness(5, 5, 2, 3, 0, 0.2, 200) == ("wait", "2 result(s) not validated yet")
    assert readiness(5, 5, 0, 5, 0, 0.2, 200) == ("ready", "")
    # the anomaly guard's rule: a rate over the limit counts from min(50, window) verdicts on
    assert readiness(60, 60, 0, 60, 13, 0.2, 200)[0] == "refuse"
    assert "13 of 60 records (22% > max_failure_rate 20%)" in readiness(60, 60, 0, 60, 13, 0.2, 200)[1]
    assert readiness(60, 60, 0, 60, 12, 0.2, 200) == ("ready", "")
    assert readiness(10, 10, 0, 10, 9, 0.2, 200) == ("ready", "")  # too few records to judge
    assert readiness(60, 60, 0, 60, 59, 0.0, 200) == ("ready", "")  # 0 disables the check
    assert combined_exit_code(0, 1) == 1 and combined_exit_code(130, 0) == 130 and combined_exit_code(2, 1) == 2
    assert combined_exit_code(0, None) == 0


def test_after_run_config_needs_model_and_tokenizer(tmp_path: Path) -> None:
    base = {"datasets": [{"name": "a", "path": "a.jsonl"}]}
    cfg = parse_config(base, tmp_path / "config.toml", check_files=False)
    assert cfg.extract.after_run == "never"
    with pytest.raises(ConfigError, match=r'extract.after_run = "dataset" needs extract.model .* and a \[tokenizer\]'):
        parse_config({**base, "extract": {"after_run": "dataset"}}, tmp_path / "config.toml", check_files=False)
    with pytest.raises(ConfigError, match="extract.after_run"):
        parse_config({**base, "extract": {"after_run": "always"}}, tmp_path / "config.toml", check_files=False)
    with pytest.raises(ValueError, match="nothing to chain"):
        ExtractChain(cfg)


def test_dataset_filter_of_the_job_and_its_input(tmp_path: Path, tiny: Path) -> None:
    recs = synth_records(12, 4, 20, seed=3, datasets=("a", "b", "c"))
    write_parquet(tmp_path / "data" / "x.parquet", recs)
    assert {r.dataset for r in iter_source("parquet", tmp_path / "data", ("a", "c"))} == {"a", "c"}
    assert len(list(iter_source("parquet", tmp_path / "data", ("b",)))) == 4
    cfg = parse_config({"datasets": [{"name": "a", "path": "a.jsonl"}, {"name": "b", "path": "b.jsonl"}],
                        "extract": {"model": str(tiny), "aux_layers": [0, 1, 2]}}, tmp_path / "config.toml",
                       check_files=False)
    job = resolve_job(cfg, data=tmp_path / "data", device="cpu", datasets=["b"])
    assert job.datasets == ("b",) and type(job).from_json(job.to_json()) == job
    assert resolve_job(cfg, data=tmp_path / "data", device="cpu").datasets is None
    with pytest.raises(ExtractError, match=r"datasets \['zz'\] not in the config's \[\[datasets\]\] \(a, b\)"):
        resolve_job(cfg, data=tmp_path / "data", device="cpu", datasets=["zz"])


# ------------------------------------------------------------------------------------------ real runs

def test_headless_after_run_run_extracts_every_validated_sample(tmp_path: Path, tiny: Path) -> None:
    cfg = chain_config(tmp_path, tiny, "run")
    out = io.StringIO()
    chains: list[ExtractChain] = []
    code = asyncio.run(run_headless_chained(cfg, out, install_signals=False, on_chain=chains.append))
    text = out.getvalue()
    assert code == 0, text[-3000:]
    chain = chains[0]
    assert len(chain.runs) == 1 and chain.starts[0][1] == ("b1", "b7") and chain.exit_code == 0
    validated = sorted(r.id for r in iter_token_records(cfg.run.dir))
    assert len(validated) == 9  # 5 + 4, every one validated
    assert sorted(manifest_ids(tmp_path / "run" / "extract")) == validated
    # (committed, unvalidated, validated, invalid) per dataset, as the "dataset" mode reads them
    assert dataset_counts(cfg.run.dir, ["b1", "b7"]) == {"b1": (5, 0, 5, 0), "b7": (4, 0, 4, 0)}
    # extraction lines come after generation's final report, prefixed
    assert text.index("extract: extraction of b1, b7 starting") > text.index("completed")
    assert "extract: chained extraction ended: exit code 0" in text


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
def test_headless_after_run_dataset_starts_before_generation_ends(tmp_path: Path, tiny: Path) -> None:
    cfg = chain_config(tmp_path, tiny, "dataset", slow_prompts=40, latency_ms=150)
    out = io.StringIO()
    chains: list[ExtractChain] = []
    code = asyncio.run(run_headless_chained(cfg, out, install_signals=False, on_chain=chains.append))
    text = out.getvalue()
    assert code == 0, text[-3000:]
    chain = chains[0]
    conn = sqlite3.connect(tmp_path / "run" / "store.sqlite")
    (b7_last,) = conn.execute("SELECT MAX(created_at) FROM results WHERE dataset='b7'").fetchone()
    (b1_last,) = conn.execute("SELECT MAX(created_at) FROM results WHERE dataset='b1'").fetchone()
    conn.close()
    first_at, first_ds = chain.starts[0]
    assert first_ds == ("b1",)  # b1 alone: b7 was still generating
    assert b1_last < first_at < b7_last, (b1_last, first_at, b7_last)
    assert chain.starts[-1][1] == ("b1", "b7") and len(chain.runs) >= 2
    validated = sorted(r.id for r in iter_token_records(cfg.run.dir))
    assert len(validated) == 45
    assert sorted(manifest_ids(tmp_path / "run" / "extract")) == validated  # each sample once
    assert "extract: extraction of b1 starting" in text


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
def test_headless_sigint_drains_generation_and_extraction(tmp_path: Path, tiny: Path) -> None:
    """SIGINT while b1 is being extracted and b7 still generates: both drain, no other extraction
    starts, exit 130; what was written is each sample once."""
    cfg = chain_config(tmp_path, tiny, "dataset", slow_prompts=60, latency_ms=250)
    out = io.StringIO()
    chains: list[ExtractChain] = []

    async def main() -> int:
        task = asyncio.create_task(run_headless_chained(cfg, out, install_signals=True, on_chain=chains.append))
        deadline = time.monotonic() + 90
        while not (chains and chains[0].current is not None and chains[0].current.info is not None):
            assert time.monotonic() < deadline and not task.done(), out.getvalue()[-2000:]
            await asyncio.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)
        return await task

    code = asyncio.run(main())
    text = out.getvalue()
    chain = chains[0]
    assert code == 130, text[-3000:]
    assert chain.quit_mode == "drain" and len(chain.runs) == 1 and chain.starts[0][1] == ("b1",)
    assert "extract: SIGINT: stopping workers after their current batch" in text
    assert "SIGINT: draining" in text and "run stopped: SIGINT: interrupted" in text
    ids = manifest_ids(tmp_path / "run" / "extract")
    assert len(ids) == len(set(ids)) and all(i.startswith("b1:") for i in ids)


@pytest.mark.parametrize("model", ["{tmp}/no-such-model", "no-such-model", "runs/no-such-model"])
def test_after_run_refuses_a_missing_model_before_anything_is_bought(tmp_path: Path, capsys, model: str) -> None:
    """``after_run`` with a target model that cannot load fails at start: before the fix the whole paid
    generation ran first and extraction then failed (exit 1) on the model path. A bare or ``DIR/NAME``
    relative name (``runs`` exists beside the config) is a local path, refused at once: before, it went
    to the Hub and failed after its retries with a misleading "couldn't connect"."""
    from fixtures_tokens import kimi_dir
    from promptcheck_helpers import write_config

    from datagen.cli import main

    cfg = write_config(tmp_path, kimi_dir(), [("b1", SAMPLES / "b1_glaive.jsonl", "glaive")])
    (tmp_path / "runs").mkdir(exist_ok=True)
    with cfg.open("a") as f:
        f.write(f'\n[extract]\nmodel = "{model.format(tmp=tmp_path)}"\nafter_run = "run"\n')
    t0 = time.monotonic()
    assert main(["run", str(cfg), "--headless"]) == 1
    err = capsys.readouterr().err
    where = cfg.parent / model.format(tmp=tmp_path)
    assert f"extract.model: no such model directory: {where} (" in err and "a hub id is ORG/NAME" in err, err
    assert time.monotonic() - t0 < 10  # no Hub retries
    assert not (tmp_path / "sim.jsonl").exists() or (tmp_path / "sim.jsonl").read_text() == ""  # nothing sent
