"""The server's own generated token ids (vLLM ``return_token_ids``): asked for only when ``[provider]
return_token_ids`` is set, read from the wire shapes vLLM sends, stored with the result and compared by
validation with the reconstruction (``token_ids_disagree``).

vLLM's shapes (``vllm/entrypoints/openai/chat_completion/protocol.py`` and ``serving.py``): a streamed chunk
carries the ids it generated in ``choices[i].token_ids`` (the first, role-only chunk carries the prompt's in a
top-level ``prompt_token_ids`` and no ``token_ids``; a chunk whose delta is empty, e.g. the ``</think>`` token
under a reasoning parser, still carries its id); a non-streamed response carries the whole list in
``choices[i].token_ids`` and the prompt's in a top-level ``prompt_token_ids``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from casesrv import MODEL, CaseServer, Reply, case_config, chunk, last_user, run_case, stream, usage
from fixtures_tokens import kimi_dir, kimi_encoding, true_count
from helpers import acc_of, store_rows

from engine.client.accumulate import parse_completion_body
from engine.client.chat import ChatClient
from engine.client.types import ChatRequest
from engine.config.provider import ProviderSection

R, C = "Two and two make four.", "The answer is 4."


def with_ids(c: dict, ids: list | None) -> dict:
    """``c`` with ``choices[0].token_ids = ids`` (vLLM's per-choice field)."""
    c["choices"][0]["token_ids"] = ids
    return c


def vllm_stream_chunks(r_ids: list, end_id: int, c_ids: list, eot_id: int, *, prompt_ids: list | None = None) -> list:
    """A vLLM-shaped stream: role chunk (prompt ids at top level), reasoning, the ``</think>`` token with an
    empty delta, content in two pieces, the finish chunk with the end-of-turn id, a usage chunk (no choices)."""
    half = len(c_ids) // 2
    return [
        chunk({"role": "assistant", "content": ""}, prompt_token_ids=prompt_ids or [1, 2, 3]),
        with_ids(chunk({"reasoning_content": R}), r_ids),
        with_ids(chunk({}), [end_id]),
        with_ids(chunk({"content": C[:8]}), c_ids[:half]),
        with_ids(chunk({"content": C[8:]}), c_ids[half:]),
        with_ids(chunk({}, "stop"), [eot_id]),
        chunk(None, choices=False, usage=usage(9, len(r_ids) + len(c_ids) + 2)),
    ]


# -- (a) the accumulator and the non-streamed body --------------------------------------------------------------

def test_streamed_ids_are_concatenated_in_order_and_nothing_else_changes():
    chunks = vllm_stream_chunks([11, 12, 13], 500, [21, 22, 23, 24], 900)
    acc = acc_of(*chunks)
    c = acc.completion()
    assert c.token_ids == (11, 12, 13, 500, 21, 22, 23, 24, 900)
    assert type(c.token_ids) is tuple
    # the same stream without the ids assembles to the same completion, ids aside
    plain = acc_of(*[{**ch, "choices": [{k: v for k, v in ch["choices"][0].items() if k != "token_ids"}]}
                     if ch["choices"] else ch for ch in chunks]).completion()
    assert plain.token_ids is None
    assert (c.reasoning, c.content, c.finish_reason, c.usage, c.flags, c.usage_reported) == (
        plain.reasoning, plain.content, plain.finish_reason, plain.usage, plain.flags, plain.usage_reported)
    assert (c.reasoning, c.content, c.finish_reason, c.usage.completion_tokens) == (R, C, "stop", 9)
    # ids are not text: the character count (the tokens_received estimate) is the text's alone
    assert acc.progress.chars_received == len(R) + len(C)


@pytest.mark.parametrize("value", [None, []])
def test_null_or_empty_token_ids_on_every_chunk_give_none(value):
    c = acc_of(with_ids(chunk({"content": "hi"}), value), with_ids(chunk({}, "stop"), value)).completion()
    assert (c.content, c.token_ids) == ("hi", None)


def test_no_token_ids_field_gives_none():
    assert acc_of(chunk({"content": "hi"}), chunk({}, "stop")).completion().token_ids is None


@pytest.mark.parametrize("bad", ["1,2", {"0": 1}, 7])
def test_a_chunk_whose_token_ids_is_not_a_list_spoils_them_all(bad):
    c = acc_of(with_ids(chunk({"content": "a"}), [5, 6]), with_ids(chunk({"content": "b"}), bad),
               with_ids(chunk({}, "stop"), [7])).completion()
    assert (c.content, c.token_ids) == ("ab", None)


@pytest.mark.parametrize("bad", [["5"], [1.5], [True], [-1], [None]])
def test_ids_that_are_not_non_negative_ints_give_none(bad):
    c = acc_of(with_ids(chunk({"content": "a"}), [5, 6]), with_ids(chunk({}, "stop"), bad)).completion()
    assert (c.content, c.token_ids) == ("a", None)


def test_ids_on_a_chunk_with_a_non_empty_finish_and_after_it_on_a_late_usage_chunk():
    # ids carried by the finish chunk count; a chunk after [DONE] is read for usage only
    acc = acc_of(with_ids(chunk({"content": "x"}), [3]), with_ids(chunk({"content": "y"}, "stop"), [4, 9]))
    acc.feed_late(with_ids(chunk({}, usage=usage(1, 3)), [77]))
    assert acc.completion().token_ids == (3, 4, 9)


def vllm_body(*, token_ids: object = "absent", content: str = C, reasoning: str = R) -> bytes:
    choice: dict = {"index": 0, "message": {"role": "assistant", "content": content, "reasoning_content": reasoning},
                    "logprobs": None, "finish_reason": "stop", "stop_reason": None}
    if token_ids != "absent":
        choice["token_ids"] = token_ids
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "model": MODEL, "choices": [choice],
                       "usage": usage(9, 6), "prompt_logprobs": None, "prompt_token_ids": [1, 2, 3]}).encode()


