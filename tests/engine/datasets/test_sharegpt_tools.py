"""ShareGPT tool rows: parallel and list-valued ``function_call`` turns, observations paired with their own
call (first in, first out), native call ids shared with glaive, rejects with file:line and the reason.
Rules: docs/dataset-rows.md, section "ShareGPT"."""

from __future__ import annotations

import json

import pytest
from fixtures_tokens import kimi_dir

from engine.config import TokenizerSection
from engine.datasets import iter_prompts, row_to_prompt
from engine.datasets.sharegpt import parse_calls, sharegpt_messages
from engine.datasets.tool_calls import CALL_ID_FORMAT, CallQueue, native_call_id
from engine.prompts import Prompt, Reject
from engine.tokens.template import render
from engine.tokens.tokenizer import load_tokenizer

PRICE_TOOL = json.dumps([{"name": "get_price", "description": "Price of a stock", "parameters": {
    "type": "object", "properties": {"ticker": {"type": "string"}}, "required": ["ticker"]}}])


def call(name: str, args: dict) -> str:
    return json.dumps({"name": name, "arguments": args})


def fc(value) -> dict:
    return {"from": "function_call", "value": value}


def obs(value: str) -> dict:
    return {"from": "observation", "value": value}


def human(text: str) -> dict:
    return {"from": "human", "value": text}


def gpt(text: str) -> dict:
    return {"from": "gpt", "value": text}


def prompt_of(turns: list, **extra) -> Prompt:
    p = row_to_prompt({"conversations": turns, "tools": PRICE_TOOL, **extra}, "rows.json:1", "sharegpt")
    assert isinstance(p, Prompt), p
    return p


def pairs(p: Prompt) -> list[tuple[str, str]]:
    """(tool_call_id, content) of each tool message, in order."""
    return [(m["tool_call_id"], m["content"]) for m in p.messages if m["role"] == "tool"]


def call_ids(p: Prompt) -> list[list[str]]:
    return [[c["id"] for c in m["tool_calls"]] for m in p.messages if m.get("tool_calls")]


def test_two_calls_then_two_observations_each_answers_its_own_call():
    p = prompt_of([human("What are AAPL and MSFT trading at?"),
                   fc(call("get_price", {"ticker": "AAPL"})), fc(call("get_price", {"ticker": "MSFT"})),
                   obs('{"ticker": "AAPL", "price": 189.1}'), obs('{"ticker": "MSFT", "price": 411.5}'),
                   gpt("AAPL is 189.1 and MSFT is 411.5.")])
    # One assistant turn with both calls (parallel calls, as an OpenAI assistant message has them)
    assert [m["role"] for m in p.messages] == ["user", "assistant", "tool", "tool"]
    assert p.messages[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "functions.get_price:0", "type": "function", "function": {"name": "get_price", "arguments": '{"ticker": "AAPL"}'}},
        {"id": "functions.get_price:1", "type": "function", "function": {"name": "get_price", "arguments": '{"ticker": "MSFT"}'}}]}
    assert pairs(p) == [("functions.get_price:0", '{"ticker": "AAPL", "price": 189.1}'),
                        ("functions.get_price:1", '{"ticker": "MSFT", "price": 411.5}')]
    assert p.notes == ("merged messages 2-3 (assistant)",)


def test_list_valued_call_and_list_valued_observation_split_one_per_call():
    p = prompt_of([human("Prices for NVDA and AMD please."),
                   fc(json.dumps([{"name": "get_price", "arguments": {"ticker": "NVDA"}},
                                  {"name": "get_price", "arguments": {"ticker": "AMD"}}])),
                   obs('[{"ticker": "NVDA", "price": 120.0}, {"ticker": "AMD", "price": 150.2}]'),
                   gpt("NVDA 120.0, AMD 150.2.")])
    assert call_ids(p) == [["functions.get_price:0", "functions.get_price:1"]]
    assert [json.loads(c["function"]["arguments"]) for c in p.messages[1]["tool_calls"]] == [{"ticker": "NVDA"}, {"ticker": "AMD"}]
    assert pairs(p) == [("functions.get_price:0", '{"ticker": "NVDA", "price": 120.0}'),
                        ("functions.get_price:1", '{"ticker": "AMD", "price": 150.2}')]
    assert p.notes == ()


