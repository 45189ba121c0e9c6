"""Records that are not one generation of the target (issue 35, item 1) never reach a training export: a substituted
model (``model_mismatch``) and a spliced stream (``spliced_generation``) fail validation, every training format
leaves them out and says how many and which models were served instead, and the ``tokens`` export carries the
columns to filter by (``model``, ``endpoint``, ``system_fingerprint``, ``flags``, ``temperature``, ``top_p``)."""

from __future__ import annotations

import dataclasses
import json

import pyarrow.parquet as pq
import pytest
from fixtures_tokens import kimi_dir, true_count
from helpers import completion, make_config, seeded_store

from engine.client.attribution import attribute
from engine.client.types import ChatRequest, Usage
from engine.config import TokenizerSection
from engine.errors import NothingToExport
from engine.storage.writer import StoreWriter
from engine.tokens import vstore
from engine.tokens.exports import export_validated, left_out, served_instead
from engine.tokens.records import SCHEMA, read_parquet_dir

ASKED = "moonshotai/kimi-k2.5"
R, C = "A one-word answer is enough here.", "Amber."
#: (served model, extra wire flags): 4 substitutes, 3 spellings of the asked model, 1 spliced stream.
SERVED = [("moonshotai/kimi-k2-thinking", ()), ("z-ai/glm-4.7", ()), ("openai/gpt-4o-mini", ()),
          ("moonshotai/kimi-k2-0905", ()), ("moonshotai/kimi-k2.5-0127", ()), ("MoonshotAI/Kimi-K2.5-20250127", ()),
          (ASKED, ()), (ASKED, ("spliced_generation",))]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    import asyncio

    tmp = tmp_path_factory.mktemp("attr")
    cfg = make_config(tmp, [{"name": "d", "path": "d.jsonl"}])

    async def build():
        store = await seeded_store(cfg, {"d": len(SERVED)})
        try:
            w = StoreWriter(store)
            req = ChatRequest(messages=[], max_tokens=100, body={"model": ASKED, "temperature": 0.6, "top_p": 0.95})
            for i, (model, flags) in enumerate(SERVED):
                c = dataclasses.replace(completion(C), reasoning=R, model=model, flags=flags, provider=f"P{i % 2}",
                                        usage=Usage(12, true_count(R, C), 0, 0.0001), system_fingerprint="fp_1")
                w.add_result(i + 1, "d", f"d-{i:06d}", attribute(req, c), 1)
            await w.flush()
        finally:
            await store.close()

    asyncio.run(build())
    export_validated(cfg.run.dir, tmp / "warm", "tokens", tokenizer=TokenizerSection(path=str(kimi_dir())))
    return cfg.run.dir


def test_the_tokens_export_leaves_out_the_substitutes_and_the_splice(run_dir, tmp_path):
    assert export_validated(run_dir, tmp_path, "tokens") == {"d": 3}
    rows = pq.read_table(tmp_path / "d.parquet").to_pylist()
    assert [(r["model"], r["flags"], r["temperature"], r["top_p"], r["system_fingerprint"], r["endpoint"])
            for r in rows] == [(m, [], 0.6, 0.95, "fp_1", "") for m in
                               ("moonshotai/kimi-k2.5-0127", "MoonshotAI/Kimi-K2.5-20250127", ASKED)]
    assert pq.read_schema(tmp_path / "d.parquet").names == SCHEMA.names


def test_the_export_says_how_many_it_left_out_why_and_which_models(run_dir):
    conn = vstore.connect(run_dir)
    try:
        invalid, unvalidated, reasons = left_out(conn)
        instead = served_instead(conn)
    finally:
        conn.close()
    assert (invalid, unvalidated, dict(reasons)) == (5, 0, {"model_mismatch": 4, "spliced_generation": 1})
    assert instead == {"moonshotai/kimi-k2-0905": 1, "moonshotai/kimi-k2-thinking": 1, "openai/gpt-4o-mini": 1,
                       "z-ai/glm-4.7": 1}


@pytest.mark.parametrize("fmt", ["tokens-jsonl", "specforge", "openai"])
def test_every_training_format_leaves_them_out(run_dir, tmp_path, fmt):
    assert export_validated(run_dir, tmp_path, fmt, check_specforge=False) == {"d": 3}
    ids = [json.loads(x)["id"] for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert ids == [f"d:d-{i:06d}" for i in (4, 5, 6)]


def test_include_invalid_exports_them_with_their_flags_to_filter_by(run_dir, tmp_path):
    assert export_validated(run_dir, tmp_path, "tokens", include_invalid=True) == {"d": len(SERVED)}
    got = [(r.model, r.flags, r.provider) for r in read_parquet_dir(tmp_path)]
    assert got == [(m, ("model_mismatch",) if i < 4 else ("spliced_generation",) if i == 7 else (), f"P{i % 2}")
                   for i, (m, _) in enumerate(SERVED)]


def test_the_raw_export_keeps_every_record_with_its_model_and_flag(run_dir, tmp_path):
    from engine.report.export import export_raw

    assert export_raw(run_dir, tmp_path) == {"d": len(SERVED)}
    got = [json.loads(x) for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert [(g["model"], g["wire_flags"]) for g in got] == [
        (m, "model_mismatch" if i < 4 else ",".join(f)) for i, (m, f) in enumerate(SERVED)]


def test_a_tokens_file_from_before_the_columns_reads_back_with_defaults(tmp_path):
    import pyarrow as pa

    old = pa.table({"id": ["d:1"], "dataset": ["d"], "input_ids": [[1, 2]], "loss_mask": [[0, 1]],
                    "prompt_len": [1], "completion_len": [1], "provider": ["P"], "finish_reason": ["stop"]})
    pq.write_table(old, tmp_path / "d.parquet")
    (r,) = read_parquet_dir(tmp_path)
    assert (r.provider, r.model, r.flags, r.temperature, r.top_p) == ("P", "", (), None, None)


def test_a_run_of_only_substitutes_exports_nothing_and_names_the_reason(tmp_path):
    import asyncio

    cfg = make_config(tmp_path, [{"name": "d", "path": "d.jsonl"}])

    async def build():
        store = await seeded_store(cfg, {"d": 2})
        try:
            w = StoreWriter(store)
            req = ChatRequest(messages=[], max_tokens=100, body={"model": ASKED})
            for i in range(2):
                c = dataclasses.replace(completion(C), reasoning=R, model="z-ai/glm-4.7",
                                        usage=Usage(12, true_count(R, C), 0, None))
                w.add_result(i + 1, "d", f"d-{i:06d}", attribute(req, c), 1)
            await w.flush()
        finally:
            await store.close()

    asyncio.run(build())
    with pytest.raises(NothingToExport, match=r"2 invalid: model_mismatch 2\)"):
        export_validated(cfg.run.dir, tmp_path / "out", "tokens", tokenizer=TokenizerSection(path=str(kimi_dir())))
