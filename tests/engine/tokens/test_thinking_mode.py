"""A reply in another mode than the run asked for is kept out of training, and a config that can only buy such
replies is refused or sent with the switch, before the first request (issue 36, cases 28 and 29: opencode #12090,
cherry-studio #12632, vLLM #43728, workers-sdk #13239)."""

from __future__ import annotations

from pathlib import Path

import pytest
from casesrv import CaseServer, Reply, case_config, chunk, cli, last_user, run_case, stream, usage
from fixtures_tokens import kimi_dir, kimi_encoding, true_count

from engine.config import TokenizerSection
from engine.tokens.modeswitch import ModeConflict, plan
from engine.tokens.reconstruct import Record, reconstruct
from engine.tokens.tokenizer import load_tokenizer
from engine.tokens.validate import check

R = "The user wants a short fact; I will answer in one sentence."


@pytest.fixture(scope="module")
def think():
    return load_tokenizer(TokenizerSection(path=str(kimi_dir())))


@pytest.fixture(scope="module")
def instant():
    return load_tokenizer(TokenizerSection(path=str(kimi_dir()), thinking=False))


def rec(reasoning: str = "", content: str = "Paris.", reasoning_tokens: int = 0, tool_calls=(), finish="stop",
        tools=()) -> Record:
    return Record(prompt_id=1, dataset="d", key="k", messages=[{"role": "user", "content": "Capital of France?"}],
                  tools=list(tools), reasoning=reasoning, content=content, tool_calls=list(tool_calls),
                  finish_reason=finish, reasoning_tokens=reasoning_tokens)


def reasons(tok, r: Record) -> list[str]:
    return check(reconstruct(tok, r), r, thinking=tok.thinking, ids=tok.ids).reasons


# -- validation: the mode a reply was generated in ---------------------------------------------------------
def test_an_instant_reply_in_a_thinking_run_is_rejected(think):
    assert reasons(think, rec()) == ["instant_reply"]  # case 28: content only, no reasoning billed
    tools = [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]
    call = {"id": "functions.w:0", "type": "function", "function": {"name": "w", "arguments": "{}"}}
    assert reasons(think, rec(content="", tool_calls=[call], tools=tools, finish="tool_calls")) == ["instant_reply"]
    # a thinking reply, and one whose reasoning text was withheld (billed): not this reason
    assert reasons(think, rec(reasoning=R)) == []
    assert reasons(think, rec(reasoning_tokens=12)) == ["reasoning_missing"]
    # never a training sample whose first generated token is </think>: the record fails, its ids say why
    ids = reconstruct(think, rec()).completion_ids
    assert ids[0] == think.ids["think_end"]


def test_a_thinking_reply_in_an_instant_run_is_rejected_with_or_without_its_text(instant):
    assert reasons(instant, rec()) == []
    assert "reasoning_unexpected" in reasons(instant, rec(reasoning=R))
    # reasoning withheld but billed: the server thought (billing would disagree too)
    assert "reasoning_unexpected" in reasons(instant, rec(reasoning_tokens=12))


# -- the plan: refuse or send the switch ----------------------------------------------------------------
OFF = [({"enabled": False}, {}), ({"effort": "none"}, {}), (None, {"chat_template_kwargs": {"thinking": False}}),
       (None, {"chat_template_kwargs": {"enable_thinking": False}}), (None, {"thinking": {"type": "disabled"}}),
       (None, {"reasoning": {"enabled": False}}), ({"max_tokens": 0}, {})]
ON = [({"effort": "high"}, {}), ({"enabled": True}, {}), ({"max_tokens": 8000}, {}),
      (None, {"chat_template_kwargs": {"thinking": True}}), (None, {"thinking": {"type": "enabled"}})]


@pytest.mark.parametrize("kind", ["openrouter", "openai", "simulated"])
@pytest.mark.parametrize("reasoning,extra", OFF)
def test_thinking_on_with_a_switch_off_is_refused(kind, reasoning, extra):
    with pytest.raises(ModeConflict, match="thinking = true but .* turns the target's thinking off"):
        plan(True, kind, reasoning, extra)
    assert plan(False, kind, reasoning, extra).add == {}  # the switch is there: nothing added


@pytest.mark.parametrize("kind", ["openrouter", "openai", "simulated"])
@pytest.mark.parametrize("reasoning,extra", ON)
def test_thinking_off_with_a_switch_on_is_refused(kind, reasoning, extra):
    with pytest.raises(ModeConflict, match="thinking = false but .* turns the target's thinking on"):
        plan(False, kind, reasoning, extra)
    assert plan(True, kind, reasoning, extra).add == {}


@pytest.mark.parametrize("reasoning,extra", [({"exclude": True}, {}), ({"effort": "high", "exclude": True}, {}),
                                             (None, {"include_reasoning": False})])
def test_reasoning_withheld_in_a_thinking_run_is_refused(reasoning, extra):
    with pytest.raises(ModeConflict, match="withholds the reasoning text"):
        plan(True, "openrouter", reasoning, extra)


def test_contradicting_switches_are_refused():
    with pytest.raises(ModeConflict, match="contradict each other"):
        plan(False, "openai", {"effort": "high"}, {"chat_template_kwargs": {"thinking": False}})


