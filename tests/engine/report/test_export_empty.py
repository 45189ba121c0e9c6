"""Exports for every loader: a dataset with nothing to export gets no file (a 0-row Parquet file makes
``datasets.load_dataset("parquet", data_dir=...)`` fail for the whole directory), in every format,
and ``datagen export`` says which dataset and why (issue 17, section 4)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fixtures_tokens import kimi_dir
from promptcheck_helpers import RENDERABLE, run, write_config, write_jsonl

from datagen.cli import main
from engine.tokens.records import SCHEMA

# "cut" is served with max_tokens = 1: every completion is truncated, so no record of it is valid.
CLASSES = """[classes.short]
max_tokens = 4000
concurrency = 8
[classes.tiny]
max_tokens = 1
concurrency = 4
datasets = ["cut"]"""


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """good: valid records; cut: results, all invalid (truncated). (A dataset whose every row is rejected at
    ingest stops the run before any request now: tests/datagen/test_dead_ends.py.)"""
    tmp = tmp_path_factory.mktemp("export_empty")
    ds = [("good", write_jsonl(tmp / "good.jsonl", RENDERABLE)),
          ("cut", write_jsonl(tmp / "cut.jsonl", RENDERABLE[:2]))]
    run(write_config(tmp, kimi_dir(), ds, classes=CLASSES))
    return tmp / "run"


def _export(capsys, run_dir, fmt, out):
    capsys.readouterr()
    code = main(["export", str(run_dir), "--format", fmt, "--out", str(out), "--force"])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("fmt,ext", [("tokens", "parquet"), ("specforge", "jsonl"), ("openai", "jsonl")])
def test_validated_formats_write_no_file_for_a_dataset_without_valid_records(finished_run, tmp_path, capsys, fmt, ext):
    out = tmp_path / fmt
    out.mkdir()
    stale = out / f"cut.{ext}"  # an older export's file of a dataset that has nothing now
    if ext == "parquet":
        pq.write_table(pa.Table.from_pylist([], schema=SCHEMA), stale)
    else:
        stale.write_text('{"id": "old"}\n')
    code, printed = _export(capsys, finished_run, fmt, out)
    assert code == 0, printed
    assert sorted(p.name for p in out.iterdir()) == [f"good.{ext}"]
    assert f"{out / f'good.{ext}'}: {len(RENDERABLE)} " in printed
    assert "dataset cut: no file written (no valid record: 2 result(s) stored, 2 invalid (truncated 2" in printed
    if ext == "parquet":
        assert pq.read_table(out / "good.parquet").num_rows == len(RENDERABLE)
    else:
        assert len((out / "good.jsonl").read_text().splitlines()) == len(RENDERABLE)


def test_include_invalid_exports_the_truncated_dataset(finished_run, tmp_path, capsys):
    out = tmp_path / "all"
    capsys.readouterr()
    assert main(["export", str(finished_run), "--format", "tokens", "--out", str(out), "--include-invalid"]) == 0
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["cut.parquet", "good.parquet"]
    assert f"{out / 'cut.parquet'}: 2 rows" in printed and "no file written" not in printed, printed
    assert pq.read_table(out / "cut.parquet").num_rows == 2


def test_raw_writes_no_file_for_a_dataset_without_results(finished_run, tmp_path, capsys):
    out = tmp_path / "raw"
    code, printed = _export(capsys, finished_run, "raw", out)
    assert code == 0, printed
    assert sorted(p.name for p in out.iterdir()) == ["cut.jsonl", "good.jsonl"]  # raw keeps invalid results
    assert [json.loads(x)["response"]["finish_reason"] for x in (out / "cut.jsonl").read_text().splitlines()] == ["length"] * 2


def test_the_tokens_export_loads_with_datasets(finished_run, tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "hf"
    assert _export(capsys, finished_run, "tokens", out)[0] == 0
    ds = datasets.load_dataset("parquet", data_dir=str(out), split="train")
    assert ds.num_rows == len(RENDERABLE) and set(ds["dataset"]) == {"good"}
