"""Rendering equals Kimi-K2.5's tokenizer, not just its template (docs/kimi-tokenizer.md): each step its
tokenizer code applies around the Jinja template, tested against a reference statement of that step.

- deep sort vs ``json.loads(json.dumps(x, sort_keys=True))`` on random nested data;
- the TypeScript tool encoder vs published expected strings (the SGLang/llm_tokenizer port's golden
  tests of the Python reference) and strings derived from the reference's rules, and the fallback to
  JSON when the encoder raises;
- the 400,000-character chunking + 25,000-character run split vs an independent statement of the rule;
- the special tokens (the 256 slots after the base vocabulary);
- the whole render of a row whose tool schema is not sorted, and a real headless run on the simulator.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from fixtures_tokens import KIMI_OFFSETS, TEKKEN_BASE, hf_dir, kimi_dir
from promptcheck_helpers import write_config

from datagen.cli import main
from engine.config import TokenizerSection
from engine.tokens.kimi_tools import ToolSchemaError, deep_sort, encode_tools_typescript, kimi_tool_vars
from engine.tokens.template import render
from engine.tokens.tokenizer import is_kimi_dir, kimi_pieces, load_tokenizer


def fn(name, params, desc=None):
    f = {"name": name, "parameters": params}
    if desc is not None:
        f["description"] = desc
    return {"type": "function", "function": f}


HEAD = "# Tools\n\n## functions\nnamespace functions {\n"

# --- 1. deep sort -------------------------------------------------------------------------------


def _random_json(r: random.Random, depth: int = 0):
    roll = r.random()
    if depth > 4 or roll < 0.3:
        return r.choice([None, True, False, 0, -7, 2.5, "", "x", "é", "zeta"])
    if roll < 0.6:
        return [_random_json(r, depth + 1) for _ in range(r.randint(0, 4))]
    keys = ["b", "a", "type", "properties", "Z", "_x", "é", "10", "9", "required", "$defs", "aa", ""]
    return {k: _random_json(r, depth + 1) for k in r.sample(keys, r.randint(0, 6))}


def test_deep_sort_equals_json_sort_keys_on_random_nested_data():
    r = random.Random(17)
    for _ in range(500):
        x = _random_json(r)
        before = json.dumps(x)
        got = deep_sort(x)
        # json.dumps compares key ORDER too (dict == would not)
        assert json.dumps(got) == json.dumps(json.loads(json.dumps(x, sort_keys=True)))
        assert json.dumps(x) == before  # the input is not modified
    assert list(deep_sort({"b": 1, "a": {"d": [{"z": 1, "y": 2}], "c": 0}})) == ["a", "b"]
    assert deep_sort([{"b": 1, "a": 2}, 3]) == [{"a": 2, "b": 1}, 3] and deep_sort(None) is None


# --- 2. the TypeScript encoder -----------------------------------------------------------------


def test_encoder_published_vectors():
    """The golden strings of the SGLang/llm_tokenizer Rust port's tests (captured from the Python
    reference ``tool_declaration_ts.py``)."""
    create_user = [{"type": "function", "function": {
        "name": "create_user", "description": "Create a new user record.",
        "parameters": {"type": "object", "properties": {"user": {"type": "object", "properties": {
            "name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name"]}}, "required": ["user"]}}}]
    assert encode_tools_typescript(create_user) == (
        HEAD + "// Create a new user record.\ntype create_user = (_: {\n  user: {\n    name: string,\n"
        "    age?: number\n  }\n}) => any;\n}\n")
    set_status = [fn("set_status", {"type": "object", "properties": {"status": {"enum": ["active", "paused", "done"]}},
                                    "required": ["status"]})]
    assert encode_tools_typescript(set_status) == (
        HEAD + 'type set_status = (_: {\n  status: "active" | "paused" | "done"\n}) => any;\n}\n')
    null_default = [fn("optional_value", {"type": "object", "properties": {"value": {"type": ["string", "null"], "default": None}}})]
    assert encode_tools_typescript(null_default) == (
        HEAD + "type optional_value = (_: {\n  value?: string | null\n}) => any;\n}\n")
    # $defs interfaces come in insertion order (Zebra before Apple) ...
    zoo = [fn("zoo", {"type": "object", "$defs": {
        "Zebra": {"type": "object", "properties": {"stripes": {"type": "integer"}}, "required": ["stripes"]},
        "Apple": {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]}},
        "properties": {"z": {"$ref": "#/$defs/Zebra"}, "a": {"$ref": "#/$defs/Apple"}}, "required": ["z", "a"]})]
    out = encode_tools_typescript(zoo)
    assert out.index("interface Zebra") < out.index("interface Apple")
    # ... which, after the tokenizer's deep sort, is sorted order
    _, ts, _ = kimi_tool_vars(zoo)
    assert ts == (HEAD + "interface Apple {\n  color: string\n}\ninterface Zebra {\n  stripes: number\n}\n"
                  "type zoo = (_: {\n  a: Apple,\n  z: Zebra\n}) => any;\n}\n")
    # schemas the reference rejects: an unknown $ref, a schema with no type/enum/anyOf/$ref
    with pytest.raises(ToolSchemaError):
        encode_tools_typescript([fn("broken", {"type": "object", "properties": {"x": {"$ref": "#/$defs/Missing"}}})])
    with pytest.raises(ToolSchemaError):
        encode_tools_typescript([fn("weird", {"type": "object", "properties": {"x": {"title": "no recognized keyword"}}})])


# Derived from the reference's rules (docs/kimi-tokenizer.md section 2), each checked byte for byte
# against the reference implementation while writing them.
DERIVED = {
    "required first, then optional, each sorted; constraints; defaults": (
        [fn("search", {"type": "object", "properties": {
            "query": {"type": "string", "description": "What to look for", "minLength": 1, "maxLength": 200},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
            "lang": {"type": "string", "default": "en", "pattern": "^[a-z]{2}$", "format": "not shown"},
            "safe": {"type": "boolean", "default": True},
            "ratio": {"type": "number", "default": 0.5}}, "required": ["query"]}, "Search the web.\nReturns the top hits.")],
        HEAD + "// Search the web.\n// Returns the top hits.\ntype search = (_: {\n  // What to look for\n"
        "  // maxLength: 200, minLength: 1\n  query: string,\n  // pattern: ^[a-z]{2}$\n  // Default: \"en\"\n"
        "  lang?: string,\n  // maximum: 50, minimum: 1\n  // Default: 10\n  limit?: number,\n  // Default: 0.5\n"
        "  ratio?: number,\n  // Default: True\n  safe?: boolean\n}) => any;\n}\n"),
    "nested objects, arrays with item descriptions, additionalProperties false": (
        [fn("plan", {"type": "object", "properties": {
            "steps": {"type": "array", "minItems": 1, "description": "Ordered steps", "items": {
                "type": "object", "description": "One step", "properties": {
                    "title": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["title"]}},
            "meta": {"type": "object", "properties": {"owner": {"type": "string", "description": "Who"}},
                     "additionalProperties": False},
            "plain": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
            "any_list": {"type": "array"}}, "required": ["steps", "meta"]})],
        HEAD + "type plan = (_: {\n  meta: {\n    // Who\n    owner?: string,\n    [k: string]: never\n  },\n"
        "  // Ordered steps\n  // minItems: 1\n  steps: Array<\n    // One step\n    {\n      title: string,\n"
        "      tags?: Array<string>\n    }\n  >,\n  any_list?: Array<any>,\n  plain?: Array<{\n    k?: string\n"
        "  }>\n}) => any;\n}\n"),
    "enum, anyOf, type lists, additionalProperties schema/true, {}": (
        [fn("set_mode", {"type": "object", "properties": {
            "mode": {"type": "string", "enum": ["fast", "slow"], "description": "Speed"},
            "level": {"enum": [1, 2, None]},
            "target": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}, {"type": "null"}]},
            "flex": {"type": ["string", "integer", "null", "object", "array"]},
            "extra": {"type": "object", "additionalProperties": {"type": "number"}},
            "free": {"type": "object", "additionalProperties": True},
            "whatever": {}}, "required": ["mode", "target"]})],
        HEAD + "type set_mode = (_: {\n  // Speed\n  mode: \"fast\" | \"slow\",\n  target: string | Array<number> | null,\n"
        "  extra?: {\n    [k: string]: number\n  },\n  flex?: string | number | null | {} | Array<any>,\n"
        "  free?: {\n    [k: string]: any\n  },\n  level?: 1 | 2 | None,\n  whatever?: any\n}) => any;\n}\n"),
    "$defs with a description, $ref with a description": (
        [fn("zoo", {"type": "object", "$defs": {
            "Zebra": {"type": "object", "description": "A striped animal", "properties": {"stripes": {"type": "integer"}},
                      "required": ["stripes"]},
            "Apple": {"type": "object", "properties": {"color": {"type": "string"}}}},
            "properties": {"z": {"$ref": "#/$defs/Zebra"}, "a": {"$ref": "#/$defs/Apple", "description": "fruit"}},
            "required": ["z"]})],
        HEAD + "// A striped animal\ninterface Zebra {\n  stripes: number\n}\ninterface Apple {\n  color?: string\n}\n"
        "type zoo = (_: {\n  z: Zebra,\n  // fruit\n  a?: Apple\n}) => any;\n}\n"),
    "self reference: a root interface, fields in declared order": (
        [fn("tree", {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#"}},
                                                      "value": {"type": "string"}}, "required": ["value"]}, "A tree node")],
        HEAD + "interface parameters {\n  children?: Array<parameters>,\n  value: string\n}\n// A tree node\n"
        "type tree = (_: parameters) => any;\n}\n"),
    "non-function tools skipped; no parameters": (
        [{"type": "_plugin", "_plugin": {"name": "web"}}, fn("ping", {}), {"type": "function", "function": {"name": "noparams"}}],
        HEAD + "type ping = (_: {}) => any;\ntype noparams = (_: {}) => any;\n}\n"),
    "non-ASCII kept in descriptions and defaults": (
        [fn("greet", {"type": "object", "properties": {"who": {"type": "string", "default": "Zoë", "description": "名前"},
                                                       "opts": {"type": "object", "default": {"a": [1, "é"]}}}})],
        HEAD + "type greet = (_: {\n  // Default: {\"a\": [1, \"é\"]}\n  opts?: {},\n  // 名前\n  // Default: \"Zoë\"\n"
        "  who?: string\n}) => any;\n}\n"),
}

@pytest.mark.parametrize("case", list(DERIVED))
def test_encoder_derived_vectors(case):
    tools, want = DERIVED[case]
    assert encode_tools_typescript(tools) == want


def test_encoder_edge_outputs():
    assert encode_tools_typescript([]) == "" and encode_tools_typescript(None) == ""
    assert encode_tools_typescript([{"type": "_plugin", "_plugin": {}}]) == ""  # no function: "" (still passed)
    assert kimi_tool_vars([{"type": "_plugin", "_plugin": {}}]) == ([{"_plugin": {}, "type": "_plugin"}], "", None)
    assert kimi_tool_vars(None) == (None, None, None) and kimi_tool_vars([]) == ([], None, None)
    # what the reference raises on, the encoder raises on too (whole declaration falls back)
    for bad in ({"type": "string", "description": 5},                     # a non-string description
                {"type": "object", "additionalProperties": "yes"},         # unknown additionalProperties
                {"type": ["string", "date"]},                              # unknown name in a type list
                {"type": "string", "enum": ["a", 1]},                      # enum value of the wrong type
                "string"):                                                 # not a schema object
        _, ts, err = kimi_tool_vars([fn("f", {"type": "object", "properties": {"x": bad}})])
        assert ts is None and err, bad


# --- 3. chunking before BPE --------------------------------------------------------------------


def rule_pieces(text: str) -> list[str]:
    """Kimi's encode, stated independently: a cut every 400,000th character from the start; inside
    each chunk, every maximal run of characters of one class (``str.isspace``) cut after each
    25,000 of its characters (the count starts at the chunk's start)."""
    cuts = {0, len(text)}
    for c0 in range(0, len(text), 400_000):
        cuts.add(c0)
        pos = c0
        for _, run in itertools.groupby(text[c0:c0 + 400_000], key=str.isspace):
            n = len(list(run))
            cuts.update(pos + k for k in range(25_000, n, 25_000))
            pos += n
    cuts = sorted(cuts)
    return [text[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]  # consecutive pairs: one shorter by design


def _word_text(n: int, at: int, insert: str) -> str:
    base = ("lorem ipsum dolor sit amet " * (n // 27 + 2))
    return (base[:at] + insert + base)[:n]


CHUNK_TEXTS = {
    "399,999": _word_text(399_999, 399_990, "Hello"),
    "400,000": _word_text(400_000, 399_995, "Hello"),
    "400,001 Hello straddles": _word_text(400_001, 399_998, "Hello"),
    "1,000,001 special text straddles": _word_text(1_000_001, 799_995, "<|im_end|>"),
    "whitespace run across the boundary": "a" * 390_000 + " " * 30_000 + "b" * 20_000,
    "letter run across the second boundary": "w " * 380_000 + "x" * 60_000 + " " * 60_001,
}


def serving_ids(enc, text: str) -> list[int]:
    """The serving path, stated independently: transformers' ``tokenize`` cuts the text at every
    special-token text (scanning left to right, the longest text at a position), emits its id, and
    gives every other segment to Kimi's ``encode`` (:func:`rule_pieces`, ordinary text)."""
    specials = sorted(enc.special_tokens_set, key=len, reverse=True)
    out: list[int] = []
    i = seg = 0
    while i < len(text):
        hit = next((t for t in specials if text.startswith(t, i)), None) if text[i] in "<[" else None
        if hit is None:
            i += 1
            continue
        out += [t for p in rule_pieces(text[seg:i]) for t in enc.encode_ordinary(p)]
        out.append(enc.encode_single_token(hit))
        i = seg = i + len(hit)
    return out + [t for p in rule_pieces(text[seg:]) for t in enc.encode_ordinary(p)]


@pytest.mark.parametrize("name", list(CHUNK_TEXTS))
def test_encode_chunks_exactly_like_kimi(kimi, name):
    text = CHUNK_TEXTS[name]
    enc = kimi.backend.enc
    pieces = rule_pieces(text)
    assert "".join(pieces) == text and kimi_pieces(text) == pieces
    assert kimi.encode(text) == [i for p in pieces for i in enc.encode_ordinary(p)]
    assert kimi.encode_chat(text) == serving_ids(enc, text)
    if "<|" not in text:  # no special text: the serving path is Kimi's plain encode
        assert kimi.encode_chat(text) == [i for p in pieces for i in enc.encode(p, allowed_special="all")]


def test_rendered_prompts_restart_the_counts_after_every_special_token(kimi):
    """The serving path splits at special-token texts before Kimi's encode: a 30,000-letter run right
    after ``<|im_middle|>`` is cut at 25,000 letters from the special token, not from the text's start;
    a special token's text straddling the 400,000th character stays one special id."""
    enc = kimi.backend.enc
    mid = TEKKEN_BASE + KIMI_OFFSETS["<|im_middle|>"]
    text = "ab" * 5 + "<|im_middle|>" + "x" * 30_000
    ids = kimi.encode_chat(text)
    assert ids == serving_ids(enc, text) and mid in ids
    assert ids[ids.index(mid) + 1:] == enc.encode_ordinary("x" * 25_000) + enc.encode_ordinary("x" * 5_000)
    eot = TEKKEN_BASE + KIMI_OFFSETS["<|im_end|>"]
    straddle = CHUNK_TEXTS["1,000,001 special text straddles"]
    assert eot in kimi.encode_chat(straddle) and eot not in kimi.encode(straddle)


def test_chunk_boundary_changes_the_tokens(kimi):
    """The cut at 400,000 is a forced token boundary of Kimi's plain encode: a token straddling it is
    split; a whitespace run's count restarts there."""
    enc = kimi.backend.enc
    assert CHUNK_TEXTS["400,001 Hello straddles"][399_998:] == "Hel"
    hello = _word_text(400_003, 399_998, "Hello")
    assert hello[399_998:400_003] == "Hello"
    whole = enc.encode(hello, allowed_special="all")
    ours = kimi.encode(hello)
    assert ours != whole and len(ours) > len(whole)
    assert ours[:len(enc.encode(hello[:400_000], allowed_special="all"))] == enc.encode(hello[:400_000], allowed_special="all")
    straddle = CHUNK_TEXTS["1,000,001 special text straddles"]
    assert straddle[799_995:800_005] == "<|im_end|>"
    ws = CHUNK_TEXTS["whitespace run across the boundary"]
    # cuts: each 25,000 of the 390,000 a's, the chunk at 400,000; the 30,000 spaces straddling it are
    # 10,000 + 20,000 (counted afresh in the second chunk), so no cut at 415,000
    assert list(itertools.accumulate(len(p) for p in kimi_pieces(ws))) == [25_000 * k for k in range(1, 16)] + [400_000, 440_000]
    assert [len(p) for p in kimi_pieces("x" * 60_000)] == [25_000, 25_000, 10_000]
    assert kimi_pieces("") == [] and kimi.encode_chat("") == []


# --- 4. special tokens -------------------------------------------------------------------------


def test_special_tokens_are_exactly_the_256_slots(kimi, tmp_path):
    assert kimi.encode_chat(f"<|reserved_token_{TEKKEN_BASE + 5}|>") == [TEKKEN_BASE + 5]  # slot 5 is unnamed
    assert kimi.encode_chat(f"<|reserved_token_{TEKKEN_BASE + 255}|>") != [TEKKEN_BASE + 255]  # named [PAD]
    assert kimi.encode_chat("[PAD]") == [TEKKEN_BASE + 255]
    assert len(kimi.encode_chat(f"<|reserved_token_{TEKKEN_BASE + 256}|>")) > 1  # past the slots
    assert kimi.vocab_size == TEKKEN_BASE + 256
    # a name at an id outside the slots is not a special token (Kimi's rule)
    d = tmp_path / "tok"
    d.mkdir()
    (d / "tiktoken.model").symlink_to(kimi_dir() / "tiktoken.model")
    cfg = json.loads((kimi_dir() / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"][str(TEKKEN_BASE + 300)] = {"content": "<|outside|>", "special": True}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    t = load_tokenizer(str(d))
    assert len(t.encode_chat("<|outside|>")) > 1 and t.encode_chat("<|im_end|>") == [TEKKEN_BASE + 2]


# --- 5. the whole render -----------------------------------------------------------------------

#: The shape of the handed row tool_declaration_order.jsonl (keys in the dataset's order, not sorted).
ROW = {"messages": [{"role": "user", "content": "How much is 100 USD in EUR?"}],
       "tools": [{"type": "function", "function": {
           "name": "convert_currency", "description": "Convert an amount between currencies",
           "parameters": {"type": "object", "properties": {"amount": {"type": "number"}, "from": {"type": "string"},
                                                           "to": {"type": "string"}},
                          "required": ["amount", "from", "to"]}}}]}
ROW_TS = (HEAD + "// Convert an amount between currencies\ntype convert_currency = (_: {\n  amount: number,\n"
          "  from: string,\n  to: string\n}) => any;\n}\n")
DECLARE = "<|im_system|>tool_declare<|im_middle|>"


def _shuffled(x, r):
    if isinstance(x, dict):
        keys = list(x)
        r.shuffle(keys)
        return {k: _shuffled(x[k], r) for k in keys}
    return [_shuffled(v, r) for v in x] if isinstance(x, list) else x


def test_render_sorts_tools_and_declares_them_in_typescript(kimi):
    assert kimi.chat_preprocess == "kimi"
    text = render(kimi, ROW["messages"], ROW["tools"], add_generation_prompt=True)
    assert text == (DECLARE + ROW_TS + "<|im_end|><|im_system|>system<|im_middle|>You are Kimi, an AI assistant "
                    "created by Moonshot AI.<|im_end|><|im_user|>user<|im_middle|>How much is 100 USD in EUR?<|im_end|>"
                    "<|im_assistant|>assistant<|im_middle|><think>")
    assert text == render(kimi, ROW["messages"], deep_sort(ROW["tools"]), add_generation_prompt=True)
    r = random.Random(3)
    for _ in range(5):  # any key order of the same tools renders the same
        assert render(kimi, ROW["messages"], _shuffled(ROW["tools"], r), add_generation_prompt=True) == text
    # without the pre-render step: the template's JSON in the dataset's key order (what it did before)
    plain = load_tokenizer(TokenizerSection(path=str(kimi_dir()), chat_preprocess="none"))
    before = render(plain, ROW["messages"], ROW["tools"], add_generation_prompt=True)
    assert before.startswith(DECLARE + json.dumps(ROW["tools"], separators=(",", ":")) + "<|im_end|>")
    assert kimi.encode_chat(text) != plain.encode_chat(before)


def test_render_falls_back_to_sorted_json_when_the_encoder_raises(kimi, caplog):
    tools = [fn("odd", {"type": "object", "properties": {"x": {"description": "no type"}}, "required": ["x"]}),
             {"type": "function", "function": {"name": "ok", "parameters": {"type": "object"}}}]
    with caplog.at_level(logging.WARNING, logger="engine.tokens.template"):
        text = render(kimi, [{"role": "user", "content": "hi"}], tools, add_generation_prompt=True)
    body = json.dumps(deep_sort(tools), separators=(",", ":"), ensure_ascii=False)
    assert text.startswith(DECLARE + body + "<|im_end|>") and '"odd","parameters":{"properties"' in body
    assert "Kimi's TypeScript encoder rejects the schema" in caplog.text
    # only non-function tools: tools_ts_str is "" and the template renders the JSON
    plug = [{"type": "_plugin", "_plugin": {"name": "web", "a": 1}}]
    assert render(kimi, [{"role": "user", "content": "hi"}], plug, add_generation_prompt=True).startswith(
        DECLARE + '[{"_plugin":{"a":1,"name":"web"},"type":"_plugin"}]<|im_end|>')


def test_hf_kind_gets_the_step_only_for_a_kimi_directory(tmp_path):
    assert is_kimi_dir(str(kimi_dir())) and not is_kimi_dir(str(hf_dir())) and not is_kimi_dir("org/model")
    hf = load_tokenizer(TokenizerSection(path=str(hf_dir())))
    assert hf.kind == "hf" and hf.chat_preprocess == "none"
    msgs = [{"role": "user", "content": "hi"}]
    assert '{"type": "function", "function": {"name": "convert_currency"' in render(hf, msgs, ROW["tools"], add_generation_prompt=True)
    d = tmp_path / "hfkimi"
    shutil.copytree(hf_dir(), d)
    (d / "tool_declaration_ts.py").write_text("# Kimi's tool encoder ships here\n")
    hk = load_tokenizer(TokenizerSection(path=str(d)))
    assert hk.kind == "hf" and hk.chat_preprocess == "kimi"
    assert '{"function": {"description": "Convert an amount' in render(hk, msgs, ROW["tools"], add_generation_prompt=True)
    forced = load_tokenizer(TokenizerSection(path=str(hf_dir()), chat_preprocess="kimi"))
    assert forced.chat_preprocess == "kimi"


# --- 6. end to end: a real headless run on the simulator ----------------------------------------


def test_headless_run_with_unsorted_tools_validates_and_declares_typescript(tmp_path, capsys):
    tok = tmp_path / "tok"
    shutil.copytree(kimi_dir(), tok)
    rows = tmp_path / "rows.jsonl"
    other = {"messages": [{"role": "user", "content": "Find flights"}], "tools": [fn("find", {
        "required": ["to"], "type": "object", "properties": {"to": {"type": "string", "description": "City"},
                                                            "when": {"type": "string"}}})]}
    rows.write_text(json.dumps(ROW) + "\n" + json.dumps(other) + "\n")
    cfg = write_config(tmp_path, tok, [("tools", rows)], name="kimi-tools",
                       sim_extra='latency_ms = 5\ntokens_per_s = 5000\nfaults = ""',
                       tokenizer_extra="billing_tolerance_tokens = 0\nbilling_tolerance_pct = 0",
                       classes="[classes.short]\nmax_tokens = 2000\nconcurrency = 4")
    p = subprocess.run([sys.executable, "-m", "datagen", "run", str(cfg), "--headless"], capture_output=True,
                       text=True, timeout=300, cwd=Path(__file__).resolve().parents[3])
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    run_dir = tmp_path / "run"
    db = sqlite3.connect(run_dir / "store.sqlite")
    sent = [json.loads(t) for (t,) in db.execute("SELECT p.tools FROM prompts p ORDER BY p.id")]
    db.close()
    assert list(sent[0][0]) == ["type", "function"]  # the request keeps the dataset's key order
    capsys.readouterr()
    assert main(["validate", str(run_dir), "--config", str(cfg), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] == doc["records"] == 2 and doc["billing"]["exact"] == 2 and doc["prompt_diff"]["mean_abs"] == 0
    assert main(["export", str(run_dir), "--format", "tokens", "--out", str(tmp_path / "out")]) == 0
    t = load_tokenizer(str(tok))
    prompts = sorted(t.decode(r["input_ids"][:r["prompt_len"]])
                     for r in pq.read_table(tmp_path / "out" / "tools.parquet").to_pylist())
    assert prompts[0].startswith(DECLARE + ROW_TS + "<|im_end|>")
    assert prompts[1].startswith(DECLARE + HEAD + "type find = (_: {\n  // City\n  to: string,\n  when?: string\n"
                                 "}) => any;\n}\n<|im_end|>")
