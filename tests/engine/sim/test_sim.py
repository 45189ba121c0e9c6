"""Tests of the OpenRouter simulator over real loopback sockets (httpx as the client).

Wire shapes asserted here are those of docs/openrouter.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest
from waiting import async_wait_for

from engine.prompts import prompt_key
from engine.sim import (
    SimConfig,
    SimServer,
    SimThread,
    add_sim_arguments,
    parse_faults,
    sim_config_from_args,
)

AUTH = {"Authorization": "Bearer sk-or-test"}
ROOT = Path(__file__).resolve().parents[3]


# -- helpers ---------------------------------------------------------------------------------------
@asynccontextmanager
async def sim(timeout: Any = 10.0, **kw: Any) -> AsyncIterator[tuple[SimServer, httpx.AsyncClient]]:
    server = SimServer(SimConfig(**kw))
    await server.start()
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    client = httpx.AsyncClient(base_url=server.base_url, headers=AUTH, timeout=timeout, limits=limits)
    try:
        yield server, client
    finally:
        await client.aclose()
        await server.stop()


def body(text: str = "What is 2+2?", max_tokens: int = 4096, **extra: Any) -> dict[str, Any]:
    return {
        "model": "moonshotai/kimi-k2.5",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}],
        "max_tokens": max_tokens,
        **extra,
    }


async def sse(client: httpx.AsyncClient, payload: dict[str, Any], headers: dict[str, str] | None = None):
    """POST a streaming request; return (response, events) with events = [(kind, value)]."""
    events: list[tuple[str, Any]] = []
    async with client.stream("POST", "/chat/completions", json={**payload, "stream": True}, headers=headers) as r:
        async for line in r.aiter_lines():
            if not line:
                continue
            if line.startswith(":"):
                events.append(("comment", line))
            elif line == "data: [DONE]":
                events.append(("done", None))
            else:
                assert line.startswith("data: "), line
                events.append(("data", json.loads(line[6:])))
    return r, events


def assemble(events: list[tuple[str, Any]]) -> dict[str, Any]:
    """Concatenate stream deltas the way a client does."""
    out: dict[str, Any] = {"reasoning": "", "content": "", "tools": {}, "finish": [], "usage": None}
    for kind, ch in events:
        if kind != "data":
            continue
        if ch.get("usage"):
            out["usage"] = ch["usage"]
        for c in ch["choices"]:
            d = c.get("delta") or {}
            out["reasoning"] += d.get("reasoning") or ""
            out["content"] += d.get("content") or ""
            for tc in d.get("tool_calls") or []:
                slot = out["tools"].setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
                if "id" in tc:
                    slot["id"] = tc["id"]
                    slot["name"] = tc["function"]["name"]
                slot["arguments"] += tc["function"].get("arguments", "")
            if c.get("finish_reason"):
                out["finish"].append(c["finish_reason"])
    return out


def words(*texts: str) -> int:
    return sum(len(t.split()) for t in texts)


def cost(usage: dict[str, Any], price_in: float = 0.40, price_out: float = 1.90) -> float:
    return usage["prompt_tokens"] * price_in / 1e6 + usage["completion_tokens"] * price_out / 1e6


# -- config ----------------------------------------------------------------------------------------
def test_parse_faults_and_errors() -> None:
    assert parse_faults("429:0.05, 502:0.03,midstream:0.01") == {"429": 0.05, "502": 0.03, "midstream": 0.01}
    assert parse_faults("") == {}
    with pytest.raises(ValueError, match="'429'"):
        parse_faults("429")
    with pytest.raises(ValueError, match="unknown kind 'teapot'"):
        parse_faults("teapot:0.1")
    with pytest.raises(ValueError, match="outside"):
        parse_faults("500:1.5")
    with pytest.raises(ValueError, match="not a number"):
        parse_faults("500:abc")
    with pytest.raises(ValueError, match="sum"):
        parse_faults("500:0.6,502:0.6")
    with pytest.raises(ValueError, match="unknown fault kind"):
        SimConfig(faults={"404": 0.1})


def test_argparse_roundtrip() -> None:
    p = argparse.ArgumentParser()
    add_sim_arguments(p)
    args = p.parse_args(
        "--port 9 --seed 7 --latency-ms 5 --tokens-per-s 30 --mean-completion-tokens 50 --credits 2.5 "
        "--price-in 0.5 --price-out 2 --faults 429:0.1 --providers A,B --cancellable B --log /tmp/x.jsonl".split()
    )
    cfg = sim_config_from_args(args)
    assert (cfg.port, cfg.seed, cfg.latency_ms, cfg.tokens_per_s, cfg.mean_completion_tokens) == (9, 7, 5.0, 30.0, 50)
    assert (cfg.credits_usd, cfg.price_in, cfg.price_out) == (2.5, 0.5, 2.0)
    assert cfg.faults == {"429": 0.1} and cfg.providers == ("A", "B") and cfg.cancellable_providers == ("B",)
    assert cfg.log_path == "/tmp/x.jsonl" and cfg.tokenizer is None
    d = sim_config_from_args(p.parse_args([]))
    assert d.credits_usd == 100.0 and d.faults == {} and d.providers == ("SimA", "SimB", "SimC")


# -- plain responses -------------------------------------------------------------------------------
async def test_nonstream_shape_and_usage_arithmetic() -> None:
    async with sim(seed=3, mean_completion_tokens=80) as (server, c):
        r = await c.post("/chat/completions", json=body())
        assert r.status_code == 200
        j = r.json()
        assert j["id"].startswith("gen-") and r.headers["x-generation-id"] == j["id"]
        assert j["object"] == "chat.completion" and j["model"] == "moonshotai/kimi-k2.5-0127"
        assert j["provider"] in ("SimA", "SimB", "SimC")
        ch = j["choices"][0]
        msg = ch["message"]
        assert msg["role"] == "assistant" and msg["content"] and msg["reasoning"]
        assert msg["reasoning_details"] == [
            {"type": "reasoning.text", "text": msg["reasoning"], "format": "unknown", "index": 0}
        ]
        assert ch["finish_reason"] == ch["native_finish_reason"] == "stop"
        u = j["usage"]
        assert u["completion_tokens"] == words(msg["reasoning"], msg["content"])
        assert u["completion_tokens_details"]["reasoning_tokens"] == words(msg["reasoning"])
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        assert u["prompt_tokens"] == (9 // 4 + 4) + (12 // 4 + 4)  # len(text)//4 + 4 per message
        assert u["prompt_tokens_details"]["cached_tokens"] == 0
        assert u["cost"] == pytest.approx(cost(u), rel=1e-12)
        st = server.ledger.stats()
        assert st["requests"] == 1 and st["completed"] == 1
        assert st["billed_usd"] == pytest.approx(u["cost"], rel=1e-12)
        assert st["completion_tokens_billed"] == u["completion_tokens"]


async def test_auth_404_bad_body_and_keepalive() -> None:
    async with sim() as (server, c):
        r = await c.post("/chat/completions", json=body(), headers={"Authorization": ""})
        assert r.status_code == 401 and r.json()["error"]["code"] == 401
        r = await c.get("/nope")
        assert r.status_code == 404 and r.json()["error"]["code"] == 404
        r = await c.post("/chat/completions", content=b"{not json")
        assert r.status_code == 400 and "error" in r.json()
        r = await c.post("/chat/completions", json={"messages": []})
        assert r.status_code == 400
        before = server.connections
        for i in range(5):
            assert (await c.post("/chat/completions", json=body(f"q{i}"))).status_code == 200
        _, ev = await sse(c, body("stream on the same connection"))
        assert ev[-1] == ("done", None)
        assert server.connections - before <= 1  # keep-alive: one connection reused


async def test_determinism_across_servers_and_seeds() -> None:
    async with sim(seed=11) as (_, a), sim(seed=11) as (_, b), sim(seed=12) as (_, other):
        ja = (await a.post("/chat/completions", json=body("same prompt"))).json()
        jb = (await b.post("/chat/completions", json=body("same prompt"))).json()
        jo = (await other.post("/chat/completions", json=body("same prompt"))).json()
        ma, mb, mo = (j["choices"][0]["message"] for j in (ja, jb, jo))
        assert (ma["reasoning"], ma["content"]) == (mb["reasoning"], mb["content"])
        assert ja["usage"]["completion_tokens"] == jb["usage"]["completion_tokens"]
        assert (ma["reasoning"], ma["content"]) != (mo["reasoning"], mo["content"])
        jc = (await a.post("/chat/completions", json=body("another prompt"))).json()
        assert jc["choices"][0]["message"]["content"] != ma["content"]


# -- streaming -------------------------------------------------------------------------------------
async def test_stream_matches_nonstream_and_both_usage_forms() -> None:
    async with sim(seed=5, mean_completion_tokens=120) as (_, c):
        plain = (await c.post("/chat/completions", json=body("explain sorting"))).json()
        forms = set()
        for _ in range(2):
            r, ev = await sse(c, body("explain sorting"))
            assert r.headers["content-type"].startswith("text/event-stream")
            assert ev[0][0] == "comment" and ev[0][1] == ": OPENROUTER PROCESSING"
            assert ev[-1] == ("done", None)
            data = [v for k, v in ev if k == "data"]
            for ch in data:
                assert ch["object"] == "chat.completion.chunk" and ch["id"] == r.headers["x-generation-id"]
                assert ch["model"] == "moonshotai/kimi-k2.5-0127" and ch["provider"] and ch["created"]
            kinds = []
            for ch in data:
                d = ch["choices"][0]["delta"] if ch["choices"] else {}
                if d.get("reasoning"):
                    assert d["reasoning_details"][0]["text"] == d["reasoning"]
                    kinds.append("r")
                elif d.get("content"):
                    kinds.append("c")
            assert kinds == sorted(kinds, key=lambda k: k == "c") and "r" in kinds and "c" in kinds
            got = assemble(ev)
            msg = plain["choices"][0]["message"]
            assert got["reasoning"] == msg["reasoning"] and got["content"] == msg["content"]
            u = got["usage"]
            assert u["completion_tokens"] == plain["usage"]["completion_tokens"]
            assert u["cost"] == pytest.approx(cost(u), rel=1e-12)
            last = data[-1]
            if last["choices"] == []:
                forms.add("a")
                assert data[-2]["choices"][0]["finish_reason"] == "stop" and "usage" not in data[-2]
            else:
                forms.add("b")
                assert last["choices"][0]["finish_reason"] == "stop" and "usage" in last
                assert data[-2]["choices"][0]["finish_reason"] == "stop" and "usage" not in data[-2]
        assert forms == {"a", "b"}


async def test_max_tokens_cut() -> None:
    async with sim(seed=2, mean_completion_tokens=200) as (_, c):
        for i in range(50):
            text = f"long answer {i}"
            if (await c.post("/chat/completions", json=body(text))).json()["usage"]["completion_tokens"] >= 60:
                break
        full = (await c.post("/chat/completions", json=body(text))).json()["choices"][0]["message"]
        n_r = words(full["reasoning"])
        j = (await c.post("/chat/completions", json=body(text, max_tokens=20))).json()
        ch = j["choices"][0]
        assert ch["finish_reason"] == "length" and j["usage"]["completion_tokens"] == 20
        assert ch["message"]["content"] == "" and words(ch["message"]["reasoning"]) == 20  # cut inside reasoning
        assert full["reasoning"].startswith(ch["message"]["reasoning"])
        j = (await c.post("/chat/completions", json=body(text, max_tokens=n_r + 5))).json()
        m = j["choices"][0]["message"]
        assert j["choices"][0]["finish_reason"] == "length" and j["usage"]["completion_tokens"] == n_r + 5
        assert m["reasoning"] == full["reasoning"] and words(m["content"]) == 5
        assert full["content"].startswith(m["content"])
        _, ev = await sse(c, body(text, max_tokens=20))
        got = assemble(ev)
        assert "length" in got["finish"] and got["usage"]["completion_tokens"] == 20 and got["content"] == ""


async def test_tool_calls_kimi_ids_and_stream_fragments() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}},
                },
            },
        },
        {"type": "function", "function": {"name": "search", "parameters": {"properties": {"query": {"type": "string"}}}}},
    ]
    prior = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "functions.search:0", "type": "function", "function": {"name": "search", "arguments": "{}"}},
            {"id": "functions.search:1", "type": "function", "function": {"name": "search", "arguments": "{}"}},
        ],
    }

    def req(i: int, **extra: Any) -> dict[str, Any]:
        msgs = [
            {"role": "user", "content": f"task {i}"},
            prior,
            {"role": "tool", "tool_call_id": "functions.search:0", "content": "r0"},
            {"role": "tool", "tool_call_id": "functions.search:1", "content": "r1"},
        ]
        return {"messages": msgs, "tools": tools, "max_tokens": 8192, **extra}

    async with sim(seed=9, mean_completion_tokens=60) as (_, c):
        with_call = without = 0
        for i in range(12):
            j = (await c.post("/chat/completions", json=req(i))).json()
            ch = j["choices"][0]
            calls = ch["message"].get("tool_calls")
            if not calls:
                without += 1
                assert ch["finish_reason"] == "stop"
                continue
            with_call += 1
            assert ch["finish_reason"] == "tool_calls" and len(calls) == 1
            call = calls[0]
            name = call["function"]["name"]
            assert call["id"] == f"functions.{name}:2" and call["type"] == "function"
            args = json.loads(call["function"]["arguments"])
            if name == "get_weather":
                assert set(args) == {"city", "days", "metric"}
                assert isinstance(args["city"], str) and isinstance(args["days"], int) and isinstance(args["metric"], bool)
            else:
                assert set(args) == {"query"}
            assert " " not in call["function"]["arguments"].replace(args.get("city", args.get("query", "")), "")
            tool_cost = 2 + len(name + call["function"]["arguments"]) // 4
            m = ch["message"]
            assert j["usage"]["completion_tokens"] == words(m["reasoning"] or "", m["content"]) + tool_cost
            _, ev = await sse(c, req(i))
            frags = [
                tc
                for k, v in ev
                if k == "data" and v["choices"]
                for tc in (v["choices"][0]["delta"].get("tool_calls") or [])
            ]
            assert frags[0]["id"] == call["id"] and frags[0]["function"] == {"name": name, "arguments": ""}
            assert len(frags) >= 2 and all(set(f) == {"index", "function"} for f in frags[1:])
            assert all(set(f["function"]) == {"arguments"} for f in frags[1:])
            got = assemble(ev)
            assert got["tools"][0]["arguments"] == call["function"]["arguments"]
            assert got["finish"][0] == "tool_calls"
        assert with_call >= 1 and without >= 1
        j = (await c.post("/chat/completions", json=req(0, tool_choice="required"))).json()
        assert j["choices"][0]["message"]["tool_calls"][0]["id"].endswith(":2")
        j = (await c.post("/chat/completions", json=req(0, tool_choice="none"))).json()
        assert "tool_calls" not in j["choices"][0]["message"]


async def test_reasoning_options_and_generation_endpoint() -> None:
    async with sim(seed=6, mean_completion_tokens=80) as (_, c):
        j = (await c.post("/chat/completions", json=body("hide", reasoning={"exclude": True}))).json()
        m, u = j["choices"][0]["message"], j["usage"]
        assert m["reasoning"] is None and "reasoning_details" not in m
        assert u["completion_tokens_details"]["reasoning_tokens"] > 0  # billed, not shown
        assert u["completion_tokens"] == u["completion_tokens_details"]["reasoning_tokens"] + words(m["content"])
        _, ev = await sse(c, body("hide", reasoning={"exclude": True}))
        got = assemble(ev)
        assert got["reasoning"] == "" and got["content"] == m["content"]
        j = (await c.post("/chat/completions", json=body("off", reasoning={"effort": "none"}))).json()
        assert j["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
        assert j["usage"]["completion_tokens"] == words(j["choices"][0]["message"]["content"])
        g = (await c.get("/generation", params={"id": j["id"]})).json()["data"]
        assert g["id"] == j["id"] and g["total_cost"] == pytest.approx(j["usage"]["cost"], rel=1e-12)
        assert g["tokens_completion"] == j["usage"]["completion_tokens"] and g["provider_name"] == j["provider"]
        assert (await c.get("/generation", params={"id": "gen-missing"})).status_code == 404


async def test_latency_and_token_pacing() -> None:
    async with sim(seed=8, mean_completion_tokens=400) as (_, fast):
        for i in range(40):
            text = f"pace {i}"
            n = (await fast.post("/chat/completions", json=body(text, max_tokens=60000))).json()["usage"]
            if 300 <= n["completion_tokens"] <= 900:
                break
    n_tok = n["completion_tokens"]
    async with sim(seed=8, mean_completion_tokens=400, latency_ms=150, tokens_per_s=1000) as (_, c):
        t0 = time.monotonic()
        first_comment = first_data = None
        writes = 0
        async with c.stream("POST", "/chat/completions", json=body(text, max_tokens=60000, stream=True)) as r:
            async for raw in r.aiter_raw():
                now = time.monotonic() - t0
                writes += 1
                if first_comment is None and b": OPENROUTER" in raw:
                    first_comment = now
                if first_data is None and b"data: {" in raw:
                    first_data = now
        total = time.monotonic() - t0
        assert first_comment is not None and first_comment < 0.1  # headers + comment come at once
        assert first_data >= 0.15  # latency_ms before the first token
        assert 0.15 + 0.8 * n_tok / 1000 <= total <= 0.15 + 1.5 * n_tok / 1000 + 0.2
        assert writes <= 25 * total + 5  # bursts, not one write per token
        t0 = time.monotonic()
        assert (await c.post("/chat/completions", json=body(text, max_tokens=60000))).status_code == 200
        assert time.monotonic() - t0 >= 0.15 + 0.9 * n_tok / 1000  # non-stream waits for the whole generation


# -- faults ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["500", "502", "503", "402"])
async def test_status_faults(kind: str) -> None:
    async with sim(faults={kind: 1.0}) as (server, c):
        for _ in range(2):
            r = await c.post("/chat/completions", json=body())
            assert r.status_code == int(kind)
            j = r.json()
            assert j["error"]["code"] == int(kind) and j["error"]["message"] and j["user_id"]
        if kind == "402":
            assert j["error"]["metadata"]["error_type"] == "payment_required"
            assert "can only afford" in j["error"]["message"]
        if kind == "502":
            assert j["error"]["metadata"]["provider_name"] in ("SimA", "SimB", "SimC") and j["error"]["metadata"]["raw"]
        assert server.ledger.faults[kind] == 2 and server.ledger.billed_usd == 0.0


async def test_429_headers_alternate() -> None:
    async with sim(faults={"429": 1.0}) as (_, c):
        r1 = await c.post("/chat/completions", json=body())
        r2 = await c.post("/chat/completions", json=body())
        assert r1.status_code == r2.status_code == 429
        assert r1.headers["retry-after"] == "1" and "x-ratelimit-reset" not in r1.headers
        reset = int(r2.headers["x-ratelimit-reset"])
        assert "retry-after" not in r2.headers
        assert time.time() * 1000 < reset < time.time() * 1000 + 5000  # epoch milliseconds
        assert r1.json()["error"]["metadata"]["error_type"] == "rate_limit_exceeded"


async def test_midstream_both_forms_and_codes() -> None:
    async with sim(faults={"midstream": 1.0}, mean_completion_tokens=80) as (server, c):
        seen = []
        for i in range(4):
            r, ev = await sse(c, body(f"m{i}"))
            assert r.status_code == 200
            assert ("done", None) not in ev
            data = [v for k, v in ev if k == "data"]
            got = assemble(ev[:-1])
            assert got["reasoning"] or got["content"]  # part of the completion came first
            last = data[-1]
            assert last["choices"][0]["finish_reason"] == "error"
            if "error" in last:
                err, form = last["error"], "top"
            else:
                err, form = last["choices"][0]["error"], "choice"
            assert err["metadata"]["error_type"] and err["metadata"]["provider_name"] == last["provider"]
            seen.append((form, err["code"]))
        assert seen == [("top", 502), ("choice", 502), ("top", "server_error"), ("choice", "server_error")]
        r = await c.post("/chat/completions", json=body("plain"))
        assert r.status_code == 200 and "error" in r.json()
        assert server.ledger.outcomes["midstream"] == 5
        assert 0 < server.ledger.completion_tokens_billed  # billed for what was sent


async def test_disconnect_aborts_connection() -> None:
    async with sim(faults={"disconnect": 1.0}, mean_completion_tokens=200) as (server, c):
        kinds = set()
        for i in range(2):  # a plain close (incomplete chunked body), then an RST
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)) as exc:
                await sse(c, body(f"d{i}"))
            kinds.add(type(exc.value))
        assert kinds == {httpx.RemoteProtocolError, httpx.ReadError}
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            await c.post("/chat/completions", json=body("plain"))
        assert server.ledger.outcomes["disconnect"] == 3


async def test_stall_blocks_only_its_stream_and_releases() -> None:
    async with sim(faults={"stall": 1.0}, mean_completion_tokens=100) as (server, c):
        t0 = time.monotonic()

        async def stalled() -> float:
            with pytest.raises(httpx.ReadTimeout):
                await sse(c, body("stall me"))
            return time.monotonic() - t0

        async def healthy() -> float:
            _, ev = await sse(c, body("fine"), headers={"X-Sim-Fault": "none"})
            assert ev[-1] == ("done", None)
            return time.monotonic() - t0

        c.timeout = httpx.Timeout(10.0, read=0.5)
        t_stall, t_ok = await asyncio.gather(stalled(), healthy())
        assert t_ok < 0.4 <= t_stall
        await async_wait_for(lambda: server.ledger.outcomes["stall"] == 1, timeout=3.0)  # released when the client left
        # a stall is also released by stopping the server
        c.timeout = httpx.Timeout(30.0)
        task = asyncio.ensure_future(sse(c, body("stall again")))
        await async_wait_for(lambda: server.ledger.faults["stall"] == 2, timeout=3.0)
        await asyncio.sleep(0.05)
        t1 = time.monotonic()
        await server.stop()
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            await task
        assert time.monotonic() - t1 < 2


async def test_padding_nonstream_and_stream() -> None:
    async with sim(faults={"padding": 1.0}) as (server, c):
        r = await c.post("/chat/completions", json=body())
        assert r.status_code == 200 and r.content[:1] in (b"\n", b" ")
        j = json.loads(r.content)
        assert j["choices"][0]["finish_reason"] == "stop" and j["usage"]["completion_tokens"] > 0
        _, ev = await sse(c, body())
        assert sum(1 for k, _ in ev if k == "comment") >= 8 and ev[-1] == ("done", None)
        assert server.ledger.faults["padding"] == 2 and server.ledger.completed == 2


async def test_200error_forms() -> None:
    async with sim(faults={"200error": 1.0}) as (server, c):
        r1 = await c.post("/chat/completions", json=body())
        r2 = await c.post("/chat/completions", json=body())
        assert r1.status_code == r2.status_code == 200
        assert "error" in r1.json() and "choices" not in r1.json()
        ch = r2.json()["choices"][0]
        assert ch["finish_reason"] == "error" and ch["error"]["code"] and ch["message"]["content"] is None
        _, ev = await sse(c, body())
        data = [v for k, v in ev if k == "data"]
        assert len(data) == 1 and data[0]["choices"][0]["finish_reason"] == "error"
        assert ("done", None) not in ev
        assert server.ledger.billed_usd == 0.0 and server.ledger.outcomes["200error"] == 3


# -- billing ---------------------------------------------------------------------------------------
async def test_credits_precheck_exhaustion_and_account_endpoints() -> None:
    async with sim(credits_usd=0.002, mean_completion_tokens=100) as (server, c):
        statuses = []
        for i in range(40):
            r = await c.post("/chat/completions", json=body(f"spend {i}", max_tokens=200))
            statuses.append(r.status_code)
            if r.status_code == 402:
                break
        assert statuses[0] == 200 and statuses[-1] == 402
        err = r.json()["error"]
        assert err["metadata"]["error_type"] == "payment_required" and "can only afford" in err["message"]
        billed = server.ledger.billed_usd
        assert 0.002 - 200 * 1.9e-6 - 1e-4 < billed <= 0.002
        key = (await c.get("/key")).json()["data"]
        assert key["usage"] == pytest.approx(billed, rel=1e-12) and key["limit"] == 0.002
        assert key["limit_remaining"] == pytest.approx(0.002 - billed) and key["is_free_tier"] is False
        cr = (await c.get("/credits")).json()["data"]
        assert cr == {"total_credits": 0.002, "total_usage": pytest.approx(billed, rel=1e-12)}
        assert (await c.post("/chat/completions", json=body("x", max_tokens=1))).status_code == 200
    async with sim(credits_usd=0.0001, credit_precheck=False, mean_completion_tokens=200) as (server, c):
        assert (await c.post("/chat/completions", json=body("a", max_tokens=500))).status_code == 200
        assert server.ledger.billed_usd >= 0.0001
        r = await c.post("/chat/completions", json=body("b", max_tokens=1))
        assert r.status_code == 402 and "Insufficient credits" in r.json()["error"]["message"]
    async with sim() as (_, c):
        key = (await c.get("/key")).json()["data"]
        assert key["limit"] is None and key["limit_remaining"] is None and key["usage"] == 0
        assert (await c.get("/credits")).json()["data"]["total_credits"] == 1e9
        m = (await c.get("/models")).json()["data"][0]
        assert m["id"] == "moonshotai/kimi-k2.5" and m["context_length"] == 262144
        assert m["pricing"]["prompt"] == "0.0000004" and m["pricing"]["completion"] == "0.0000019"


async def test_cancellable_vs_full_billing_on_client_drop(tmp_path: Path) -> None:
    log = tmp_path / "sim.jsonl"
    cfg = dict(seed=4, mean_completion_tokens=3000)
    async with sim(**cfg) as (_, fast):  # same seed, no pacing: learn the full usage of a long prompt
        for i in range(40):
            text = f"essay {i}"
            full = (await fast.post("/chat/completions", json=body(text, max_tokens=60000))).json()["usage"]
            if full["completion_tokens"] >= 1500:
                break
        assert full["completion_tokens"] >= 1500
    async with sim(**cfg, tokens_per_s=3000, log_path=str(log)) as (server, c):
        for prov in ("SimA", "SimC"):  # SimA cancellable, SimC not
            payload = body(text, max_tokens=60000, stream=True, provider={"only": [prov]})
            async with c.stream("POST", "/chat/completions", json=payload) as r:
                n = 0
                async for line in r.aiter_lines():
                    n += line.startswith("data: ")
                    if n >= 3:
                        break
        await async_wait_for(lambda: server.ledger.outcomes["client_dropped"] == 2, timeout=3.0)
        recs = [json.loads(x) for x in log.read_text().splitlines()]
        assert [r["provider"] for r in recs] == ["SimA", "SimC"]
        a, cc = recs
        for rec in recs:
            assert rec["outcome"] == "client_dropped" and rec["fully_sent"] is False and rec["stream"] is True
            assert rec["prompt_key"] == prompt_key(body(text)["messages"]) and rec["generation_id"].startswith("gen-")
            assert rec["prompt_tokens"] == full["prompt_tokens"]
            assert rec["cost_usd"] == pytest.approx(
                rec["prompt_tokens"] * 0.4e-6 + rec["completion_tokens_billed"] * 1.9e-6, rel=1e-12
            )
        assert 0 < a["completion_tokens_billed"] < full["completion_tokens"] // 2
        assert cc["completion_tokens_billed"] == full["completion_tokens"]
        assert server.ledger.billed_usd == pytest.approx(a["cost_usd"] + cc["cost_usd"], rel=1e-12)
        key = (await c.get("/key")).json()["data"]
        assert key["usage"] == pytest.approx(server.ledger.billed_usd, rel=1e-12)


# -- routing ---------------------------------------------------------------------------------------
async def test_routing_only_ignore_order() -> None:
    async with sim() as (_, c):

        async def provider(routing: dict[str, Any]) -> tuple[int, Any]:
            r = await c.post("/chat/completions", json=body(provider=routing))
            return r.status_code, (r.json().get("provider") if r.status_code == 200 else r.json())

        for _ in range(4):
            assert await provider({"only": ["simb"]}) == (200, "SimB")
            assert await provider({"ignore": ["SimA", "SimB"]}) == (200, "SimC")
            assert await provider({"order": ["SimC", "SimA"]}) == (200, "SimC")
        seen = {(await provider({}))[1] for _ in range(20)}
        assert seen == {"SimA", "SimB", "SimC"}
        status, err = await provider({"only": ["nope"]})
        assert status == 503 and err["error"]["metadata"]["error_type"] == "provider_unavailable"
        status, _ = await provider({"order": ["nope"], "allow_fallbacks": False})
        assert status == 503


# -- scale, threads, processes ---------------------------------------------------------------------
async def test_500_concurrent_streams() -> None:
    async with sim(seed=1, mean_completion_tokens=40, tokens_per_s=400) as (server, _):
        # httpcore's pool is O(n^2) in open connections: shard 500 streams over 10 clients
        clients = [httpx.AsyncClient(base_url=server.base_url, headers=AUTH, timeout=20) for _ in range(10)]
        try:
            t0 = time.monotonic()
            results = await asyncio.gather(*(sse(clients[i % 10], body(f"concurrent {i}")) for i in range(500)))
            elapsed = time.monotonic() - t0
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))
        assert all(ev[-1] == ("done", None) for _, ev in results)
        assert server.ledger.completed == 500 and server.ledger.requests == 500
        assert elapsed < 6


def test_simthread_from_sync_code() -> None:
    with SimThread(SimConfig(seed=1)) as url:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/api/v1")
        with httpx.Client(base_url=url, headers=AUTH, timeout=5) as c:
            j = c.post("/chat/completions", json=body()).json()
            assert j["choices"][0]["finish_reason"] == "stop"
    with pytest.raises(httpx.ConnectError):
        httpx.post(url + "/chat/completions", json=body(), headers=AUTH, timeout=2)


async def test_simthread_inside_running_loop() -> None:
    t = SimThread(SimConfig())
    url = t.start()  # its own loop: does not need (or block) ours
    try:
        async with httpx.AsyncClient(base_url=url, headers=AUTH) as c:
            assert (await c.get("/key")).status_code == 200
        assert t.ledger.requests == 0
    finally:
        t.stop()


def test_serve_forever_subprocess() -> None:
    code = "from engine.sim import SimConfig, serve_forever; serve_forever(SimConfig())"
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline().strip()
        assert line.startswith("simulator listening on http://127.0.0.1:") and line.endswith("/api/v1")
        url = line.split()[-1]
        assert httpx.get(url + "/credits", headers=AUTH, timeout=5).status_code == 200
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()


# -- tokenizer mode --------------------------------------------------------------------------------
async def test_tokenizer_mode_counts_with_real_tokenizer(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    from engine.sim.generator import VOCAB

    vocab = {w: i for i, w in enumerate(["[UNK]", ".", ",", *sorted({v for w in VOCAB for v in (w, w.capitalize())})])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))

    def n(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    async with sim(tokenizer=str(tmp_path), mean_completion_tokens=80) as (_, c):
        j = (await c.post("/chat/completions", json=body("count me"))).json()
        m, u = j["choices"][0]["message"], j["usage"]
        assert u["completion_tokens"] == n(m["reasoning"]) + 1 + n(m["content"]) + 1
        assert u["completion_tokens_details"]["reasoning_tokens"] == n(m["reasoning"])
        assert u["prompt_tokens"] == n("Be brief.") + 4 + n("count me") + 4
        assert u["completion_tokens"] != words(m["reasoning"], m["content"])  # punctuation is its own token
        j = (await c.post("/chat/completions", json=body("count me", max_tokens=10))).json()
        assert j["choices"][0]["finish_reason"] == "length" and j["usage"]["completion_tokens"] <= 10
        for off in ({"enabled": False}, {"effort": "none"}):  # instant mode: no </think> generated, none billed
            j = (await c.post("/chat/completions", json=body("count me", reasoning=off))).json()
            m, u = j["choices"][0]["message"], j["usage"]
            assert not m["reasoning"] and u["completion_tokens"] == n(m["content"]) + 1
