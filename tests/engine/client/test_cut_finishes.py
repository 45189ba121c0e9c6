"""Any finish that reached max_tokens, and any native finish that says cut, is a cut (issue 36, case 26: vLLM #58228,
#53269): finish ``length``, never closed with markers the model did not write; a complete turn keeps its finish."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import completion

from engine.client.conformance import finalize
from engine.client.types import ChatRequest, ToolCall, Usage

CALL = (ToolCall(id="functions.get_weather:0", name="get_weather", arguments='{"city": "Paris"}'),)


def _req(max_tokens: int = 1000) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": "weather?"}], max_tokens=max_tokens)


@pytest.mark.parametrize("finish,native,completion_tokens,want,flag", [
    ("tool_calls", "tool_calls", 1000, "length", "finish_at_max_tokens"),  # case 26: cut right after the arguments
    ("tool_calls", "tool_calls", 1200, "length", "finish_at_max_tokens"),  # a provider that overshoots
    ("content_filter", "content_filter", 1000, "length", "finish_at_max_tokens"),
    ("stop", "stop", 1000, "length", "stop_at_max_tokens"),  # as before
    ("tool_calls", "tool_calls", 999, "tool_calls", None),  # a complete call under the cap
    ("stop", "length", 400, "length", "native_finish_cut"),  # held back: native says cut, finish says stop
    ("stop", "MAX_TOKENS", 400, "length", "native_finish_cut"),
    ("tool_calls", "abort", 400, "length", "native_finish_cut"),
    ("stop", "eos", 400, "stop", None),
    ("length", "length", 1000, "length", None),
])
def test_a_turn_that_reached_the_cap_or_says_cut_is_a_cut(finish, native, completion_tokens, want, flag):
    c = dataclasses.replace(completion("x"), finish_reason=finish, native_finish_reason=native, tool_calls=CALL,
                            usage=Usage(10, completion_tokens, 0, 0.001))
    got = finalize(_req(), c)
    assert got.finish_reason == want
    cut_flags = {"finish_at_max_tokens", "stop_at_max_tokens", "native_finish_cut"}
    assert [f for f in got.flags if f in cut_flags] == ([flag] if flag else [])
    assert got.native_finish_reason == native  # the provider's own word stays on record
