"""openai-format tool rows: each result answers its own call (missing ids filled, as ShareGPT and
SWE-agent rows get them; docs/dataset-rows.md)."""

from __future__ import annotations

from fixtures_tokens import kimi_dir

from engine.datasets import row_to_prompt
from engine.datasets.tool_calls import pair_openai_results
from engine.prompts import Prompt
from engine.tokens.template import render
from engine.tokens.tokenizer import load_tokenizer


def call(name: str, args: str, cid: str | None = None) -> dict:
    c = {"type": "function", "function": {"name": name, "arguments": args}}
    return {"id": cid, **c} if cid else c


def test_results_without_ids_answer_their_own_calls_in_order_and_calls_get_native_ids():
    """Before: a ``tool`` message without ``tool_call_id`` rendered ``## Return of `` (empty) and a call
    without ``id`` rendered an empty id."""
    row = {"messages": [
        {"role": "user", "content": "Weather in Oslo and Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [call("weather", '{"city": "Oslo"}'),
                                                            call("weather", '{"city": "Rome"}')]},
        {"role": "tool", "content": "Oslo: 3C"},
        {"role": "tool", "content": "Rome: 18C"},
        {"role": "assistant", "content": "", "tool_calls": [call("clock", "{}", "c9")]},
        {"role": "tool", "content": "12:00"},
        {"role": "assistant", "content": "Oslo 3C, Rome 18C, at noon."}]}
    p = row_to_prompt(row, "f.jsonl:1", "openai")
    assert isinstance(p, Prompt), p
    ids = [c["id"] for m in p.messages if m["role"] == "assistant" for c in m["tool_calls"]]
    assert ids == ["functions.weather:0", "functions.weather:1", "c9"]
    assert [m.get("tool_call_id") for m in p.messages if m["role"] == "tool"] == [
        "functions.weather:0", "functions.weather:1", "c9"]
    assert [m["content"] for m in p.messages if m["role"] == "tool"] == ["Oslo: 3C", "Rome: 18C", "12:00"]
    assert "tool_call_id" not in row["messages"][2] and "id" not in row["messages"][1]["tool_calls"][0]  # row untouched
    text = render(load_tokenizer(str(kimi_dir())), p.messages, p.tools, add_generation_prompt=True)
    assert "## Return of functions.weather:0\nOslo: 3C" in text and "## Return of functions.weather:1\nRome: 18C" in text
    assert "## Return of \n" not in text and "<|tool_call_begin|><|tool_call_argument_begin|>" not in text


def test_ids_the_row_gives_are_kept_even_unknown_and_a_user_turn_closes_unanswered_calls():
    msgs = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [call("a", "{}", "x1")]},
            {"role": "tool", "tool_call_id": "zzz", "content": "r1"},
            {"role": "user", "content": "and?"},
            {"role": "tool", "content": "late"}]
    out = pair_openai_results(msgs)
    assert out[2]["tool_call_id"] == "zzz"  # the row's own id, not rewritten
    assert "tool_call_id" not in out[4]  # x1 was closed by the user turn: nothing to answer
    assert out == msgs
