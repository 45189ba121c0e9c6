"""Pure tests of the client's parsing, classification and retry timing (no sockets)."""

from __future__ import annotations

import asyncio
import email.utils
import json
import random

import pytest

from engine.client.accumulate import (
    StreamAccumulator,
    StreamProgress,
    estimate_tokens,
    parse_completion_body,
    reasoning_text,
)
from engine.client.errors import MAX_RETRY_AFTER_S, classify_http_error, parse_retry_after
from engine.client.retry import RetryPolicy, call_with_retries
from engine.client.sse import DONE, SSEDecodeError, SSEParser
from engine.client.types import ErrorClass, RequestError

NOW = 1_770_000_000.0


def chunk(delta=None, finish=None, usage=None, **top):
    c = {"id": "gen-1", "model": "moonshotai/kimi-k2.5-0127", "provider": "Chutes", "object": "chat.completion.chunk"}
    c.update(top)
    choices = []
    if delta is not None or finish is not None:
        ch = {"index": 0, "delta": delta or {}, "finish_reason": finish}
        if finish:
            ch["native_finish_reason"] = finish
        choices.append(ch)
    c["choices"] = choices
    if usage is not None:
        c["usage"] = usage
    return c


USAGE = {
    "prompt_tokens": 31,
    "completion_tokens": 12,
    "total_tokens": 43,
    "cost": 0.0000376,
    "prompt_tokens_details": {"cached_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 6},
}


def run_acc(chunks):
    """Feed chunks with a fake clock that reads i + 1 while chunk i is fed (t_start = 0)."""
    now = [0.0]
    acc = StreamAccumulator(t_start=0.0, clock=lambda: now[0])
    for i, c in enumerate(chunks):
        now[0] = float(i + 1)
        acc.feed(c)
    return acc


# --------------------------------------------------------------------------------------------- SSE parser


def test_sse_skips_comments_and_parses_data_and_done():
    p = SSEParser()
    out = p.feed(b": OPENROUTER PROCESSING\n\n: OPENROUTER PROCESSING\n\ndata: {\"a\": 1}\n\ndata: [DONE]\n\n")
    assert out == [{"a": 1}, DONE]
    assert p.comments == 2 and p.events == 2


def test_sse_data_without_space_crlf_and_split_reads():
    raw = b'data:{"a":1}\r\n\r\ndata: {"b": "x\\ny"}\r\n\r\n:ping\r\n\r\ndata: [DONE]\r\n\r\n'
    # byte-by-byte feeding exercises CRLF split across reads and partial lines
    p = SSEParser()
    out = []
    for i in range(len(raw)):
        out.extend(p.feed(raw[i : i + 1]))
    assert out == [{"a": 1}, {"b": "x\ny"}, DONE]
    # bare CR line endings too
    assert SSEParser().feed(b'data: {"c": 2}\r\rdata: [DONE]\r\r') == [{"c": 2}, DONE]


def test_sse_multiline_event_and_fields_ignored():
    p = SSEParser()
    out = p.feed(b'event: message\nid: 7\nretry: 100\ndata: {"a":\ndata:  [1, 2]}\n\n')
    assert out == [{"a": [1, 2]}]


def test_sse_flush_discards_unterminated_event_and_missing_blank_lines():
    # HTML standard: "If the file ends in the middle of an event, before the final empty line, the
    # incomplete event is not dispatched."
    p = SSEParser()
    assert p.feed(b'data: {"a": 1}') == []
    assert p.flush() == [] and p.discarded
    # two chunks without the blank line between them (seen from sloppy servers): recovered one by one
    assert SSEParser().feed(b'data: {"a": 1}\ndata: {"b": 2}\n\n') == [{"a": 1}, {"b": 2}]


def test_sse_undecodable_raises():
    with pytest.raises(SSEDecodeError):
        SSEParser().feed(b"data: {not json\n\n")


def test_sse_feed_line_interface():
    p = SSEParser()
    assert p.feed_line(": OPENROUTER PROCESSING") == []
    assert p.feed_line('data: {"x": 1}') == []
    assert p.feed_line("") == [{"x": 1}]
    assert p.feed_line("data: [DONE]\r") == []
    assert p.feed_line("") == [DONE]


# --------------------------------------------------------------------------------------------- accumulator


def test_accumulate_content_usage_final_empty_choices_chunk():
    acc = run_acc(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "The answer"}),
            chunk({"content": " is 4."}),
            chunk({}, finish="stop"),
            chunk(usage=USAGE),  # form (a): choices: [] with usage
        ]
    )
    c = acc.completion(latency_s=2.5)
    assert c.content == "The answer is 4."
    assert c.finish_reason == "stop" and c.native_finish_reason == "stop"
    assert c.usage.prompt_tokens == 31 and c.usage.completion_tokens == 12
    assert c.usage.reasoning_tokens == 6 and c.usage.cost_usd == pytest.approx(0.0000376)
    assert c.provider == "Chutes" and c.model == "moonshotai/kimi-k2.5-0127" and c.generation_id == "gen-1"
    assert c.latency_s == 2.5
    assert c.ttft_s == 2.0  # the empty role chunk (t=1) does not count; first text at t=2


