"""Streamed requests ask for usage (``stream_options.include_usage``, ``[provider] stream_usage``), against the
project's simulator as a real loopback server in its vLLM-like mode (usage in a stream only when asked), and
a real ``datagen run`` against a scripted server recording the bodies it receives."""

from __future__ import annotations

import httpx
import pytest
from casesrv import CaseServer, case_config, chunk, run_case, stream, usage

from engine.client.chat import ChatClient
from engine.client.types import ChatRequest
from engine.config import ProviderSection
from engine.sim import SimConfig, SimServer

REQ = ChatRequest(messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=256,
                  body={"model": "moonshotai/kimi-k2.5"})


async def complete(server: SimServer, **kw):
    async with ChatClient(server.base_url, "sk-test", trust_env=False, stall_timeout_s=10, total_timeout_s=20,
                          **kw) as c:
        return await c.complete(REQ)


async def test_vllm_like_server_sends_usage_only_when_asked():
    server = SimServer(SimConfig(seed=3, mean_completion_tokens=40, usage_on_request=True))
    await server.start()
    try:
        asked = await complete(server)  # default: stream with stream_options.include_usage
        assert asked.usage_reported and asked.usage.completion_tokens > 0 and asked.usage.cost_usd > 0
        silent = await complete(server, stream_usage=False)
        assert not silent.usage_reported
        assert silent.usage.completion_tokens == 0 and silent.usage.cost_usd is None
        assert silent.content == asked.content  # same prompt, same seed: the same generation, only usage differs
        plain = await complete(server, stream=False)  # no stream_options on a non-streamed request
        assert plain.usage_reported and plain.usage.completion_tokens == asked.usage.completion_tokens
    finally:
        await server.stop()


async def test_openrouter_like_sim_sends_usage_either_way():
    server = SimServer(SimConfig(seed=3, mean_completion_tokens=40))
    await server.start()
    try:
        assert (await complete(server, stream_usage=False)).usage_reported
    finally:
        await server.stop()


@pytest.mark.parametrize("extra,stream,message", [
    ({"stream_options": {"include_usage": True}}, False, "only allowed when stream is true"),
    ({"stream_options": "yes"}, True, "expected an object"),
    ({"stream_options": {"include_usage": "yes"}}, True, "expected an object"),
])
async def test_sim_refuses_malformed_stream_options(extra, stream, message):
    server = SimServer(SimConfig(seed=1))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": "Bearer x"}) as c:
            r = await c.post("/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                        "max_tokens": 16, "stream": stream, **extra})
        assert r.status_code == 400 and message in r.json()["error"]["message"]
    finally:
        await server.stop()


async def test_client_merges_stream_options_from_the_body():
    server = SimServer(SimConfig(seed=3, mean_completion_tokens=40, usage_on_request=True))
    await server.start()
    try:
        req = ChatRequest(messages=REQ.messages, max_tokens=64,
                          body={"model": "m", "stream_options": {"continuous_usage_stats": False}})
        async with ChatClient(server.base_url, "k", trust_env=False) as c:
            assert (await c.complete(req)).usage_reported
    finally:
        await server.stop()


def test_config_key_default_and_type():
    assert ProviderSection().stream_usage is True
    assert ProviderSection(stream_usage=False).stream_usage is False
    with pytest.raises(ValueError, match="stream_usage"):
        ProviderSection(stream_usage="sometimes")


@pytest.mark.parametrize("setting,sent", [(None, {"include_usage": True}), ("false", None)])
def test_run_sends_stream_options_per_config(tmp_path, setting, sent):
    def respond(req, n):
        return stream(chunk({"content": "Four."}), chunk({}, finish="stop", usage=usage(10, 3)))

    with CaseServer(respond) as srv:
        cfg = case_config(tmp_path, srv.base_url, [{"messages": [{"role": "user", "content": "2+2?"}]}])
        if setting is not None:
            text = cfg.read_text().replace('api_key_env = "CASE_KEY"',
                                           f'api_key_env = "CASE_KEY"\nstream_usage = {setting}')
            cfg.write_text(text)
        r = run_case(cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(srv.requests) == 1 and srv.requests[0]["stream"] is True
    assert srv.requests[0].get("stream_options") == sent
