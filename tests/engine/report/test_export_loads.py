"""Every export loads where people load data (issue 15): ``datasets.load_dataset`` (``json`` and
``parquet`` builders) and pandas, on a real run over every bundled sample dataset, the four
other-schema datasets and rows made to break pyarrow's schema inference; the JSON-text fields parse
back to exactly what the store holds; SpecForge's reading of a row renders the same conversation;
a store from before the newer columns still exports. Facts: docs/export-loading.md."""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.json as paj
import pytest

datasets = pytest.importorskip("datasets")

from e2e import SAMPLE_DATASETS, SCHEMA_ROWS  # noqa: E402
from fixtures_tokens import kimi_dir  # noqa: E402
from helpers import SAMPLES  # noqa: E402
from promptcheck_helpers import run, write_config, write_jsonl  # noqa: E402

from datagen.cli import main  # noqa: E402
from engine.config import TokenizerSection  # noqa: E402
from engine.datasets import row_to_prompt  # noqa: E402
from engine.prompts import Prompt  # noqa: E402
from engine.report.status import collect_status  # noqa: E402
from engine.tokens import vstore  # noqa: E402
from engine.tokens.jsonrows import MESSAGE_KEYS  # noqa: E402
from engine.tokens.reconstruct import count_tool_calls, native_tool_calls  # noqa: E402
from engine.tokens.template import assistant_turn, render  # noqa: E402
from engine.tokens.tokenizer import load_tokenizer  # noqa: E402

datasets.disable_progress_bars()


def tool(name: str, props: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"the {name} tool", "parameters": {
        "type": "object", "properties": props, "required": required}}}


#: The same property ``where`` as a nested object (with an object default) and as an array (with an
#: array default); ``n`` typed by a string and by a list; ``required`` empty and not.
NESTED = tool("locate", {"where": {"type": "object", "default": {"city": "Rome"}, "properties": {
    "city": {"type": "string"}, "geo": {"type": "object", "properties": {"lat": {"type": "number"}}}}},
    "n": {"type": "integer"}}, ["where"])
ARRAY = tool("locate", {"where": {"type": "array", "items": {"type": "string"}, "default": ["Rome", "Oslo"]},
                        "n": {"type": ["integer", "null"]}}, [])
OPEN = tool("open", {"path": {"type": "string"}, "lines": {"type": "array", "items": {"type": "integer"}}}, ["path"])


def call(cid: str, arguments) -> dict:
    return {"id": cid, "type": "function", "function": {"name": "open", "arguments": arguments}}