def test_accumulate_usage_in_repeated_finish_chunk_counted_once():
    acc = run_acc(
        [
            chunk({"content": "hi"}),
            chunk({}, finish="length"),
            chunk({}, finish="length", usage=USAGE),  # form (b): finish repeated with usage
        ]
    )
    c = acc.completion()
    assert c.finish_reason == "length"
    assert c.usage.completion_tokens == 12 and c.usage.cost_usd == pytest.approx(0.0000376)
    assert c.content == "hi"


def test_reasoning_not_double_counted_when_reasoning_and_details_both_sent():
    details = lambda t: [{"type": "reasoning.text", "text": t, "format": "unknown", "index": 0}]  # noqa: E731
    acc = run_acc(
        [
            chunk({"reasoning": "2+2", "reasoning_details": details("2+2")}),
            chunk({"reasoning": " is 4.", "reasoning_details": details(" is 4.")}),
            chunk({"content": "4"}, finish="stop"),
        ]
    )
    c = acc.completion()
    assert c.reasoning == "2+2 is 4."
    assert acc.progress.chars_received == len("2+2 is 4.") + 1


@pytest.mark.parametrize(
    "spelling",
    [
        lambda t: {"reasoning": t},
        lambda t: {"reasoning_content": t},
        lambda t: {"reasoning_details": [{"type": "reasoning.text", "text": t, "index": 0}]},
        lambda t: {"reasoning": None, "reasoning_content": t},
    ],
    ids=["reasoning", "reasoning_content", "reasoning_details", "null-reasoning+content"],
)
def test_reasoning_three_spellings(spelling):
    acc = run_acc([chunk(spelling("think ")), chunk(spelling("hard")), chunk({"content": "ok"}, finish="stop")])
    assert acc.completion().reasoning == "think hard"


def test_reasoning_text_helper_priorities_and_encrypted_ignored():
    assert reasoning_text({"reasoning": "a", "reasoning_content": "b"}) == "a"
    assert reasoning_text({"reasoning_content": "b", "reasoning_details": [{"type": "reasoning.text", "text": "c"}]}) == "b"
    assert (
        reasoning_text(
            {
                "reasoning_details": [
                    {"type": "reasoning.encrypted", "data": "xxx"},
                    {"type": "reasoning.summary", "summary": "S"},
                    {"type": "reasoning.text", "text": "T"},
                ]
            }
        )
        == "ST"
    )


def test_tool_call_deltas_assembled_by_index_verbatim():
    acc = run_acc(
        [
            chunk({"content": None, "tool_calls": [{"index": 0, "id": "functions.get_weather:0", "type": "function",
                                                   "function": {"name": "get_weather", "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\""}}]}),
            chunk({"tool_calls": [{"index": 1, "id": "call_x1y2", "type": "function",
                                   "function": {"name": "get_time", "arguments": "{}"}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": \"Rome\"}"}}]}),
            chunk({}, finish="tool_calls", usage=USAGE),
        ]
    )
    c = acc.completion()
    assert c.finish_reason == "tool_calls"
    assert [t.to_openai() for t in c.tool_calls] == [
        {"id": "functions.get_weather:0", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}},
        {"id": "call_x1y2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
    ]
    assert c.content == ""
    assert c.ttft_s is not None


