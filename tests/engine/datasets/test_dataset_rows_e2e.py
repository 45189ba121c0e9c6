"""Tool rows end to end: a real ``datagen run --headless`` (the built-in simulator counting with the Kimi-layout
fixture tokenizer) over ShareGPT parallel-call rows, SWE-agent repr-string rows and a Parquet file with
``list<struct>`` tool columns. The simulator logs the key of every request body it received
(``prompt_key(messages, tools)``), so equal keys prove the body sent was the expected prompt."""

from __future__ import annotations

import json
import sqlite3
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
from e2e import read_log, run_cmd, run_env
from fixtures_tokens import kimi_dir
from promptcheck_helpers import write_config

from engine.prompts import prompt_key

PRICE = [{"type": "function", "function": {"name": "get_price", "description": "Price of a stock", "parameters": {
    "type": "object", "properties": {"ticker": {"type": "string"}}, "required": ["ticker"]}}}]


def price_call(t: str) -> dict:
    return {"name": "get_price", "arguments": {"ticker": t}}


def native(i: int, t: str) -> dict:
    return {"id": f"functions.get_price:{i}", "type": "function",
            "function": {"name": "get_price", "arguments": json.dumps({"ticker": t})}}


SHAREGPT = [
    {"conversations": [{"from": "human", "value": "What are AAPL and MSFT trading at?"},
                       {"from": "function_call", "value": json.dumps(price_call("AAPL"))},
                       {"from": "function_call", "value": json.dumps(price_call("MSFT"))},
                       {"from": "observation", "value": '{"ticker": "AAPL", "price": 189.1}'},
                       {"from": "observation", "value": '{"ticker": "MSFT", "price": 411.5}'},
                       {"from": "gpt", "value": "AAPL is 189.1 and MSFT is 411.5."}],
     "tools": json.dumps([t["function"] for t in PRICE])},
    {"conversations": [{"from": "human", "value": "Prices for NVDA and AMD please."},
                       {"from": "function_call", "value": json.dumps([price_call("NVDA"), price_call("AMD")])},
                       {"from": "observation", "value": '[{"ticker": "NVDA", "price": 120.0}, {"ticker": "AMD", "price": 150.2}]'},
                       {"from": "gpt", "value": "NVDA 120.0, AMD 150.2."}],
     "tools": json.dumps([t["function"] for t in PRICE])},
    {"conversations": [{"from": "human", "value": "Three at once: A, B, C."},
                       {"from": "function_call", "value": json.dumps([price_call("A"), price_call("B")])},
                       {"from": "function_call", "value": json.dumps(price_call("C"))},
                       {"from": "observation", "value": "1"}, {"from": "observation", "value": "2"},
                       {"from": "observation", "value": "3"}, {"from": "gpt", "value": "1, 2, 3."}],
     "tools": json.dumps([t["function"] for t in PRICE])},
    {"conversations": [{"from": "human", "value": "orphan"}, {"from": "observation", "value": "x"},
                       {"from": "function_call", "value": json.dumps(price_call("A"))}, {"from": "gpt", "value": "y"}]},
]
SHAREGPT_EXPECTED = [
    ([{"role": "user", "content": "What are AAPL and MSFT trading at?"},
      {"role": "assistant", "content": "", "tool_calls": [native(0, "AAPL"), native(1, "MSFT")]},
      {"role": "tool", "content": '{"ticker": "AAPL", "price": 189.1}', "tool_call_id": "functions.get_price:0"},
      {"role": "tool", "content": '{"ticker": "MSFT", "price": 411.5}', "tool_call_id": "functions.get_price:1"}], PRICE),
    ([{"role": "user", "content": "Prices for NVDA and AMD please."},
      {"role": "assistant", "content": "", "tool_calls": [native(0, "NVDA"), native(1, "AMD")]},
      {"role": "tool", "content": '{"ticker": "NVDA", "price": 120.0}', "tool_call_id": "functions.get_price:0"},
      {"role": "tool", "content": '{"ticker": "AMD", "price": 150.2}', "tool_call_id": "functions.get_price:1"}], PRICE),
    ([{"role": "user", "content": "Three at once: A, B, C."},
      {"role": "assistant", "content": "", "tool_calls": [native(0, "A"), native(1, "B"), native(2, "C")]},
      {"role": "tool", "content": "1", "tool_call_id": "functions.get_price:0"},
      {"role": "tool", "content": "2", "tool_call_id": "functions.get_price:1"},
      {"role": "tool", "content": "3", "tool_call_id": "functions.get_price:2"}], PRICE),
]

