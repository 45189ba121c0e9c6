"""SWE-agent rows whose ``tool_calls``/``tool_call_ids`` are stored as Python-repr (or JSON) strings: parsed
and checked at ingest, or rejected there with file:line and the reason. Rules: docs/dataset-rows.md, "SWE-agent"."""

from __future__ import annotations

import json

import pytest
from fixtures_tokens import kimi_dir

from engine.datasets import iter_prompts, row_to_prompt
from engine.datasets.swe_agent import parse_call_ids, parse_tool_calls, read_literal
from engine.prompts import Prompt, Reject
from engine.tokens.template import render
from engine.tokens.tokenizer import load_tokenizer

OPEN = {"function": {"arguments": '{"path":"tests/test_math.py"}', "name": "open"}, "id": "call_abc123", "type": "function"}
EDIT = {"function": {"arguments": '{"start":2,"end":2}', "name": "edit"}, "id": "call_def456", "type": "function"}
NATIVE_OPEN = {"id": "call_abc123", "type": "function", "function": {"name": "open", "arguments": '{"path":"tests/test_math.py"}'}}


def history(calls_field, ids_field, last=None) -> dict:
    """The handed row's shape: system, user, assistant with calls, tool, final assistant with calls."""
    return {"environment": "local", "trajectory": [], "info": {}, "history": [
        {"role": "system", "content": "You are an autonomous programmer working in a shell.", "agent": "main",
         "message_type": "system_prompt"},
        {"role": "user", "content": "Fix the failing test in tests/test_math.py.", "agent": "main", "message_type": "observation"},
        {"role": "assistant", "content": "Let me look at the test file.", "thought": "Let me look at the test file.",
         "action": "open tests/test_math.py", "agent": "main", "tool_calls": calls_field, "message_type": "action"},
        {"role": "tool", "content": "[File: tests/test_math.py (3 lines total)]\n1:def test_add():\n", "agent": "main",
         "tool_call_ids": ids_field, "message_type": "observation"},
        {"role": "assistant", "content": "Edit line 2.", "thought": "...", "action": "edit 2:2", "agent": "main",
         "tool_calls": last if last is not None else repr([EDIT]), "message_type": "action"}]}


@pytest.mark.parametrize("calls_field, ids_field", [
    (repr([OPEN]), repr(["call_abc123"])),  # Python repr strings (the handed row)
    (json.dumps([OPEN]), json.dumps(["call_abc123"])),  # JSON strings
    ([OPEN], ["call_abc123"]),  # real JSON values
    (repr([OPEN]), "call_abc123"),  # a bare id
    (repr([OPEN]), None),  # no ids: the result answers the oldest unanswered call
])
def test_repr_json_and_native_fields_give_the_same_prompt(calls_field, ids_field):
    p = row_to_prompt(history(calls_field, ids_field), "t.jsonl:1", "swe_agent")
    assert isinstance(p, Prompt), p
    assert [m["role"] for m in p.messages] == ["system", "user", "assistant", "tool"]  # cut before the last assistant turn
    assert p.messages[2] == {"role": "assistant", "content": "Let me look at the test file.", "tool_calls": [NATIVE_OPEN]}
    assert p.messages[3]["tool_call_id"] == "call_abc123"
    same = row_to_prompt(history([OPEN], ["call_abc123"]), "t.jsonl:1", "swe_agent")
    assert p.key == same.key


def test_repr_row_renders_with_the_kimi_template():
    p = row_to_prompt(history(repr([OPEN]), repr(["call_abc123"])), "t.jsonl:1", "swe_agent")
    text = render(load_tokenizer(kimi_dir()), p.messages, p.tools, add_generation_prompt=True)
    assert ('<|tool_call_begin|>call_abc123<|tool_call_argument_begin|>{"path":"tests/test_math.py"}<|tool_call_end|>'
            in text) and "## Return of call_abc123\n[File: tests/test_math.py" in text


