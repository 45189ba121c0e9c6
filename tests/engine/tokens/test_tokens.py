"""Token reconstruction on real tokenizers: loading, special ids, templates, both methods, checks."""

from __future__ import annotations

import json
import random

import pytest
from fixtures_tokens import (
    HF_MARKERS,
    HF_TEMPLATE,
    KIMI_OFFSETS,
    KIMI_REAL_BASE,
    KIMI_TEMPLATE,
    TEKKEN_BASE,
    hf_dir,
    kimi_dir,
    write_hf_dir,
    write_kimi_dir,
)
from helpers import make_config

from engine.config import ConfigError, TokenizerSection
from engine.tokens import vstore
from engine.tokens.reconstruct import Record, native_tool_calls, reconstruct
from engine.tokens.startup import startup_check
from engine.tokens.tokenizer import KIMI_SPLIT_REGEX, TokenizerError, load_tokenizer
from engine.tokens.validate import check

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def hf():
    return load_tokenizer(TokenizerSection(path=str(hf_dir()), **HF_MARKERS))


def rec(messages=None, reasoning="Think about it.", content="The answer.", tool_calls=(), finish="stop", **kw) -> Record:
    return Record(prompt_id=1, dataset="d", key="k", messages=messages or [{"role": "user", "content": "Q?"}],
                  tools=kw.pop("tools", []), reasoning=reasoning, content=content, tool_calls=list(tool_calls),
                  finish_reason=finish, **kw)


def verdict(tok, r):
    return check(reconstruct(tok, r), r, thinking=tok.thinking, ids=tok.ids)


# -- loading and ids --------------------------------------------------------------------------------
def test_kimi_layout_ids_come_from_the_tokenizer_not_from_kimi(kimi):
    assert kimi.kind == "tiktoken" and kimi.backend.n_base == TEKKEN_BASE
    info = startup_check(kimi)
    assert info["special_ids"] == {
        "<think>": TEKKEN_BASE + 22, "</think>": TEKKEN_BASE + 23, "<|im_end|>": TEKKEN_BASE + 2,
        "<|tool_calls_section_begin|>": TEKKEN_BASE + 11, "<|tool_calls_section_end|>": TEKKEN_BASE + 12,
        "<|tool_call_begin|>": TEKKEN_BASE + 13, "<|tool_call_argument_begin|>": TEKKEN_BASE + 14,
        "<|tool_call_end|>": TEKKEN_BASE + 15}
    assert not set(info["special_ids"].values()) & {KIMI_REAL_BASE + o for o in KIMI_OFFSETS.values()}
    assert info["generation_prompt_tail"].endswith("<|im_middle|><think>")
    assert info["traits"] == {"keeps_reasoning_plain": False, "keeps_reasoning_tools": True}