def test_thinking_off_without_a_switch_sends_openrouters_or_refuses():
    p = plan(False, "openrouter", {"max_tokens": None}, {})
    assert p.add == {"reasoning": {"max_tokens": None, "enabled": False}} and "enabled = false" in (p.note or "")
    assert plan(False, "simulated", None, {}).add == {"reasoning": {"enabled": False}}
    with pytest.raises(ModeConflict, match="chat_template_kwargs = { thinking = false }"):
        plan(False, "openai", None, {})
    assert plan(True, "openai", None, {}) == plan(True, "openrouter", {"effort": "high"}, {}) == plan(True, "x", None, {})


# -- end to end against a scripted server (vLLM-style: thinks unless a switch it reads says not to) ---------
def thinks_unless_told(req: dict, n: int) -> Reply:
    off = ((req.get("chat_template_kwargs") or {}).get("thinking") is False
           or (req.get("reasoning") or {}).get("enabled") is False
           or (req.get("thinking") or {}).get("type") == "disabled")
    c = "Answer to: " + last_user(req)[:30]
    if off:
        return stream(chunk({"role": "assistant", "content": c}), chunk({}, "stop"),
                      chunk(None, choices=False, usage=usage(20, len(kimi_encoding().encode(c)) + 1, 0)))
    return stream(chunk({"role": "assistant", "reasoning_content": R}), chunk({"content": c}), chunk({}, "stop"),
                  chunk(None, choices=False, usage=usage(20, true_count(R, c), len(kimi_encoding().encode(R)))))


def instant_mostly(req: dict, n: int) -> Reply:
    """Case 28's provider: three of four replies in instant mode although thinking was asked for."""
    c = "Oxygen has atomic number 8."
    if last_user(req).startswith("control"):
        return stream(chunk({"role": "assistant", "reasoning": R}), chunk({"content": c}), chunk({}, "stop"),
                      chunk(None, choices=False, usage=usage(20, true_count(R, c), len(kimi_encoding().encode(R)))))
    return stream(chunk({"role": "assistant", "content": ""}), chunk({"content": c}), chunk({}, "stop"),
                  chunk(None, choices=False, usage=usage(20, len(kimi_encoding().encode(c)) + 1, 0)))


def _prompts(n: int, head: str = "fact") -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"{head} {i}: name one planet with rings."}]} for i in range(n)]


def _export_tokens(tmp: Path) -> tuple[int, str]:
    r = cli("export", str(tmp / "run"), "--format", "tokens", "--out", str(tmp / "tok"))
    rows = 0
    for line in r.stdout.splitlines():
        if ".parquet:" in line:
            rows += int(line.split(":")[-1].split()[0])
    return rows, r.stdout + r.stderr


@pytest.mark.parametrize("switch", [
    "[generation]\nextra_body = { chat_template_kwargs = { thinking = false } }\n",
    "[generation]\nreasoning = { enabled = false }\n",
    '[generation]\nextra_body = { thinking = { type = "disabled" } }\n',
])
def test_case29_with_the_switch_every_record_is_valid(tmp_path, switch):
    with CaseServer(thinks_unless_told) as srv:
        cfg = case_config(tmp_path, srv.base_url, _prompts(6), tokenizer=kimi_dir(), extra=switch)
        cfg.write_text(cfg.read_text().replace('executor = "thread"\n', 'executor = "thread"\nthinking = false\n'))
        r = run_case(cfg)
        assert r.returncode == 0, r.stdout + r.stderr
    assert len(srv.requests) == 6
    rows, out = _export_tokens(tmp_path)
    assert rows == 6, out


def test_case29_without_a_switch_kind_openai_is_refused_before_any_request(tmp_path):
    with CaseServer(thinks_unless_told) as srv:
        cfg = case_config(tmp_path, srv.base_url, _prompts(12), tokenizer=kimi_dir())
        cfg.write_text(cfg.read_text().replace('executor = "thread"\n', 'executor = "thread"\nthinking = false\n'))
        r = run_case(cfg)
    assert r.returncode == 1
    err = [x for x in (r.stdout + r.stderr).splitlines() if x.startswith("error:")]
    assert len(err) == 1 and "chat_template_kwargs = { thinking = false }" in err[0], r.stdout + r.stderr
    assert srv.requests == [] and not (tmp_path / "run" / "store.sqlite").exists()


def test_case29_without_a_switch_kind_openrouter_sends_its_switch(tmp_path):
    with CaseServer(thinks_unless_told) as srv:
        cfg = case_config(tmp_path, srv.base_url, _prompts(5), tokenizer=kimi_dir(), kind="openrouter")
        cfg.write_text(cfg.read_text().replace('executor = "thread"\n', 'executor = "thread"\nthinking = false\n'))
        r = run_case(cfg)
        assert r.returncode == 0, r.stdout + r.stderr
    assert "sending reasoning = { enabled = false }" in r.stdout
    assert len(srv.requests) == 5 and all(q["reasoning"] == {"enabled": False} for q in srv.requests)
    assert _export_tokens(tmp_path)[0] == 5


def test_case28_instant_replies_in_a_thinking_run_are_left_out(tmp_path):
    ps = _prompts(5, "instant") + _prompts(2, "control")
    with CaseServer(instant_mostly) as srv:
        cfg = case_config(tmp_path, srv.base_url, ps, tokenizer=kimi_dir(), kind="openrouter",
                          extra='[generation]\nreasoning = { effort = "high" }\n')
        r = run_case(cfg)
        assert r.returncode == 0, r.stdout + r.stderr
    assert all(q["reasoning"] == {"effort": "high"} for q in srv.requests)
    rows, out = _export_tokens(tmp_path)
    assert rows == 2 and "instant_reply 5" in out, out