OPEN = {"function": {"arguments": '{"path":"tests/test_math.py"}', "name": "open"}, "id": "call_abc123", "type": "function"}
SWE = {"environment": "local", "trajectory": [], "info": {}, "history": [
    {"role": "system", "content": "You are an autonomous programmer working in a shell.", "agent": "main"},
    {"role": "user", "content": "Fix the failing test in tests/test_math.py.", "agent": "main"},
    {"role": "assistant", "content": "Let me look at the test file.", "tool_calls": repr([OPEN]), "agent": "main"},
    {"role": "tool", "content": "1:def test_add():\n2:    assert add(1, 1) == 3\n", "tool_call_ids": "['call_abc123']"},
    {"role": "assistant", "content": "Edit line 2.", "tool_calls": repr([{**OPEN, "id": "call_def456"}])}]}
SWE_EXPECTED = ([{"role": "system", "content": "You are an autonomous programmer working in a shell."},
                 {"role": "user", "content": "Fix the failing test in tests/test_math.py."},
                 {"role": "assistant", "content": "Let me look at the test file.", "tool_calls": [
                     {"id": "call_abc123", "type": "function",
                      "function": {"name": "open", "arguments": '{"path":"tests/test_math.py"}'}}]},
                 {"role": "tool", "content": "1:def test_add():\n2:    assert add(1, 1) == 3\n", "tool_call_id": "call_abc123"}], [])

TIME = [{"type": "function", "function": {"name": "get_time", "description": "Time in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ADD = [{"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
PARQUET = [
    {"messages": [{"role": "system", "content": "Use tools when needed."}, {"role": "user", "content": "What time is it in Oslo?"},
                  {"role": "assistant", "content": "Let me check."}], "tools": TIME},
    {"messages": [{"role": "user", "content": "Add 2 and 40."},
                  {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                        "function": {"name": "add", "arguments": '{"a":2,"b":40}'}}]},
                  {"role": "tool", "content": "42", "tool_call_id": "c1"}, {"role": "assistant", "content": "42."}], "tools": ADD},
]


def test_tool_rows_run_headless_send_the_rows_own_prompt_and_validate(tmp_path):
    tok = kimi_dir()
    (tmp_path / "calls.json").write_text(json.dumps(SHAREGPT, indent=1))
    (tmp_path / "swe.jsonl").write_text(json.dumps(SWE) + "\n")
    pq.write_table(pa.Table.from_pylist(PARQUET), tmp_path / "nested.parquet")
    cfg = write_config(tmp_path, tok, [("calls", tmp_path / "calls.json", "sharegpt"),
                                       ("swe", tmp_path / "swe.jsonl", "swe_agent"),
                                       ("nested", tmp_path / "nested.parquet", "openai")],
                       classes="[classes.short]\nmax_tokens = 2000\nconcurrency = 8", name="rows")
    done = subprocess.run(run_cmd(cfg), capture_output=True, text=True, env=run_env(), timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    db = sqlite3.connect(tmp_path / "run" / "store.sqlite")
    stored = {}
    for ds, source, m, t, ok in db.execute(
            "SELECT p.dataset, p.source, p.messages, p.tools, v.ok FROM prompts p JOIN results r ON r.prompt_id = p.id "
            "LEFT JOIN validations v ON v.prompt_id = p.id"):
        stored[(ds, int(source.rsplit(":", 1)[1]))] = (json.loads(m), json.loads(t), ok)
    rejects = [(s.rsplit(":", 1)[1], r) for s, r in db.execute("SELECT source, reason FROM rejects")]
    db.close()
    expected = {("calls", n + 1): e for n, e in enumerate(SHAREGPT_EXPECTED)}
    expected[("swe", 1)] = SWE_EXPECTED
    expected.update({("nested", n + 1): (row["messages"][:-1], row["tools"]) for n, row in enumerate(PARQUET)})
    assert set(stored) == set(expected)
    for where, (messages, tools) in expected.items():
        got_m, got_t, ok = stored[where]
        assert (got_m, got_t) == (messages, tools), where
        assert ok == 1, where  # reconstructed and validated live, with the Kimi-layout tokenizer
    # each tool message answers its own call
    for (ds, _), (messages, _, _) in stored.items():
        calls = [c["id"] for m in messages for c in m.get("tool_calls", [])]
        answers = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
        assert answers == calls, (ds, answers, calls)
    assert rejects == [("4", "sharegpt: message 2: observation without a preceding function_call")]
    # what the simulator received: exactly these prompts (tools without null properties)
    sent = {r["prompt_key"] for r in read_log(tmp_path / "sim.jsonl") if r["outcome"] == "completed"}
    assert sent == {prompt_key(m, t) for m, t in expected.values()}