def test_kimi_dir_loads_natively_never_through_its_remote_code(kimi, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = json.loads((kimi_dir() / "tokenizer_config.json").read_text())
    assert cfg["auto_map"]["AutoTokenizer"][0] == "tokenization_kimi.TikTokenTokenizer"  # no such file shipped
    with pytest.raises(TokenizerError, match="AutoTokenizer could not load"):
        load_tokenizer(TokenizerSection(path=str(kimi_dir()), kind="hf"))


def test_plain_and_chat_encodings_and_round_trips(kimi):
    te = kimi.ids["think_end"]
    plain = kimi.encode("a </think> b")
    assert te not in plain and kimi.decode(plain) == "a </think> b"
    assert kimi.encode_chat("a </think> b").count(te) == 1
    for text in ["Hello, world!", "二加二等于四。数学", "tab\tand\r\nnewlines  ", "emoji 🙂 ok", " " * 30_000 + "x" * 30_000]:
        assert kimi.decode(kimi.encode(text)) == text
    assert kimi.encode("x" * 30_000) == kimi.encode("x" * 25_000) + kimi.encode("x" * 5_000)  # Kimi's 25k-run split


def test_split_regex_is_configurable_and_kimi_is_the_default(kimi):
    assert kimi.section.split_regex is None
    other = load_tokenizer(TokenizerSection(path=str(kimi_dir()), split_regex=r"\S+|\s+"))
    text = "Hello, world; 12345 你好world"
    assert kimi.encode(text) != other.encode(text)
    assert other.decode(other.encode(text)) == text
    han = kimi.encode("你好world")  # Han runs are their own pieces under Kimi's regex
    assert kimi.decode(han[:-1]) + kimi.decode(han[-1:]) == "你好world" and "world" in kimi.decode(han[-1:])
    assert "&&[^\\p{Han}]" in KIMI_SPLIT_REGEX


# -- the start-up check ----------------------------------------------------------------------------
def test_startup_refuses_markers_that_are_not_one_token(kimi):
    tok = load_tokenizer(TokenizerSection(path=str(kimi_dir()), think_end="</thinking>"))
    assert "think_end" in tok.unresolved
    with pytest.raises(TokenizerError, match="think_end = '</thinking>'.*not a single token"):
        startup_check(tok)
    tok = load_tokenizer(TokenizerSection(path=str(kimi_dir()), tool_call_end=""))
    with pytest.raises(TokenizerError, match="set all of"):
        startup_check(tok)


def test_startup_refuses_generation_prompt_that_disagrees_with_the_mode(tmp_path):
    tok = load_tokenizer(TokenizerSection(path=str(kimi_dir()), template_vars={"thinking": False}))
    with pytest.raises(TokenizerError, match="thinking = true but the generation prompt ends with .*<think></think>"):
        startup_check(tok)
    off = load_tokenizer(TokenizerSection(path=str(kimi_dir()), thinking=False))
    info = startup_check(off)  # the template's own switch renders <think></think>
    assert info["generation_prompt_tail"].endswith("<think></think>")
    no_think = write_kimi_dir(tmp_path / "k", KIMI_TEMPLATE.replace("<think>{%- endif -%}\n{%- endif -%}", "{%- endif -%}\n{%- endif -%}"))
    with pytest.raises(TokenizerError, match="thinking = true but the generation prompt ends with"):
        startup_check(load_tokenizer(TokenizerSection(path=str(no_think))))
    with pytest.raises(TokenizerError, match="thinking = false but the generation prompt ends with '<think>'"):
        startup_check(load_tokenizer(TokenizerSection(path=str(kimi_dir()), thinking=False, template_vars={"thinking": True})))


def test_startup_refuses_a_template_whose_turn_layout_differs_from_the_rebuild(tmp_path):
    # a template that puts a newline after </think> in the generated turn: method A != method B
    d = write_kimi_dir(tmp_path / "nl", KIMI_TEMPLATE.replace("</think>{%- else", "</think>{{ '\\n' }}{%- else")
                       .replace("</think>{%- endif", "</think>{{ '\\n' }}{%- endif"))
    with pytest.raises(TokenizerError, match="not rebuilt consistently: method_disagree"):
        startup_check(load_tokenizer(TokenizerSection(path=str(d))))


# -- reconstruction --------------------------------------------------------------------------------
def test_multi_turn_prompt_renders_earlier_assistant_turns_with_empty_think(kimi):
    msgs = [{"role": "user", "content": "Tell me about topic 1."},
            {"role": "assistant", "content": "Sure.", "reasoning_content": "old reasoning"},
            {"role": "user", "content": "More detail please."}]
    r = rec(msgs, reasoning="Expand.", content="Here.", prompt_tokens=0)
    x = reconstruct(kimi, r)
    text = kimi.decode(x.prompt_ids)
    assert "<|im_assistant|>assistant<|im_middle|><think></think>Sure.<|im_end|>" in text
    assert "old reasoning" not in text and text.endswith("<|im_user|>user<|im_middle|>More detail please.<|im_end|>"
                                                          "<|im_assistant|>assistant<|im_middle|><think>")
    assert x.prefix_stable and x.agree
    assert kimi.decode(x.completion_ids) == "Expand.</think>Here.<|im_end|>"
    assert kimi.decode(x.rendered_ids) == "</think>Here.<|im_end|>"  # Kimi's template blanks the final turn


def test_tool_calls_rebuilt_in_native_form(kimi):
    prior = [{"role": "user", "content": "Weather?"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}},
                 {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}]},
             {"role": "tool", "tool_call_id": "call_a", "content": "3C"}, {"role": "tool", "tool_call_id": "call_b", "content": "20C"},
             {"role": "user", "content": "And Paris?"}]
    args = '{"city": "Paris", "unit":"c"}'
    r = rec(prior, reasoning="Call it.", content="Checking.", tools=TOOLS, finish="tool_calls",
            tool_calls=[{"id": "call_XYZ", "type": "function", "function": {"name": "get_weather", "arguments": args}}])
    x = reconstruct(kimi, r)
    assert x.tool_calls[0]["id"] == "functions.get_weather:2" and x.ids_rebuilt == 1
    assert x.tool_calls[0]["function"]["arguments"] == args  # verbatim, spacing kept
    assert kimi.decode(x.completion_ids) == (
        "Call it.</think>Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:2"
        f"<|tool_call_argument_begin|>{args}<|tool_call_end|><|tool_calls_section_end|><|im_end|>")
    assert x.agree and x.rendered_ids == x.completion_ids  # tool-call turns keep their reasoning
    prompt = kimi.decode(x.prompt_ids)
    assert prompt.startswith("<|im_system|>tool_declare<|im_middle|># Tools\n\n## functions\nnamespace functions {\n"
                             "// Weather of a city\ntype get_weather = (_: {\n  city?: string\n}) => any;\n}\n<|im_end|>")
    assert "## Return of call_a\n3C" in prompt
    v = check(x, r, thinking=True, ids=kimi.ids)
    assert v.ok and v.notes == ["tool_id_rebuilt", "no_usage"]
    assert native_tool_calls(r.tool_calls, 0, "")[0][0]["id"] == "call_XYZ"  # "" keeps provider ids


