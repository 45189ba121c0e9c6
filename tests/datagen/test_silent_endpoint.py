"""A server that accepts connections and never answers, through the real command line (issue 34).

Before: every prompt failed with ``stall`` after its retries and the run exited 0 ``run completed``.
Now such a server pauses the run like an unreachable one (``no answer from URL (stall): the server
accepts connections but has not answered in 1s ...``): prompts return to pending, nothing fails, no
money is counted, ``--exit-on-pause`` exits 3, and without it the headless run waits, paused. A
stream that sends bytes, however slowly, is never taken for it, nor is one silent request while
other streams are answered.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from casesrv import (
    CaseServer,
    Reply,
    case_config,
    chunk,
    prompts,
    run_case,
    states,
    status,
    status_when_there,
    stream,
    usage,
)
from silentsrv import SilentServer
from waiting import wait_for

PY = sys.executable


def fast_stall(cfg, stall_s: float = 1.0) -> None:
    """Set ``[provider.timeouts] stall_s`` of a :func:`case_config` file (it writes 10)."""
    text = cfg.read_text()
    assert "stall_s = 10\n" in text
    cfg.write_text(text.replace("stall_s = 10\n", f"stall_s = {stall_s:g}\n"))


def test_a_server_that_never_answers_pauses_the_run_exits_3_and_fails_nothing(tmp_path):
    with SilentServer() as srv:
        cfg = case_config(tmp_path, srv.base_url, prompts(6), max_attempts=2)
        fast_stall(cfg)
        r = run_case(cfg, "--exit-on-pause", timeout=90)
        out = r.stdout + r.stderr
        assert srv.connections >= 1 and srv.received > 0  # it accepted and read the requests
    assert r.returncode == 3, out
    assert (f"no answer from {srv.base_url} (stall): the server accepts connections but has not answered in 1s "
            f"(no status line; stall timeout)") in out
    assert "run completed" not in out
    assert states(tmp_path / "run") == {"pending": 6}  # not one failed for good
    doc = status(tmp_path / "run")
    d = doc["datasets"][0]
    assert (d["failed"], d["pending"], d["done"]) == (0, 6, 0)
    assert doc["totals"]["cost_usd"] == 0.0  # nothing was answered, nothing is counted as spent


def test_headers_then_silence_pauses_a_headless_run_until_ctl(tmp_path):
    """The server sends ``HTTP/1.1 200`` and its headers, then nothing: the same endpoint failure.
    Without ``--exit-on-pause`` the headless run waits, paused (``status`` shows why); SIGTERM ends it."""
    with CaseServer(lambda req, n: Reply(pieces=[60.0])) as srv:
        cfg = case_config(tmp_path, srv.base_url, prompts(4), max_attempts=2)
        fast_stall(cfg)
        run_dir = tmp_path / "run"
        env = dict(os.environ, CASE_KEY="case-key-123")
        proc = subprocess.Popen([PY, "-m", "datagen", "run", str(cfg), "--headless"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env)
        try:
            doc = wait_for(lambda: (d := status_when_there(run_dir)) and d["run"]["state"] == "paused" and d, 60,
                           "the run to pause")
            reason = doc["run"]["state_reason"]
            assert reason.startswith(f"no answer from {srv.base_url} (stall): the server sent response headers "
                                     f"(HTTP 200) but not one byte of the body in 1s (stall timeout)"), reason
            time.sleep(1.5)
            assert proc.poll() is None  # still there, paused
            assert status(run_dir)["datasets"][0]["failed"] == 0
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 130, out
    assert "GUARD: run paused by a guard: no answer from" in out
    assert states(run_dir) == {"pending": 4}


def slow(req: dict, n: int) -> Reply:
    """A stream that takes ~4 s, one piece every 0.4 s (under the 1 s stall timeout); the prompt
    ``... number 0.`` gets no byte after its headers instead."""
    text = req["messages"][-1]["content"]
    if text.endswith("number 0."):
        return Reply(pieces=[30.0])
    pieces: list = [b": keep-alive\n\n", 0.4]
    for i in range(9):
        pieces += [b"data: " + json.dumps(chunk({"content": f"w{i} "})).encode() + b"\n\n", 0.4]
    r = stream(chunk({}, "stop", usage=usage(15, 10, cost=0.0001)))
    return Reply(pieces=pieces + r.pieces)


def test_slow_streams_are_never_a_silent_server(tmp_path):
    """Streams of ~4 s with a byte every 0.4 s at a 1 s stall timeout complete; the one request that
    gets no body byte while those are answered fails as its own ``stall`` (no run pause)."""
    with CaseServer(slow) as srv:
        cfg = case_config(tmp_path, srv.base_url, prompts(4), max_attempts=2)
        fast_stall(cfg)
        r = run_case(cfg, "--exit-on-pause", timeout=90)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "no answer from" not in out
    assert states(tmp_path / "run") == {"done": 3, "failed": 1}
    d = status(tmp_path / "run")["datasets"][0]
    assert d["errors"].get("stall") == 2, d["errors"]