@pytest.mark.parametrize("code,cls,status", [(502, ErrorClass.SERVER, 502), ("server_error", ErrorClass.SERVER, 500),
                                             (None, ErrorClass.MIDSTREAM, 200),
                                             ("E_PROVIDER_42", ErrorClass.MIDSTREAM, 200)])
def test_midstream_error_top_level_form(code, cls, status):
    # A coded error chunk is classed like the HTTP status its code stands for; only a code-less one (or a
    # code that is no HTTP status and no known name) stays MIDSTREAM.
    acc = StreamAccumulator()
    acc.feed(chunk({"content": "x" * 9}))
    err = {"code": code, "message": "Provider disconnected",
           "metadata": {"error_type": "provider_unavailable", "provider_name": "Nebius", "raw": "upstream 502"}}
    if code is None:
        del err["code"]
    with pytest.raises(RequestError) as ei:
        acc.feed(chunk({}, finish="error", error=err))
    e = ei.value
    assert e.error_class is cls and e.retryable and e.status == status
    assert e.tokens_received == 3  # ceil(9 / 4)
    assert e.provider == "Nebius"
    assert e.generation_id == "gen-1"
    assert "Provider disconnected" in e.message and "upstream 502" in e.message
    assert code is None or f"code={code}" in e.message


@pytest.mark.parametrize("code", [500, "internal", "E_UNKNOWN"])
def test_midstream_error_old_form_inside_choice(code):
    acc = StreamAccumulator()
    acc.feed(chunk({"reasoning": "abcd"}))
    c = chunk({}, finish="error")
    c["choices"][0]["error"] = {"code": code, "message": "boom"}
    with pytest.raises(RequestError) as ei:
        acc.feed(c)
    assert ei.value.error_class is (ErrorClass.MIDSTREAM if code == "E_UNKNOWN" else ErrorClass.SERVER)
    assert ei.value.tokens_received == 1
    assert ei.value.provider == "Chutes"  # from the chunk when the error names none
    assert "boom" in ei.value.message


def test_estimate_tokens_and_progress():
    assert [estimate_tokens(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    p = StreamProgress()
    acc = StreamAccumulator(progress=p, generation_id="gen-hdr")
    acc.feed(chunk({"content": "hello"}))
    assert p.tokens_received == 2 and p.generation_id == "gen-hdr" and p.provider == "Chutes"
    acc.feed(chunk({}, finish="stop"))
    assert acc.completion().generation_id == "gen-hdr"  # header id wins over chunk id


# --------------------------------------------------------------------------------------------- non-stream bodies

BODY = {
    "id": "gen-1770000000-Ab12", "object": "chat.completion", "created": 1770000000,
    "model": "moonshotai/kimi-k2.5-0127", "provider": "Chutes",
    "choices": [{"index": 0, "finish_reason": "stop", "native_finish_reason": "stop",
                 "message": {"role": "assistant", "content": "The answer is 4.", "reasoning": "2+2 is 4.",
                             "reasoning_details": [{"type": "reasoning.text", "text": "2+2 is 4.",
                                                    "format": "unknown", "index": 0}]}}],
    "usage": USAGE,
}


def test_nonstream_body_with_whitespace_padding():
    text = "\n\n   \n" + json.dumps(BODY)
    c = parse_completion_body(text, {"x-generation-id": "gen-hdr"}, latency_s=3.0)
    assert c.content == "The answer is 4." and c.reasoning == "2+2 is 4."
    assert c.finish_reason == "stop" and c.usage.cost_usd == pytest.approx(0.0000376)
    assert c.usage.reasoning_tokens == 6
    assert c.generation_id == "gen-hdr" and c.latency_s == 3.0 and c.provider == "Chutes"
    # bytes body without header: id from body
    assert parse_completion_body(b" \n" + json.dumps(BODY).encode()).generation_id == "gen-1770000000-Ab12"


@pytest.mark.parametrize("key", ["reasoning", "reasoning_content", "reasoning_details"])
def test_nonstream_reasoning_spellings(key):
    body = json.loads(json.dumps(BODY))
    msg = body["choices"][0]["message"]
    msg.pop("reasoning")
    details = msg.pop("reasoning_details")
    msg[key] = details if key == "reasoning_details" else "2+2 is 4."
    assert parse_completion_body(json.dumps(body)).reasoning == "2+2 is 4."


def test_nonstream_tool_calls():
    body = json.loads(json.dumps(BODY))
    body["choices"][0]["finish_reason"] = "tool_calls"
    body["choices"][0]["message"] = {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "functions.get_weather:0", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}],
    }
    c = parse_completion_body(json.dumps(body))
    assert c.content == "" and c.finish_reason == "tool_calls"
    assert c.tool_calls[0].id == "functions.get_weather:0"
    assert c.tool_calls[0].arguments == "{\"city\":\"Rome\"}"


