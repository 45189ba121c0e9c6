"""Every trainer's format: the pre-tokenized ``tokens-jsonl`` export, SpecForge's vocabulary mapping and
gzip option, Model-Optimizer's offline ``{id}.pt`` layout, and the aux layer ids each output records and
``datagen extract --convert --draft-config`` checks.

Real values from the tiny model (6 layers, H = 64, vocab 1000) against a direct forward pass. Each
trainer's reading code runs where it installs: speculators 0.9.0 (``.venv-train``, ``make train-venv``:
``prepare-data``'s pre-tokenized passthrough) and Model-Optimizer (``OfflineSupervisedDataset``, when
``modelopt`` imports). SpecForge pins another torch and SGLang: its calls are quoted verbatim below from
sgl-project/SpecForge at commit a6b6b0230009d15ec2a97a57384e6f53f0f96946, and with ``SPECFORGE_SRC``
pointing at a checkout its own modules run as well.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections import Counter
from collections.abc import Sequence
from numbers import Integral
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from extract_jobs import AUX, make_job, sf_list_feature_files, sf_load_feature_file
from fixtures_tokens import kimi_dir
from promptcheck_helpers import RENDERABLE, run, write_config, write_jsonl
from test_extract import direct

from datagen.cli import main
from engine.config import ConfigError, parse_config
from engine.extract.convert import convert
from engine.extract.job import ExtractError
from engine.extract.layouts.modelopt import sample_file_name
from engine.extract.shards import OutDir
from engine.extract.tiny import synth_records
from engine.extract.worker import run_worker
from engine.tokens.records import write_parquet

LAYERS = 6
TINY_LAYERS = LAYERS  # the shared `tiny` fixture (tests/conftest.py) builds this many layers
VOCAB = 1000


# --- the tiny model and one extraction per layout ---------------------------------------------------------


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, tiny: Path, hf):
    """16 samples extracted as shards, specforge (draft vocabulary 100), specforge gzipped and modelopt."""
    tmp = tmp_path_factory.mktemp("formats")
    recs = synth_records(16, 5, 120, seed=2)
    write_parquet(tmp / "data" / "a.parquet", recs)
    jobs = {"shards": make_job(tmp, tiny, "shards", "shards"),
            "specforge": make_job(tmp, tiny, "specforge", "sf", draft_vocab_size=100),
            "specforge-gz": make_job(tmp, tiny, "specforge", "sfgz", compress=True, compression_level=1),
            "modelopt": make_job(tmp, tiny, "modelopt", "mo")}
    for name, job in jobs.items():
        Path(job.out_dir).mkdir(parents=True)
        job.save(Path(job.out_dir) / "job.json")  # as `datagen extract` does: convert reads it
        res = run_worker(job, model=hf)
        assert res.state == "done" and res.samples == len(recs), name
    return tmp, {r.id: r for r in recs}, jobs


# --- tokens-jsonl: SpecForge data.prompts_path and speculators prepare-data ------------------------------

# SpecForge specforge/data/prompt_builder.py (commit a6b6b02), verbatim: what data.prompts_path reads
# (prepare_prompt_tasks -> _iter_records -> _prompt_from_record; a file whose first record has both keys
# is pre-tokenized).


def sf_iter_records(path: str):
    with open(path, encoding="utf-8") as stream:
        for line_number, line in enumerate(stream, start=1):
            line = line.strip()
            if not line:
                continue
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"JSON record in {path!r} at line {line_number} must be an object")
            yield line_number, record


def _sf_is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def sf_normalize_integer_sequence(value: Any, *, field: str, source: str, binary: bool) -> list[int]:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise ValueError(f"{source} field {field} must be a sequence")
    sequence = list(value)
    if len(sequence) == 1 and _sf_is_sequence(sequence[0]):
        sequence = list(sequence[0])
    if any(_sf_is_sequence(item) for item in sequence):
        raise ValueError(f"{source} field {field} must be one-dimensional")
    normalized: list[int] = []
    for index, item in enumerate(sequence):
        is_invalid_token_id = field == "input_ids" and isinstance(item, bool)
        if not isinstance(item, Integral) or is_invalid_token_id:
            raise ValueError(f"{source} field {field}[{index}] must be an integer, got {type(item).__name__}")
        integer = int(item)
        if binary and integer not in (0, 1):
            raise ValueError(f"{source} field {field}[{index}] must be 0 or 1, got {integer}")
        normalized.append(integer)
    return normalized


def sf_prompt_from_record(record, *, source: str, max_length: int, min_loss_tokens: int):
    if "input_ids" not in record or "loss_mask" not in record:
        raise ValueError(f"{source} must contain both input_ids and loss_mask")
    input_ids = sf_normalize_integer_sequence(record["input_ids"], field="input_ids", source=source, binary=False)
    loss_mask = sf_normalize_integer_sequence(record["loss_mask"], field="loss_mask", source=source, binary=True)
    if len(input_ids) != len(loss_mask):
        raise ValueError(f"{source} has mismatched input_ids/loss_mask lengths: {len(input_ids)} != {len(loss_mask)}")
    if not input_ids:
        raise ValueError(f"{source} contains an empty token sequence")
    input_ids = input_ids[:max_length]
    loss_mask = loss_mask[:max_length]
    if sum(loss_mask) < min_loss_tokens:
        return None
    return {"payload": {"input_ids": input_ids, "loss_mask": loss_mask}}


def specforge_prompts(path: Path, max_length: int = 1 << 20) -> list[dict]:
    """SpecForge's own ``prepare_prompt_tasks`` with ``SPECFORGE_SRC`` (the module is stdlib-only), else the
    quoted calls above."""
    src = os.environ.get("SPECFORGE_SRC")
    if src:
        spec = importlib.util.spec_from_file_location("sf_prompt_builder", Path(src) / "specforge/data/prompt_builder.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return list(mod.prepare_prompt_tasks(path, None, chat_template=None, max_length=max_length, is_preformatted=False,
                                             train_only_last_turn=False, cache_dir=None, cache_key=None, num_proc=None))
    _, first = next(sf_iter_records(str(path)))
    assert "input_ids" in first and "loss_mask" in first  # -> its pre-tokenized path, no tokenizer
    out = []
    for line_number, record in sf_iter_records(str(path)):
        p = sf_prompt_from_record(record, source=f"{path}:{line_number}", max_length=max_length, min_loss_tokens=1)
        if p is not None:
            out.append(p)
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A finished simulated run (Kimi-layout tokenizer), exported as ``tokens`` and ``tokens-jsonl``."""
    tmp = tmp_path_factory.mktemp("tokens_jsonl")
    more = json.loads(json.dumps(RENDERABLE[:2]))  # prompts of their own (one shared prompt is bought once)
    for row in more:
        row["messages"][0]["content"] += " (asked again)"
    ds = [("good", write_jsonl(tmp / "good.jsonl", RENDERABLE)), ("more", write_jsonl(tmp / "more.jsonl", more))]
    run(write_config(tmp, kimi_dir(), ds))
    for fmt in ("tokens", "tokens-jsonl"):
        assert main(["export", str(tmp / "run"), "--format", fmt, "--out", str(tmp / fmt)]) == 0
    return tmp