def test_list_valued_call_answered_by_separate_observations_and_string_elements():
    three = json.dumps([{"name": "a", "arguments": {}}, {"name": "b", "arguments": "{\"x\": 1}"},
                        {"type": "function", "function": {"name": "c", "arguments": {"y": [1, 2]}}}])
    p = prompt_of([human("go"), fc(three), obs("A"), obs("B"), obs("C"), gpt("done")])
    assert call_ids(p) == [["functions.a:0", "functions.b:1", "functions.c:2"]]
    assert [c["function"]["arguments"] for c in p.messages[1]["tool_calls"]] == ["{}", '{"x": 1}', '{"y": [1, 2]}']
    assert pairs(p) == [("functions.a:0", "A"), ("functions.b:1", "B"), ("functions.c:2", "C")]
    # a list observation whose elements are strings: each string is the result text as it is
    p = prompt_of([human("go"), fc(json.dumps([{"name": "a"}, {"name": "b"}])), obs('["first", {"k": "é"}]'), gpt("ok")])
    assert pairs(p) == [("functions.a:0", "first"), ("functions.b:1", '{"k": "é"}')]


def test_list_observation_not_split_when_it_does_not_mirror_a_list_valued_call():
    two = fc(json.dumps([{"name": "s", "arguments": {"q": 1}}, {"name": "s", "arguments": {"q": 2}}]))
    # three elements for two calls: one tool message answering the first call; the second stays unanswered
    p = prompt_of([human("go"), two, obs("[1, 2, 3]"), gpt("ok")])
    assert pairs(p) == [("functions.s:0", "[1, 2, 3]")]
    # a single call whose result is an array: kept as one result
    p = prompt_of([human("go"), fc(call("s", {"q": 1})), obs('[{"hit": 1}, {"hit": 2}]'), gpt("ok")])
    assert pairs(p) == [("functions.s:0", '[{"hit": 1}, {"hit": 2}]')]
    # two separate (non-list) calls and one two-element array: not split either (first in, first out)
    p = prompt_of([human("go"), fc(call("s", {"q": 1})), fc(call("s", {"q": 2})), obs("[1, 2]"), obs("x"), gpt("ok")])
    assert pairs(p) == [("functions.s:0", "[1, 2]"), ("functions.s:1", "x")]
    # a list-valued call with one element is an ordinary call: its list observation stays whole
    p = prompt_of([human("go"), fc(json.dumps([{"name": "s", "arguments": {}}])), obs("[7]"), gpt("ok")])
    assert pairs(p) == [("functions.s:0", "[7]")]


def test_ids_count_calls_across_rounds_and_unanswered_calls_are_kept():
    p = prompt_of([human("first"), fc(call("get_price", {"ticker": "A"})), obs("1"), gpt("A is 1"),
                   human("second"), fc(call("get_price", {"ticker": "B"})),  # never answered
                   gpt("let me try again"), human("third"),
                   fc(json.dumps([{"name": "get_price", "arguments": {"ticker": "C"}},
                                  {"name": "get_price", "arguments": {"ticker": "D"}}])),
                   obs("3"), obs("4"), gpt("C 3, D 4")])
    assert call_ids(p) == [["functions.get_price:0"], ["functions.get_price:1"], ["functions.get_price:2", "functions.get_price:3"]]
    # the unanswered call 1 is kept (merged with the gpt turn after it); the later results answer calls 2 and 3
    assert pairs(p) == [("functions.get_price:0", "1"), ("functions.get_price:2", "3"), ("functions.get_price:3", "4")]
    assert p.messages[5]["content"] == "let me try again" and p.messages[5]["tool_calls"][0]["id"] == "functions.get_price:1"


