"""Stream assembly, whole kind: tool-call fragments in every shape servers send, finish_reason rules, usage
presence, and error objects inside 200 responses classified like their HTTP status (pure, no sockets)."""

from __future__ import annotations

import json

import pytest
from helpers import tool_fragment as tc

from engine.client.accumulate import StreamAccumulator, finish_value, parse_completion_body, usage_present
from engine.client.errors import classify_error_object, classify_http_error, error_status
from engine.client.toolcalls import ToolCallAssembler
from engine.client.types import KNOWN_FINISH_REASONS, ErrorClass, RequestError


def assemble(*deltas) -> list[tuple[str, str, str]]:
    """Feed each item (one fragment or a list of fragments = one delta) and return (id, name, arguments)."""
    a = ToolCallAssembler()
    for d in deltas:
        a.feed(d if isinstance(d, list) else [d])
    return [(c.id, c.name, c.arguments) for c in a.calls()]


PARIS, OSLO = '{"city": "Paris"}', '{"city": "Oslo"}'


# -- tool-call assembly ------------------------------------------------------------------------------------------


def test_index_reused_with_distinct_ids_is_two_calls():
    # case 01: Ollama / dynamo / plexus stream parallel calls all at index 0
    got = assemble(tc(0, "functions.get_weather:0", "get_weather", ""), tc(0, args=PARIS),
                   tc(0, "functions.get_weather:1", "get_weather", ""), tc(0, args=OSLO))
    assert got == [("functions.get_weather:0", "get_weather", PARIS), ("functions.get_weather:1", "get_weather", OSLO)]


def test_standard_openai_shape_id_only_on_first_fragment():
    got = assemble(tc(0, "call_a", "get_weather", ""), tc(0, args='{"city": '), tc(0, args='"Paris"}'),
                   tc(1, "call_b", "get_time", ""), tc(1, args='{"tz": "CET"}'))
    assert got == [("call_a", "get_weather", PARIS), ("call_b", "get_time", '{"tz": "CET"}')]


def test_id_and_name_repeated_on_every_fragment():
    got = assemble(tc(0, "c1", "get_weather", '{"city": '), tc(0, "c1", "get_weather", '"Paris"}'),
                   tc(0, "c1", "get_weather", ""))
    assert got == [("c1", "get_weather", PARIS)]


def test_name_split_across_fragments():
    assert assemble(tc(0, "c1", "get_"), tc(0, name="weather"), tc(0, args=PARIS)) == [("c1", "get_weather", PARIS)]


def test_cumulative_name_is_not_doubled():
    assert assemble(tc(0, "c1", "get_"), tc(0, name="get_weather", args=PARIS)) == [("c1", "get_weather", PARIS)]


def test_index_missing_keyed_by_id_then_latest():
    got = assemble(tc(None, "a", "get_weather", ""), tc(None, args=PARIS), tc(None, "b", "get_weather", ""),
                   tc(None, args=OSLO), tc(None, "a"))  # id "a" again: continues call a, adds nothing
    assert got == [("a", "get_weather", PARIS), ("b", "get_weather", OSLO)]


def test_index_reused_after_a_gap():
    got = assemble(tc(0, "a", "f", ""), tc(1, "b", "g", ""), tc(0, args="{}"), tc(1, args="{}"),
                   tc(0, "c", "h", ""), tc(0, args='{"x": 1}'))
    assert got == [("a", "f", "{}"), ("b", "g", "{}"), ("c", "h", '{"x": 1}')]


def test_calls_interleaved_by_index():
    got = assemble([tc(0, "a", "get_weather", ""), tc(1, "b", "get_weather", "")],
                   tc(1, args='{"city": '), tc(0, args='{"city": '), tc(0, args='"Paris"}'), tc(1, args='"Oslo"}'))
    assert got == [("a", "get_weather", PARIS), ("b", "get_weather", OSLO)]


def test_whole_calls_at_one_index_without_ids_are_split():
    # e.g. a gateway sending each call complete in one fragment, all at index 0, no ids
    got = assemble(tc(0, name="get_weather", args=PARIS), tc(0, name="get_weather", args=OSLO))
    assert got == [("call_0", "get_weather", PARIS), ("call_1", "get_weather", OSLO)]


def test_trailing_name_echo_without_arguments_is_not_a_call():
    assert assemble(tc(0, name="get_weather", args=PARIS), tc(0, name="get_weather")) == [
        ("call_0", "get_weather", PARIS)]
    # ...but a different name after a complete call is a new call even before its arguments
    got = assemble(tc(0, name="get_weather", args=PARIS), tc(0, name="get_time"), tc(0, args="{}"))
    assert got == [("call_0", "get_weather", PARIS), ("call_1", "get_time", "{}")]


