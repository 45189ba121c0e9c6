"""An error chunk that carries the usage billed so far (issue 36, held-back kind): that usage is the failed
attempt's spend (cost and billed tokens), not lost."""

from __future__ import annotations

import pytest

from engine.client.accumulate import StreamAccumulator
from engine.client.types import RequestError


def _chunk(text: str) -> dict:
    return {"id": "gen-1", "provider": "P", "choices": [{"index": 0, "delta": {"content": text}}]}


@pytest.mark.parametrize("where", ["top", "choice"])
def test_the_usage_of_an_error_chunk_is_the_attempts_spend(where):
    acc = StreamAccumulator()
    for t in ("one", " two", " three"):
        acc.feed(_chunk(t))
    usage = {"prompt_tokens": 40, "completion_tokens": 57, "cost": 0.00231}
    err = {"code": 502, "message": "upstream died"}
    last = ({"id": "gen-1", "error": err, "usage": usage} if where == "top" else
            {"id": "gen-1", "choices": [{"index": 0, "delta": {}, "finish_reason": "error", "error": err}], "usage": usage})
    with pytest.raises(RequestError) as e:
        acc.feed(last)
    assert e.value.partial_cost_usd == pytest.approx(0.00231)
    assert e.value.tokens_received == 57  # billed, though 3 pieces arrived
    assert e.value.provider == "P" and e.value.generation_id == "gen-1"


def test_an_error_chunk_without_usage_keeps_what_arrived():
    acc = StreamAccumulator()
    acc.feed(_chunk("one"))
    with pytest.raises(RequestError) as e:
        acc.feed({"id": "gen-1", "error": {"code": 502, "message": "x"}})
    assert e.value.partial_cost_usd is None and e.value.tokens_received == acc.tokens_received