def test_leading_calls_before_the_first_user_turn_do_not_shift_the_index():
    p = prompt_of([fc(call("x", {})), obs("r"), human("go"), fc(call("get_price", {"ticker": "A"})), obs("1"), gpt("ok")])
    assert call_ids(p) == [["functions.get_price:0"]] and pairs(p) == [("functions.get_price:0", "1")]


def test_call_payload_variants():
    assert parse_calls('{"name": "f", "arguments": {"a": 1}}') == ([("f", {"a": 1})], False)
    assert parse_calls('[{"name": "f", "arguments": {"a": 1}}, {"name": "g"}]') == ([("f", {"a": 1}), ("g", {})], True)
    assert parse_calls("{'name': 'f', 'arguments': {'a': 'it'}}") == ([("f", {"a": "it"})], False)  # Python literal
    assert parse_calls({"name": "f", "arguments": "{}"}) == ([("f", "{}")], False)  # already parsed
    assert parse_calls([{"function": {"name": "f", "arguments": "{}"}}]) == ([("f", "{}")], True)
    assert parse_calls('{"name": "f", "arguments": \'{"a": 1}\'}') == ([("f", '{"a": 1}')], False)  # glaive shape


@pytest.mark.parametrize("value, reason", [
    ("not a call", "function_call is not a call or a list of calls ({name, arguments}): 'not a call'"),
    ("[]", "function_call holds no calls (an empty list)"),
    ('[{"name": "f"}, {"arguments": {}}]', "function_call call 2: function name is missing, expected a non-empty string"),
    ('[{"name": "f"}, 3]', "function_call call 2 is an int, expected an object {name, arguments}"),
    ('{"name": ""}', "function_call: function name is empty, expected a non-empty string"),
    ("5", "function_call is an int, expected a call or a list of calls ({name, arguments})"),
])
def test_bad_function_call_rejected_without_glaive_wording(value, reason):
    r = row_to_prompt({"conversations": [human("go"), fc(value), obs("x"), gpt("ok")]}, "f.json:3", "sharegpt")
    assert r == Reject("f.json:3", f"sharegpt: message 2: {reason}")
    assert "glaive" not in r.reason and "functioncall" not in r.reason


def test_observation_without_call_rejected_with_file_line(tmp_path):
    rows = [
        {"conversations": [human("go"), fc(call("f", {})), obs("1"), obs("2"), gpt("ok")]},  # one call, two results
        {"conversations": [human("go"), fc(call("f", {})), obs("1"), gpt("so"), obs("late"), gpt("ok")]},
        {"conversations": [human("go"), fc(call("f", {})), gpt("no result"), human("again"), obs("orphan"), gpt("ok")]},
        {"conversations": [human("go"), fc(call("f", {})), obs("1"), gpt("ok")]},  # fine
    ]
    path = tmp_path / "calls.json"
    path.write_text(json.dumps(rows, indent=1))
    items = list(iter_prompts(path, "sharegpt"))
    assert [(i.source, i.reason) for i in items if isinstance(i, Reject)] == [
        (f"{path}:1", "sharegpt: message 4: observation without a preceding function_call"),
        (f"{path}:2", "sharegpt: message 5: observation without a preceding function_call"),
        (f"{path}:3", "sharegpt: message 5: observation without a preceding function_call"),
    ]
    assert isinstance(items[3], Prompt) and items[3].source == f"{path}:4"


def test_hermes_style_rows_without_function_call_turns_keep_their_tool_turns():
    turns = [{"from": "system", "value": "You may call tools."}, human("weather?"),
             gpt('<tool_call>{"name": "w", "arguments": {}}</tool_call>'), {"from": "tool", "value": "sunny"}, gpt("Sunny.")]
    p = prompt_of(turns)
    assert p.messages[-1] == {"role": "tool", "content": "sunny"}