def test_same_id_repeated_in_one_delta_and_object_arguments():
    got = assemble([tc(0, "a", "f", '{"x": '), tc(0, "a", args="1}")], tc(1, "b", "g", args={"y": 2}))
    assert got == [("a", "f", '{"x": 1}'), ("b", "g", '{"y": 2}')]


def test_malformed_fragments_skipped_and_bool_index_is_no_index():
    a = ToolCallAssembler()
    assert a.feed("nonsense") == 0
    a.feed([None, 3, tc(True, "a", "f", "{}")])
    assert [(c.id, c.name) for c in a.calls()] == [("a", "f")]


def test_accumulator_uses_the_assembler_and_counts_chars():
    acc = StreamAccumulator(t_start=0.0, clock=lambda: 1.0)
    acc.feed({"choices": [{"delta": {"tool_calls": [tc(0, "a", "get_weather", "")]}}]})
    acc.feed({"choices": [{"delta": {"tool_calls": [tc(0, args=PARIS)]}}]})
    acc.feed({"choices": [{"delta": {"tool_calls": [tc(0, "b", "get_weather", "")]}}]})
    acc.feed({"choices": [{"delta": {"tool_calls": [tc(0, args=OSLO)]}}], "usage": None})
    acc.feed({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]})
    c = acc.completion()
    assert [(t.id, t.arguments) for t in c.tool_calls] == [("a", PARIS), ("b", OSLO)]
    assert acc.progress.chars_received == 2 * len("get_weather") + len(PARIS) + len(OSLO)


