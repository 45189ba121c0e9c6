"""The one prompt rule (docs/prompt-construction.md), every format: a conversation ending on a user or tool
turn is the prompt whole; one ending on an assistant turn is cut just before it; anything else is rejected.
Plus the counts ingest keeps and logs of what each row became."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from helpers import make_config

from engine.datasets import iter_prompts, row_to_prompt
from engine.prompts import Prompt, Reject
from engine.run.ingest import ingest_all
from engine.storage.store import Store

CALL = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": \"x\"}"}}
U = lambda t: {"role": "user", "content": t}  # noqa: E731
A = lambda t: {"role": "assistant", "content": t}  # noqa: E731


def one(tmp_path: Path, row, fmt: str) -> Prompt | Reject:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (item,) = list(iter_prompts(path, fmt))
    return item


def check(item, messages, ended_on: str, cut_at: str = ""):
    assert isinstance(item, Prompt), item
    assert item.messages == messages
    assert (item.became.ended_on, item.became.cut, item.became.cut_at) == (ended_on, ended_on == "assistant", cut_at)


# ----------------------------------------------------------------------------- sharegpt


def test_sharegpt_ending_on_an_unanswered_human_turn_is_prompted_with_that_turn(tmp_path):
    # the handed rows' shapes: human, gpt, human / human, gpt / human, gpt, human, gpt, human
    conv = [{"from": "human", "value": "What is the capital of Peru?"}, {"from": "gpt", "value": "Lima."},
            {"from": "human", "value": "And what is its population, roughly?"}]
    check(one(tmp_path, {"conversations": conv}, "sharegpt"),
          [U("What is the capital of Peru?"), A("Lima."), U("And what is its population, roughly?")], "user")
    check(one(tmp_path, {"conversations": conv[:2]}, "sharegpt"), [U("What is the capital of Peru?")], "assistant",
          "message 2")
    five = conv[:2] + [{"from": "human", "value": "Swap."}, {"from": "gpt", "value": "Done."},
                       {"from": "human", "value": "Add a budget."}]
    check(one(tmp_path, {"conversations": five}, "sharegpt"),
          [U("What is the capital of Peru?"), A("Lima."), U("Swap."), A("Done."), U("Add a budget.")], "user")
    # more of the kind: a system field, a `user`/`assistant` spelling, and two human turns at the end (merged)
    row = {"system": "Be brief.", "conversations": [{"from": "user", "value": "q1"}, {"from": "assistant", "value": "a1"},
                                                     {"from": "human", "value": "q2"}, {"from": "human", "value": "q3"}]}
    check(one(tmp_path, row, "sharegpt"),
          [{"role": "system", "content": "Be brief."}, U("q1"), A("a1"), U("q2\n\nq3")], "user")
    # two gpt turns at the end are one answer (merged), cut as a whole; the numbering names the first
    row = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}, {"from": "gpt", "value": "b"}]}
    check(one(tmp_path, row, "sharegpt"), [U("q")], "assistant", "message 2")


def test_sharegpt_ending_on_an_observation_is_whole(tmp_path):
    row = {"conversations": [{"from": "human", "value": "find x"},
                             {"from": "function_call", "value": '{"name": "lookup", "arguments": {"q": "x"}}'},
                             {"from": "observation", "value": "found"}],
           "tools": [{"name": "lookup", "parameters": {"type": "object"}}]}
    item = one(tmp_path, row, "sharegpt")
    check(item, [U("find x"), {"role": "assistant", "content": "", "tool_calls": [{**CALL, "id": "functions.lookup:0"}]},
                 {"role": "tool", "content": "found", "tool_call_id": "functions.lookup:0"}], "tool")


# ----------------------------------------------------------------------------- openai


def test_openai_rows_ending_on_user_assistant_tool_and_system(tmp_path):
    check(one(tmp_path, {"messages": [U("a"), A("b"), U("c")]}, "openai"), [U("a"), A("b"), U("c")], "user")
    check(one(tmp_path, {"messages": [U("a"), A("b"), U("c"), A("d")]}, "openai"), [U("a"), A("b"), U("c")],
          "assistant", "message 4")
    loop = [U("a"), {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "content": "r", "tool_call_id": "c1"}]
    check(one(tmp_path, {"messages": loop}, "openai"), loop, "tool")
    check(one(tmp_path, {"messages": [*loop, A("done")]}, "openai"), loop, "assistant", "message 4")
    # an assistant that ends on a pending tool call: the call is the final assistant turn, cut
    check(one(tmp_path, {"messages": loop[:2]}, "openai"), [U("a")], "assistant", "message 2")
    # fits no rule: ends on a system turn
    r = one(tmp_path, {"messages": [U("a"), A("b"), {"role": "system", "content": "s"}]}, "openai")
    assert r == Reject(r.source, "openai: conversation ends on a system turn (message 3): no prompt rule fits "
                                 "(a prompt is a conversation ending on a user or tool turn, or one ending on an "
                                 "assistant turn cut before it)")
    # cut before the final assistant turn, then ends on a later system turn: out of order
    r = one(tmp_path, {"messages": [U("a"), A("b"), {"role": "system", "content": "s"}, A("c")]}, "openai")
    assert r.reason == "openai: roles out of order: prompt ends with a system turn (message 3)"
    r = one(tmp_path, {"messages": [U("a"), A("b"), U("  ")]}, "openai")
    assert r.reason == "openai: message 3: final user turn is empty"


# ----------------------------------------------------------------------------- ultrachat, instruction, single-turn


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_ultrachat_odd_is_whole_even_is_cut(tmp_path, n):
    data = [f"turn {i}" for i in range(n)]
    item = one(tmp_path, {"id": "0", "data": data}, "ultrachat")
    expect = [(U if i % 2 == 0 else A)(t) for i, t in enumerate(data)]
    if n % 2:
        check(item, expect, "user")
    else:
        check(item, expect[:-1], "assistant", f"message {n}")


def test_ultrachat_200k_in_openai_shape_gets_the_same_rule(tmp_path):
    msgs = [U("How do plants grow?"), A("With light."), U("And water?")]
    check(one(tmp_path, {"prompt": "How do plants grow?", "prompt_id": "0" * 64, "messages": msgs}, "auto"), msgs, "user")


def test_instruction_rows(tmp_path):
    check(one(tmp_path, {"instruction": "Do X.", "input": "data", "output": "done"}, "instruction"),
          [U("Do X.\n\ndata")], "assistant", "message 2")
    check(one(tmp_path, {"instruction": "Do X.", "input": "data"}, "instruction"), [U("Do X.\n\ndata")], "user")
    check(one(tmp_path, {"instruction": "Now?", "output": None, "history": [["Q1", "A1"]]}, "instruction"),
          [U("Q1"), A("A1"), U("Now?")], "user")
    check(one(tmp_path, {"instruction": "Now?", "response": "r", "history": [["Q1", "A1"]], "system": "s"}, "instruction"),
          [{"role": "system", "content": "s"}, U("Q1"), A("A1"), U("Now?")], "assistant", "message 4")


def test_single_turn_formats(tmp_path):
    check(one(tmp_path, {"problem": "P", "solution": "S"}, "oss_instruct"), [U("P")], "assistant", "message 2")
    check(one(tmp_path, {"problem": "P"}, "oss_instruct"), [U("P")], "user")
    check(one(tmp_path, {"id": "1", "input": "I", "output": "O"}, "opencodeinstruct"), [U("I")], "assistant", "message 2")
    check(one(tmp_path, {"input": "I"}, "opencodeinstruct"), [U("I")], "user")
    check(one(tmp_path, {"prompt": "T", "system": "be brief"}, "text"),
          [{"role": "system", "content": "be brief"}, U("T")], "user")


# ----------------------------------------------------------------------------- glaive, swe_agent

SYSTEM = 'SYSTEM: x Use them if required -\n{"name": "lookup", "parameters": {"type": "object"}}\n'


def test_glaive_ending_on_a_function_response_keeps_the_call(tmp_path):
    chat = ("USER: find x\n\n\nASSISTANT: <functioncall> {\"name\": \"lookup\", \"arguments\": '{\"q\": \"x\"}'} <|endoftext|>"
            "\n\n\nFUNCTION RESPONSE: {\"hit\": 1}\n\n\n")
    item = one(tmp_path, {"system": SYSTEM, "chat": chat}, "glaive")
    check(item, [{"role": "system", "content": "x Use them if required -"}, U("find x"),
                 {"role": "assistant", "content": "", "tool_calls": [{**CALL, "id": "functions.lookup:0"}]},
                 {"role": "tool", "content": '{"hit": 1}', "tool_call_id": "functions.lookup:0"}], "tool")
    item = one(tmp_path, {"system": SYSTEM, "chat": chat + "ASSISTANT: x is here <|endoftext|>\n\n\n"}, "glaive")
    assert item.messages[-1]["tool_call_id"] == "functions.lookup:0" and item.became.cut_at == "message 4"


def test_swe_agent_ending_on_an_output_is_whole(tmp_path):
    hist = [{"role": "system", "content": "s"}, {"role": "user", "content": "fix it"},
            {"role": "assistant", "content": "look", "tool_calls": [CALL], "thought": "look", "action": "ls"},
            {"role": "tool", "content": "a.py", "tool_call_ids": ["c1"]}]
    want = [{"role": "system", "content": "s"}, U("fix it"), {"role": "assistant", "content": "look", "tool_calls": [CALL]},
            {"role": "tool", "content": "a.py", "tool_call_id": "c1"}]
    check(one(tmp_path, {"history": hist}, "swe_agent"), want, "tool")
    check(one(tmp_path, {"history": [*hist, {"role": "assistant", "content": "submit"}]}, "swe_agent"), want,
          "assistant", "message 5")


# ----------------------------------------------------------------------------- ingest counts and log lines


def test_ingest_counts_and_logs_what_each_row_became(tmp_path, caplog):
    path = tmp_path / "mix.jsonl"
    rows = [{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"},
                               {"from": "human", "value": "unanswered"}]},
            {"conversations": [{"from": "human", "value": "q2"}, {"from": "gpt", "value": "a2"}]},
            {"messages": [U("q3"), A("<think>r</think>\n\nv"), U("q4"), A("final")]},
            {"messages": [U("q5"), {"role": "assistant", "content": None, "tool_calls": [CALL]},
                          {"role": "tool", "content": "r", "tool_call_id": "c1"}]},
            {"messages": [U("q6"), A("b"), {"role": "system", "content": "s"}]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = make_config(tmp_path, datasets=[{"name": "mix", "path": str(path)}])

    async def go():
        store = await Store.open(cfg.run.dir)
        try:
            return await ingest_all(cfg, store)
        finally:
            await store.close()

    with caplog.at_level(logging.DEBUG, logger="engine.run.ingest"):  # the per-prompt lines are DEBUG
        (rep,) = asyncio.run(go())
    assert (rep.prompts, rep.rejected, rep.whole, rep.cut, rep.reasoning_moved) == (4, 1, 2, 2, 1)
    assert rep.became_summary() == ("2 prompt(s) whole (ended on a user or tool turn), 2 cut before the final "
                                    "assistant turn, 1 with inline reasoning moved to reasoning_content "
                                    "(docs/prompt-construction.md)")
    lines = [r.getMessage() for r in caplog.records]
    assert f"[mix] {rep.became_summary()}" in lines
    assert f"[mix] prompt {path}:1: whole conversation (ends on a user turn)" in lines
    assert f"[mix] prompt {path}:2: cut before the final assistant turn (message 2)" in lines
    assert (f"[mix] prompt {path}:3: cut before the final assistant turn (message 4); inline reasoning moved to "
            f"reasoning_content: message 2 (<think>)") in lines
    assert f"[mix] prompt {path}:4: whole conversation (ends on a tool turn)" in lines


def test_an_empty_instruction_with_an_input_is_just_the_input():
    """Before: ``{"instruction": "", "input": "only input"}`` was sent as ``"\\n\\nonly input"``."""
    p = row_to_prompt({"instruction": "", "input": "only input", "output": "x"}, "i.jsonl:1", "instruction")
    assert isinstance(p, Prompt) and p.messages == [{"role": "user", "content": "only input"}]
    both = row_to_prompt({"instruction": "Sum:", "input": "1 2"}, "i.jsonl:2", "instruction")
    assert both.messages == [{"role": "user", "content": "Sum:\n\n1 2"}]
    empty = row_to_prompt({"instruction": " ", "input": ""}, "i.jsonl:3", "instruction")
    assert isinstance(empty, Reject) and empty.reason.endswith("final user turn is empty")


def test_glaive_turns_without_blank_line_separators_are_rejected_not_merged():
    """Before: ``"USER: hi ASSISTANT: hello <|endoftext|>"`` became ONE user turn holding the assistant's
    text and glaive's end marker, counted whole, silently."""
    r = row_to_prompt({"system": "SYSTEM: You are helpful.", "chat": "USER: hi ASSISTANT: hello <|endoftext|>"},
                      "g.jsonl:7", "glaive")
    assert isinstance(r, Reject) and r.source == "g.jsonl:7"
    assert "message 1: USER turn holds '<|endoftext|>'" in r.reason
    ok = row_to_prompt({"system": "SYSTEM: You are helpful.",
                        "chat": "USER: hi\n\n\nASSISTANT: hello <|endoftext|>\n\n\nUSER: and?"}, "g.jsonl:8", "glaive")
    assert isinstance(ok, Prompt) and [m["role"] for m in ok.messages] == ["system", "user", "assistant", "user"]