def test_tokens_jsonl_rows_are_the_parquet_rows(exported) -> None:
    tmp = exported
    files = sorted((tmp / "tokens-jsonl").iterdir())
    assert [f.name for f in files] == ["good.jsonl", "more.jsonl"]
    for f in files:
        table = pq.read_table(tmp / "tokens" / f"{f.stem}.parquet").to_pylist()
        rows = [json.loads(line) for line in f.read_text().splitlines()]
        assert len(rows) == len(table) > 0
        for row, want in zip(rows, table, strict=True):
            assert list(row) == ["input_ids", "loss_mask", "id"] and row["id"] == want["id"]
            assert row["input_ids"] == want["input_ids"] and row["loss_mask"] == want["loss_mask"]
            assert all(type(x) is int for x in row["input_ids"] + row["loss_mask"])
            assert sum(row["loss_mask"]) == want["completion_len"] > 0


def test_specforge_prompts_path_reads_tokens_jsonl(exported) -> None:
    tmp = exported
    for f in sorted((tmp / "tokens-jsonl").iterdir()):
        table = pq.read_table(tmp / "tokens" / f"{f.stem}.parquet").to_pylist()
        prompts = specforge_prompts(f)
        assert [p["payload"] for p in prompts] == [{"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]} for r in table]


def test_speculators_prepare_data_passes_tokens_jsonl_through(exported) -> None:
    """speculators 0.9.0 ``prepare-data``: ``load_raw_dataset`` (a local .jsonl, or the export directory)
    then ``build_speculator_training_dataset``, whose ``_preprocess_batch`` passes rows with ``input_ids``
    and ``loss_mask`` through (no chat template, no render endpoint). Runs in .venv-train."""
    prep = pytest.importorskip("speculators.data_generation.preprocessing",
                               reason="speculators 0.9.0 is in .venv-train (make train-venv)")
    tmp = exported
    raw, normalize = prep.load_raw_dataset(str(tmp / "tokens-jsonl"))  # the whole directory
    assert normalize is None
    ds = prep.build_speculator_training_dataset(dataset=raw, processor=None, max_length=1 << 20, num_proc=None,
                                                render_endpoint=None, minimum_valid_tokens=None)
    want = [r for f in sorted((tmp / "tokens").iterdir()) for r in pq.read_table(f).to_pylist()]
    assert len(ds) == len(want) and set(ds.column_names) == {"input_ids", "loss_mask", "seq_len"}
    for row, w in zip(ds, want, strict=True):
        assert row["input_ids"].tolist() == w["input_ids"] and row["loss_mask"].tolist() == w["loss_mask"]
        assert int(row["seq_len"]) == len(w["input_ids"])


# --- SpecForge: vocabulary mapping and gzip --------------------------------------------------------------
# (list_feature_files and load_feature_file: sf_list_feature_files, sf_load_feature_file in tests/support/extract_jobs.py)

def sf_count_effective_feature_tokens(hidden_states_path: str, *, max_length=None, target_vocab_size=None) -> Counter:
    """SpecForge training/vocab_mapping.py ``count_effective_feature_tokens`` (verbatim)."""
    paths = sf_list_feature_files(hidden_states_path)
    counts: Counter = Counter()
    for path in paths:
        raw = sf_load_feature_file(path)
        input_ids = raw["input_ids"].reshape(-1)
        loss_mask = raw["loss_mask"].reshape(-1)
        if max_length is not None:
            input_ids = input_ids[:max_length]
            loss_mask = loss_mask[:max_length]
        selected = input_ids[loss_mask.to(dtype=bool)]
        if selected.numel() == 0:
            continue
        token_ids, frequencies = selected.unique(return_counts=True)
        for token_id, frequency in zip(token_ids.tolist(), frequencies.tolist(), strict=True):
            counts[int(token_id)] += int(frequency)
    return counts


def sf_process_token_dict_to_mappings(token_dict: Counter, draft_vocab_size: int, target_vocab_size: int):
    """SpecForge data/preprocessing.py ``process_token_dict_to_mappings`` (verbatim, prints left out)."""
    if len(token_dict) < draft_vocab_size:
        existing_tokens = set(token_dict.keys())
        missing_tokens = set(range(draft_vocab_size)) - existing_tokens
        for token in missing_tokens:
            token_dict[token] = 0
            if len(token_dict) >= draft_vocab_size:
                break
    top_N = token_dict.most_common(draft_vocab_size)
    used_tokens = [key for key, freq in top_N]
    used_tokens.sort()
    d2t = [used_tokens[i] - i for i in range(len(used_tokens))]
    t2d = [i in used_tokens for i in range(target_vocab_size)]
    return torch.tensor(d2t), torch.tensor(t2d)


def sf_validate_vocab_mapping_consistency(t2d: torch.Tensor, d2t: torch.Tensor) -> None:
    """SpecForge core/compact_teacher.py ``validate_vocab_mapping_consistency`` (verbatim)."""
    selected = torch.nonzero(t2d.bool(), as_tuple=False).flatten()
    if selected.numel() != d2t.numel():
        raise ValueError(f"t2d selects {selected.numel()} tokens but d2t has {d2t.numel()} entries.")
    expected = d2t.to(device=selected.device, dtype=selected.dtype) + torch.arange(
        d2t.numel(), device=selected.device, dtype=selected.dtype)
    if not torch.equal(selected, expected):
        raise ValueError("t2d/d2t mapping is inconsistent: nonzero(t2d) must equal d2t + arange(draft_vocab_size).")


@pytest.mark.parametrize("name", ["specforge", "specforge-gz"])
def test_specforge_vocab_mapping_is_the_one_specforge_derives(work, name: str) -> None:
    """``vocab_mapping/vocab_mapping.pt`` beside the features: ``{"d2t": [draft] int64, "t2d": [vocab] bool}``,
    equal to SpecForge's own derivation from these very files (its local offline path), loadable into its
    draft model's buffers (``load_vocab_mapping``: ``torch.load`` then ``copy_``)."""
    tmp, rows, jobs = work
    job = jobs[name]
    out = Path(job.out_dir)
    draft = 100 if name == "specforge" else 32_000
    assert job.vocab_size == VOCAB and job.draft_vocab_size == (100 if name == "specforge" else VOCAB)
    mapping = torch.load(out / "vocab_mapping" / "vocab_mapping.pt")
    assert set(mapping) == {"d2t", "t2d"}
    d2t, t2d = mapping["d2t"], mapping["t2d"]
    n = min(draft, VOCAB)
    assert d2t.dtype == torch.int64 and d2t.shape == (n,) and t2d.dtype == torch.bool and t2d.shape == (VOCAB,)
    counts = sf_count_effective_feature_tokens(str(out), target_vocab_size=VOCAB)
    want_d2t, want_t2d = sf_process_token_dict_to_mappings(Counter(counts), n, VOCAB)  # (it adds to its Counter)
    assert torch.equal(d2t, want_d2t) and torch.equal(t2d, want_t2d)
    sf_validate_vocab_mapping_consistency(t2d, d2t)
    buffers = {"t2d": torch.ones(VOCAB, dtype=torch.bool), "d2t": torch.zeros(n, dtype=torch.int64)}  # llama3_eagle.py
    buffers["t2d"].copy_(mapping["t2d"])
    buffers["d2t"].copy_(mapping["d2t"])
    if name == "specforge":  # the 100 most frequent completion tokens are in the draft vocabulary
        freq = Counter(t for r in rows.values() for t, m in zip(r.input_ids, r.loss_mask, strict=True) if m)
        top = [t for t, c in freq.items() if c > sorted(freq.values(), reverse=True)[100]]
        assert all(t2d[t] for t in top) and int(t2d.sum()) == 100
    if os.environ.get("SPECFORGE_SRC"):  # its own modules over our files
        import sys

        sys.path.insert(0, os.environ["SPECFORGE_SRC"])
        try:
            from specforge.core.compact_teacher import validate_vocab_mapping_consistency
            from specforge.data.preprocessing import process_token_dict_to_mappings
            from specforge.runtime.data_plane.offline_reader import OfflineManifestReader
            from specforge.training.vocab_mapping import count_effective_feature_tokens

            own = count_effective_feature_tokens(str(out), target_vocab_size=VOCAB)
            assert own == counts and list(own) == list(counts)  # the same counts, in the same order
            own_d2t, own_t2d = process_token_dict_to_mappings(own, n, VOCAB)
            assert torch.equal(own_d2t, d2t) and torch.equal(own_t2d, t2d)
            validate_vocab_mapping_consistency(t2d, d2t)
            refs = OfflineManifestReader(str(out), validate_files=True).read()  # gzipped files too
            assert len(refs) == len(rows) and sum(r.num_tokens for r in refs) == sum(len(r.input_ids) for r in rows.values())
        finally:
            sys.path.remove(os.environ["SPECFORGE_SRC"])


def test_specforge_gzip_files_hold_the_same_tensors(work, hf) -> None:
    """``compress = true``: ``rows_*/data_{i}.ckpt.gz`` (SpecForge's --compress), read by its gzip branch,
    with the tensors of the plain files."""
    tmp, rows, jobs = work
    plain, gz = Path(jobs["specforge"].out_dir), Path(jobs["specforge-gz"].out_dir)
    files = sf_list_feature_files(str(gz))
    assert len(files) == len(rows) and all(f.endswith(".ckpt.gz") for f in files)
    by_id = {e["id"]: e["file"] for e in OutDir(plain).read_manifest()}
    size_plain = size_gz = 0
    for e in OutDir(gz).read_manifest():
        a, b = sf_load_feature_file(str(plain / by_id[e["id"]])), sf_load_feature_file(str(gz / e["file"]))
        assert list(a) == list(b) == ["input_ids", "loss_mask", "aux_hidden_state", "hidden_state"]
        assert all(torch.equal(a[k], b[k]) for k in a)
        size_plain += (plain / by_id[e["id"]]).stat().st_size
        size_gz += (gz / e["file"]).stat().st_size
    print(f"\nspecforge gzip level 1 (fp32 states of the tiny model): {size_gz} vs {size_plain} bytes, "
          f"{size_gz / size_plain:.3f}x")
    assert size_gz < size_plain


# --- Model-Optimizer ----------------------------------------------------------------------------------------


def mo_getitem(path: str, answer_only_loss: bool = True) -> dict[str, Any]:
    """Model-Optimizer modelopt/torch/speculative/eagle/utils.py ``OfflineSupervisedDataset.__getitem__``
    (commit a2fbac7b; its loss-mask recovery branch left out), or the real one when modelopt imports."""
    try:
        from modelopt.torch.speculative.eagle.utils import OfflineSupervisedDataset
    except ImportError:
        offline_data = torch.load(path, weights_only=True)
        labels = torch.full_like(offline_data["input_ids"], -100)
        labels[..., :-1] = offline_data["input_ids"][..., 1:]
        if answer_only_loss:
            loss_mask = offline_data["loss_mask"].to(offline_data["input_ids"].dtype)
        else:
            loss_mask = torch.ones_like(offline_data["input_ids"])
        return {
            "input_ids": offline_data["input_ids"],
            "base_model_hidden_states": offline_data["hidden_states"],
            "aux_hidden_states": offline_data["aux_hidden_states"],
            "attention_mask": torch.ones_like(offline_data["input_ids"]),
            "loss_mask": loss_mask,
            "labels": labels,
            "base_hidden_prenorm": bool(offline_data.get("hidden_states_prenorm", False)),
        }
    return OfflineSupervisedDataset([path], answer_only_loss=answer_only_loss)[0]


def check_modelopt_dir(out: Path, rows: dict, hf) -> None:
    H = hf.config.hidden_size
    files = sorted(str(p) for p in out.rglob("*.pt"))  # eagle_utils.py make_speculative_data_module
    assert len(files) == len(rows)
    for f in files:
        raw = torch.load(f, weights_only=True)  # its trainer's call
        assert list(raw) == ["input_ids", "hidden_states", "aux_hidden_states", "loss_mask", "conversation_id"]
        rec = rows[raw["conversation_id"]]
        assert Path(f).name == sample_file_name(rec.id)
        T = len(rec.input_ids)
        assert raw["input_ids"].dtype == raw["loss_mask"].dtype == torch.int64
        assert raw["input_ids"].tolist() == rec.input_ids and raw["loss_mask"].tolist() == rec.loss_mask
        assert raw["hidden_states"].shape == (T, H) and raw["aux_hidden_states"].shape == (T, len(AUX) * H)
        layers, normed, logits = direct(hf, rec.input_ids)
        torch.testing.assert_close(raw["aux_hidden_states"], torch.cat([layers[i] for i in AUX], -1), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(raw["hidden_states"], normed, rtol=1e-5, atol=1e-5)  # post-norm, its default
        item = mo_getitem(f)
        assert item["base_hidden_prenorm"] is False and item["loss_mask"].tolist() == rec.loss_mask
        assert item["labels"][:-1].tolist() == rec.input_ids[1:]
        with torch.no_grad():
            torch.testing.assert_close(hf.lm_head(item["base_model_hidden_states"]), logits, rtol=1e-4, atol=1e-4)


def test_modelopt_files_as_its_dataset_reads_them(work, hf) -> None:
    tmp, rows, jobs = work
    out = Path(jobs["modelopt"].out_dir)
    check_modelopt_dir(out, rows, hf)
    try:  # its dataset and collator over the whole directory, where modelopt imports
        from modelopt.torch.speculative.eagle.utils import EagleOfflineDataCollator, OfflineSupervisedDataset
    except ImportError:
        return
    ds = OfflineSupervisedDataset(sorted(str(p) for p in out.rglob("*.pt")), answer_only_loss=True)
    batch = EagleOfflineDataCollator(train_len=128)([ds[i] for i in range(4)])
    H = hf.config.hidden_size
    assert batch["input_ids"].shape == batch["loss_mask"].shape == (4, 128)
    assert batch["base_model_outputs"]["aux_hidden_states"].shape == (4, 128, len(AUX) * H)
    assert batch["base_model_outputs"]["base_model_hidden_states"].shape == (4, 128, H)


@pytest.mark.parametrize("name", ["modelopt", "specforge"])
def test_projection_matches_bytes_written(work, name: str) -> None:
    from engine.extract.plan import project

    tmp, rows, jobs = work
    job = jobs[name]
    out = Path(job.out_dir)
    files = list(out.glob("*.pt")) if name == "modelopt" else list(out.glob("rows_*/data_*.ckpt"))
    disk = sum(f.stat().st_size for f in files)
    p = project([len(r.input_ids) for r in rows.values()], job.hidden_size, len(AUX), job.dtype_bytes, job.layout)
    print(f"\n{name}: projected {p.total} vs on disk {disk}: {disk / p.total:.4f}x")
    assert abs(disk - p.total) <= 0.03 * p.total


def test_convert_to_modelopt_equals_direct_extraction(work, hf, tmp_path: Path) -> None:
    tmp, rows, jobs = work
    rep = convert(Path(jobs["shards"].out_dir), tmp_path / "mo", "modelopt")
    assert rep.converted == len(rows) and rep.complete and rep.layer_ids == AUX
    check_modelopt_dir(tmp_path / "mo", rows, hf)


def test_modelopt_file_names_are_safe() -> None:
    assert sample_file_name("a:000001-ff") == "a:000001-ff.pt"
    assert sample_file_name("ds:dir/x y") == "ds:dir%2Fx%20y.pt"
    assert sample_file_name(".hidden") == "%2Ehidden.pt"
    assert sample_file_name("d:" + "k" * 300).startswith("sha1-")


# --- aux layer ids: recorded, checked ------------------------------------------------------------------------


def test_each_output_records_its_aux_layer_ids(work, tiny: Path) -> None:
    tmp, rows, jobs = work
    for name, job in jobs.items():
        doc = json.loads((Path(job.out_dir) / "job.json").read_text())
        assert doc["aux_layers"] == AUX and doc["eagle_aux_hidden_state_layer_ids"] == AUX, name
    sp = make_job(tmp, tiny, "speculators", "never")
    assert json.loads(sp.to_json())["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]  # hidden-state ids
    assert type(sp).from_json(sp.to_json()) == sp


def test_convert_refuses_a_draft_config_with_other_layer_ids(work, tmp_path: Path, capsys) -> None:
    """SpecForge's draft config nests the ids in ``eagle_config`` (0-based), speculators' is top-level in
    hidden-state ids (aux + 1); a config naming none means the trainer's default, refused when it differs.
    A refusal writes nothing."""
    tmp, rows, jobs = work
    src = jobs["shards"].out_dir
    good_sf = tmp_path / "sf.json"
    good_sf.write_text(json.dumps({"eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX}, "draft_vocab_size": 100}))
    bad_sf = tmp_path / "sf-bad.json"
    bad_sf.write_text(json.dumps({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 2]}}))
    sp_ok = tmp_path / "sp.json"
    sp_ok.write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [1, 3, 5]}))
    sp_zero_based = tmp_path / "sp-bad.json"  # the 0-based ids given to speculators: off by one
    sp_zero_based.write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": AUX}))
    default = tmp_path / "none.json"  # SpecForge then captures [1, L//2 - 1, L - 4] = [1, 2, 2]
    default.write_text(json.dumps({"draft_vocab_size": 100}))
    for cfg, to in ((bad_sf, "specforge"), (sp_zero_based, "speculators"), (default, "specforge")):
        dst = tmp_path / f"refused-{cfg.stem}"
        assert main(["extract", "--convert", src, "--to", to, "--convert-out", str(dst), "--draft-config", str(cfg)]) == 1
        err = capsys.readouterr().err
        assert "a drafter trained on them would be served with other layers" in err, err
        assert not list(dst.rglob("*.ckpt")) and not list(dst.rglob("*.safetensors"))
    assert main(["extract", "--convert", src, "--to", "specforge", "--convert-out", str(tmp_path / "ok"),
                 "--draft-config", str(good_sf)]) == 0
    assert "eagle_aux_hidden_state_layer_ids = [0, 2, 4] (the draft config's)" in capsys.readouterr().out
    with pytest.raises(ExtractError, match=r"numbers them \[1, 3, 5\]"):
        convert(src, tmp_path / "sp-refused", "speculators", draft_config=sp_zero_based)
    from engine.extract.convert import check_draft_config

    assert check_draft_config(sp_ok, "speculators", jobs["shards"]) == [1, 3, 5]


def test_an_output_of_other_aux_layers_is_not_mixed(work, tiny: Path, hf) -> None:
    """A job with other aux layers (or another save dtype) cannot take over an output holding samples."""
    tmp, rows, jobs = work
    other = make_job(tmp, tiny, "shards", "shards", aux_layers=[1, 2, 3])
    with pytest.raises(ExtractError, match=r"aux_layers \[0, 2, 4\] there, \[1, 2, 3\] now"):
        other.save(Path(other.out_dir) / "job.json")
    jobs["shards"].save(Path(jobs["shards"].out_dir) / "job.json")  # the same job again: fine


def test_layout_settings_are_checked(tmp_path: Path, tiny: Path) -> None:
    base = {"datasets": [{"name": "a", "path": "a.jsonl"}]}
    for extract, msg in (({"layout": "specforge", "save_dtype": "fp8"}, "compress = true"),
                         ({"layout": "modelopt", "save_dtype": "fp8"}, "model dtype"),
                         ({"layout": "shards", "compress": True}, "specforge"),
                         ({"layout": "speculators", "draft_vocab_size": 10}, "vocabulary mapping")):
        with pytest.raises(ConfigError, match=msg):
            parse_config({**base, "extract": extract}, tmp_path / "c.toml", check_files=False)
    (tmp_path / "data").mkdir()
    with pytest.raises(ExtractError, match="exceeds the target's vocab_size 1000"):
        make_job(tmp_path, tiny, "specforge", "o", draft_vocab_size=5000)
