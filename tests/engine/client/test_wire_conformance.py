"""The wire contract (docs/wire-conformance.md): where usage and cost arrive, what a finish means, whether
the text is the model's. Each kind is tested beyond the handed case (``../shared/cases/20..25``): other
places, other aliases, other pieces of text; first on the pure rules, then through the real client
against a scripted server on 127.0.0.1, then end to end (``datagen run`` + validation + export).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from casesrv import DONE, CaseServer, Reply, case_config, chunk, last_user, run_case, sse, stream, usage
from fixtures_tokens import kimi_dir, true_count
from helpers import acc_of, store_rows

from engine.client.chat import ChatClient
from engine.client.conformance import FAILING, NOTES, finalize, finish_aliases, read_usage, resolve_finish
from engine.client.types import ChatRequest, Completion, ToolCall, Usage
from engine.tokens.validate import REASONS


def completion(content: str = "ok", reasoning: str = "", finish: str = "stop", completion_tokens: int = 5,
               calls: tuple = (), reported: bool = True) -> Completion:
    return Completion(reasoning=reasoning, content=content, tool_calls=calls, finish_reason=finish,
                      native_finish_reason=None, usage=Usage(3, completion_tokens, 0, None), provider="P", model="m",
                      generation_id="g", latency_s=1.0, ttft_s=0.1, usage_reported=reported)


def req(text: str = "hi", max_tokens: int = 100) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": text}], max_tokens=max_tokens)


# -- the pure rules ---------------------------------------------------------------------------------------

def test_every_failing_flag_is_a_validation_reason_and_notes_are_not():
    assert set(FAILING) <= set(REASONS)
    assert not set(NOTES) & set(REASONS)


@pytest.mark.parametrize("u,expected,flags", [
    # OpenAI/OpenRouter: completion includes reasoning
    ({"prompt_tokens": 9, "completion_tokens": 50, "completion_tokens_details": {"reasoning_tokens": 30},
      "cost": 0.002}, Usage(9, 50, 30, 0.002), ()),
    # xAI/Gemini style: reasoning reported apart and larger than the answer
    ({"prompt_tokens": 9, "completion_tokens": 12, "completion_tokens_details": {"reasoning_tokens": 700}},
     Usage(9, 712, 700, None), ("usage_reasoning_outside",)),
    # numeric strings
    ({"prompt_tokens": "9", "completion_tokens": "3", "completion_tokens_details": {"reasoning_tokens": "4"}},
     Usage(9, 7, 4, None), ("usage_reasoning_outside",)),
    # BYOK: OpenRouter's fee in cost, the provider's charge upstream
    ({"prompt_tokens": 1, "completion_tokens": 2, "cost": 0.0005, "is_byok": True,
      "cost_details": {"upstream_inference_cost": 0.01}}, Usage(1, 2, 0, 0.0105), ("byok_upstream_cost",)),
    # BYOK with cost 0 and no is_byok field: the upstream cost is the spend
    ({"prompt_tokens": 1, "completion_tokens": 2, "cost": 0, "cost_details": {"upstream_inference_cost": "0.02"}},
     Usage(1, 2, 0, 0.02), ("byok_upstream_cost",)),
    # not BYOK: cost already includes the upstream figure (never counted twice)
    ({"prompt_tokens": 1, "completion_tokens": 2, "cost": 0.03, "is_byok": False,
      "cost_details": {"upstream_inference_cost": 0.03}}, Usage(1, 2, 0, 0.03), ()),
    ("not a usage", Usage(), ()),
])
def test_read_usage(u, expected, flags):
    got, f = read_usage(u)
    assert (got.prompt_tokens, got.completion_tokens, got.reasoning_tokens) == (
        expected.prompt_tokens, expected.completion_tokens, expected.reasoning_tokens)
    if expected.cost_usd is None:
        assert got.cost_usd is None
    else:
        assert got.cost_usd == pytest.approx(expected.cost_usd)
    assert f == flags


def test_finish_aliases_and_a_configured_one():
    table = finish_aliases({"Complete": "stop", "cut": "length"})
    assert [resolve_finish(x, table) for x in ("stop", "eos", "END", "complete", "cut", "stop_sequence", "abort")] == [
        ("stop", False), ("stop", True), ("stop", True), ("stop", True), ("length", True), ("stop", True),
        ("abort", False)]
    with pytest.raises(ValueError, match="finish_reasons.x: expected one of"):
        finish_aliases({"x": "done"})


def test_stop_that_reached_max_tokens_is_a_cut():
    c = finalize(req(max_tokens=40), completion(completion_tokens=40))
    assert (c.finish_reason, c.flags) == ("length", ("stop_at_max_tokens",))
    # one token short of the cap: a natural stop, untouched (the same object)
    c0 = completion(completion_tokens=39)
    assert finalize(req(max_tokens=40), c0) is c0
    # no usage: nothing to decide it on
    assert finalize(req(max_tokens=40), completion(completion_tokens=0, reported=False)).finish_reason == "stop"


@pytest.mark.parametrize("where", ["content", "reasoning", "arguments", "name"])
def test_replacement_char_anywhere_generated_is_flagged(where):
    kw = {"content": "ok", "reasoning": "", "calls": ()}
    if where in ("arguments", "name"):
        kw["calls"] = (ToolCall("functions.f:0", "f\ufffd" if where == "name" else "f",
                                '{"a": "\ufffd"}' if where == "arguments" else "{}"),)
    else:
        kw[where] = "caf\ufffd"
    assert "replacement_char" in finalize(req(), completion(**kw)).flags


def test_replacement_char_the_prompt_holds_is_not_flagged():
    assert finalize(req("repeat: \ufffd"), completion(content="\ufffd")).flags == ()


# -- the accumulator: usage places, previews, order of reasoning and content ---------------------------------

def test_usage_inside_the_choice_and_in_an_extension_object():
    c = acc_of(chunk({"content": "hi"}), {"id": "g", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop",
                                                                    "usage": usage(5, 7)}]}).completion()
    assert (c.usage.completion_tokens, c.usage_reported, c.flags) == (7, True, ("usage_in_choice",))
    c = acc_of(chunk({"content": "hi"}), chunk({}, "stop", x_groq={"id": "req_1", "usage": usage(5, 9)})).completion()
    assert (c.usage.completion_tokens, c.flags) == (9, ("usage_extension",))


def test_running_totals_end_on_the_final_figure():
    c = acc_of(chunk({"content": "a"}, usage=usage(5, 1)), chunk({"content": "b"}, usage=usage(5, 2)),
               chunk({"content": "c"}, usage=usage(5, 3)), chunk({}, "stop", usage=usage(5, 4))).completion()
    assert (c.usage.completion_tokens, c.flags) == (4, ())


def test_a_preview_usage_before_any_text_is_not_the_generations():
    # preview only: no usage at all (accounted another way)
    c = acc_of(chunk({"role": "assistant"}, usage=usage(5, 0, cost=0.0)), chunk({"content": "hello"}),
               chunk({}, "stop")).completion()
    assert (c.usage_reported, c.usage.completion_tokens, c.flags) == (False, 0, ("usage_preview",))
    # preview then the final figure: the final one, no flag
    c = acc_of(chunk({"role": "assistant"}, usage=usage(5, 1)), chunk({"content": "hello"}),
               chunk({}, "stop", usage=usage(5, 3, cost=0.001))).completion()
    assert (c.usage_reported, c.usage.completion_tokens, c.usage.cost_usd, c.flags) == (True, 3, 0.001, ())
    # usage in the same chunk as the first text: not a preview
    c = acc_of(chunk({"content": "hello"}, usage=usage(5, 2)), chunk({}, "stop")).completion()
    assert (c.usage.completion_tokens, c.flags) == (2, ())


def test_usage_after_done_is_read_by_feed_late():
    acc = acc_of(chunk({"content": "hi"}), chunk({}, "stop"))
    acc.feed_late(chunk(None, choices=False, usage=usage(5, 6, cost=0.01)))
    c = acc.completion()
    assert (c.usage.completion_tokens, c.usage.cost_usd, c.flags) == (6, 0.01, ("usage_after_done",))


@pytest.mark.parametrize("chunks,flagged", [
    # A, B, C, D: thinking resumed after the answer began
    ([{"reasoning_content": "A"}, {"content": "B"}, {"reasoning_content": "C"}, {"content": "D"}], True),
    # OpenRouter spelling, resumed once at the very end
    ([{"reasoning": "A"}, {"content": "B"}, {"reasoning": "C"}], True),
    # reasoning after a tool call started
    ([{"reasoning": "A"}, {"tool_calls": [{"index": 0, "id": "functions.f:0", "function": {"name": "f", "arguments": "{}"}}]},
      {"reasoning": "B"}], True),
    # the last reasoning and the first content in one chunk: legal
    ([{"reasoning_content": "A"}, {"reasoning_content": "C", "content": "B"}, {"content": "D"}], False),
    # reasoning in several pieces before the content: legal
    ([{"reasoning_content": "A"}, {"reasoning_content": "C"}, {"content": "B"}], False),
])
def test_reasoning_after_content_is_flagged(chunks, flagged):
    c = acc_of(*[chunk(d) for d in chunks], chunk({}, "stop")).completion()
    assert ("reasoning_after_content" in c.flags) is flagged


# -- the real client against a scripted server ----------------------------------------------------------------

def _complete(respond, request: ChatRequest) -> Completion:
    async def go():
        with CaseServer(respond) as srv:
            async with ChatClient(srv.base_url, "k-123", drain_timeout_s=1.0) as client:
                return await client.complete(request)
    return asyncio.run(go())


def test_client_reads_usage_sent_after_done_in_the_same_read_and_in_a_later_one():
    late = sse(chunk(None, choices=False, usage=usage(4, 9, cost=0.02)))
    for pieces in ([sse(chunk({"content": "hi"})), sse(chunk({}, "stop")) + DONE + late],
                   [sse(chunk({"content": "hi"})), sse(chunk({}, "stop")), DONE, 0.05, late]):
        c = _complete(lambda r, n, pieces=pieces: Reply(pieces=pieces), req())
        assert (c.usage.completion_tokens, c.usage.cost_usd, c.flags) == (9, 0.02, ("usage_after_done",))


def test_client_flags_bytes_of_one_character_split_over_two_events():
    b = "Un café".encode()
    i = b.index(b"\xc3\xa9") + 1
    pieces = [b'data: {"id":"g","choices":[{"index":0,"delta":{"content":"' + p + b'"},"finish_reason":null}]}\n\n'
              for p in (b[:i], b[i:])] + [sse(chunk({}, "stop", usage=usage(3, 4))), DONE]
    c = _complete(lambda r, n: Reply(pieces=pieces), req())
    assert "\ufffd" in c.content and c.flags == ("replacement_char",)


def test_client_turns_a_stop_at_max_tokens_into_a_cut_non_streamed_too():
    body = json.dumps({"id": "g", "choices": [{"index": 0, "message": {"content": "x " * 16},
                                               "finish_reason": "eos"}], "usage": usage(3, 16)}).encode()

    async def go():
        with CaseServer(lambda r, n: Reply(headers=[("Content-Type", "application/json")], pieces=[body],
                                           chunked=False)) as srv:
            async with ChatClient(srv.base_url, "k-123", stream=False) as client:
                return await client.complete(req(max_tokens=16))
    c = asyncio.run(go())
    assert (c.finish_reason, c.native_finish_reason, c.flags) == ("length", "eos", ("finish_alias", "stop_at_max_tokens"))


# -- end to end: datagen run, validation, status, export --------------------------------------------------------

def _respond_mixed(req_body: dict, n: int) -> Reply:
    """Per row: a configured finish alias, a reasoning U+FFFD, a provider's usage in the choice, a stop that
    reached max_tokens, thinking resumed after a tool call."""
    q = last_user(req_body)
    r, c = "Thinking it over.", "Fine answer here."
    if q.startswith("alias"):
        return stream(chunk({"reasoning": r}), chunk({"content": c}), chunk({}, "completed", usage=usage(9, true_count(r, c))),
                      )
    if q.startswith("fffd"):
        r2 = "Le caf\ufffd\ufffd est pr\u00eat."
        return stream(chunk({"reasoning": r2}), chunk({"content": c}), chunk({}, "stop", usage=usage(9, true_count(r2, c))))
    if q.startswith("choice"):
        return stream(chunk({"reasoning": r}, provider="Odd"), chunk({"content": c}, provider="Odd"),
                      {"id": "g", "provider": "Odd", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop",
                                                                 "usage": usage(9, true_count(r, c))}]})
    if q.startswith("maxed"):
        long = "word " * 40
        return stream(chunk({"reasoning": r}), chunk({"content": long}), chunk({}, "stop", usage=usage(9, 64)))
    return stream(chunk({"reasoning": r}), chunk({"content": c}), chunk({}, "stop", usage=usage(9, true_count(r, c))))


def test_run_flags_stores_counts_per_provider_and_exports_only_the_models_text(tmp_path):
    qs = ["alias: one", "fffd: two", "choice: three", "maxed: four", "plain: five"]
    with CaseServer(_respond_mixed) as srv:
        cfg = case_config(tmp_path, srv.base_url, [{"messages": [{"role": "user", "content": q}]} for q in qs],
                          tokenizer=kimi_dir(), max_tokens=64)
        text = cfg.read_text().replace('api_key_env = "CASE_KEY"',
                                       'api_key_env = "CASE_KEY"\nfinish_reasons = { completed = "stop" }')
        cfg.write_text(text)
        r = run_case(cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    run = tmp_path / "run"
    got = {json.loads(m)[-1]["content"]: (fin, wf, ok, json.loads(reasons)) for m, fin, wf, ok, reasons in store_rows(
        run, "SELECT p.messages, r.finish_reason, r.wire_flags, v.ok, v.reasons FROM results r "
             "JOIN prompts p ON p.id = r.prompt_id JOIN validations v ON v.prompt_id = r.prompt_id")}
    assert got == {
        "alias: one": ("stop", "finish_alias", 1, []),
        "fffd: two": ("stop", "replacement_char", 0, ["replacement_char"]),
        "choice: three": ("stop", "usage_in_choice", 1, []),
        "maxed: four": ("length", "stop_at_max_tokens", 0, ["truncated"]),
        "plain: five": ("stop", "", 1, []),
    }
    st = json.loads(subprocess.run([sys.executable, "-m", "datagen", "status", str(run), "--json"],
                                   capture_output=True, text=True, timeout=60).stdout)
    flags = {p["name"]: p["flags"] for p in st["providers"]}
    assert flags == {"Scripted": {"finish_alias": 1, "replacement_char": 1, "stop_at_max_tokens": 1}, "Odd": {"usage_in_choice": 1}}
    out = tmp_path / "openai"
    e = subprocess.run([sys.executable, "-m", "datagen", "export", str(run), "--format", "openai", "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert e.returncode == 0, e.stdout + e.stderr
    exported = [json.loads(line) for line in (out / "d.jsonl").read_text().splitlines()]
    assert len(exported) == 3 and "\ufffd" not in json.dumps(exported, ensure_ascii=False)
    raw = tmp_path / "raw"
    subprocess.run([sys.executable, "-m", "datagen", "export", str(run), "--format", "raw", "--out", str(raw)],
                   capture_output=True, text=True, timeout=120, check=True)
    assert sorted(json.loads(ln)["wire_flags"] for ln in (raw / "d.jsonl").read_text().splitlines()) == [
        "", "finish_alias", "replacement_char", "stop_at_max_tokens", "usage_in_choice"]


def test_byok_spend_counts_against_a_run_cap(tmp_path):
    """Another input of case 20's kind: BYOK with OpenRouter's own fee in ``cost`` (not 0) and the upstream
    charge apart; a RUN cap (not a dataset cap) stops buying once their sum reaches it."""
    def respond(req_body, n):
        u = dict(usage(9, 5), cost=0.001, is_byok=True, cost_details={"upstream_inference_cost": 0.019})
        return stream(chunk({"content": "Oslo."}), chunk({}, "stop"), chunk(None, choices=False, usage=u))

    with CaseServer(respond) as srv:
        cfg = case_config(tmp_path, srv.base_url, [{"messages": [{"role": "user", "content": f"q{i}"}]} for i in range(12)],
                          concurrency=1, extra="[spend]\nmax_cost_usd = 0.06\n")
        r = run_case(cfg)
        bought = len(srv.requests)
    assert r.returncode == 0, r.stdout + r.stderr
    (n, spent), = store_rows(tmp_path / "run", "SELECT COUNT(*), SUM(cost_usd) FROM results")
    assert n == 3 and bought == 3 and spent == pytest.approx(0.06)


def test_kimi_ids_passed_through_are_kept_verbatim_minted_ids_rebuilt():
    from engine.tokens.reconstruct import native_tool_calls

    def call(i, name):
        return {"id": i, "type": "function", "function": {"name": name, "arguments": "{}"}}
    calls = [call("functions.get_weather:0", "get_weather"), call("functions.get_weather:0", "get_weather"),
             call("call_8c1f3a", "search"), call("functions.other:7", "search"), call("functions.search:x", "search")]
    out, rebuilt = native_tool_calls(calls, 1, "functions.{name}:{index}")
    # what the model wrote stays, even in another shape (issue 36); what a provider minted is rebuilt
    assert [c["id"] for c in out] == ["functions.get_weather:0", "functions.get_weather:0", "functions.search:3",
                                      "functions.other:7", "functions.search:x"]
    assert rebuilt == 1
    odd = [call(i, "read") for i in ("functionsread3", "functions_read_3", "call00003", "call_Zx81Kq2mPa0b",
                                     "chatcmpl-tool-9f2c", "D681PevKs", "c1", "")]
    out, rebuilt = native_tool_calls(odd, 0, "functions.{name}:{index}")
    assert [c["id"] for c in out] == ["functionsread3", "functions_read_3", "call00003", "functions.read:3",
                                      "functions.read:4", "functions.read:5", "functions.read:6", "functions.read:7"]
    assert rebuilt == 5


def test_providers_pane_shows_flags_once_a_provider_has_some():
    from rich.console import Console

    from engine.metrics.stats import ProviderStats
    from tui.panes.providers import providers_table

    def render(stats):
        con = Console(width=120, record=True)
        con.print(providers_table(stats.snapshot()))
        return con.export_text()

    stats = ProviderStats()
    stats.record_success("Clean", 1.0, 0.1, 10, 0.001)
    assert "flags" not in render(stats)
    stats.record_success("Odd", 1.0, 0.1, 10, 0.001, flags=("finish_alias",))
    stats.record_success("Odd", 1.0, 0.1, 10, 0.001, flags=("finish_alias", "replacement_char"))
    stats.record_success("Notes", 1.0, 0.1, 10, 0.001, flags=("usage_in_choice",))
    lines = {ln.split()[0]: ln.split()[-1] for ln in render(stats).splitlines() if ln.strip()}
    assert (lines["provider"], lines["Odd"], lines["Notes"], lines["Clean"]) == ("flags", "1!", "1", "-")
    assert {p.name: p.flags for p in stats.snapshot()}["Odd"] == {"finish_alias": 2, "replacement_char": 1}


def test_non_streamed_body_with_invalid_utf8_is_stored_flagged_not_failed():
    body = b'{"id":"g","choices":[{"index":0,"message":{"content":"Un caf\xc3 au lait."},"finish_reason":"stop"}],' \
           b'"usage":{"prompt_tokens":3,"completion_tokens":6,"cost":0.0001}}'

    async def go():
        with CaseServer(lambda r, n: Reply(headers=[("Content-Type", "application/json")], pieces=[body],
                                           chunked=False)) as srv:
            async with ChatClient(srv.base_url, "k-123", stream=False) as client:
                return await client.complete(req())
    c = asyncio.run(go())
    assert (c.content, c.usage.cost_usd, c.flags) == ("Un caf\ufffd au lait.", 0.0001, ("replacement_char",))


@pytest.mark.parametrize("fin,calls,flag", [("content_filter", (), "content_filtered"),
                                            ("tool_calls", (), "tool_calls_missing"),
                                            ("halted", (), "unknown_finish"),
                                            ("tool_calls", (ToolCall("functions.f:0", "f", "{}"),), None)])
def test_finishes_that_leave_the_text_in_doubt_are_flagged(fin, calls, flag):
    flags = finalize(req(), completion(finish=fin, calls=calls)).flags
    assert flags == ((flag,) if flag else ())
    assert flag is None or flag in REASONS


def test_a_standard_finish_cannot_be_made_an_alias():
    with pytest.raises(ValueError, match="finish_reasons.stop: 'stop' is a standard finish reason"):
        finish_aliases({"stop": "length"})
    from engine.config.provider import ProviderSection

    with pytest.raises(ValueError, match="finish_reasons"):
        ProviderSection(kind="openai", base_url="http://127.0.0.1:1/v1", finish_reasons={"Length": "stop"})