def test_nonstream_body_calls_are_distinct_even_with_equal_ids():
    body = {"id": "g", "choices": [{"finish_reason": "tool_calls", "message": {"tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "x", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}}]}
    c = parse_completion_body(json.dumps(body))
    assert [(t.id, t.arguments) for t in c.tool_calls] == [("x", "{}"), ("x", '{"a": 1}')]


# -- finish_reason ------------------------------------------------------------------------------------------------


def feed_all(*chunks) -> StreamAccumulator:
    acc = StreamAccumulator()
    for c in chunks:
        acc.feed(c)
    return acc


def ch(content=None, finish=None, **top):
    delta = {"content": content} if content is not None else {}
    return {"id": "gen-1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **top}


@pytest.mark.parametrize("empty", ["", None, "  ", False])
def test_empty_or_null_finish_reason_never_finishes(empty):
    acc = feed_all(ch("a", empty), ch("b", empty))
    assert not acc.finished and acc.finish_reason is None
    with pytest.raises(RuntimeError):
        acc.completion()
    acc.feed(ch(None, "length"))
    assert acc.finished and acc.completion().finish_reason == "length" and acc.completion().content == "ab"


def test_first_non_empty_finish_kept_later_empty_ones_ignored():
    acc = feed_all(ch("a", ""), ch(None, "stop"), ch(None, ""), ch(None, "length"))
    assert acc.completion().finish_reason == "stop" and acc.empty_finishes == 2


@pytest.mark.parametrize("fr", ["abort", "eot_id", "paused", 7])
def test_unknown_finish_reason_kept_verbatim_and_flagged(fr):
    c = feed_all(ch("a"), ch(None, fr)).completion()
    assert c.finish_reason == str(fr) and not c.finish_known and "finish_alias" not in c.flags


@pytest.mark.parametrize("fr,std", [("end_turn", "stop"), ("eos", "stop"), ("STOP", "stop"), ("end", "stop"),
                                    ("MAX_TOKENS", "length"), ("tool_use", "tool_calls"), ("Length", "length")])
def test_finish_alias_read_as_the_standard_one_and_noted(fr, std):
    c = feed_all(ch("a"), ch(None, fr)).completion()
    assert (c.finish_reason, c.native_finish_reason, c.finish_known, c.flags) == (std, fr, True, ("finish_alias",))


@pytest.mark.parametrize("fr", sorted(KNOWN_FINISH_REASONS))
def test_known_finish_reasons(fr):
    assert feed_all(ch("a", fr)).completion().finish_known


def test_finish_value():
    assert [finish_value(v) for v in (None, "", " ", False, "stop", 0)] == [None, None, None, None, "stop", "0"]


@pytest.mark.parametrize("fr", [None, "", "  "])
def test_nonstream_body_without_finish_is_not_a_completion(fr):
    body = {"id": "g", "choices": [{"finish_reason": fr, "message": {"content": "cut"}}]}
    with pytest.raises(RequestError) as ei:
        parse_completion_body(json.dumps(body))
    assert ei.value.error_class is ErrorClass.PROTOCOL and ei.value.retryable


# -- usage presence -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("u,present", [(None, False), ({}, False), ([], False), ("x", False),
                                       ({"cost": 0.1}, False), ({"prompt_tokens": None}, False),
                                       ({"completion_tokens": 0}, True), ({"prompt_tokens": "12"}, True),
                                       ({"total_tokens": 5}, True)])
def test_usage_present(u, present):
    assert usage_present(u) is present


def test_usage_reported_false_without_a_usage_object_stream_and_body():
    assert not feed_all(ch("a"), ch(None, "stop", usage=None)).completion().usage_reported
    assert not feed_all(ch("a"), ch(None, "stop", usage={})).completion().usage_reported
    assert feed_all(ch("a"), ch(None, "stop", usage={"prompt_tokens": 3, "completion_tokens": 1})).completion(
    ).usage_reported
    body = {"id": "g", "choices": [{"finish_reason": "stop", "message": {"content": "x"}}], "usage": None}
    assert not parse_completion_body(json.dumps(body)).usage_reported
    body["usage"] = {"completion_tokens": 4}
    assert parse_completion_body(json.dumps(body)).usage_reported


# -- error objects inside 200 responses ---------------------------------------------------------------------------


@pytest.mark.parametrize("code", [429, "429", 429.0, "rate_limit_exceeded", "RESOURCE_EXHAUSTED"])
def test_in_stream_rate_limit_is_rate_limit(code):
    acc = StreamAccumulator()
    with pytest.raises(RequestError) as ei:
        acc.feed({"id": "gen-x", "error": {"message": "Provider returned error", "code": code},
                  "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}]})
    e = ei.value
    assert e.error_class is ErrorClass.RATE_LIMIT and e.retryable and e.status == 429
    assert e.generation_id == "gen-x" and "200 response" in e.message


@pytest.mark.parametrize("status", [400, 401, 402, 403, 404, 408, 413, 429, 500, 502, 503, 524, 529])
def test_coded_error_object_classed_exactly_like_the_http_status(status):
    err = {"code": status, "message": "m"}
    inline = classify_error_object(err)
    http = classify_http_error(status, {}, json.dumps({"error": err}))
    assert (inline.error_class, inline.status, inline.retryable) == (http.error_class, http.status, http.retryable)


@pytest.mark.parametrize("err,status", [
    ({"type": "overloaded_error", "message": "Overloaded"}, 529),  # Anthropic-shaped
    ({"code": "invalid_api_key", "message": "bad key"}, 401),
    ({"code": 1234, "type": "authentication_error"}, 401),  # no HTTP status in code: the type decides
    ({"code": 99, "message": "provider specific"}, None),
    ({"message": "no code"}, None),
    ("a plain string", None),
])
def test_error_status(err, status):
    assert error_status(err) == status


def test_code_less_error_stays_midstream():
    e = classify_error_object({"message": "stream broke", "metadata": {"provider_name": "P"}})
    assert e.error_class is ErrorClass.MIDSTREAM and e.status == 200 and e.provider == "P"


@pytest.mark.parametrize("status,cls,fatal", [(402, ErrorClass.CREDITS, True), (401, ErrorClass.AUTH, True),
                                              (400, ErrorClass.BAD_REQUEST, False), (404, ErrorClass.ROUTE, True)])
def test_account_and_request_errors_in_stream_are_not_retried_as_midstream(status, cls, fatal):
    acc = StreamAccumulator()
    with pytest.raises(RequestError) as ei:
        acc.feed({"error": {"code": status, "message": "No endpoints found" if status == 404 else "x"}})
    assert ei.value.error_class is cls and ei.value.error_class.fatal is fatal and not ei.value.retryable


def test_retry_after_from_error_metadata():
    # OpenRouter puts the upstream headers in metadata.headers; epoch-ms X-RateLimit-Reset as for HTTP 429
    now = 1_770_000_000.0
    e = classify_error_object({"code": 429, "message": "m", "metadata": {"headers": {
        "X-RateLimit-Reset": str(int((now + 7) * 1000))}}}, now=lambda: now)
    assert e.retry_after_s == pytest.approx(7.0)
    assert classify_error_object({"code": "429", "message": "m", "retry_after": 3}).retry_after_s == 3.0
    raw = json.dumps({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "12s"}]}})
    e = classify_error_object({"code": 429, "message": "m", "metadata": {"raw": raw}})
    assert e.retry_after_s == 12.0
    assert classify_error_object({"code": 429, "message": "m"}).retry_after_s is None  # backoff decides


def test_error_carries_what_the_stream_received():
    acc = StreamAccumulator()
    acc.feed({"id": "g1", "provider": "Q", "choices": [{"delta": {"content": "x" * 8}}]})
    with pytest.raises(RequestError) as ei:
        acc.feed({"error": {"code": 503, "message": "down"}})
    e = ei.value
    assert e.error_class is ErrorClass.SERVER and e.tokens_received == 2 and e.provider == "Q"
    assert e.generation_id == "g1"