def test_non_streamed_body_ids():
    c = parse_completion_body(vllm_body(token_ids=[11, 12, 500, 21, 900]), latency_s=0.5)
    assert c.token_ids == (11, 12, 500, 21, 900)
    assert (c.reasoning, c.content, c.finish_reason, c.usage.completion_tokens, c.latency_s) == (R, C, "stop", 6, 0.5)


@pytest.mark.parametrize("value", ["absent", None, [], "12", [1, "2"]])
def test_non_streamed_body_without_usable_ids_gives_none(value):
    c = parse_completion_body(vllm_body(token_ids=value))
    assert (c.content, c.token_ids) == (C, None)


# -- (b) the request asks for them only when configured -------------------------------------------------------------

def test_provider_setting_is_off_by_default_and_strict():
    assert ProviderSection().return_token_ids is False
    assert ProviderSection(kind="openai", base_url="http://127.0.0.1:8000/v1", return_token_ids=True).return_token_ids
    with pytest.raises(ValueError, match="return_token_ids"):
        ProviderSection(return_token_ids="sometimes")


@pytest.mark.parametrize("streamed", [True, False])
@pytest.mark.parametrize("ask", [True, False, None])
def test_request_body_carries_return_token_ids_only_when_asked(streamed, ask):
    ids = [4, 5, 6]

    def respond(req_body: dict, n: int) -> Reply:
        if not streamed:
            return Reply(headers=[("Content-Type", "application/json")], chunked=False,
                         pieces=[vllm_body(token_ids=ids)])
        return stream(with_ids(chunk({"content": C}), ids[:2]), with_ids(chunk({}, "stop"), ids[2:]))

    async def go():
        kw = {} if ask is None else {"return_token_ids": ask}
        async with ChatClient(srv.base_url, "k-1", stream=streamed, trust_env=False, **kw) as client:
            return await client.complete(ChatRequest(messages=[{"role": "user", "content": "q"}], max_tokens=16,
                                                     body={"model": MODEL}))

    with CaseServer(respond) as srv:
        c = asyncio.run(go())
    body, = srv.requests
    if ask:
        assert body["return_token_ids"] is True
    else:
        assert "return_token_ids" not in body
    assert (body["model"], body["max_tokens"], body["stream"]) == (MODEL, 16, streamed)
    assert c.content == C and c.token_ids == (4, 5, 6)  # read whenever sent


# -- (c) end to end: datagen run, validation, export ----------------------------------------------------------------

def kimi_ids(reasoning: str, content: str) -> tuple[list[int], int, list[int], int]:
    """(reasoning ids, ``</think>`` id, content ids, ``<|im_end|>`` id) in the fixture's vocabulary."""
    enc = kimi_encoding()
    end, = enc.encode("</think>", allowed_special="all")
    eot, = enc.encode("<|im_end|>", allowed_special="all")
    return enc.encode(reasoning), end, enc.encode(content), eot