def test_nonstream_200_with_top_level_error():
    body = {"id": "gen-9", "error": {"code": 502, "message": "Upstream error",
                                     "metadata": {"provider_name": "Groq", "raw": "{\"e\":1}"}},
            "choices": [{"index": 0, "message": {"role": "assistant", "content": None}}]}
    with pytest.raises(RequestError) as ei:
        parse_completion_body("\n" + json.dumps(body))
    e = ei.value
    assert e.error_class is ErrorClass.SERVER and e.status == 502  # as an HTTP 502 would be
    assert e.provider == "Groq" and e.generation_id == "gen-9" and "Upstream error" in e.message
    del body["error"]["code"]
    with pytest.raises(RequestError) as ei:
        parse_completion_body(json.dumps(body))
    assert ei.value.error_class is ErrorClass.MIDSTREAM and ei.value.status == 200


def test_nonstream_200_with_choice_error():
    body = json.loads(json.dumps(BODY))
    body["choices"][0]["finish_reason"] = "error"
    body["choices"][0]["error"] = {"message": "model crashed"}
    with pytest.raises(RequestError) as ei:
        parse_completion_body(json.dumps(body))
    assert ei.value.error_class is ErrorClass.MIDSTREAM and "model crashed" in ei.value.message
    assert ei.value.partial_cost_usd == pytest.approx(0.0000376)


@pytest.mark.parametrize("text", ["", "   \n ", "<html>502 Bad Gateway</html>", "[1, 2]"])
def test_nonstream_garbage_is_protocol(text):
    with pytest.raises(RequestError) as ei:
        parse_completion_body(text)
    assert ei.value.error_class is ErrorClass.PROTOCOL


# --------------------------------------------------------------------------------------------- HTTP errors


def err_body(code, message, **meta):
    return json.dumps({"error": {"code": code, "message": message, "metadata": meta}, "user_id": "u"})


@pytest.mark.parametrize(
    "status,cls",
    [
        (400, ErrorClass.BAD_REQUEST), (401, ErrorClass.AUTH), (402, ErrorClass.CREDITS),
        (403, ErrorClass.FORBIDDEN), (404, ErrorClass.ROUTE), (408, ErrorClass.TIMEOUT),
        (409, ErrorClass.OTHER), (429, ErrorClass.RATE_LIMIT), (500, ErrorClass.SERVER),
        (502, ErrorClass.SERVER), (503, ErrorClass.SERVER), (504, ErrorClass.SERVER),
        (524, ErrorClass.TIMEOUT), (529, ErrorClass.SERVER), (599, ErrorClass.SERVER),
    ],
)
def test_classify_status(status, cls):
    e = classify_http_error(status, {}, err_body(status, f"msg {status}"))
    assert e.error_class is cls and e.status == status
    assert f"msg {status}" in e.message
    assert e.retryable == (cls in {ErrorClass.TIMEOUT, ErrorClass.RATE_LIMIT, ErrorClass.SERVER})


