"""SpecForge's own parser over the ``specforge`` export (issue 36, case 30): rows it would mis-train are left out,
or the export refused with the path to train from (``tokens-jsonl`` + ``data.prompts_path``).

The transcription (:mod:`engine.tokens.specforgecheck`) follows ``specforge/data/parse.py`` and
``specforge/data/template.py`` of sgl-project/SpecForge at a6b6b02 (``GeneralParser.parse``,
``ThinkingParser``, ``_sanitize_message``, template ``kimi-k2-thinking``); the served ids are built with the
project's own reconstruction (what the ``tokens`` export holds) on the Kimi-layout fixture tokenizer.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from fixtures_tokens import kimi_dir, true_count
from helpers import completion, make_config

from engine.client.types import ToolCall, Usage
from engine.config import TokenizerSection
from engine.errors import NothingToExport
from engine.storage.store import Store
from engine.storage.writer import StoreWriter
from engine.tokens.exports import export_validated
from engine.tokens.jsonrows import assistant_message, export_message
from engine.tokens.reconstruct import completion_ids, prompt_ids
from engine.tokens.specforgecheck import KIMI_K2_THINKING, check, likely, parser_messages, supervised_mask, template_for
from engine.tokens.specforgeguard import SpecForgeGuard, left_out_line
from engine.tokens.template import render
from engine.tokens.tokenizer import load_tokenizer

SYS = {"role": "system", "content": "Answer like a patient teacher."}
USER = {"role": "user", "content": "what is a sonnet?"}
R, C = "The user asks something simple.", "A fourteen-line poem."
WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def instant():
    return load_tokenizer(TokenizerSection(path=str(kimi_dir()), thinking=False))


def _row(tok, prompt, reasoning, content, calls=(), tools=None):
    """(exported conversations, served ids, prompt_len) of one record, as the exports build them."""
    native = [{"id": f"functions.{n}:{i}", "type": "function", "function": {"name": n, "arguments": a}}
              for i, (n, a) in enumerate(calls)]
    _, p = prompt_ids(tok, prompt, tools)
    ids = p + completion_ids(tok, reasoning, content, native, finished=True)
    turns = [export_message(m) for m in prompt] + [assistant_message(content, reasoning, native)]
    return turns, ids, len(p)


def _check(tok, turns, ids, pl, tools=None):
    return check(turns, tools or [], ids, pl, lambda m, t: render(tok, m, t, add_generation_prompt=False),
                 tok.encode_chat, KIMI_K2_THINKING)


def test_parser_messages_insert_the_template_system_prompt_and_parse_arguments():
    turns = [export_message(USER), assistant_message("", "r", [
        {"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}])]
    got = parser_messages(turns, KIMI_K2_THINKING)
    assert got == [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "what is a sonnet?", "reasoning_content": None, "tool_calls": [], "tool_call_id": "",
         "name": ""},
        {"role": "assistant", "content": "", "reasoning_content": "r", "tool_call_id": "", "name": "",
         "tool_calls": [{"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
    ]
    # the row's own system turn is kept (and nothing inserted); ShareGPT keys read; an assistant after an
    # assistant truncates there (GeneralParser.parse's role rule)
    got = parser_messages([{"from": "system", "value": "S"}, {"from": "human", "value": "u"}, {"from": "gpt", "value": "a"},
                           {"from": "gpt", "value": "b"}], KIMI_K2_THINKING)
    assert got == [{"role": "system", "content": "S"}, {"role": "user", "content": "u"},
                   {"role": "assistant", "content": "a"}]


def test_supervised_mask_covers_header_to_end_of_turn():
    t = KIMI_K2_THINKING
    text = "<u>q" + t.assistant_header + "ab" + t.end_of_turn + "<u>r" + t.assistant_header + "cd"
    mask = supervised_mask(text, len(text), len, t)  # one token per character
    want = [0] * len(text)
    for start, end in ((text.index("ab"), text.index("ab") + 2 + len(t.end_of_turn)), (len(text) - 2, len(text))):
        want[start:end] = [1] * (end - start)
    assert mask == want
    last = [0] * len(text)
    last[len(text) - 2:] = [1, 1]
    assert supervised_mask(text, len(text), len, t, last_only=True) == last


def test_thinking_plain_turn_loses_its_reasoning_and_gets_a_system_prompt(kimi):
    turns, ids, pl = _row(kimi, [USER], R, C)
    v = _check(kimi, turns, ids, pl)
    assert v is not None and v.kinds == ("reasoning", "system")
    assert "reasoning dropped (31 chars" in v.detail and "'You are a helpful assistant.'" in v.detail
    turns, ids, pl = _row(kimi, [SYS, USER], R, C)
    assert _check(kimi, turns, ids, pl).kinds == ("reasoning",)


def test_instant_mode_with_a_system_turn_trains_as_bought(instant):
    turns, ids, pl = _row(instant, [SYS, USER], "", C)
    assert _check(instant, turns, ids, pl) is None
    # the same without a system turn: SpecForge inserts one
    turns, ids, pl = _row(instant, [USER], "", C)
    assert _check(instant, turns, ids, pl).kinds == ("system",)


def test_tool_call_turn_keeps_its_reasoning_but_not_compact_arguments(kimi):
    turns, ids, pl = _row(kimi, [SYS, USER], R, "", [("get_weather", '{"city": "Lima"}')], WEATHER)
    assert _check(kimi, turns, ids, pl, WEATHER) is None  # reasoning rendered (not the last plain turn), args as dumped
    turns, ids, pl = _row(kimi, [SYS, USER], R, "", [("get_weather", '{"city":"Lima"}')], WEATHER)
    v = _check(kimi, turns, ids, pl, WEATHER)
    assert v is not None and v.kinds == ("arguments",) and """'{"city":"Lima"}' not rendered""" in v.detail


def test_without_a_tokenizer_the_certain_kinds_decide(kimi):
    turns, _, _ = _row(kimi, [SYS, USER], R, C)
    assert likely(turns).kinds == ("reasoning",)
    turns, _, _ = _row(kimi, [SYS, USER], "", C)
    assert likely(turns) is None
    assert template_for("{{ messages }}") is None and template_for(kimi.chat_template) is KIMI_K2_THINKING


def test_guard_counts_and_its_lines(kimi):
    g = SpecForgeGuard(kimi)
    a = _row(kimi, [USER], R, C)
    b = _row(kimi, [SYS, USER], R, "", [("get_weather", '{"city": "Lima"}')], WEATHER)
    reasons = [("d:1", g.verdict(a[0], [], a[1], a[2]).detail)]
    assert g.verdict(b[0], WEATHER, b[1], b[2]) is None
    assert (g.left, g.kept, dict(g.kinds)) == (1, 1, {"reasoning": 1, "system": 1})
    line = left_out_line([*reasons, ("d:9", "truncated before turn 2: ...")], "RUN")
    assert line.startswith("left out: 1 row(s) SpecForge's own parser would mis-train (reasoning dropped 1, "
                           "system prompt inserted 1), e.g. d:1: SpecForge kimi-k2-thinking (a6b6b02): ")
    assert "`datagen export RUN --format tokens-jsonl --out DIR`" in line and "data.prompts_path=DIR/<dataset>.jsonl" in line
    assert left_out_line([("d:9", "truncated before turn 2: ...")], "RUN") is None


PROMPTS = {"k-sys-tool": ([SYS, USER], WEATHER), "k-plain": ([USER], []), "k-sys-plain": ([SYS, USER], [])}


def _run(tmp, keys):
    """A run whose records are honest thinking-mode answers to PROMPTS[keys] (a tool call for the tool prompt)."""
    cfg = make_config(tmp, [{"name": "d", "path": "d.jsonl"}])

    async def build():
        store = await Store.open(cfg.run.dir)
        try:
            await store.set_meta("run_name", cfg.run.name)
            await store.register_dataset("d", 0, "d.jsonl", None)
            await store.ingest_batch("d", [(k, f"d.jsonl:{i + 1}", "short", 10, json.dumps(PROMPTS[k][0]),
                                            json.dumps(PROMPTS[k][1])) for i, k in enumerate(keys)])
            await store.finish_ingest("d", "fp", 0)
            w = StoreWriter(store)
            for i, k in enumerate(keys):
                if PROMPTS[k][1]:
                    calls = (ToolCall("call_x1", "get_weather", '{"city": "Lima"}'),)
                    n = true_count(R, "", (("get_weather", '{"city": "Lima"}'),))
                    c = completion("")
                    c = type(c)(**{**{f: getattr(c, f) for f in c.__dataclass_fields__}, "reasoning": R,
                                   "tool_calls": calls, "finish_reason": "tool_calls",
                                   "native_finish_reason": "tool_calls", "usage": Usage(12, n, 0, 0.0001)})
                else:
                    c = completion(C)
                    c = type(c)(**{**{f: getattr(c, f) for f in c.__dataclass_fields__}, "reasoning": R,
                                   "usage": Usage(12, true_count(R, C), 0, 0.0001)})
                w.add_result(i + 1, "d", k, c, 1)
            await w.flush()
        finally:
            await store.close()

    asyncio.run(build())
    return cfg.run.dir


def test_export_refuses_when_every_row_would_be_mis_trained(tmp_path):
    run = _run(tmp_path, ["k-plain", "k-sys-plain"])
    section = TokenizerSection(path=str(kimi_dir()))
    with pytest.raises(NothingToExport) as e:
        export_validated(run, tmp_path / "sf", "specforge", tokenizer=section)
    msg = str(e.value)
    assert msg.startswith("refused: SpecForge's own parser (kimi-k2-thinking template, SpecForge a6b6b02) would "
                          "mis-train all 2 row(s) (reasoning dropped 2, system prompt inserted 1); nothing written.")
    assert f"`datagen export {run} --format tokens-jsonl --out DIR`" in msg and "data.prompts_path" in msg
    assert not (tmp_path / "sf" / "d.jsonl").exists()
    # a user who knows better: --force (check_specforge=False) exports them as before
    assert export_validated(run, tmp_path / "forced", "specforge", tokenizer=section, check_specforge=False) == {"d": 2}
    # the pre-tokenized path holds them all
    assert export_validated(run, tmp_path / "tj", "tokens-jsonl", tokenizer=section) == {"d": 2}


def test_export_leaves_out_the_mis_trained_rows_and_keeps_the_rest(tmp_path):
    run = _run(tmp_path, ["k-sys-tool", "k-plain"])
    left: list[tuple[str, str]] = []
    got = export_validated(run, tmp_path / "sf", "specforge", tokenizer=TokenizerSection(path=str(kimi_dir())),
                           on_left_out=lambda rid, why: left.append((rid, why)))
    assert got == {"d": 1}
    rows = [json.loads(x) for x in (tmp_path / "sf" / "d.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["d:k-sys-tool"]
    assert [rid for rid, _ in left] == ["d:k-plain"]
    assert left[0][1].startswith("SpecForge kimi-k2-thinking (a6b6b02): reasoning dropped")
