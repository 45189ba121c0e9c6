"""Tests of engine.datasets: readers (file formats), adapters (row formats) and the prompt rule."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from engine.datasets import FORMATS, DatasetError, detect_format, iter_prompts, readers
from engine.datasets.glaive import arguments_json, parse_call
from engine.prompts import Prompt, Reject, prompt_key

SAMPLES = Path(__file__).parents[3] / "engine" / "samples"
SHARED = Path(__file__).parents[3].parent / "shared" / "datasets"

# file -> (explicit format, prompt count, {element/line: reject reason substring})
SAMPLE_FILES = {
    "b1_glaive.jsonl": ("glaive", 5, {}),
    "b3_magicoder_oss_instruct.jsonl": ("oss_instruct", 1, {}),
    "b3_magicoder_evol_instruct.jsonl": ("instruction", 1, {}),
    # 100 elements: #29 (J410gdS_7) ends, once cut, on an empty human turn; #72 (ZUkSe7V_0) is empty.
    "b7_sharegpt.json": ("sharegpt", 98, {29: "message 12: final user turn is empty", 72: "empty conversation"}),
    "b8_swe_agent_trajectories.jsonl": ("swe_agent", 5, {}),
}
HEX32 = re.compile(r"[0-9a-f]{32}")


def load(path, format="auto", fields=None):
    """All items of a file, split into (prompts, rejects), checking the item order on the way."""
    items = list(iter_prompts(path, format, fields))
    lines = [int(i.source.rsplit(":", 1)[1]) for i in items]
    assert lines == sorted(lines) and len(set(lines)) == len(lines), "items must come in file order"
    return [i for i in items if isinstance(i, Prompt)], [i for i in items if isinstance(i, Reject)]


def by_line(items):
    return {int(i.source.rsplit(":", 1)[1]): i for i in items}


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def roles(prompt: Prompt) -> str:
    return "".join(m["role"][0] for m in prompt.messages)


# ----------------------------------------------------------------------------- bundled samples


@pytest.mark.parametrize("name", sorted(SAMPLE_FILES))
@pytest.mark.parametrize("how", ["auto", "explicit"])
def test_sample_counts_rejects_and_keys(name, how):
    fmt, count, expected_rejects = SAMPLE_FILES[name]
    prompts, rejects = load(SAMPLES / name, "auto" if how == "auto" else fmt)
    assert len(prompts) == count
    assert {line: r.reason for line, r in by_line(rejects).items()}.keys() == expected_rejects.keys()
    for line, r in by_line(rejects).items():
        assert r.source == f"{SAMPLES / name}:{line}"
        assert expected_rejects[line] in r.reason
    for p in prompts:
        assert p.messages[-1]["role"] in ("user", "tool")
        assert HEX32.fullmatch(p.key)
        assert p.key == prompt_key(p.messages, p.tools)
    assert len({p.key for p in prompts}) == count
    again, _ = load(SAMPLES / name, fmt)
    assert [p.key for p in again] == [p.key for p in prompts]


def test_b1_glaive_content():
    prompts, _ = load(SAMPLES / "b1_glaive.jsonl")
    first = prompts[0]
    assert [t["function"]["name"] for t in first.tools] == ["get_exchange_rate"]
    assert first.tools[0]["type"] == "function"
    assert first.tools[0]["function"]["parameters"]["required"] == ["base_currency", "target_currency"]
    assert first.messages == [
        {"role": "system", "content": "You are a helpful assistant with access to the following functions. Use them if required -"},
        {"role": "user", "content": "Can you book a flight for me from New York to London?"},
    ]
    second = prompts[1]
    assert roles(second) == "suatauat"
    call = second.messages[2]
    assert call["content"] == ""
    assert call["tool_calls"] == [
        {"id": "functions.get_news_headlines:0", "type": "function",
         "function": {"name": "get_news_headlines", "arguments": '{"country": "United States"}'}}
    ]
    assert second.messages[3]["tool_call_id"] == "functions.get_news_headlines:0"
    assert second.messages[3]["content"].startswith('{"headlines": ["Biden announces')
    assert second.messages[4]["content"].endswith("collects first Mars rock sample")  # <|endoftext|> stripped
    assert second.messages[6]["tool_calls"][0]["id"] == "functions.get_news_headlines:1"
    assert json.loads(second.messages[6]["tool_calls"][0]["function"]["arguments"]) == {"country": "France"}
    assert second.messages[7]["tool_call_id"] == "functions.get_news_headlines:1"
    assert [t["function"]["name"] for t in prompts[2].tools] == ["generate_password", "create_task"]
    args = prompts[3].messages[4]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(args) == {"length": 12, "include_numbers": True, "include_special_characters": True}
    assert not any("<|endoftext|>" in (m.get("content") or "") for p in prompts for m in p.messages)


def test_b3_content():
    (oss,), _ = load(SAMPLES / "b3_magicoder_oss_instruct.jsonl")
    assert oss.messages[0]["role"] == "user" and len(oss.messages) == 1
    assert oss.messages[0]["content"].startswith("You are given two arrays, A and B, each of length n.")
    assert "C[i] = Σ(A[j] * B[i-j])" in oss.messages[0]["content"]
    (evol,), _ = load(SAMPLES / "b3_magicoder_evol_instruct.jsonl")
    assert evol.messages == [{"role": "user", "content": evol.messages[0]["content"]}]
    assert evol.messages[0]["content"].startswith("Please amend the subsequent Python script")


def test_b7_sharegpt_multiturn_cut():
    path = SAMPLES / "b7_sharegpt.json"
    raw = json.loads(path.read_text())
    prompts = by_line(load(path)[0])
    assert raw[0]["id"] == "QWJhYvA_0" and len(raw[0]["conversations"]) == 12
    first = prompts[1]
    assert len(first.messages) == 11  # cut before the 12th turn, the last gpt one
    assert first.messages[-1] == {"role": "user", "content": raw[0]["conversations"][10]["value"]}
    assert first.source == f"{path}:1"
    assert roles(prompts[2]) == "u"
    # hRPPgZT_11 is a continuation split that starts with a gpt turn: 7 turns -> 6 messages, and the
    # leading gpt turn is dropped (SpecForge's parser drops it too: the prompt sent = the prompt trained)
    assert raw[4]["id"] == "hRPPgZT_11" and roles(prompts[5]) == "uauau"
    assert prompts[5].messages[0]["content"] == raw[4]["conversations"][1]["value"]
    assert prompts[5].notes == ("dropped message 1 (assistant) before the first user turn",)
    # J410gdS_38: an empty human turn in the middle is kept; the prompt ends on a non-empty one
    assert raw[37]["id"] == "J410gdS_38" and roles(prompts[38]) == "uauau"
    assert prompts[38].messages[2]["content"] == ""
    # ZUkSe7V_0 appears twice: empty at #72, real at #73
    assert raw[71] == {"id": "ZUkSe7V_0", "conversations": []} and raw[72]["id"] == "ZUkSe7V_0"
    assert roles(prompts[73]) == "u"


def test_b8_swe_agent_history():
    prompts, _ = load(SAMPLES / "b8_swe_agent_trajectories.jsonl")
    # row 2's demonstration and its task are two user turns in a row: merged into one (SpecForge's role order)
    # rows 1 and 3 end on a tool turn (the last action's output): the whole trajectory is the prompt (the one
    # prompt rule, docs/prompt-construction.md); rows 2, 4, 5 end on an assistant turn, cut before it
    assert [len(p.messages) for p in prompts] == [10, 24, 24, 28, 10]
    assert [(p.became.ended_on, p.became.cut) for p in prompts] == [
        ("tool", False), ("assistant", True), ("tool", False), ("assistant", True), ("assistant", True)]
    assert [p.notes for p in prompts] == [(), ("merged messages 2-3 (user)",), (), (), ()]
    assert all(p.tools == [] for p in prompts)
    first = prompts[0]
    assert roles(first) == "suatatatat"
    assert first.messages[-1]["content"].startswith("8.2\n(Open file: /SWE-agent__test-repo/tests/missing_colon.py)")
    for call, result in zip(first.messages[2::2], first.messages[3::2], strict=True):
        assert result["tool_call_id"] == call["tool_calls"][0]["id"]
    assert first.messages[2]["tool_calls"][0]["function"] == {"arguments": '{"file_name":"missing_colon.py"}', "name": "find_file"}
    allowed = {"role", "content", "tool_calls", "tool_call_id"}
    assert all(set(m) <= allowed for p in prompts for m in p.messages)
    demo = prompts[1].messages[1]  # the is_demo message of the old-format run is kept, its task joined after it
    assert demo["role"] == "user" and demo["content"].startswith("Here is a demonstration")
    assert "\n\nWe're currently solving the following issue" in demo["content"]
    assert prompts[1].messages[-1]["role"] == "user" and prompts[4].messages[0]["role"] == "system"


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared/datasets not present")
@pytest.mark.parametrize("name", sorted(SAMPLE_FILES))
def test_shared_copies_give_identical_keys(name):
    bundled, bundled_rejects = load(SAMPLES / name)
    shared, shared_rejects = load(SHARED / name)
    assert [p.key for p in shared] == [p.key for p in bundled]
    assert [r.reason for r in shared_rejects] == [r.reason for r in bundled_rejects]
    assert all(p.source.startswith(str(SHARED / name) + ":") for p in shared)


# ----------------------------------------------------------------------------- published schemas


def schema_rows():
    """Rows written to the published schemas of B2, B4, B5 and B6 (docs/datasets.md), with expected prompts."""
    think = "<think>\nLet me add them.\n</think>\n\n4"
    system_114k = "Your role as an assistant involves thoroughly exploring questions through a systematic long thinking process."
    return [
        ("opencodeinstruct", {"id": "a1b2", "input": "Write a function `add(a, b)`.", "output": "def add(a, b):\n    return a + b",
                              "domain": "generic", "generation_algorithm": "self-instruct", "llm_judgement": "{\"score\": 5}",
                              "unit_tests": "['assert add(1, 2) == 3']", "tests_execution_status": "['pass']", "average_test_score": "1"},
         [{"role": "user", "content": "Write a function `add(a, b)`."}]),
        ("openai", {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": think}],
                    "num_tokens": 123, "source": "open-r1/OpenR1-Math-220k"},
         [{"role": "user", "content": "What is 2+2?"}]),
        ("sharegpt", {"system": system_114k, "conversations": [
            {"from": "user", "value": "Return your final response within \\boxed{}. Compute 2+2."},
            {"from": "assistant", "value": "<|begin_of_thought|>\n2+2=4\n<|end_of_thought|>\n\n"
                                           "<|begin_of_solution|>\n\\boxed{4}\n<|end_of_solution|>"}]},
         [{"role": "system", "content": system_114k},
          {"role": "user", "content": "Return your final response within \\boxed{}. Compute 2+2."}]),
        ("sharegpt", {"difficulty": 6, "source": "nvidia/OpenCodeReasoning", "domain": "code", "conversations": [
            {"from": "human", "value": "Reverse a string in Python."}, {"from": "gpt", "value": "<think>\nslice\n</think>\n\ns[::-1]"}]},
         [{"role": "user", "content": "Reverse a string in Python."}]),
        ("openai", {"prompt": "Hi", "prompt_id": "0" * 64, "messages": [
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Tell me a joke."}, {"role": "assistant", "content": "No."}]},
         [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Tell me a joke."}]),
        ("ultrachat", {"id": "0", "data": ["How do plants grow?", "With light.", "And water?", "Yes."]},
         [{"role": "user", "content": "How do plants grow?"}, {"role": "assistant", "content": "With light."},
          {"role": "user", "content": "And water?"}]),
    ]


@pytest.mark.parametrize("how", ["auto", "explicit"])
def test_published_schema_rows(tmp_path, how):
    for n, (fmt, row, expected) in enumerate(schema_rows(), 1):
        assert detect_format(row) == fmt
        path = write_jsonl(tmp_path / f"{n}.jsonl", [row])
        (prompt,), rejects = load(path, "auto" if how == "auto" else fmt)
        assert rejects == []
        assert prompt.messages == expected and prompt.tools == []
        assert prompt.source == f"{path}:1"


def test_detect_format_signatures():
    assert detect_format({"history": [], "info": {}}) == "swe_agent"
    assert detect_format({"system": "SYSTEM: x", "chat": "USER: hi"}) == "glaive"
    assert detect_format({"instruction": "x", "input": "y", "output": "z"}) == "instruction"
    assert detect_format({"problem": "x", "solution": "y"}) == "oss_instruct"
    assert detect_format({"prompt": "x"}) == "text"
    assert detect_format({"prompt": 3}) is None
    assert detect_format({"instruction": "q", "output": "a", "history": [["q0", "a0"]]}) == "instruction"
    assert detect_format({"data": [{"title": "x"}]}) is None
    assert detect_format({"id": 1}) is None
    assert detect_format(["messages"]) is None
    assert FORMATS[0] == "auto" and set(FORMATS) == {
        "auto", "openai", "sharegpt", "instruction", "oss_instruct", "opencodeinstruct", "glaive", "swe_agent", "ultrachat", "text"}


# ----------------------------------------------------------------------------- bad rows


GOOD = {"messages": [{"role": "user", "content": "good"}]}


def test_bad_jsonl_rows_cost_one_row_each(tmp_path):
    lines = [
        json.dumps(GOOD).encode(),                                                     # 1 ok
        b'{"messages": [',                                                             # 2 invalid JSON
        b"",                                                                           # 3 blank: skipped
        '{"prompt": "caf\u00e9"}'.encode("latin-1"),                                   # 4 Latin-1
        json.dumps({"messages": []}).encode(),                                         # 5 empty
        json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(),       # 6 unknown role
        json.dumps({"messages": [{"role": "user", "content": None}]}).encode(),        # 7 null content
        json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                 {"role": "assistant", "content": "c"}]}).encode(),    # 8 ends with assistant
        b"[1, 2]",                                                                     # 9 not an object
        json.dumps({"foo": 1, "bar": 2}).encode(),                                     # 10 unrecognised
        json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]}).encode(),  # 11
        json.dumps({"messages": [{"role": "user",
                                  "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]}).encode(),  # 12 image part
        json.dumps({"messages": [{"role": "user", "content": "g2"}]}).encode(),        # 13 ok
        b'{"messages": [{"role": "user", "content": "cut',                             # 14 truncated, no newline
    ]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(lines))
    prompts, rejects = load(path)
    assert [p.source for p in prompts] == [f"{path}:1", f"{path}:8", f"{path}:13"]
    assert [p.messages[0]["content"] for p in prompts] == ["good", "a", "g2"]
    # row 8's two assistant turns in a row are one answer (SpecForge's role order): the prompt is its user turn
    assert prompts[1].messages == [{"role": "user", "content": "a"}]
    assert prompts[1].notes == ("merged messages 2-3 (assistant)",)
    reasons = {line: r.reason for line, r in by_line(rejects).items()}
    assert sorted(reasons) == [2, 4, 5, 6, 7, 9, 10, 11, 12, 14]
    assert reasons[2].startswith("invalid JSON: Expecting value")
    assert reasons[4].startswith("not UTF-8: byte 0xe9")
    assert reasons[5] == "openai: empty conversation"
    assert reasons[6] == "openai: message 1: unknown role 'wizard'"
    assert reasons[7] == "openai: message 1: null content"
    assert reasons[9] == "row is a list, expected a JSON object"
    assert reasons[10].startswith("unrecognised row format: keys ['foo', 'bar']; expected one of: history (swe_agent)")
    assert reasons[11] == "openai: no user turn before the last assistant turn"
    assert reasons[12] == "openai: message 1: content part 1 has type 'image_url'; only text parts can be sent as text"
    assert reasons[14].startswith("truncated last line: Unterminated string")


def test_bom_and_crlf(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD).encode() + b"\r\n" + json.dumps(GOOD).encode() + b"\r\n")
    prompts, rejects = load(path)
    assert rejects == [] and [p.source for p in prompts] == [f"{path}:1", f"{path}:2"]
    array = tmp_path / "bom.json"
    array.write_bytes(b"\xef\xbb\xbf[" + json.dumps(GOOD).encode() + b"]")
    assert [p.messages for p in load(array)[0]] == [GOOD["messages"]]


def test_null_content_allowed_on_assistant_tool_call(tmp_path):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    row = {"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                        {"role": "tool", "content": "r", "tool_call_id": "c1"}, {"role": "assistant", "content": "done"}],
           "tools": json.dumps([{"name": "f", "parameters": {"type": "object"}}])}
    bad = {"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": None},
                        {"role": "user", "content": "v"}, {"role": "assistant", "content": "w"}]}
    last_null = {"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": None}]}
    (p, q), (r,) = load(write_jsonl(tmp_path / "t.jsonl", [row, bad, last_null]))
    assert roles(p) == "uat" and p.messages[1]["content"] is None and p.messages[2]["tool_call_id"] == "c1"
    assert p.tools == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert r.source.endswith(":2") and r.reason == "openai: message 2: null content"
    assert q.source.endswith(":3") and q.messages == [{"role": "user", "content": "u"}]  # the null answer is cut


def test_lone_surrogate_is_rejected(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"prompt": "a\\ud800b"}\n{"prompt": "ok"}\n')
    prompts, (r,) = load(path)
    assert r.source == f"{path}:1" and "lone surrogate" in r.reason
    assert [p.messages for p in prompts] == [[{"role": "user", "content": "ok"}]]


def test_truncated_sharegpt_array_falls_back(tmp_path):
    data = (SAMPLES / "b7_sharegpt.json").read_bytes()
    raw = json.loads(data)
    start_51 = data.index(b'"id": "' + raw[50]["id"].encode())
    path = tmp_path / "ShareGPT_truncated.json"
    path.write_bytes(data[: start_51 + 400])  # cut inside element 51
    prompts, rejects = load(path, "sharegpt")
    assert len(prompts) == 49  # elements 1-50 minus #29
    assert [r.source for r in rejects] == [f"{path}:29", f"{path}:51"]
    assert rejects[1].reason.startswith("truncated JSON array at element 51: ")
    full = {p.source.rsplit(":", 1)[1]: p.key for p in load(SAMPLES / "b7_sharegpt.json")[0]}
    assert [p.key for p in prompts] == [full[p.source.rsplit(":", 1)[1]] for p in prompts]


def test_json_array_edge_cases(tmp_path):
    row = json.dumps({"prompt": "p"})
    cases = {
        f"[{row}, {row}": (2, "truncated JSON array at element 3: expected ',' or ']' after element 2, found end of file"),
        f"[{row}, ": (1, "truncated JSON array at element 2: Expecting value"),
        f"[{row} {row}]": (1, "invalid JSON array at element 2: expected ',' or ']' after element 1"),
        f"[{row}, {{oops}}, {row}]": (1, "invalid JSON array at element 2: Expecting property name"),
    }
    for n, (text, (good, reason)) in enumerate(cases.items()):
        path = tmp_path / f"{n}.json"
        path.write_text(text)
        prompts, (r,) = load(path)
        assert len(prompts) == good and r.reason.startswith(reason), (text, r)
    (tmp_path / "empty.json").write_text(" [ ] ")
    assert load(tmp_path / "empty.json") == ([], [])
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'[{"prompt": "caf\xe9"}, ' + row.encode() + b"]")
    prompts, (r,) = load(latin)
    assert r.source == f"{latin}:1" and r.reason.startswith("not UTF-8") and prompts[0].source == f"{latin}:2"


def test_json_with_lines_and_single_traj_object(tmp_path):
    lines = tmp_path / "lines.json"
    write_jsonl(lines, [GOOD, {"prompt": "x"}])
    assert [p.source for p in load(lines)[0]] == [f"{lines}:1", f"{lines}:2"]
    traj_row = json.loads((SAMPLES / "b8_swe_agent_trajectories.jsonl").read_text().splitlines()[0])
    traj = tmp_path / "run.traj"
    traj.write_text(json.dumps(traj_row, indent=2))
    (p,), rejects = load(traj)
    assert rejects == [] and p.source == f"{traj}:1"
    assert p.key == load(SAMPLES / "b8_swe_agent_trajectories.jsonl")[0][0].key


def test_parquet_rows_and_batches(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [
        {"id": "1", "messages": [{"role": "user", "content": "one", "tool_call_id": None}], "prompt": None},
        {"id": "2", "messages": [], "prompt": None},
        {"id": "3", "messages": [{"role": "user", "content": "three", "tool_call_id": None},
                                 {"role": "assistant", "content": "x", "tool_call_id": None}], "prompt": None},
        {"id": "4", "messages": None, "prompt": "four"},
        {"id": "5", "messages": [{"role": "tool", "content": "t", "tool_call_id": None}], "prompt": None},
    ]
    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    monkeypatch.setattr(readers, "_PARQUET_BATCH_ROWS", 2)  # rows 1-2, 3-4, 5: numbering spans batches
    prompts, rejects = load(path)
    assert [(p.source, p.messages) for p in prompts] == [
        (f"{path}:1", [{"role": "user", "content": "one"}]),
        (f"{path}:3", [{"role": "user", "content": "three"}]),
        (f"{path}:4", [{"role": "user", "content": "four"}]),
    ]
    assert [(r.source, r.reason) for r in rejects] == [(f"{path}:2", "openai: empty conversation"), (f"{path}:5", "openai: no user turn")]
    explicit, _ = load(path, "openai")
    assert [p.source for p in explicit] == [f"{path}:1", f"{path}:3"]


# ----------------------------------------------------------------------------- formats in detail


def test_glaive_edge_cases(tmp_path):
    no_functions = {"system": "SYSTEM: You are a helpful assistant, with no access to external functions.\n\n",
                    "chat": "USER: Hi\n\n\nline two\n\n\nASSISTANT: Hello <|endoftext|>\n\n\n"}
    apostrophe = {"system": "SYSTEM: x. Use them if required -\n{\"name\": \"say\", \"parameters\": {}}\n",
                  "chat": "USER: Say it\n\n\nASSISTANT: <functioncall> "
                          "{\"name\": \"say\", \"arguments\": '{\"text\": \"I'm here\"}'} <|endoftext|>\n\n\n"
                          "FUNCTION RESPONSE: {\"ok\": true}\n\n\nASSISTANT: Done <|endoftext|>\n\n\n"}
    broken_last = {"system": "", "chat": "USER: a\n\n\nASSISTANT: <functioncall> {garbage <|endoftext|>\n\n\n"}
    broken_mid = {"system": "", "chat": "USER: a\n\n\nASSISTANT: <functioncall> {garbage\n\n\nFUNCTION RESPONSE: {}\n\n\nASSISTANT: b"}
    bad_schema = {"system": "SYSTEM: x Use them if required -\n{\"name\": \"f\"}\n\n{not json}\n", "chat": "USER: a"}
    prompts, rejects = load(write_jsonl(tmp_path / "g.jsonl", [no_functions, apostrophe, broken_last, broken_mid, bad_schema]), "glaive")
    p1, p2, p3 = prompts
    assert p1.tools == [] and p1.messages == [
        {"role": "system", "content": "You are a helpful assistant, with no access to external functions."},
        {"role": "user", "content": "Hi\n\n\nline two"}]
    assert p2.tools == [{"type": "function", "function": {"name": "say", "parameters": {}}}]
    assert p2.messages[2]["tool_calls"][0]["function"]["arguments"] == '{"text": "I\'m here"}'
    assert p2.messages[3] == {"role": "tool", "content": '{"ok": true}', "tool_call_id": "functions.say:0"}
    assert p3.messages == [{"role": "user", "content": "a"}]
    assert [(r.source.rsplit(":", 1)[1], r.reason) for r in rejects] == [
        ("4", "glaive: message 2: unparseable <functioncall> payload: '{garbage'"),
        ("5", "glaive: system: function schema 2 is not JSON: Expecting property name enclosed in double quotes (char 17)"),
    ]


def test_parse_call_variants():
    assert parse_call('{"name": "f", "arguments": \'{"a": 1}\'}') == ("f", '{"a": 1}')
    assert parse_call('{"name": "f", "arguments": {"a": [1, true]}}') == ("f", '{"a": [1, true]}')
    assert parse_call('{"name": "f", "arguments": \'{"s": "it\\\'s"}\'}') == ("f", '{"s": "it\'s"}')
    assert parse_call('{"name": "f", "arguments": \'{"a": undefined}\'}') == ("f", '{"a": undefined}')  # raw kept
    assert arguments_json("{\\'a\\': 1}") == "{\\'a\\': 1}"
    with pytest.raises(ValueError):
        parse_call("not a call")


def test_sharegpt_roles_tools_and_errors(tmp_path):
    tools = json.dumps([{"name": "lookup", "parameters": {"type": "object"}}])
    calling = {"conversations": [
        {"from": "human", "value": "find x"},
        {"from": "function_call", "value": '{"name": "lookup", "arguments": {"q": "x"}}'},
        {"from": "observation", "value": "found"},
        {"from": "gpt", "value": "x is here"}], "tools": tools}
    rows = [calling,
            {"conversations": [{"from": "narrator", "value": "x"}]},
            {"conversations": [{"from": "human"}]},
            {"conversations": [{"from": "human", "value": None}, {"from": "gpt", "value": "a"}]},
            {"conversations": [{"from": "human", "value": "   "}]},
            {"conversations": "oops"},
            {"system": 5, "conversations": [{"from": "human", "value": "q"}]}]
    prompts, rejects = load(write_jsonl(tmp_path / "s.jsonl", rows), "sharegpt")
    (p,) = prompts
    assert roles(p) == "uat" and p.tools[0]["function"]["name"] == "lookup"
    assert p.messages[1]["tool_calls"] == [{"id": "functions.lookup:0", "type": "function",
                                            "function": {"name": "lookup", "arguments": '{"q": "x"}'}}]
    assert p.messages[2] == {"role": "tool", "content": "found", "tool_call_id": "functions.lookup:0"}
    assert [r.reason for r in rejects] == [
        "sharegpt: message 1: unknown role 'narrator'",
        "sharegpt: message 1: missing field 'value'",
        "sharegpt: message 1: null content",
        "sharegpt: message 1: final user turn is empty",
        "sharegpt: field 'conversations' is a str, expected a list",
        "sharegpt: field 'system' is an int, expected a string",
    ]


def test_single_turn_formats_and_missing_fields(tmp_path):
    rows = [{"instruction": "Do X.", "input": "data", "output": "done"},
            {"instruction": "Do Y.", "input": "", "response": "ok"},
            {"input": "only input"},
            {"problem": "P", "solution": "S"},
            {"prompt": "T", "system": "be brief"},
            {"instruction": "And now?", "input": "", "output": "c", "history": [["Q1", "A1"], ["Q2", "A2"]]}]
    prompts, _ = load(write_jsonl(tmp_path / "s.jsonl", rows))
    assert [p.messages for p in prompts] == [
        [{"role": "user", "content": "Do X.\n\ndata"}],
        [{"role": "user", "content": "Do Y."}],
        [{"role": "user", "content": "only input"}],
        [{"role": "user", "content": "P"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "T"}],
        [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"},
         {"role": "assistant", "content": "A2"}, {"role": "user", "content": "And now?"}]]
    _, rejects = load(write_jsonl(tmp_path / "m.jsonl", [{"problem": "P"}, {"input": 3}]), "instruction")
    assert [r.reason for r in rejects] == ["instruction: missing field 'instruction'"] * 2
    _, (r,) = load(write_jsonl(tmp_path / "n.jsonl", [{"problem": None}]), "oss_instruct")
    assert r.reason == "oss_instruct: field 'problem' is null, expected a string"


def test_fields_mapping(tmp_path):
    path = write_jsonl(tmp_path / "f.jsonl", [{"question": "Why?"}, {"dialog": [{"role": "user", "content": "hey"}]}, {"other": 1}])
    prompts, (r, r3) = load(path, "text", {"prompt": "question"})
    assert prompts[0].messages == [{"role": "user", "content": "Why?"}] and r.source.endswith(":2")
    assert r.reason == r3.reason == "text: missing field 'question' (mapped to 'prompt')"
    prompts, rejects = load(path, "auto", {"prompt": "question", "messages": "dialog"})
    assert [p.messages[0]["content"] for p in prompts] == ["Why?", "hey"]
    assert rejects[0].source.endswith(":3") and rejects[0].reason.startswith("unrecognised row format: keys ['other']")


def test_swe_agent_call_id_repr_and_errors(tmp_path):
    call = {"id": "call_a", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    row = {"history": [
        {"role": "system", "content": "s", "agent": "main", "message_type": "system_prompt"},
        {"role": "user", "content": "u", "is_demo": True},
        {"role": "assistant", "content": "t", "thought": "t", "action": "ls", "tool_calls": [call]},
        {"role": "tool", "content": "out", "tool_call_ids": "['call_a']"},
        {"role": "assistant", "content": "end", "tool_calls": None}]}
    bad = {"history": [{"role": "ai", "content": "x"}], "trajectory": []}
    (p,), (r,) = load(write_jsonl(tmp_path / "t.jsonl", [row, bad]))
    assert p.messages == [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                          {"role": "assistant", "content": "t", "tool_calls": [call]},
                          {"role": "tool", "content": "out", "tool_call_id": "call_a"}]
    assert r.reason == "swe_agent: message 1: unknown role 'ai'"


# ----------------------------------------------------------------------------- whole-file errors


def test_dataset_errors(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DatasetError, match=re.escape(str(missing))):
        iter_prompts(missing)
    existing = write_jsonl(tmp_path / "ok.jsonl", [GOOD])
    with pytest.raises(DatasetError, match=r"unknown format 'alpaca'.*expected one of: auto, "):
        iter_prompts(existing, "alpaca")
    with pytest.raises(DatasetError, match=r"unknown field mapping key 'answer'"):
        iter_prompts(existing, fields={"answer": "output"})
    text = tmp_path / "notes.json"
    text.write_text("hello")
    with pytest.raises(DatasetError, match=re.escape(str(text)) + r".*expected a \.jsonl"):
        iter_prompts(text)
    (tmp_path / "empty").mkdir()  # a directory is a shard set (tests/engine/datasets/test_inputs_compressed.py): this one has none
    with pytest.raises(DatasetError, match="no dataset files in the directory"):
        iter_prompts(tmp_path / "empty")
    fake = tmp_path / "fake.parquet"
    fake.write_text("not parquet")
    with pytest.raises(DatasetError, match=re.escape(str(fake)) + ".*not a readable Parquet file"):
        iter_prompts(fake)