def test_classify_400_context_length_reason_and_raw_truncated():
    e = classify_http_error(
        400, {}, err_body(400, "This endpoint's maximum context length is 262144 tokens",
                          error_type="context_length_exceeded", raw="R" * 5000, provider_name="Moonshot AI")
    )
    assert e.error_class is ErrorClass.BAD_REQUEST and not e.retryable
    assert "context_length_exceeded" in e.message and "262144" in e.message
    assert "RRRR" in e.message and len(e.message) <= 500
    assert e.provider == "Moonshot AI"


def test_classify_non_json_body():
    e = classify_http_error(502, {}, "<html>\n<h1>502   Bad Gateway</h1></html>")
    assert e.error_class is ErrorClass.SERVER and "<h1>502 Bad Gateway</h1>" in e.message
    assert classify_http_error(503, {}, "").message == "empty error body"


def test_retry_after_seconds_date_and_ratelimit_reset_ms():
    e = classify_http_error(429, {"Retry-After": "7"}, err_body(429, "slow down"), now=lambda: NOW)
    assert e.retry_after_s == 7.0 and e.error_class is ErrorClass.RATE_LIMIT
    date = email.utils.formatdate(NOW + 30, usegmt=True)
    assert classify_http_error(503, {"retry-after": date}, "", now=lambda: NOW).retry_after_s == pytest.approx(30.0)
    ms = str(int((NOW + 12.5) * 1000))
    e = classify_http_error(429, {"X-RateLimit-Reset": ms}, err_body(429, "rl"), now=lambda: NOW)
    assert e.retry_after_s == pytest.approx(12.5)
    # Retry-After wins over X-RateLimit-Reset
    e = classify_http_error(429, {"Retry-After": "2", "X-RateLimit-Reset": ms}, "", now=lambda: NOW)
    assert e.retry_after_s == 2.0
    # X-RateLimit-Reset is ignored on non-429 statuses
    assert classify_http_error(500, {"X-RateLimit-Reset": ms}, "", now=lambda: NOW).retry_after_s is None
    assert classify_http_error(429, {}, "", now=lambda: NOW).retry_after_s is None


def test_retry_after_clamped():
    past_ms = str(int((NOW - 100) * 1000))
    assert parse_retry_after({"X-RateLimit-Reset": past_ms}, now=lambda: NOW) == 0.0
    assert parse_retry_after({"Retry-After": "-5"}, now=lambda: NOW) == 0.0
    assert parse_retry_after({"Retry-After": "99999"}, now=lambda: NOW) == MAX_RETRY_AFTER_S
    assert parse_retry_after({"Retry-After": "garbage"}, now=lambda: NOW) is None
    assert parse_retry_after({"X-RateLimit-Reset": str(int(NOW + 40))}, now=lambda: NOW) == pytest.approx(40.0)


# --------------------------------------------------------------------------------------------- retry policy


class FakeSleep:
    def __init__(self):
        self.waits: list[float] = []

    async def __call__(self, s: float) -> None:
        self.waits.append(s)


def failing(errors, result="ok"):
    calls = {"n": 0}

    async def fn():
        calls["n"] += 1
        if errors:
            raise errors.pop(0)
        return result

    return fn, calls


async def test_retry_honours_retry_after_exactly_and_reports_attempts():
    errs = [
        RequestError(ErrorClass.RATE_LIMIT, "429", status=429, retry_after_s=7.0),
        RequestError(ErrorClass.SERVER, "503", status=503, retry_after_s=2.5),
    ]
    fn, calls = failing(errs)
    sleep = FakeSleep()
    seen = []
    out = await call_with_retries(
        fn, RetryPolicy(retry_after_jitter=0.0), lambda n, e, w: seen.append((n, e and e.status, w)), sleep=sleep
    )
    assert out == "ok" and calls["n"] == 3
    assert sleep.waits == [7.0, 2.5]
    assert seen == [(1, 429, 7.0), (2, 503, 2.5), (3, None, None)]