def test_split_observation_keeps_message_numbers_of_later_turns():
    # message 5 (a human turn with null content) is named by its own number after the split of message 3
    r = row_to_prompt({"conversations": [human("go"), fc(json.dumps([{"name": "a"}, {"name": "b"}])), obs("[1, 2]"),
                                         gpt("ok"), {"from": "human", "value": None}, gpt("x")]}, "f:1", "sharegpt")
    assert r == Reject("f:1", "sharegpt: message 5: null content")
    msgs, numbers = sharegpt_messages([human("go"), fc(json.dumps([{"name": "a"}, {"name": "b"}])), obs("[1, 2]"), gpt("ok")])
    assert numbers == [1, 2, 3, 3, 4] and [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool", "assistant"]


def test_call_queue_is_first_in_first_out():
    q = CallQueue()
    q.add([{"id": "a"}, {"id": "b"}], "list")
    q.add([{"id": "c"}])
    assert q.made == 3 and len(q) == 3 and q.head_turn() == (2, 2, "list")
    assert q.take() == "a" and q.head_turn() == (1, 2, "list")
    assert q.take("c") == "c" and q.take("zz") == "zz" and len(q) == 1
    assert q.clear() == 1 and q.take() is None and q.head_turn() == (0, 0, None)


def test_glaive_and_sharegpt_share_the_native_id_scheme():
    assert CALL_ID_FORMAT == TokenizerSection(path="x").tool_id_format  # the default [tokenizer] tool_id_format
    assert native_call_id("get_price", 3) == "functions.get_price:3"
    glaive = {"system": "SYSTEM: x Use them if required -\n{\"name\": \"get_price\", \"parameters\": {}}\n",
              "chat": "USER: a\n\n\nASSISTANT: <functioncall> {\"name\": \"get_price\", \"arguments\": '{\"ticker\": \"A\"}'} "
                      "<|endoftext|>\n\n\nFUNCTION RESPONSE: 1\n\n\nASSISTANT: <functioncall> {\"name\": \"get_price\", "
                      "\"arguments\": '{\"ticker\": \"B\"}'} <|endoftext|>\n\n\nFUNCTION RESPONSE: 2\n\n\nASSISTANT: done"}
    g = row_to_prompt(glaive, "g:1", "glaive")
    s = prompt_of([human("a"), fc(call("get_price", {"ticker": "A"})), obs("1"), fc(call("get_price", {"ticker": "B"})),
                   obs("2"), gpt("done")])
    assert call_ids(g) == call_ids(s) == [["functions.get_price:0"], ["functions.get_price:1"]]
    assert pairs(g) == pairs(s) == [("functions.get_price:0", "1"), ("functions.get_price:1", "2")]


def test_kimi_template_renders_each_result_under_its_own_call():
    tok = load_tokenizer(kimi_dir())
    p = prompt_of([human("Prices for NVDA and AMD please."),
                   fc(json.dumps([{"name": "get_price", "arguments": {"ticker": "NVDA"}},
                                  {"name": "get_price", "arguments": {"ticker": "AMD"}}])),
                   obs('[{"ticker": "NVDA", "price": 120.0}, {"ticker": "AMD", "price": 150.2}]'), gpt("x")])
    text = render(tok, p.messages, p.tools, add_generation_prompt=True)
    assert ('<|tool_call_begin|>functions.get_price:0<|tool_call_argument_begin|>{"ticker": "NVDA"}<|tool_call_end|>'
            '<|tool_call_begin|>functions.get_price:1<|tool_call_argument_begin|>{"ticker": "AMD"}<|tool_call_end|>') in text
    assert ('## Return of functions.get_price:0\n{"ticker": "NVDA", "price": 120.0}<|im_end|>'
            '<|im_system|>tool<|im_middle|>## Return of functions.get_price:1\n{"ticker": "AMD", "price": 150.2}<|im_end|>') in text