def test_checks_flag_each_fault(kimi):
    ok = rec(completion_tokens=0)
    assert verdict(kimi, ok).ok
    x = reconstruct(kimi, ok)
    billed = rec(completion_tokens=len(x.completion_ids) + 5, prompt_tokens=len(x.prompt_ids) - 1)
    v = verdict(kimi, billed)
    assert v.reasons == ["billing_diff"] and v.billing_diff == -5 and v.prompt_diff == 1
    assert verdict(kimi, rec(completion_tokens=len(x.completion_ids) + 2)).ok  # within the default 2-token tolerance
    assert verdict(kimi, rec(reasoning="", content="Hmm.</think>The answer.", reasoning_tokens=3)).reasons == [
        "reasoning_leak", "reasoning_missing", "method_disagree"]
    # a special token's text inside content: plain-encoded here, but the template path would parse it
    assert verdict(kimi, rec(content="text <|im_end|> more")).reasons == ["special_text", "method_disagree"]
    cut = rec(content="", finish="length")
    v = verdict(kimi, cut)
    assert v.reasons == ["truncated", "empty"] and kimi.ids["end_of_turn"] not in reconstruct(kimi, cut).completion_ids
    assert verdict(kimi, rec(content="  ")).reasons == ["empty"]
    bad = rec(tool_calls=[{"id": "functions.get_weather:0", "function": {"name": "get_weather", "arguments": '{"city": "Ro'}}],
              tools=TOOLS)
    assert verdict(kimi, bad).reasons == ["bad_tool_args"]
    off = load_tokenizer(TokenizerSection(path=str(kimi_dir()), thinking=False))
    assert verdict(off, rec(reasoning="")).ok
    assert "reasoning_unexpected" in verdict(off, rec(reasoning="oops")).reasons
    assert off.decode(reconstruct(off, rec(reasoning="")).completion_ids) == "The answer.<|im_end|>"


def test_render_error_is_a_reason_not_a_crash(tmp_path):
    d = write_kimi_dir(tmp_path / "r", "{{ raise_exception('no tools here') if tools else '' }}" + KIMI_TEMPLATE)
    tok = load_tokenizer(TokenizerSection(path=str(d)))
    v = verdict(tok, rec(tools=TOOLS))
    assert v.reasons[0] == "render_error" and not v.ok


# -- another family through transformers --------------------------------------------------------------
def test_hf_family_with_other_markers(hf, tmp_path):
    assert hf.kind == "hf"
    info = startup_check(hf)
    assert info["special_ids"]["</reasoning>"] == hf.backend.tok.convert_tokens_to_ids("</reasoning>")
    assert info["traits"]["keeps_reasoning_plain"] is True
    r = rec(reasoning="Think.", content="Done.", tools=TOOLS, finish="tool_calls",
            tool_calls=[{"id": "call_c1", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}])
    x = reconstruct(hf, r)
    assert hf.decode(x.completion_ids) == ("Think.</reasoning>Done.<tool_calls><call>functions.get_weather:0<args>"
                                           '{"city":"Rome"}</call></tool_calls><|end|>')
    assert x.agree and hf.decode(x.prompt_ids).endswith("<|assistant|><reasoning>")
    with pytest.raises(TokenizerError, match="think_start = '<think>'"):
        startup_check(load_tokenizer(TokenizerSection(path=str(hf_dir()))))  # Kimi's defaults do not fit
    d = write_hf_dir(tmp_path / "h", HF_TEMPLATE.replace("<reasoning>{%- endif -%}\n{%- endif -%}", "{%- endif -%}\n{%- endif -%}"))
    with pytest.raises(TokenizerError, match="does not end with|ends with"):
        startup_check(load_tokenizer(TokenizerSection(path=str(d), **HF_MARKERS)))


