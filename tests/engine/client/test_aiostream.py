"""ChatClient's aiohttp backend (engine.client.aiostream) against the httpx one, over a real loopback socket.

Every row of engine.client.chat's failure table is played to both backends with the same bytes
(test_client_wire's ScriptServer) and must end in the same ErrorClass; a normal completion must be identical;
the gate must hold a request before any byte of it reaches the server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import ssl

import aiohttp
import httpx
import pytest
from test_client_wire import (
    CANARY,
    END,
    REQ,
    USAGE,
    Close,
    Reset,
    ScriptServer,
    Sleep,
    WaitClose,
    assert_no_key,
    ch,
    chunk,
    err_json,
    head,
    make_client,
    srv,  # noqa: F401 - the fixture
    sse,
    stream_script,
)

from engine.client.accumulate import StreamProgress
from engine.client.aiochoice import STREAM_HTTP_ENV, stream_backend
from engine.client.aiostream import AioStream, as_httpx
from engine.client.chat import ChatClient
from engine.client.types import ErrorClass, RequestError

BACKENDS = ["httpx", "aiohttp"]


class Held(Exception):
    """What the test gate raises (the stream worker's StreamHeld stands in the same place)."""


def _client(server: ScriptServer, backend: str, **kw) -> ChatClient:
    return make_client(server, http_backend=backend, **kw)


def _body(status: int) -> tuple[bytes, bytes]:
    body = err_json(status, f"error {status} upstream", provider_name="Moonshot AI")
    return head(status, chunked=False, length=len(body), ctype="application/json"), body


_ROWS = {
    # name: (script, client kwargs, class, no_answer, tokens_received)
    "http_429": (list(_body(429)), {}, ErrorClass.RATE_LIMIT, False, 0),
    "http_402": (list(_body(402)), {}, ErrorClass.CREDITS, False, 0),
    "http_503": (list(_body(503)), {}, ErrorClass.SERVER, False, 0),
    "http_500_body_over_64k": ([head(500, ctype="text/plain"), ch(b"x" * 70000), ch(b"y" * 70000), END], {},
                               ErrorClass.SERVER, False, 0),
    "stall_before_status": ([Sleep(3)], {"stall_timeout_s": 0.3}, ErrorClass.STALL, True, 0),
    "stall_after_headers": ([head(200), Sleep(3)], {"stall_timeout_s": 0.3}, ErrorClass.STALL, True, 0),
    "stall_mid_body": ([head(200), ch(sse(chunk({"content": "abcde"}))), Sleep(3)], {"stall_timeout_s": 0.3},
                       ErrorClass.STALL, False, 2),
    "total_timeout": ([head(200), ch(sse(chunk({"content": "abcd"})))] + [ch(b": PING\n\n"), Sleep(0.05)] * 40,
                      {"stall_timeout_s": 1, "total_timeout_s": 0.5}, ErrorClass.TIMEOUT, False, 1),
    "reset_mid_stream": ([head(200), ch(sse(chunk({"content": "y" * 21}))), Sleep(0.05), Reset()], {},
                         ErrorClass.DISCONNECT, False, 6),
    "fin_inside_chunk": ([head(200), ch(sse(chunk({"reasoning": "abcdefgh"}))), b"40\r\ndata: {\"trunc", Close()],
                         {}, ErrorClass.DISCONNECT, False, 2),
    "close_delimited_no_finish": ([head(200, chunked=False), sse(chunk({"content": "abcd"})), Close()], {},
                                  ErrorClass.DISCONNECT, False, 1),
    "closed_before_status": ([Close()], {}, ErrorClass.DISCONNECT, False, 0),
    "malformed_status_line": ([b"HTTP/1.1 2x0 Nonsense\r\n\r\n", Close()], {}, ErrorClass.DISCONNECT, False, 0),
    "done_without_finish": (stream_script([chunk({"content": "text"})]), {}, ErrorClass.DISCONNECT, False, 1),
    "error_chunk_429": (stream_script([chunk({"content": "ab"}), {"error": {"code": 429, "message": "slow"}}]), {},
                        ErrorClass.RATE_LIMIT, False, 1),
    "error_chunk_codeless": (stream_script([{"error": {"message": "upstream broke"}}]), {},
                             ErrorClass.MIDSTREAM, False, 0),
    "undecodable_chunk": (stream_script([chunk({"content": "abcdefgh"}), b"data: {\"choices\": [tru\n\n"]), {},
                          ErrorClass.PROTOCOL, False, 2),
    "html_200": ([head(200, chunked=False, length=13, ctype="text/html"), b"<html></html>"], {},
                 ErrorClass.PROTOCOL, False, 0),
    "json_200_no_finish": ([head(200, chunked=False, length=54, ctype="application/json"),
                            b'{"id":"g","choices":[{"index":0,"message":{"content":"x"}}]}'[:54]], {},
                           ErrorClass.PROTOCOL, False, 0),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("row", sorted(_ROWS))
async def test_failure_table_row(srv, backend, row):  # noqa: F811 - the fixture
    script, kw, cls, no_answer, tokens = _ROWS[row]
    srv.push(*script)
    async with _client(srv, backend, **kw) as c:
        with pytest.raises(RequestError) as ei:
            await c.complete(REQ)
        assert_no_key(ei.value, c)
    e = ei.value
    assert (e.error_class, e.no_answer, e.tokens_received) == (cls, no_answer, tokens), e.message


@pytest.mark.parametrize("backend", BACKENDS)
async def test_connect_refused_and_timeout(backend):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    async with ChatClient(f"http://127.0.0.1:{port}/api/v1", CANARY, trust_env=False, http_backend=backend) as c:
        with pytest.raises(RequestError) as ei:
            await c.complete(REQ)
    assert ei.value.error_class is ErrorClass.CONNECT and "cannot connect" in ei.value.message
    assert_no_key(ei.value)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_key_echoed_in_error_body_is_scrubbed(srv, backend):  # noqa: F811
    body = err_json(400, f"Invalid header 'Authorization: Bearer {CANARY}'")
    srv.push(head(400, chunked=False, length=len(body), ctype="application/json"), body)
    async with _client(srv, backend) as c:
        with pytest.raises(RequestError) as ei:
            await c.complete(REQ)
        assert ei.value.error_class is ErrorClass.BAD_REQUEST and "[REDACTED]" in ei.value.message
        assert_no_key(ei.value, c)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_finish_then_reset_before_done_is_a_completion(srv, backend):  # noqa: F811
    srv.push(head(200), ch(sse(chunk({"content": "complete text"}))), ch(sse(chunk({}, finish="stop"))),
             Sleep(0.05), Reset())
    async with _client(srv, backend) as c:
        comp = await c.complete(REQ)
    assert (comp.content, comp.finish_reason, comp.usage_reported) == ("complete text", "stop", False)


def _normal_script() -> list:
    return stream_script([b": OPENROUTER PROCESSING\n\n", chunk({"role": "assistant", "reasoning": "2+2"}),
                          chunk({"content": "The answer"}), chunk({"content": " is 4."}), chunk({}, finish="stop"),
                          chunk(usage=USAGE)], headers={"X-Generation-Id": "gen-hdr-77"})


async def test_normal_completion_identical_between_backends(srv):  # noqa: F811
    got = {}
    for backend in BACKENDS:
        for _ in range(2):
            srv.push(*_normal_script())
        before = srv.connections
        async with _client(srv, backend) as c:
            p = StreamProgress()
            comps = [await c.complete(REQ, p) for _ in range(2)]
        assert srv.connections - before == 1  # keep-alive: the second request reused the connection
        d = dataclasses.asdict(comps[1])
        for k in ("latency_s", "ttft_s"):
            d.pop(k)
        got[backend] = (d, p.tokens_received, p.generation_id, p.status)
    assert got["aiohttp"] == got["httpx"]
    assert got["aiohttp"][0]["content"] == "The answer is 4." and got["aiohttp"][0]["generation_id"] == "gen-hdr-77"
    a, b = srv.requests[-1], srv.requests[0]
    assert a["body"] == b["body"] and a["headers"]["authorization"] == f"Bearer {CANARY}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("warm", [False, True], ids=["new_connection", "pooled_connection"])
async def test_gate_holds_before_any_byte(srv, backend, warm):  # noqa: F811
    async with _client(srv, backend) as c:
        if warm:  # a keep-alive connection waits in the pool: the gate runs on the reused one
            srv.push(*stream_script([chunk({"content": "a"}, finish="stop")]))
            await c.complete(REQ)
        calls = []

        async def gate() -> None:
            calls.append(len(srv.requests))
            await asyncio.sleep(0.1)  # the server would have the request by now if any byte had gone
            raise Held("held")

        with pytest.raises(Held):
            await c.complete(REQ, gate=gate)
        await asyncio.sleep(0.1)
        assert calls == [int(warm)] and len(srv.requests) == int(warm)
        srv.push(*stream_script([chunk({"content": "b"}, finish="stop")]))
        assert (await c.complete(REQ, gate=lambda: asyncio.sleep(0))).content == "b"  # the pool still works
    assert len(srv.requests) == 1 + int(warm)
    # aiohttp puts the held (clean) connection back in the pool; httpcore closes it and connects anew
    assert srv.connections == (1 if backend == "aiohttp" else 2)


async def test_gate_cancelled_while_holding_sends_nothing(srv):  # noqa: F811
    async with _client(srv, "aiohttp") as c:
        entered = asyncio.Event()

        async def gate() -> None:
            entered.set()
            await asyncio.sleep(30)

        task = asyncio.create_task(c.complete(REQ, gate=gate))
        await asyncio.wait_for(entered.wait(), 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.05)
    assert srv.requests == []


async def test_cancel_closes_the_connection(srv):  # noqa: F811
    srv.push(head(200), ch(sse(chunk({"content": "z" * 30}))), WaitClose(timeout=3))
    progress = StreamProgress()
    async with _client(srv, "aiohttp") as c:
        task = asyncio.create_task(c.complete(REQ, progress))
        for _ in range(200):
            if progress.tokens_received:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            if srv.client_closed:
                break
            await asyncio.sleep(0.01)
    assert srv.client_closed and srv.client_closed[0] < 1.0 and progress.tokens_received == 8


async def test_connection_limit_is_max_connections(srv):  # noqa: F811
    for _ in range(6):
        srv.push(head(200), ch(sse(chunk({"content": "a"}))), Sleep(0.1), ch(sse(chunk({}, finish="stop"))),
                 ch(b"data: [DONE]\n\n"), END)
    async with _client(srv, "aiohttp", max_connections=2) as c:
        comps = await asyncio.gather(*(c.complete(REQ) for _ in range(6)))
    assert [x.content for x in comps] == ["a"] * 6 and srv.connections == 2


def test_aiohttp_errors_map_to_the_httpx_ones():
    key = aiohttp.client_reqrep.ConnectionKey("h", 1, False, True, None, None, None)
    cases = [
        (aiohttp.ConnectionTimeoutError("t"), httpx.ConnectTimeout),
        (aiohttp.SocketTimeoutError("t"), httpx.ReadTimeout),
        (aiohttp.ClientConnectorError(key, OSError(111, "refused")), httpx.ConnectError),
        (aiohttp.ServerDisconnectedError(), httpx.RemoteProtocolError),
        (aiohttp.ClientPayloadError("Response payload is not completed"), httpx.RemoteProtocolError),
        (aiohttp.ClientPayloadError("Can not decode content-encoding: gzip"), httpx.DecodingError),
        (aiohttp.ClientOSError(104, "reset"), httpx.ReadError),
        (ConnectionResetError(104, "reset"), httpx.ReadError),
    ]
    assert [type(as_httpx(e)) for e, _ in cases] == [t for _, t in cases]
    odd = ValueError("x")
    assert as_httpx(odd) is odd


def test_stream_backend_switch(monkeypatch):
    assert stream_backend({}) == "aiohttp"  # the default when installed (by B1's numbers)
    assert stream_backend({STREAM_HTTP_ENV: "HTTPX "}) == "httpx"
    assert stream_backend({STREAM_HTTP_ENV: " AioHTTP"}) == "aiohttp"
    with pytest.raises(ValueError, match="DATAGEN_STREAM_HTTP"):
        stream_backend({STREAM_HTTP_ENV: "curl"})
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ValueError, match="not installed"):
        stream_backend({STREAM_HTTP_ENV: "aiohttp"})
    assert stream_backend({}) == "httpx"  # aiohttp missing: httpx


def test_bad_backend_and_proxies(monkeypatch):
    with pytest.raises(ValueError, match="http_backend"):
        ChatClient("http://127.0.0.1:1/v1", None, http_backend="curl")
    with pytest.raises(ValueError, match="socks5"):
        AioStream("https://api.example/v1/chat/completions", {}, connect_timeout_s=1, stall_timeout_s=1,
                  max_connections=1, keepalive_s=1, ssl_context=ssl.create_default_context(),
                  proxy="socks5://127.0.0.1:9")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "")
    c = ChatClient("https://api.example/v1", None, http_backend="aiohttp")
    assert c._aio is not None and c._aio._proxy == "http://127.0.0.1:9"  # the environment's proxy, as httpx's
    assert ChatClient("https://api.example/v1", None, http_backend="aiohttp", trust_env=False)._aio._proxy is None