def server_ids(q: str) -> list[int] | None:
    """What the scripted vLLM returns for row ``q``: the right ids, ids off by one token, or none."""
    r_ids, end, c_ids, eot = kimi_ids(R, C)
    if q.startswith("none"):
        return None
    if q.startswith("differ"):
        c_ids = [c_ids[0] + 1, *c_ids[1:]]  # one content token replaced by its neighbour in the vocabulary
    return [*r_ids, end, *c_ids, eot]


@pytest.mark.parametrize("streamed", [True, False])
def test_run_stores_server_ids_and_validation_compares_them(tmp_path, streamed):
    r_ids, end, c_ids, eot = kimi_ids(R, C)
    right = [*r_ids, end, *c_ids, eot]
    assert len(right) == true_count(R, C)  # the layout the billing check and the reconstruction count

    def respond(req_body: dict, n: int) -> Reply:
        q = last_user(req_body)
        ids = server_ids(q)
        u = usage(9, true_count(R, C))
        if not streamed:
            body = json.loads(vllm_body(token_ids=ids if ids is not None else "absent"))
            body["usage"] = u
            return Reply(headers=[("Content-Type", "application/json")], chunked=False,
                         pieces=[json.dumps(body).encode()])
        if ids is None:
            return stream(chunk({"reasoning_content": R}), chunk({"content": C}), chunk({}, "stop"),
                          chunk(None, choices=False, usage=u))
        n_r = len(r_ids)
        return stream(chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1, 2, 3]),
                      with_ids(chunk({"reasoning_content": R}), ids[:n_r]),
                      with_ids(chunk({}), ids[n_r:n_r + 1]),
                      with_ids(chunk({"content": C}), ids[n_r + 1:-1]),
                      with_ids(chunk({}, "stop"), ids[-1:]),
                      chunk(None, choices=False, usage=u))

    qs = ["match: one", "differ: two", "none: three"]
    with CaseServer(respond) as srv:
        cfg = case_config(tmp_path, srv.base_url, [{"messages": [{"role": "user", "content": q}]} for q in qs],
                          tokenizer=kimi_dir(), max_tokens=256)
        setting = f"return_token_ids = true\nstream = {'true' if streamed else 'false'}"
        cfg.write_text(cfg.read_text().replace('api_key_env = "CASE_KEY"', f'api_key_env = "CASE_KEY"\n{setting}'))
        r = run_case(cfg)
        bodies = list(srv.requests)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(bodies) == 3 and all(b["return_token_ids"] is True and b["stream"] is streamed for b in bodies)
    run = tmp_path / "run"
    got = {json.loads(m)[-1]["content"]: (json.loads(tids) if tids is not None else None, ok, json.loads(reasons))
           for m, tids, ok, reasons in store_rows(
               run, "SELECT p.messages, r.token_ids, v.ok, v.reasons FROM results r "
                    "JOIN prompts p ON p.id = r.prompt_id JOIN validations v ON v.prompt_id = r.prompt_id")}
    wrong = server_ids("differ")
    assert wrong != right and len(wrong) == len(right) and sum(a != b for a, b in zip(wrong, right, strict=True)) == 1
    assert got == {
        "match: one": (right, 1, []),
        "differ: two": (wrong, 0, ["token_ids_disagree"]),
        "none: three": (None, 1, []),
    }
    out = tmp_path / "openai"
    e = subprocess.run([sys.executable, "-m", "datagen", "export", str(run), "--format", "openai", "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert e.returncode == 0, e.stdout + e.stderr
    exported = [json.loads(line) for line in (out / "d.jsonl").read_text().splitlines()]
    assert sorted(x["messages"][0]["content"] for x in exported) == ["match: one", "none: three"]
    assert all(x["messages"][-1]["content"] == C for x in exported)


def test_run_without_the_setting_does_not_ask(tmp_path):
    with CaseServer(lambda req_body, n: stream(chunk({"content": C}), chunk({}, "stop", usage=usage(9, 6)))) as srv:
        cfg = case_config(tmp_path, srv.base_url, [{"messages": [{"role": "user", "content": "q"}]}])
        r = run_case(cfg)
        bodies = list(srv.requests)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(bodies) == 1 and "return_token_ids" not in bodies[0]
    assert store_rows(tmp_path / "run", "SELECT content, token_ids FROM results") == [(C, None)]
