"""A server that accepts connections and never answers (issue 34): the pure rule, the sign that the
endpoint answers, the flag across the stream workers' socket, and the client's reading of silence."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from casesrv import CaseServer, Reply, chunk, stream, usage
from silentsrv import SilentServer

from engine.client.chat import ChatClient
from engine.client.progress import StreamProgress
from engine.client.types import ChatRequest, ErrorClass, RequestError
from engine.run.failures import Failures
from engine.run.runwide import condition_of
from engine.stream.wire import error_fields, error_from_fields

SILENT = "the server accepts connections but has not answered in 1s (no status line; stall timeout)"


def test_a_silent_stall_is_the_connect_condition_a_talking_one_is_not():
    cond = condition_of("stall", 0, SILENT, where="http://127.0.0.1:9/v1", no_answer=True)
    assert cond is not None and cond.kind == "connect"
    assert cond.reason.startswith(f"no answer from http://127.0.0.1:9/v1 (stall): {SILENT}; a hung server")
    assert condition_of("stall", 200, "no bytes for 1s (stall timeout) while reading the stream") is None
    assert condition_of("stall", 0, SILENT, no_answer=True, endpoint_fault=True) is None  # one replica of several
    assert condition_of("timeout", 0, SILENT, no_answer=True) is None  # only a stall is silence


def _failures(streams: dict, now: list[float]) -> Failures:
    run = SimpleNamespace(datasets={"d": SimpleNamespace(streams=streams)}, paused=False)
    return Failures(run, writer=None, store=None, telemetry=None, api_key_env="K", reach="URL",  # type: ignore[arg-type]
                    event=lambda *a: None, stall_s=10.0, clock=lambda: now[0])


def test_silence_is_the_run_s_only_while_nothing_else_is_answered():
    now = [100.0]
    talking = StreamProgress()
    streams: dict = {1: ("short", talking, 10)}
    f = _failures(streams, now)
    e = RequestError(ErrorClass.STALL, SILENT)
    e.no_answer = True
    assert f.run_wide(e) is not None and f.run_wide(e).kind == "connect"  # type: ignore[union-attr]
    talking.chars_received = 1  # a stream in flight receives text: the server answers
    assert f.run_wide(e) is None
    talking.chars_received = 0
    f.on_success()  # a result within stall_s: answering
    assert f.answering() and f.run_wide(e) is None
    now[0] += 10.0  # stall_s later, with nothing since
    assert not f.answering() and f.run_wide(e) is not None
    plain = RequestError(ErrorClass.STALL, "no bytes for 10s (stall timeout) while reading the stream")
    assert f.run_wide(plain) is None  # a stream that had sent bytes stalled: the prompt's own


def test_no_answer_crosses_the_workers_socket():
    e = RequestError(ErrorClass.STALL, SILENT)
    e.no_answer = True
    assert error_from_fields(error_fields(e)).no_answer is True
    assert error_from_fields(error_fields(RequestError(ErrorClass.STALL, "x"))).no_answer is False
    old = error_fields(e)
    del old["no_answer"]  # a frame without the field (no such sender now, but harmless)
    assert error_from_fields(old).no_answer is False


async def _one(url: str, stall_s: float = 0.5) -> RequestError | object:
    async with ChatClient(url, None, stall_timeout_s=stall_s, total_timeout_s=20) as c:
        try:
            return await c.complete(ChatRequest([{"role": "user", "content": "hi"}], 8, body={"model": "m"}))
        except RequestError as e:
            return e


def test_the_client_reads_silence_and_only_silence_as_no_answer():
    with SilentServer() as srv:
        e = asyncio.run(_one(srv.base_url))
    assert isinstance(e, RequestError) and e.error_class is ErrorClass.STALL and e.no_answer
    assert e.message == "the server accepts connections but has not answered in 0.5s (no status line; stall timeout)"

    with CaseServer(lambda req, n: Reply(pieces=[5.0])) as srv:
        e = asyncio.run(_one(srv.base_url))
    assert isinstance(e, RequestError) and e.no_answer and e.status == 200
    assert e.message == "the server sent response headers (HTTP 200) but not one byte of the body in 0.5s (stall timeout)"

    # a keep-alive comment, then silence: the server was answering; a plain stall, the prompt's own
    with CaseServer(lambda req, n: Reply(pieces=[b": OPENROUTER PROCESSING\n\n", 5.0])) as srv:
        e = asyncio.run(_one(srv.base_url))
    assert isinstance(e, RequestError) and e.error_class is ErrorClass.STALL and not e.no_answer

    # bytes every 0.3 s for 1.5 s at a 0.5 s stall timeout: a slow stream completes
    slow = [b": OPENROUTER PROCESSING\n\n", 0.3, b": OPENROUTER PROCESSING\n\n", 0.3]
    for i in range(3):
        slow += [stream(chunk({"content": f"w{i} "}), done=False).pieces[0], 0.3]
    slow += stream(chunk({}, "stop", usage=usage(5, 3, cost=0.00001))).pieces
    with CaseServer(lambda req, n: Reply(pieces=list(slow))) as srv:
        c = asyncio.run(_one(srv.base_url))
    assert not isinstance(c, RequestError), c
    assert c.content == "w0 w1 w2 "  # type: ignore[union-attr]