@pytest.mark.parametrize("calls_field, reason", [
    ("[{'function': {'name': 'open'", "tool_calls is not a list of calls: neither JSON nor a Python literal"),
    ("open tests/test_math.py", "tool_calls is not a list of calls: neither JSON nor a Python literal"),
    ("{'id': 'x'}", "tool_calls is not a list of calls: a dict"),
    ("['open']", "tool_calls is not a list of calls: call 1 is a str, expected an object"),
    (repr([{**OPEN, "id": ""}]), "tool_calls is not a list of calls: call 1 has no 'id' (a non-empty string)"),
    (repr([{**OPEN, "type": "code_interpreter"}]),
     "tool_calls is not a list of calls: call 1 has type 'code_interpreter', expected 'function'"),
    (repr([{"id": "c", "type": "function", "function": "open"}]),
     "tool_calls is not a list of calls: call 1: 'function' is a str, expected an object {name, arguments}"),
    (repr([{"id": "c", "function": {"arguments": "{}"}}]),
     "tool_calls is not a list of calls: call 1: function name is null, expected a non-empty string"),
    (repr([{"id": "c", "function": {"name": "open"}}]), "tool_calls is not a list of calls: call 1 (open): missing 'arguments'"),
    (repr([{"id": "c", "function": {"name": "open", "arguments": 3}}]),
     "tool_calls is not a list of calls: call 1 (open): 'arguments' is an int, expected a JSON string"),
    ("__import__('os').system('true')", "tool_calls is not a list of calls: neither JSON nor a Python literal"),  # never run
])
def test_unparseable_tool_calls_rejected_at_ingest_with_file_line(tmp_path, calls_field, reason):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(history([OPEN], ["call_abc123"])) + "\n" + json.dumps(history(calls_field, "['call_abc123']")) + "\n")
    first, second = iter_prompts(path, "swe_agent")
    assert isinstance(first, Prompt)
    assert isinstance(second, Reject) and second.source == f"{path}:2"
    assert second.reason.startswith(f"swe_agent: message 3: {reason}"), second.reason


def test_unparseable_calls_on_the_final_assistant_turn_do_not_spoil_the_prompt():
    p = row_to_prompt(history(repr([OPEN]), "['call_abc123']", last="edit 2:2 <garbled"), "t:1", "swe_agent")
    good = row_to_prompt(history(repr([OPEN]), "['call_abc123']"), "t:1", "swe_agent")
    assert isinstance(p, Prompt) and p.messages == good.messages


def test_several_ids_on_one_tool_message_rejected():
    two = [OPEN, {**EDIT, "id": "call_2"}]
    r = row_to_prompt(history(repr(two), "['call_abc123', 'call_2']"), "t:4", "swe_agent")
    assert r == Reject("t:4", "swe_agent: message 4: one tool message answers 2 calls "
                              "(tool_call_ids ['call_abc123', 'call_2']); expected one observation per call")


def test_ids_pair_first_in_first_out_when_absent_and_arguments_objects_become_json():
    row = {"history": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": repr([
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}}])},
        {"role": "tool", "content": "ra"},
        {"role": "tool", "content": "rb", "tool_call_ids": "['b']"},
        {"role": "assistant", "content": "done"}]}
    p = row_to_prompt(row, "t:1", "swe_agent")
    assert p.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'
    assert [(m["tool_call_id"], m["content"]) for m in p.messages if m["role"] == "tool"] == [("a", "ra"), ("b", "rb")]


def test_literal_readers():
    assert read_literal("None") is None and read_literal("") is None and read_literal("[]") is None
    assert read_literal("[1, 'a']") == [1, "a"] and read_literal('{"a": null}') == {"a": None}
    assert read_literal([1]) == [1]
    with pytest.raises(ValueError, match="neither JSON nor a Python literal"):
        read_literal("os.system('x')")
    assert parse_tool_calls(None) == [] and parse_tool_calls("[]") == [] and parse_tool_calls([]) == []
    assert parse_call_ids("('a',)") == ["a"] and parse_call_ids("['a', 'b']") == ["a", "b"] and parse_call_ids(None) == []
    with pytest.raises(ValueError, match="tool_call_ids is not a list of ids"):
        parse_call_ids("[1, 2]")


@pytest.mark.parametrize("stored", [
    "[{'id': 'c1', 'type': 'function', 'function': {'name': 'open', 'arguments': '{\"path\": \"a.py\"}'}}]",
    '[{"id": "c1", "type": "function", "function": {"name": "open", "arguments": {"path": "a.py"}}}]',
])
def test_openai_tool_calls_stored_as_text_are_parsed(stored):
    """The same kind in the openai format: ``tool_calls`` written as a Python repr or as JSON text
    (some exports store variable-schema columns so) is parsed, checked, and sent as a list."""
    from engine.datasets import row_to_prompt
    from engine.prompts import Prompt

    row = {"messages": [{"role": "user", "content": "Open a.py"},
                        {"role": "assistant", "content": "", "tool_calls": stored},
                        {"role": "tool", "content": "print(1)", "tool_call_id": "c1"}]}
    p = row_to_prompt(row, "f.jsonl:3", "openai")
    assert isinstance(p, Prompt), p
    assert p.messages[1]["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "open", "arguments": '{"path": "a.py"}'}}]
    bad = row_to_prompt({"messages": [row["messages"][0], {**row["messages"][1], "tool_calls": "[{'id': 'c1'"},
                                      row["messages"][2]]}, "f.jsonl:4", "openai")
    assert not isinstance(bad, Prompt)
    assert bad.source == "f.jsonl:4" and "message 2: tool_calls is not a list of calls" in bad.reason