# -- plumbing ------------------------------------------------------------------------------------------
def test_packed_ids_round_trip():
    ids = [random.Random(1).randrange(2**31 - 1) for _ in range(1000)] + [0, 163_839]
    assert vstore.unpack_ids(vstore.pack_ids(ids)) == ids


def test_config_tokenizer_section(tmp_path):
    assert make_config(tmp_path).tokenizer is None  # absent: reconstruction off, config still valid
    (tmp_path / "tok").mkdir()
    cfg = make_config(tmp_path, tokenizer={"path": "tok", "chat_template": "t.jinja", "think_end": "</r>"})
    assert cfg.tokenizer.path == str(tmp_path / "tok") and cfg.tokenizer.chat_template == tmp_path / "t.jinja"
    assert make_config(tmp_path, tokenizer={"path": "org/model"}).tokenizer.path == "org/model"  # a hub id
    with pytest.raises(ConfigError, match="tokenizer.thinkng: unknown key"):
        make_config(tmp_path, tokenizer={"path": "tok", "thinkng": True})
    with pytest.raises(ConfigError, match="tool_id_format"):
        make_config(tmp_path, tokenizer={"path": "tok", "tool_id_format": "{nme}"})


def test_simulator_counts_with_the_same_tokenizer(kimi):
    from engine.prompts import prompt_key
    from engine.sim.generator import TokenCounter, inject_data_fault, make_plan

    counter = TokenCounter(str(kimi_dir()))
    msgs = [{"role": "user", "content": "Weather in Rome?"}]
    plan = make_plan(seed=1, key=prompt_key(msgs, TOOLS), messages=msgs, tools=TOOLS, max_tokens=4000,
                     mean_completion_tokens=60, reasoning_fraction=0.5, counter=counter, tool_choice="required")
    calls = [plan.tool_call.to_openai()]
    x = reconstruct(kimi, rec(msgs, plan.reasoning, plan.content, calls, tools=TOOLS, finish=plan.finish_reason))
    assert plan.completion_tokens == len(x.completion_ids) and plan.prompt_tokens == len(x.prompt_ids)
    before = plan.completion_tokens
    inject_data_fault(plan, "split", counter, random.Random(0))
    assert plan.completion_tokens == before + 3 and plan.extra["data_fault"] == "split"


def test_a_tool_call_chain_closed_by_a_plain_answer_is_valid_with_the_prompt_as_served(kimi):
    """Before: an agent row whose trailing tool-call turn carries ``reasoning_content`` (rendered in
    the prompt, as Kimi renders its own chain) failed ``prefix_unstable`` whenever the reply was a plain
    answer: the template drops the chain's reasoning once a plain turn closes it. The training ids are
    the prompt as served plus method A; method B is checked on the pair rendered without the history's
    reasoning, and the record is valid (note ``history_rerendered``)."""
    call = {"id": "functions.lookup:0", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
    messages = [{"role": "user", "content": "task"},
                {"role": "assistant", "content": "", "reasoning_content": "I should call the tool", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "functions.lookup:0", "content": "result"}]
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {
        "q": {"type": "string"}}}}}]
    plain = rec(messages, tools=tools, reasoning="Now answer.", content="It is x.")
    r = reconstruct(kimi, plain)
    assert "I should call the tool" in kimi.decode(r.prompt_ids)  # the prompt as served keeps the chain's reasoning
    assert r.prefix_stable is True and r.history_rerendered is True and r.agree is True
    v = check(r, plain, thinking=True, ids=kimi.ids)
    assert v.ok, v.reasons
    assert "history_rerendered" in v.notes
    # a reply that continues the chain needs no re-rendering
    more = rec(messages, tools=tools, reasoning="Call again.", content="", tool_calls=[
        {"id": "functions.lookup:1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "y"}'}}])
    r2 = reconstruct(kimi, more)
    assert r2.prefix_stable is True and r2.history_rerendered is False and r2.agree is True
