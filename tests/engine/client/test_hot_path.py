"""The per-chunk fast paths (issue 37) decide exactly as the full rules: the SSE parser's fused
``data:``/blank-line loop, the accumulator's skipped identity and usage look-ups."""

import json
import random

from engine.client.accumulate import StreamAccumulator
from engine.client.sse import DONE, SSEParser


def _chunk(i: int, **kw) -> dict:
    c = {"id": "gen-1", "model": "moonshotai/kimi-k2.5", "provider": "P", "object": "chat.completion.chunk",
         "created": 1, "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]}
    c.update(kw)
    return c


def test_identity_change_after_a_long_run_is_a_splice() -> None:
    acc = StreamAccumulator()
    for i in range(6):
        acc.feed(_chunk(i))
    assert acc.flags == []
    acc.feed(_chunk(6, model="other/model"))
    assert acc.flags == ["spliced_generation"] and acc.model == "moonshotai/kimi-k2.5"


def test_second_stable_id_after_a_run_is_a_splice() -> None:
    acc = StreamAccumulator()
    for i in range(5):
        acc.feed(_chunk(i))
    acc.feed(_chunk(5, id="gen-2"))
    assert acc.flags == []  # one odd chunk id is no second generation
    acc.feed(_chunk(6, id="gen-2"))
    assert acc.flags == ["spliced_generation"] and acc.generation_id == "gen-1"


def test_usage_in_choice_and_extension_after_plain_chunks() -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17, "cost": 0.5}
    for where, flag in (("choice", "usage_in_choice"), ("x_groq", "usage_extension"), ("top", None)):
        acc = StreamAccumulator()
        for i in range(4):
            acc.feed(_chunk(i))
        last = _chunk(4)
        last["choices"][0]["finish_reason"] = "stop"
        if where == "choice":
            last["choices"][0]["usage"] = usage
        elif where == "x_groq":
            last["x_groq"] = {"usage": usage}
        else:
            last["usage"] = usage
        acc.feed(last)
        c = acc.completion()
        assert (c.usage.completion_tokens, c.usage.cost_usd) == (7, 0.5)
        assert (flag in c.flags) if flag else not c.flags


def _stream() -> bytes:
    parts = [b"\xef\xbb\xbf: OPENROUTER PROCESSING\r\n\r\n"]
    for i in range(40):
        body = json.dumps(_chunk(i)).encode()
        if i % 7 == 3:
            parts.append(b"id: e%d\nevent: x\ndata:" % i + body + b"\n\n")
        elif i % 7 == 5:
            k = body.index(b", ") + 1  # two data lines, joined by a newline: JSON whitespace
            parts.append(b"data: " + body[:k] + b"\r\ndata:" + body[k:] + b"\r\n\r\n")
        else:
            parts.append(b"data: " + body + b"\n\n")
        if i % 9 == 0:
            parts.append(b"data:   \n\n: keep-alive\nretry: 5\n\n")
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def _slow(raw: bytes, cuts: list[int]) -> tuple[list, SSEParser]:
    """The reference: the rules one event at a time (feed_events, then each payload decoded alone)."""
    from engine.client.sse import decode_payload

    p = SSEParser()
    out: list = []
    prev = 0
    for c in [*cuts, len(raw)]:
        for ev in p.feed_events(raw[prev:c]):
            if ev.data.strip():
                out.append(decode_payload(ev.data))
            else:
                p.empty_events += 1
        prev = c
    return out, p


def test_fused_feed_equals_the_rules_at_any_split() -> None:
    raw = _stream()
    rng = random.Random(7)
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(raw)), rng.randint(1, 60)))
        p = SSEParser()
        got: list = []
        prev = 0
        for c in [*cuts, len(raw)]:
            got += p.feed(raw[prev:c])
            prev = c
        want, q = _slow(raw, cuts)
        assert got == want and got[-1] is DONE and len(got) == 41
        assert (p.events, p.empty_events, p.comments, p.last_event_id, p.retry_ms) == \
               (q.events, q.empty_events, q.comments, q.last_event_id, q.retry_ms) == (46, 5, 6, "e38", 5)


def test_plain_chunks_skip_the_usage_and_identity_lookups(monkeypatch) -> None:
    import engine.client.accumulate as acc_mod
    from engine.client.attribution import GenerationIdentity

    calls = {"usage": 0, "observe": 0}
    real_loc, real_obs = acc_mod.usage_location, GenerationIdentity.observe

    def loc(chunk):
        calls["usage"] += 1
        return real_loc(chunk)

    def obs(self, chunk):
        calls["observe"] += 1
        return real_obs(self, chunk)

    monkeypatch.setattr(acc_mod, "usage_location", loc)
    monkeypatch.setattr(GenerationIdentity, "observe", obs)
    acc = StreamAccumulator()
    for i in range(10):
        acc.feed(_chunk(i))
    last = _chunk(10, usage={"prompt_tokens": 1, "completion_tokens": 11, "total_tokens": 12})
    last["choices"][0]["finish_reason"] = "stop"
    acc.feed(last)
    assert calls == {"usage": 1, "observe": 2}  # the usage chunk only; the first two of the identity's run
    assert acc.completion().usage.completion_tokens == 11
