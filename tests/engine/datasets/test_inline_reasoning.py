"""Reasoning in earlier assistant turns (docs/prompt-construction.md): moved out of content into
``reasoning_content`` at ingest, both marker styles and the edge cases, every format; reasoning fields kept;
and end to end, a real headless run against the simulator with the Kimi-layout tokenizer whose tokens
export holds the earlier turns' visible answers and none of their reasoning."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from fixtures_tokens import kimi_dir
from promptcheck_helpers import write_config

from datagen.cli import main
from engine.config import load_config
from engine.datasets import iter_prompts
from engine.datasets.reasoning import ReasoningError, Split, move_reasoning, split_inline
from engine.prompts import Prompt, Reject
from engine.run.headless import run_headless
from engine.tokens.tokenizer import load_tokenizer

U = lambda t: {"role": "user", "content": t}  # noqa: E731
A = lambda t: {"role": "assistant", "content": t}  # noqa: E731
CALL = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
THOUGHT = "<|begin_of_thought|>\n91 = 7*13.\n<|end_of_thought|>\n\n<|begin_of_solution|>\nNo, 91 = 7 x 13.\n<|end_of_solution|>"


# ----------------------------------------------------------------------------- the split, pure


@pytest.mark.parametrize("text, content, reasoning, unclosed", [
    ("<think>\n17*20=340, 17*3=51, total 391.\n</think>\n\n17*23 = 391.", "17*23 = 391.", "17*20=340, 17*3=51, total 391.", ""),
    ("<think></think>Just the answer.", "Just the answer.", "", ""),
    ("Let me see.\n</think>\n\nIt is 4.", "It is 4.", "Let me see.", ""),  # R1: the template wrote <think>
    (THOUGHT, "No, 91 = 7 x 13.", "91 = 7*13.", ""),
    ("<|begin_of_thought|>...<|end_of_thought|> Yes.", "Yes.", "...", ""),  # no solution block: the text after
    ("<|begin_of_thought|>t<|end_of_thought|>\n\n<|begin_of_solution|>\nsol", "sol", "t", ""),  # solution never ended
    ("Sure. <think>hmm</think> The answer is 4.", "Sure.\n\nThe answer is 4.", "hmm", ""),  # mid-content
    ("<think>a</think>x<think>b</think>\n\ny", "x\n\ny", "a\n\nb", ""),  # several blocks, in order
    ("Answer first. <think>and then a thought never closed", "Answer first.", "and then a thought never closed", "<think>"),
    ("<think>only thinking, cut off", "", "only thinking, cut off", "<think>"),
    ("<|begin_of_thought|>\nlong\n", "", "long", "<|begin_of_thought|>"),
    ("<think>x <think> nested</think> out", "out", "x <think> nested", ""),
    ("<|begin_of_thought|>t<|end_of_thought|><think>r</think>\n\nv", "v", "t\n\nr", ""),  # both styles
])
def test_split_inline(text, content, reasoning, unclosed):
    s = split_inline(text)
    assert (s.content, s.reasoning, s.unclosed) == (content, reasoning, unclosed)
    assert not any(m in s.content for m in ("<think>", "</think>", "<|begin_of_thought|>", "<|end_of_thought|>",
                                            "<|begin_of_solution|>", "<|end_of_solution|>"))


def test_split_inline_without_markers_is_none_and_styles_are_named():
    assert split_inline("The tag is written as think in angle brackets.") is None
    assert split_inline(THOUGHT) == Split("No, 91 = 7 x 13.", "91 = 7*13.", ("<|begin_of_thought|>", "<|begin_of_solution|>"), "")


def test_move_reasoning_fields_and_edge_cases():
    msg = A("<think>r</think>\n\nv")
    out, split = move_reasoning(msg)
    assert out == {"role": "assistant", "content": "v", "reasoning_content": "r"} and msg == A("<think>r</think>\n\nv")
    # a field is kept verbatim; OpenRouter's `reasoning` becomes reasoning_content
    assert move_reasoning({**A("v"), "reasoning_content": "  kept \n"})[0] == {**A("v"), "reasoning_content": "  kept \n"}
    assert move_reasoning({**A("v"), "reasoning": "or"})[0] == {**A("v"), "reasoning_content": "or"}
    assert move_reasoning({**A("v"), "reasoning_content": "", "reasoning": "or"})[0] == {**A("v"), "reasoning_content": "or"}
    assert move_reasoning({**A("v"), "reasoning": None})[0] == A("v")
    # both a field and inline markers: the field first, then the inline reasoning
    assert move_reasoning({**A("<think>inline</think>v"), "reasoning_content": "field"})[0] == {
        **A("v"), "reasoning_content": "field\n\ninline"}
    # a tool-call turn with only reasoning is normal in agent loops
    assert move_reasoning({**A("<think>plan</think>"), "tool_calls": [CALL]})[0] == {
        "role": "assistant", "content": "", "tool_calls": [CALL], "reasoning_content": "plan"}
    with pytest.raises(ReasoningError, match=r"^holds only reasoning, no visible answer \(<think> never closed\)$"):
        move_reasoning(A("<think>cut off"))
    with pytest.raises(ReasoningError, match=r"^holds only reasoning, no visible answer$"):
        move_reasoning(A("<|begin_of_thought|>t<|end_of_thought|>\n\n"))
    with pytest.raises(ReasoningError, match=r"^'reasoning' is a dict, expected a string$"):
        move_reasoning({**A("v"), "reasoning": {"effort": "high"}})
    # user, system and tool turns are never touched
    for role in ("user", "system", "tool"):
        m = {"role": role, "content": "<think>typed</think>"}
        assert move_reasoning(m) == (m, None)
    plain = A("no markers")
    assert move_reasoning(plain) == (plain, None)


# ----------------------------------------------------------------------------- through the adapters


def prompts(tmp_path: Path, rows, fmt: str) -> list[Prompt | Reject]:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return list(iter_prompts(path, fmt))


def test_think_in_history_rows(tmp_path):
    # the handed rows' shapes (openai): <think> and OpenThoughts markers in the earlier assistant turn
    rows = [{"messages": [U("What is 17*23?"), A("<think>\n17*20=340, 17*3=51, total 391.\n</think>\n\n17*23 = 391."),
                          U("Now divide that by 17."), A("<think>\n391/17 = 23.\n</think>\n\n23.")]},
            {"messages": [U("Is 91 prime?"), A(THOUGHT), U("What about 97?"), A("<|begin_of_thought|>...<|end_of_thought|> Yes.")]}]
    p1, p2 = prompts(tmp_path, rows, "openai")
    assert p1.messages == [U("What is 17*23?"), {**A("17*23 = 391."), "reasoning_content": "17*20=340, 17*3=51, total 391."},
                           U("Now divide that by 17.")]
    assert p2.messages == [U("Is 91 prime?"), {**A("No, 91 = 7 x 13."), "reasoning_content": "91 = 7*13."}, U("What about 97?")]
    assert p1.became.reasoning == ("message 2 (<think>)",)
    assert p2.became.reasoning == ("message 2 (<|begin_of_thought|>, <|begin_of_solution|>)",)


def test_every_format_moves_reasoning_of_kept_assistant_turns(tmp_path):
    system = "Structure your answer: <|begin_of_thought|> {thought} <|end_of_thought|> then the solution."
    openthoughts = {"system": system, "conversations": [
        {"from": "user", "value": "Is 91 prime?"}, {"from": "assistant", "value": THOUGHT},
        {"from": "user", "value": "And 97?"}]}
    (p,) = prompts(tmp_path, [openthoughts], "sharegpt")
    assert p.messages == [{"role": "system", "content": system}, U("Is 91 prime?"),
                          {**A("No, 91 = 7 x 13."), "reasoning_content": "91 = 7*13."}, U("And 97?")]  # system untouched
    (p,) = prompts(tmp_path, [{"id": "0", "data": ["q", "<think>r</think>a", "q2"]}], "ultrachat")
    assert p.messages == [U("q"), {**A("a"), "reasoning_content": "r"}, U("q2")]
    (p,) = prompts(tmp_path, [{"instruction": "now?", "history": [["q", "<think>r</think>a"]], "output": "<think>x</think>y"}],
                   "instruction")
    assert p.messages == [U("q"), {**A("a"), "reasoning_content": "r"}, U("now?")]
    (p,) = prompts(tmp_path, [{"system": "", "chat": "USER: q\n\n\nASSISTANT: <think>r</think>a <|endoftext|>\n\n\nUSER: q2\n\n\n"}],
                   "glaive")
    assert p.messages == [U("q"), {**A("a"), "reasoning_content": "r"}, U("q2")]
    (p,) = prompts(tmp_path, [{"history": [U("fix"), {**A("<think>plan</think>look"), "tool_calls": [CALL]},
                                           {"role": "tool", "content": "out", "tool_call_ids": ["c1"]}]}], "swe_agent")
    assert p.messages[1] == {**A("look"), "tool_calls": [CALL], "reasoning_content": "plan"}
    # user turns keep typed markers (the special-text setting's business); the final assistant turn is cut anyway
    (p,) = prompts(tmp_path, [{"messages": [U("what does <think> do?"), A("<think>unclosed")]}], "openai")
    assert p.messages == [U("what does <think> do?")] and p.became.reasoning == ()


def test_agent_loop_reasoning_fields_are_kept(tmp_path):
    loop = [U("weather?"), {"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning_content": "call lookup"},
            {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
            {"role": "assistant", "content": "", "tool_calls": [{**CALL, "id": "c2"}], "reasoning": "again",
             "reasoning_details": [{"type": "reasoning.text", "text": "again"}]},
            {"role": "tool", "content": "still sunny", "tool_call_id": "c2"}]
    (p,) = prompts(tmp_path, [{"messages": loop}], "openai")
    assert p.messages[1] == {"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning_content": "call lookup"}
    assert p.messages[3] == {"role": "assistant", "content": "", "tool_calls": [{**CALL, "id": "c2"}],
                             "reasoning_content": "again"}
    assert p.became.ended_on == "tool" and p.became.reasoning == ()
    # two assistant turns in a row merge; both reasoning fields survive, joined
    merged = [U("q"), {**A("a"), "reasoning_content": "r1"}, {**A("b"), "reasoning": "r2"}, U("q2")]
    (p,) = prompts(tmp_path, [{"messages": merged}], "openai")
    assert p.messages[1] == {**A("a\n\nb"), "reasoning_content": "r1\n\nr2"}


def test_kimi_template_renders_kept_reasoning_only_in_the_trailing_tool_call_chain(tmp_path):
    from engine.config import TokenizerSection
    from engine.tokens.template import render

    tok = load_tokenizer(TokenizerSection(path=str(kimi_dir())))
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    row = {"messages": [U("q"), A("<think>old model's thought</think>\n\nearlier answer"), U("now look it up"),
                        {"role": "assistant", "content": "<think>plan the call</think>", "tool_calls": [CALL]},
                        {"role": "tool", "content": "result", "tool_call_id": "c1"}], "tools": tools}
    (p,) = prompts(tmp_path, [row], "openai")
    text = render(tok, p.messages, p.tools, add_generation_prompt=True)
    assert "<|im_assistant|>assistant<|im_middle|><think></think>earlier answer<|im_end|>" in text
    assert "old model's thought" not in text
    assert "<|im_assistant|>assistant<|im_middle|><think>plan the call</think><|tool_calls_section_begin|>" in text


def test_rows_whose_kept_turn_is_reasoning_only_are_rejected(tmp_path):
    rows = [{"messages": [U("q"), A("<think>cut off mid-thought"), U("q2")]},
            {"messages": [U("q"), A("<|begin_of_thought|>t<|end_of_thought|>"), U("q2")]},
            {"messages": [U("q"), {**A("v"), "reasoning_content": ["not", "text"]}, U("q2")]}]
    r1, r2, r3 = prompts(tmp_path, rows, "openai")
    assert r1.reason == "openai: message 2: holds only reasoning, no visible answer (<think> never closed)"
    assert r2.reason == "openai: message 2: holds only reasoning, no visible answer"
    assert r3.reason == "openai: message 2: 'reasoning_content' is a list, expected a string"
    assert r1.source.endswith(":1") and r3.source.endswith(":3")


# ----------------------------------------------------------------------------- end to end


def test_headless_run_tokens_export_holds_visible_answers_not_reasoning(tmp_path, capsys):
    tok_dir = kimi_dir()
    rows = [{"messages": [U("What is 17*23?"), A("<think>\nSEKRIT-A 17*20=340.\n</think>\n\n17*23 = 391."),
                          U("Now divide that by 17."), A("<think>\n391/17 = 23.\n</think>\n\n23.")]},
            {"messages": [U("Is 91 prime?"), A(THOUGHT.replace("91 = 7*13.", "SEKRIT-B 91 = 7*13.")), U("What about 97?"),
                          A("<|begin_of_thought|>...<|end_of_thought|> Yes.")]},
            {"conversations": [{"from": "human", "value": "What is the capital of Peru?"}, {"from": "gpt", "value": "Lima."},
                               {"from": "human", "value": "And what is its population, roughly?"}]}]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = write_config(tmp_path, tok_dir, [("hist", data, "auto")],
                       classes="[classes.short]\nmax_tokens = 2000\nconcurrency = 8", name="reasoning")
    out = io.StringIO()
    assert asyncio.run(run_headless(load_config(cfg), out, install_signals=False)) == 0, out.getvalue()
    assert ("[hist] 1 prompt(s) whole (ended on a user or tool turn), 2 cut before the final assistant turn, "
            "2 with inline reasoning moved to reasoning_content") in out.getvalue()
    capsys.readouterr()
    assert main(["export", str(tmp_path / "run"), "--format", "tokens", "--out", str(tmp_path / "tok")]) == 0
    tok = load_tokenizer(load_config(cfg).tokenizer)
    decoded = []
    for f in (tmp_path / "tok").glob("*.parquet"):
        for row in pq.read_table(f).to_pylist():
            decoded.append(tok.decode([i for i, k in zip(row["input_ids"], row["loss_mask"], strict=True) if k == 0]))
    assert len(decoded) == 3
    by_first = {next(q for q in ("17*23", "91 prime", "Peru") if q in p): p for p in decoded}
    gen = "<|im_assistant|>assistant<|im_middle|><think>"
    for prompt in decoded:
        assert prompt.endswith(gen) and prompt.count("<think>") == prompt.count("</think>") + 1
        assert "SEKRIT" not in prompt and "begin_of_thought" not in prompt and "end_of_thought" not in prompt
        assert "begin_of_solution" not in prompt and "end_of_solution" not in prompt
    assert "<|im_assistant|>assistant<|im_middle|><think></think>17*23 = 391.<|im_end|>" in by_first["17*23"]
    assert by_first["17*23"].count("<think>") == 2  # the earlier turn's empty pair + the generation prompt's
    assert "<|im_assistant|>assistant<|im_middle|><think></think>No, 91 = 7 x 13.<|im_end|>" in by_first["91 prime"]
    assert by_first["Peru"].endswith("<|im_assistant|>assistant<|im_middle|><think></think>Lima.<|im_end|>"
                                     "<|im_user|>user<|im_middle|>And what is its population, roughly?<|im_end|>" + gen)
