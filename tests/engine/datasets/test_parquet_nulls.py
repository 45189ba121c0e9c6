"""Parquet rows read back as the JSON they were written from: no null fields from Arrow's struct union in
tool schemas or messages. Rules: docs/dataset-rows.md, section "Parquet"."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from engine.datasets import iter_prompts
from engine.datasets.arrow_nulls import drop_nulls
from engine.datasets.readers import open_records
from engine.prompts import Prompt, prompt_key


def fn(name: str, properties: dict, required: list[str] | None = None, **extra) -> dict:
    params = {"type": "object", "properties": properties}
    if required is not None:
        params["required"] = required
    return {"type": "function", "function": {"name": name, "description": f"{name} tool", "parameters": params, **extra}}


#: Rows whose objects declare different keys, so the Parquet column types are unions of them.
ROWS = [
    {"messages": [{"role": "system", "content": "Use tools when needed."}, {"role": "user", "content": "Time in Oslo?"},
                  {"role": "assistant", "content": "Let me check."}],
     "tools": [fn("get_time", {"city": {"type": "string"}}, ["city"])]},
    {"messages": [{"role": "user", "content": "Add 2 and 40."},
                  {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                        "function": {"name": "add", "arguments": '{"a":2,"b":40}'}}]},
                  {"role": "tool", "content": "42", "tool_call_id": "c1"}, {"role": "assistant", "content": "42."}],
     "tools": [fn("add", {"a": {"type": "integer"}, "b": {"type": "integer", "description": "second"}}, ["a", "b"])]},
    {"messages": [{"role": "user", "content": "Set the unit."}, {"role": "assistant", "content": "ok"}],
     "tools": [fn("set_unit", {"unit": {"type": "string", "enum": ["C", "F"]},
                               "where": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}}}}),
               fn("search", {"q": {"type": "string"}, "filters": {"type": "array", "items": {"type": "string"}}}, ["q"],
                  strict=True)]},
    {"messages": [{"role": "user", "content": "No tools here."}, {"role": "assistant", "content": "fine"}]},
]


def own_prompt(row: dict) -> tuple[list[dict], list[dict]]:
    """The prompt the row's own JSON gives: messages before the final assistant turn, and its tools."""
    return row["messages"][:-1], row.get("tools", [])


def write(tmp_path, rows) -> str:
    path = tmp_path / "nested.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_arrow_adds_union_nulls_and_the_reader_drops_them(tmp_path):
    path = write(tmp_path, ROWS)
    raw = pq.read_table(path).to_pylist()
    # what Arrow hands back: the union of every row's keys, nulls where a row had none
    assert raw[0]["tools"][0]["function"]["parameters"]["properties"]["unit"] is None
    assert raw[0]["messages"][0]["tool_calls"] is None and raw[3]["tools"] is None
    rows = [row for _, row in open_records(path)]
    assert rows == ROWS


def test_tools_and_messages_sent_equal_the_rows_own_json(tmp_path):
    path = write(tmp_path, ROWS)
    prompts = list(iter_prompts(path, "openai"))
    assert all(isinstance(p, Prompt) for p in prompts), prompts
    for p, row in zip(prompts, ROWS, strict=True):
        messages, tools = own_prompt(row)
        assert p.messages == messages and p.tools == tools
        assert p.key == prompt_key(messages, tools)
        assert "null" not in json.dumps(p.tools) and "null" not in json.dumps(p.messages)


def test_handed_shape_two_rows_with_different_properties(tmp_path):
    rows = [
        {"messages": [{"role": "system", "content": "Use tools when needed."}, {"role": "user", "content": "What time is it in Oslo?"},
                      {"role": "assistant", "content": "Let me check."}],
         "tools": [fn("get_time", {"city": {"type": "string"}}, ["city"])]},
        {"messages": [{"role": "user", "content": "Add 2 and 40."},
                      {"role": "assistant", "content": None, "tool_calls": [
                          {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":2,"b":40}'}}]},
                      {"role": "tool", "content": "42", "tool_call_id": "c1"}, {"role": "assistant", "content": "42."}],
         "tools": [fn("add", {"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"])]},
    ]
    first, second = iter_prompts(write(tmp_path, rows), "auto")
    assert first.tools[0]["function"]["parameters"]["properties"] == {"city": {"type": "string"}}
    assert second.tools[0]["function"]["parameters"]["properties"] == {"a": {"type": "integer"}, "b": {"type": "integer"}}
    # a null content on a tool-call turn cannot be told from an absent one after Parquet: it is absent
    assert second.messages[1] == {"role": "assistant", "tool_calls": rows[1]["messages"][1]["tool_calls"]}
    assert second.messages[0] == {"role": "user", "content": "Add 2 and 40."}


def test_drop_nulls_shapes():
    assert drop_nulls({"a": None, "b": [None, {"c": None, "d": 0}], "e": {"f": None}, "g": False, "h": ""}) == \
        {"b": [None, {"d": 0}], "e": {}, "g": False, "h": ""}
    assert drop_nulls([{"x": None}]) == [{}] and drop_nulls(None) is None and drop_nulls(3) == 3
    src = {"a": {"b": None}}
    drop_nulls(src)
    assert src == {"a": {"b": None}}  # input not mutated