async def test_a_bad_stream_http_setting_stops_the_run_with_one_line_before_any_worker(monkeypatch):
    from engine.errors import DatagenError
    from engine.stream.pool import StreamWorkerPool

    monkeypatch.setenv(STREAM_HTTP_ENV, "curl")
    pool = StreamWorkerPool(1, ["http://127.0.0.1:9/v1"], None, {})
    with pytest.raises(DatagenError, match="stream workers not started: DATAGEN_STREAM_HTTP must be 'aiohttp' or "
                                           "'httpx', got 'curl'"):
        await pool.start()
    assert pool.figures().workers[0].pid == 0  # no process was started
    await pool.aclose()


def test_a_bad_stream_http_setting_is_refused_before_the_run_directory_exists(tmp_path, monkeypatch, capsys):
    from datagen.cli import main

    (tmp_path / "p.jsonl").write_text('{"prompt": "hello"}\n')
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[run]\nname = "x"\ndir = "{tmp_path / "run"}"\n[provider]\nkind = "simulated"\n'
                   f'[classes.short]\nmax_tokens = 64\nconcurrency = 2\n'
                   f'[[datasets]]\nname = "a"\npath = "{tmp_path / "p.jsonl"}"\nformat = "text"\n')
    monkeypatch.setenv(STREAM_HTTP_ENV, "bogus")
    assert main(["run", str(cfg), "--headless"]) == 1
    assert capsys.readouterr().err.strip() == ("error: stream workers not started: DATAGEN_STREAM_HTTP must be "
                                               "'aiohttp' or 'httpx', got 'bogus'")
    assert not (tmp_path / "run").exists()  # nothing ingested, no store