async def test_retry_after_default_jitter_never_earlier():
    random.seed(1)
    p = RetryPolicy()
    waits = [p.wait_s(1, RequestError(ErrorClass.RATE_LIMIT, "x", retry_after_s=10.0)) for _ in range(200)]
    assert min(waits) >= 10.0 and max(waits) <= 11.0 and len(set(waits)) > 100


async def test_retry_exponential_jitter_bounds_and_exhaustion():
    random.seed(7)
    errs = [RequestError(ErrorClass.DISCONNECT, f"d{i}", tokens_received=i) for i in range(10)]
    fn, calls = failing(errs)
    sleep = FakeSleep()
    seen = []

    async def on_attempt(n, e, w):  # a coroutine callback works too
        seen.append((n, e.message if e else None, w))

    with pytest.raises(RequestError) as ei:
        await call_with_retries(fn, RetryPolicy(max_attempts=6, base_s=1.0, max_s=8.0), on_attempt, sleep=sleep)
    assert calls["n"] == 6 and ei.value.attempts == 6 and ei.value.message == "d5"
    assert len(sleep.waits) == 5
    for i, w in enumerate(sleep.waits, start=1):
        assert 0.0 <= w <= min(8.0, 2 ** (i - 1))
    assert [s[0] for s in seen] == [1, 2, 3, 4, 5, 6]
    assert [s[2] for s in seen[:5]] == sleep.waits and seen[5] == (6, "d5", None)


@pytest.mark.parametrize(
    "cls", [ErrorClass.AUTH, ErrorClass.CREDITS, ErrorClass.BAD_REQUEST, ErrorClass.FORBIDDEN, ErrorClass.OTHER]
)
async def test_non_retryable_raised_at_once(cls):
    fn, calls = failing([RequestError(cls, "no", retry_after_s=1.0)])
    sleep = FakeSleep()
    seen = []
    with pytest.raises(RequestError) as ei:
        await call_with_retries(fn, RetryPolicy(), lambda *a: seen.append(a), sleep=sleep)
    assert calls["n"] == 1 and sleep.waits == [] and ei.value.attempts == 1
    assert seen == [(1, ei.value, None)]


async def test_retry_does_not_swallow_cancel_or_foreign_errors():
    async def boom():
        raise KeyError("bug")

    sleep = FakeSleep()
    with pytest.raises(KeyError):
        await call_with_retries(boom, RetryPolicy(), sleep=sleep)

    async def cancelled():
        raise asyncio.CancelledError()

    with pytest.raises(asyncio.CancelledError):
        await call_with_retries(cancelled, RetryPolicy(), sleep=sleep)
    assert sleep.waits == []


def test_policy_validation():
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    p = RetryPolicy(max_attempts=6, base_s=1.0, max_s=60.0)
    random.seed(3)
    assert all(0 <= p.wait_s(10, None) <= 60.0 for _ in range(50))
    assert max(p.wait_s(10, None) for _ in range(200)) > 30.0  # the window really reaches the cap


# --------------------------------------------------------------------------------------------- pool sharding


def test_sharded_transport_sizes_and_least_loaded_pick():
    from engine.client.pool import ShardedTransport

    t = ShardedTransport(max_connections=100, shard_size=32)
    assert t.shards == 4 and t._capacity == [32, 32, 32, 4]
    assert t._pick() == 0  # idle: always the first shard (keeps reusing warm connections)
    t._in_flight[:] = [3, 1, 2, 0]
    assert t._pick() == 1  # shard 3 is idle but has only 4 slots: most free slots wins (31)
    t._in_flight[:] = [32, 32, 32, 0]
    assert t._pick() == 3
    t._in_flight[:] = [5, 0, 0, 0]
    assert t._pick() == 1


def test_env_proxy_for(monkeypatch):
    import httpx

    from engine.client.pool import env_proxy_for

    for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY",
              "no_proxy"):
        monkeypatch.delenv(k, raising=False)
    assert env_proxy_for(httpx.URL("https://openrouter.ai/api/v1")) is None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.local:3128")
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    assert env_proxy_for(httpx.URL("https://openrouter.ai/api/v1")) == "http://proxy.local:3128"
    assert env_proxy_for(httpx.URL("http://127.0.0.1:8000/v1")) is None
