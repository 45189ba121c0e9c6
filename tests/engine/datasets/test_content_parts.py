"""OpenAI content parts (``content: [{"type": "text", "text": ...}]``): text parts joined as Kimi-K2.5's template
joins them (no separator), other parts rejected with ``file:N`` and the reason, in every format whose messages
can hold them (``openai`` ``messages``, ``sharegpt`` values, ``swe_agent`` ``history``)."""

from __future__ import annotations

import json

import pytest

from engine.datasets import iter_prompts, row_to_prompt
from engine.datasets.parts import join_text_parts
from engine.prompts import Prompt, Reject
from engine.tokens.demo_tokenizer import KIMI_TEMPLATE


def parts(*texts: str) -> list[dict]:
    return [{"type": "text", "text": t} for t in texts]


def test_text_parts_join_with_nothing_between():
    assert join_text_parts(parts("Hello", " world", "\n!")) == "Hello world\n!"
    assert join_text_parts([{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}]) == "a"
    assert join_text_parts([]) == ""
    assert join_text_parts("plain") == "plain" and join_text_parts(None) is None


@pytest.mark.parametrize("part, reason", [
    ({"type": "image_url", "image_url": {"url": "https://x/y.png"}},
     "content part 2 has type 'image_url'; only text parts can be sent as text"),
    ({"type": "input_audio", "input_audio": {"data": "..."}}, "content part 2 has type 'input_audio'; only text parts can be sent as text"),
    ({"text": "no type"}, "content part 2 has no 'type' (expected 'text')"),
    ({"type": "text"}, "content part 2: 'text' is missing, expected a string"),
    ({"type": "text", "text": 3}, "content part 2: 'text' is an int, expected a string"),
    ("bare string", "content part 2 is a str, expected an object"),
])
def test_other_parts_are_refused_with_the_reason(part, reason):
    with pytest.raises(ValueError) as e:
        join_text_parts([{"type": "text", "text": "ok"}, part])
    assert str(e.value) == reason


def test_the_joined_string_renders_as_kimis_template_renders_the_parts():
    """The template's own rendering of the parts equals its rendering of the string ingest stores."""
    from transformers.utils.chat_template_utils import render_jinja_template

    listed = [{"role": "system", "content": parts("You are ", "terse.")},
              {"role": "user", "content": parts("Line one\n", "line two", " end")},
              {"role": "assistant", "content": parts("ok")}, {"role": "user", "content": parts("more")}]
    prompt = row_to_prompt({"messages": listed}, "f:1", "openai")
    assert isinstance(prompt, Prompt)
    assert [m["content"] for m in prompt.messages] == ["You are terse.", "Line one\nline two end", "ok", "more"]

    def render(messages):
        out = render_jinja_template(conversations=[messages], chat_template=KIMI_TEMPLATE, add_generation_prompt=True)
        rendered = out[0] if isinstance(out, tuple) else out
        return rendered[0] if isinstance(rendered, list) else rendered

    assert render(prompt.messages) == render(listed)
    assert "<|im_user|>user<|im_middle|>Line one\nline two end<|im_end|>" in render(prompt.messages)


def test_a_row_with_text_parts_is_the_same_prompt_as_with_strings():
    a = row_to_prompt({"messages": [{"role": "user", "content": parts("what is ", "2+2?")}]}, "f:1", "auto")
    b = row_to_prompt({"messages": [{"role": "user", "content": "what is 2+2?"}]}, "f:2", "auto")
    assert isinstance(a, Prompt) and isinstance(b, Prompt) and a.key == b.key and a.messages == b.messages


def test_every_format_with_message_lists_reads_parts(tmp_path):
    rows = [
        {"messages": [{"role": "user", "content": parts("open", "ai")}, {"role": "assistant", "content": parts("answer")}]},
        {"conversations": [{"from": "human", "value": parts("share", "gpt")}, {"from": "gpt", "value": "a"}]},
        {"conversations": [{"role": "user", "content": parts("role ", "content")}]},
        {"history": [{"role": "system", "content": parts("sys")}, {"role": "user", "content": parts("swe ", "task")},
                     {"role": "assistant", "content": parts("thinking"), "tool_calls": [
                         {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
                     {"role": "tool", "content": parts("file.py"), "tool_call_ids": ["c1"]}]},
        # a final assistant answer with an image is cut from the prompt: the row is fine
        {"messages": [{"role": "user", "content": "draw"}, {"role": "assistant", "content": [{"type": "image_url"}]}]},
        # a non-text part anywhere in the prompt rejects the row
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {}}]}]},
        {"conversations": [{"from": "human", "value": [{"type": "input_audio", "input_audio": {}}]}, {"from": "gpt", "value": "x"}]},
        {"history": [{"role": "user", "content": [{"type": "image_url"}]}, {"role": "assistant", "content": "a"}]},
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    items = list(iter_prompts(path))
    ok = {p.source: p for p in items if isinstance(p, Prompt)}
    assert [ok[f"{path}:{n}"].messages[0]["content"] for n in (1, 2, 3)] == ["openai", "sharegpt", "role content"]
    swe = ok[f"{path}:4"].messages
    assert [(m["role"], m["content"]) for m in swe] == [("system", "sys"), ("user", "swe task"), ("assistant", "thinking"),
                                                        ("tool", "file.py")]
    assert swe[3]["tool_call_id"] == "c1"
    assert ok[f"{path}:5"].messages == [{"role": "user", "content": "draw"}]
    assert [(r.source, r.reason) for r in items if isinstance(r, Reject)] == [
        (f"{path}:6", "openai: message 1: content part 2 has type 'image_url'; only text parts can be sent as text"),
        (f"{path}:7", "sharegpt: message 1: content part 1 has type 'input_audio'; only text parts can be sent as text"),
        (f"{path}:8", "swe_agent: message 1: content part 1 has type 'image_url'; only text parts can be sent as text"),
    ]


def test_parts_in_parquet_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"messages": [{"role": "user", "content": parts("par", "quet")}, {"role": "assistant", "content": parts("a")}]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    (p,) = list(iter_prompts(tmp_path / "p.parquet"))
    assert isinstance(p, Prompt) and p.messages == [{"role": "user", "content": "parquet"}] and p.source.endswith("p.parquet:1")