#: Rows that break pyarrow's inference of the previous export shapes: different tool schemas, tool
#: calls and none, argument objects of different shapes (and a string), a named tool result, an
#: earlier turn's reasoning, null content; "Say hello." gets list-valued content in the store.
MIXED = [
    {"messages": [{"role": "user", "content": "Where is the Colosseum?"}], "tools": [NESTED]},
    {"messages": [{"role": "user", "content": "Which of these cities are capitals?"}], "tools": [ARRAY, OPEN]},
    {"messages": [{"role": "user", "content": "Open a.py and show lines 1-2."},
                  {"role": "assistant", "content": "", "reasoning_content": "I should open the file.",
                   "tool_calls": [call("call_a", {"path": "a.py", "lines": [1, 2]})]},
                  {"role": "tool", "tool_call_id": "call_a", "name": "open", "content": "import os\nprint(os.sep)"}],
     "tools": [OPEN]},
    {"messages": [{"role": "user", "content": "Open the file in src."},
                  {"role": "assistant", "content": None,
                   "tool_calls": [call("call_b", {"path": {"dir": "src", "file": "b.py"}, "lines": "all"})]},
                  {"role": "tool", "tool_call_id": "call_b", "content": "x = 1"},
                  {"role": "user", "content": "And what does it do?"}], "tools": [OPEN]},
    {"messages": [{"role": "user", "content": "Open c.py"},
                  {"role": "assistant", "content": "Opening.", "tool_calls": [call("call_c", '{"path": "c.py"}')]},
                  {"role": "tool", "tool_call_id": "call_c", "content": "pass"}], "tools": [OPEN]},
    {"messages": [{"role": "user", "content": "Say hello."}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."}]},
]
PARTS = [{"type": "text", "text": "Say "}, {"type": "text", "text": "hello."}]

CLASSES = "[classes.short]\nmax_tokens = 4000\nconcurrency = 64"
FORMATS = ("raw", "specforge", "openai", "tokens")

# The one schema every single row of a JSONL format infers (so any chunk, file or subset does too).
S = pa.string()
MESSAGE = pa.list_(pa.struct([(k, S) for k in MESSAGE_KEYS]))
SCHEMAS = {
    "raw": pa.schema([("dataset", S), ("key", S), ("messages", S), ("tools", S),
                      ("response", pa.struct([("reasoning", S), ("content", S), ("tool_calls", S), ("finish_reason", S)])),
                      ("usage", pa.struct([("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()),
                                           ("reasoning_tokens", pa.int64())])),
                      ("usage_source", S), ("cost_usd", pa.float64()), ("provider", S), ("model", S),
                      ("generation_id", S), ("wire_flags", S)]),
    "specforge": pa.schema([("id", S), ("conversations", MESSAGE), ("tools", S)]),
    "openai": pa.schema([("id", S), ("messages", MESSAGE), ("tools", S)]),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A finished simulated run over the sample, schema-row and mixed datasets, "Say hello." edited to
    list content in the store (ingest refuses it: only an edited store holds one), exported in every
    format to ``out/<format>``. Returns ``(tmp, store truth, done per dataset)``."""
    tmp = tmp_path_factory.mktemp("export_loads")
    entries = [(n, SAMPLES / f, fmt) for n, f, fmt in SAMPLE_DATASETS]
    entries += [(n, write_jsonl(tmp / f"{n}.jsonl", rows), "auto") for n, rows in SCHEMA_ROWS.items()]
    entries.append(("mixed", write_jsonl(tmp / "mixed.jsonl", MIXED), "openai"))
    run(write_config(tmp, kimi_dir(), entries, classes=CLASSES))
    db = sqlite3.connect(tmp / "run" / "store.sqlite")
    pid, msgs = db.execute("SELECT id, messages FROM prompts WHERE messages LIKE '%Say hello.%'").fetchone()
    edited = json.loads(msgs)
    edited[-1]["content"] = PARTS
    db.execute("UPDATE prompts SET messages=? WHERE id=?", (json.dumps(edited), pid))
    db.commit()
    db.close()
    for fmt in FORMATS:
        assert main(["export", str(tmp / "run"), "--format", fmt, "--out", str(tmp / "out" / fmt), "--force"]) == 0
    done = {d["name"]: d["done"] for d in collect_status(tmp / "run")["datasets"]}
    return tmp, truth(tmp / "run"), done


def truth(run_dir: Path) -> dict[str, dict]:
    """``{"dataset:key": stored prompt + result + validation}`` read straight from the store."""
    db = sqlite3.connect(run_dir / "store.sqlite")
    try:
        rows = db.execute("SELECT r.dataset, r.key, p.messages, p.tools, r.reasoning, r.content, r.tool_calls, "
                          "r.finish_reason, r.prompt_tokens, r.completion_tokens, r.reasoning_tokens, r.cost_usd, "
                          "r.provider, r.model, r.generation_id, r.usage_source, v.input_ids, v.prompt_len "
                          "FROM results r JOIN prompts p ON p.id = r.prompt_id "
                          "LEFT JOIN validations v ON v.prompt_id = r.prompt_id").fetchall()
    finally:
        db.close()
    out = {}
    for ds, key, m, t, rs, c, tc, fin, pt, ct, rt, cost, prov, model, gid, src, blob, pl in rows:
        out[f"{ds}:{key}"] = dict(dataset=ds, key=key, messages=json.loads(m), tools=json.loads(t), reasoning=rs,
                                  content=c, tool_calls=json.loads(tc), finish=fin, usage=(pt, ct, rt), cost=cost,
                                  provider=prov, model=model, generation_id=gid, usage_source=src,
                                  ids=vstore.unpack_ids(blob) if blob else None, prompt_len=pl)
    return out


def files(tmp: Path, fmt: str) -> list[Path]:
    return sorted((tmp / "out" / fmt).glob("*.parquet" if fmt == "tokens" else "*.jsonl"))


def load(fmt_builder: str, data_files, tmp: Path, **kw):
    return datasets.load_dataset(fmt_builder, data_files=[str(f) for f in data_files], split="train",
                                 cache_dir=str(tmp / "hf-cache"), **kw)


# ----------------------------------------------------------------------------- the store-side truth


def test_the_run_covers_every_dataset_and_the_breaking_shapes(exported):
    tmp, t, done = exported
    names = {n for n, _, _ in SAMPLE_DATASETS} | set(SCHEMA_ROWS) | {"mixed"}
    assert set(done) == names and all(done[n] > 0 for n in names)
    assert done["mixed"] == len(MIXED) and len(t) == sum(done.values())
    assert all(r["ids"] is not None for r in t.values())  # every record validated (and valid: see below)
    prompts = [r for r in t.values() if r["dataset"] == "mixed"]
    args = [c["function"]["arguments"] for r in prompts for m in r["messages"] for c in m.get("tool_calls", [])]
    assert {type(a) for a in args} == {dict, str}  # argument objects (of two shapes) and a string
    assert any(isinstance(m["content"], list) for r in prompts for m in r["messages"])
    assert any(m.get("name") for r in prompts for m in r["messages"])
    assert any(r["tool_calls"] for r in t.values()) and any(not r["tool_calls"] for r in t.values())
    for fmt in FORMATS:
        assert {f.stem for f in files(tmp, fmt)} == names


# ----------------------------------------------------------------------------- JSONL formats


@pytest.mark.parametrize("fmt", ["raw", "specforge", "openai"])
def test_every_row_infers_the_one_schema(exported, fmt):
    """pyarrow's own inference on each single line gives the format's schema: so does any chunk of any
    file, and no load can meet a key, a type or a null-typed column its first chunk did not have."""
    tmp = exported[0]
    n = 0
    for f in files(tmp, fmt):
        for line in f.read_bytes().split(b"\n"):
            if line:
                assert paj.read_json(io.BytesIO(line)).schema == SCHEMAS[fmt], (f.name, line[:300])
                n += 1
    assert n == sum(exported[2].values())


@pytest.mark.parametrize("fmt", ["raw", "specforge", "openai"])
def test_jsonl_formats_load_with_datasets_and_pandas(exported, fmt):
    tmp, _, done = exported
    fs = files(tmp, fmt)
    for f in fs:
        assert load("json", [f], tmp).num_rows == done[f.stem], f.name
        assert len(pd.read_json(f, lines=True)) == done[f.stem], f.name
    # the whole directory, read in 16 KiB chunks (as a large file is read in 10 MiB ones), the files in
    # three orders (one starts with a dataset without tools or tool calls, where the earlier shape failed:
    # "Couldn't cast array of type struct<role, content, tool_calls, ...>"): the first chunk's schema must
    # hold for every later chunk and file
    plain = [f for f in fs if f.stem == "b3_evol_instruct"]
    for order in (plain + [f for f in fs if f not in plain], fs, fs[::-1]):
        ds = load("json", order, tmp, chunksize=16 << 10)
        assert ds.num_rows == sum(done.values())
        assert ds.features.arrow_schema == SCHEMAS[fmt]
    whole = datasets.load_dataset("json", data_dir=str(tmp / "out" / fmt), split="train", cache_dir=str(tmp / "hf-cache"))
    assert whole.num_rows == sum(done.values())


def decode_message(m: dict) -> dict:
    """An exported message back to the stored one: docs/export-loading.md's one-liners (``json.loads`` of
    ``tool_calls``; ``""``/null/``"[]"`` mean the key is absent)."""
    out = {"role": m["role"]}
    if m["content"] is not None or m["role"] == "assistant":
        out["content"] = m["content"]
    for k in ("reasoning_content", "tool_call_id", "name"):
        if m[k]:
            out[k] = m[k]
    calls = json.loads(m["tool_calls"])
    if calls:
        out["tool_calls"] = calls
    return out


def expected_stored(m: dict) -> dict:
    """A stored message as :func:`decode_message` sees it: list content is its JSON text."""
    m = dict(m)
    if m["role"] == "assistant":
        m.setdefault("content", None)
    if not isinstance(m.get("content"), (str, type(None))):
        m["content"] = json.dumps(m["content"], ensure_ascii=False)
    return m


def generated_calls(r: dict) -> list[dict]:
    tok_format = TokenizerSection(path="-").tool_id_format
    return native_tool_calls(r["tool_calls"], count_tool_calls(r["messages"]), tok_format)[0]


def check_row(fmt: str, row: dict, t: dict[str, dict]) -> None:
    if fmt == "raw":
        r = t[f"{row['dataset']}:{row['key']}"]
        assert json.loads(row["messages"]) == r["messages"]
        assert json.loads(row["tools"]) == r["tools"]
        assert json.loads(row["response"]["tool_calls"]) == r["tool_calls"]
        assert row["response"] == {"reasoning": r["reasoning"], "content": r["content"], "finish_reason": r["finish"],
                                   "tool_calls": row["response"]["tool_calls"]}
        assert (row["usage"]["prompt_tokens"], row["usage"]["completion_tokens"], row["usage"]["reasoning_tokens"]) == r["usage"]
        assert (row["cost_usd"], row["provider"], row["model"], row["generation_id"], row["usage_source"]) == (
            r["cost"], r["provider"], r["model"], r["generation_id"], r["usage_source"])
        return
    r = t[row["id"]]
    turns = row["conversations" if fmt == "specforge" else "messages"]
    assert json.loads(row["tools"]) == r["tools"]
    assert [list(m) for m in turns] == [list(MESSAGE_KEYS)] * len(turns)
    assert [decode_message(m) for m in turns[:-1]] == [expected_stored(m) for m in r["messages"]]
    gen, calls = turns[-1], generated_calls(r)
    content = r["content"] if (fmt == "specforge" or r["content"] or not calls) else None
    assert (gen["role"], gen["content"], gen["reasoning_content"], json.loads(gen["tool_calls"])) == (
        "assistant", content, r["reasoning"], calls)


@pytest.mark.parametrize("fmt", ["raw", "specforge", "openai"])
def test_json_text_fields_parse_back_exactly(exported, fmt):
    """Through ``datasets`` (Arrow round trip) and pandas, each row's JSON-text fields ``json.loads``
    back to exactly the stored values: tool schemas, argument objects, list content, tool calls."""
    tmp, t, _ = exported
    seen = set()
    for f in files(tmp, fmt):
        for row in load("json", [f], tmp):
            check_row(fmt, row, t)
            seen.add(row["id"] if "id" in row else f"{row['dataset']}:{row['key']}")
        # (pandas' default float parser rounds the last digits of a cost: precise_float keeps them)
        for row in pd.read_json(f, lines=True, precise_float=True).to_dict("records"):
            check_row(fmt, row, t)
    assert seen == set(t)


def test_the_openai_export_ingests_back_to_the_same_prompts(exported):
    """Our own ``openai`` adapter reads an exported row as the prompt that was bought: same key. Aside:
    the edited list-content prompt (its key is of the text it had at ingest), and prompts whose calls
    hold argument OBJECTS: the adapter reads a ``tool_calls`` string with SWE-agent's parser, which
    writes arguments as JSON text (another prompt, another key)."""
    tmp, t, _ = exported
    n = skipped = 0
    for f in files(tmp, "openai"):
        for line in f.read_text(encoding="utf-8").split("\n"):
            if not line:
                continue
            row = json.loads(line)
            r = t[row["id"]]
            if any(isinstance(m.get("content"), list) or any(not isinstance(c["function"]["arguments"], str)
                                                             for c in m.get("tool_calls", []))
                   for m in r["messages"]):
                skipped += 1
                continue
            p = row_to_prompt(row, f"{f.name}:1", "openai")
            assert isinstance(p, Prompt), p
            assert p.key == r["key"] and p.messages == r["messages"] and p.tools == r["tools"]
            n += 1
    assert skipped == 3 and n == len(t) - 3


def test_specforge_reads_a_row_as_the_conversation_that_was_bought(exported):
    """SpecForge's reading (ThinkingParser, the ``kimi-k2-thinking`` template's parser: its message keys,
    ``tool_calls`` and ``tools`` strings ``json.loads``-ed) renders exactly the stored prompt followed by
    the generated turn with the Kimi-layout template: the ``""`` keys change nothing."""
    tmp, t, _ = exported
    tok = load_tokenizer(TokenizerSection(path=str(kimi_dir()), kind="tiktoken"))
    keys = ("role", "content", "tool_calls", "reasoning_content", "name", "tool_call_id")  # ThinkingParser.standard_keys
    n = 0
    for row in load("json", files(tmp, "specforge"), tmp):
        r = t[row["id"]]
        if any(isinstance(m.get("content"), list) for m in r["messages"]):
            continue  # SpecForge would render the JSON text of the parts (as its own loader writes them)
        msgs = [{k: (json.loads(m[k]) if k == "tool_calls" else m[k]) for k in keys} for m in row["conversations"]]
        want = r["messages"] + [assistant_turn(r["reasoning"], r["content"], generated_calls(r))]
        assert render(tok, msgs, json.loads(row["tools"]), add_generation_prompt=False) == \
            render(tok, want, r["tools"], add_generation_prompt=False), row["id"]
        n += 1
    assert n == len(t) - 1


# ----------------------------------------------------------------------------- tokens (Parquet)


def test_the_tokens_export_loads_with_datasets_and_pandas(exported):
    tmp, t, done = exported
    fs = files(tmp, "tokens")
    for f in fs:
        assert load("parquet", [f], tmp).num_rows == done[f.stem]
        assert len(pd.read_parquet(f)) == done[f.stem]
    ds = datasets.load_dataset("parquet", data_dir=str(tmp / "out" / "tokens"), split="train",
                               cache_dir=str(tmp / "hf-cache"))
    frame = pd.read_parquet(tmp / "out" / "tokens")
    assert ds.num_rows == len(frame) == sum(done.values())
    for row in ds:
        r = t[row["id"]]
        assert row["input_ids"] == r["ids"] and row["prompt_len"] == r["prompt_len"]
        assert row["loss_mask"] == [0] * r["prompt_len"] + [1] * (len(r["ids"]) - r["prompt_len"])
    assert sorted(frame["id"]) == sorted(t)


# ----------------------------------------------------------------------------- an older store


def test_a_store_from_before_the_newer_columns_exports_and_loads(exported, tmp_path, capsys):
    """A store without ``results.usage_source``, ``prompts.special_text`` and the ``validations`` table:
    ``datagen export`` still writes every format (validating first with the stored tokenizer), and each
    loads with the row count of its done results."""
    tmp, t, done = exported
    old = tmp_path / "run"
    shutil.copytree(tmp / "run", old)
    db = sqlite3.connect(old / "store.sqlite")
    db.execute("ALTER TABLE results DROP COLUMN usage_source")
    db.execute("ALTER TABLE prompts DROP COLUMN special_text")
    db.execute("DROP TABLE validations")
    # the edited list-content prompt is re-validated now; put its text back so it renders as it was bought
    db.execute("UPDATE prompts SET messages=? WHERE messages LIKE '%\"Say \"%'",
               (json.dumps([{"role": "user", "content": "Say hello."}]),))
    db.commit()
    db.close()
    for fmt in FORMATS:
        out = tmp_path / fmt
        capsys.readouterr()
        assert main(["export", str(old), "--format", fmt, "--out", str(out), "--force"]) == 0, capsys.readouterr()
        fs = sorted(out.iterdir())
        ds = load("parquet" if fmt == "tokens" else "json", fs, tmp_path)
        assert ds.num_rows == sum(done.values()), fmt
        if fmt == "raw":
            assert set(ds["usage_source"]) == {"reported"}  # what a store older than the column means
        elif fmt != "tokens":
            assert ds.features.arrow_schema == SCHEMAS[fmt]


# ----------------------------------------------------------------------------- the loader facts


@pytest.mark.parametrize("first, later, error", [
    ({"m": [{"role": "user", "content": "q"}]}, {"m": [{"role": "tool", "content": "r", "tool_call_id": "c"}]},
     "Couldn't cast array of type"),                                   # a key the first chunk never saw
    ({"tools": None}, {"tools": [{"type": "function"}]}, "Couldn't cast array of type"),  # null-typed there
    ({"tool_calls": []}, {"tool_calls": [{"id": "c"}]}, "Couldn't cast array of type"),   # list<null> there
    ({"cost": 0}, {"cost": 0.5}, "was truncated converting to int64"),                    # int there
])
def test_datasets_fixes_the_schema_from_the_first_chunk(tmp_path, first, later, error):
    """Why every row must carry the whole schema (docs/export-loading.md): rows a later chunk adds
    fail the load. 16 KiB chunks stand in for the builder's 10 MiB."""
    path = tmp_path / "x.jsonl"
    path.write_text("".join(json.dumps(first) + "\n" for _ in range(2000)) + json.dumps(later) + "\n")
    with pytest.raises(Exception) as e:
        load("json", [path], tmp_path, chunksize=16 << 10)
    chain, x = [], e.value
    while x is not None:
        chain.append(str(x))
        x = x.__cause__ or x.__context__
    assert any(error in s for s in chain), chain
