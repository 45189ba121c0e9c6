"""Errors of the account, the route or the config are the run's, never one prompt's (issue 11 §3),
and ``retry-failed`` returns failed prompts to pending.

Field case 08 (a temporary OpenRouter 404 "No endpoints found" failed 53 of 60 prompts for good)
and other shapes of the same kind, each a real ``datagen run --headless`` subprocess against a
scripted loopback server (:mod:`casesrv`), checked in the real store and ``datagen status --json``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from casesrv import (
    CaseServer,
    case_config,
    cli,
    error_reply,
    last_user,
    ok_reply,
    prompts,
    run_case,
    states,
    status,
    status_when_there,
)
from waiting import wait_for

from engine.client.errors import class_for_status, classify_http_error
from engine.client.types import ErrorClass
from engine.run.runwide import ConfigMistakeDetector, condition_of, is_rejection, signature

NO_ENDPOINTS = "No endpoints found for moonshotai/kimi-k2.5."


def dataset_row(run_dir: Path) -> tuple[str, str]:
    with sqlite3.connect(run_dir / "store.sqlite") as c:
        return c.execute("SELECT state, state_reason FROM datasets WHERE name='d'").fetchone()


def events(run_dir: Path, kind: str) -> list[str]:
    with sqlite3.connect(run_dir / "store.sqlite") as c:
        return [m for (m,) in c.execute("SELECT message FROM events WHERE kind=? ORDER BY id", (kind,))]


def start_run(cfg: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, CASE_KEY="case-key-123")
    return subprocess.Popen([sys.executable, "-m", "datagen", "run", str(cfg), "--headless", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


# ---- the pure rules ---------------------------------------------------------------------------
def test_404_is_a_route_error_not_a_prompt_error():
    assert class_for_status(404) is ErrorClass.ROUTE
    e = classify_http_error(404, {}, json.dumps({"error": {"code": 404, "message": NO_ENDPOINTS}}))
    assert e.error_class is ErrorClass.ROUTE and not e.retryable and e.error_class.fatal


@pytest.mark.parametrize("ec, status, message, kind", [
    ("credits", 402, "Insufficient credits", "credits"),
    ("auth", 401, "User not found.", "auth"),
    ("route", 404, NO_ENDPOINTS, "route"),
    ("bad_request", 400, "No endpoints found matching your data policy (Free model publication)", "route"),
    ("other", 409, "No allowed providers are available for the selected model.", "route"),
    ("midstream", 200, "No endpoints found that support tool use.", "route"),  # an error chunk, however classed
    ("forbidden", 403, "Key limit exceeded (total limit). Manage it at https://openrouter.ai/settings/keys", "credits"),
    ("forbidden", 403, "Your chosen model requires moderation and your input was flagged for harassment", None),
    ("bad_request", 400, "This endpoint's maximum context length is 262144 tokens", None),
    ("server", 503, "Provider returned error", None),
    ("rate_limit", 429, "Rate limit exceeded", None),
])
def test_condition_of_names_the_run_wide_kinds(ec, status, message, kind):
    cond = condition_of(ec, status, message)
    assert (cond.kind if cond else None) == kind
    if cond:
        assert message in cond.reason


def test_is_rejection_is_a_4xx_that_fails_one_prompt():
    assert is_rejection("bad_request", 400) and is_rejection("forbidden", 403) and is_rejection("other", 409)
    assert not is_rejection("other", 0) and not is_rejection("server", 502) and not is_rejection("rate_limit", 429)


def test_detector_finds_the_same_rejection_on_the_first_three_distinct_prompts():
    d: ConfigMistakeDetector[str] = ConfigMistakeDetector()
    sig = signature("bad_request", "Reasoning is  mandatory\nfor this endpoint")
    assert sig == ("bad_request", "Reasoning is mandatory for this endpoint")
    assert d.on_rejection(1, sig, "p1") == (None, [])
    assert d.on_rejection(2, sig, "p2") == (None, [])
    found, release = d.on_rejection(3, sig, "p3")
    assert release == [] and found is not None
    cond, undo = found
    assert undo == ["p1", "p2", "p3"] and cond.kind == "config" and cond.signature == sig
    assert "the first 3 prompts were all rejected with bad_request: Reasoning is mandatory" in cond.reason


def test_detector_releases_on_success_on_another_rejection_and_after_a_dismissal():
    d: ConfigMistakeDetector[str] = ConfigMistakeDetector()
    a, b = ("bad_request", "too long"), ("bad_request", "bad tool schema")
    assert d.on_rejection(1, a, "p1") == (None, [])
    assert d.on_rejection(2, b, "p2") == (None, ["p1"])  # another rejection: p1's failure is its own
    assert d.on_success() == ["p2"] and not d.armed
    assert d.on_rejection(3, a, "p3") == (None, ["p3"])  # after a success every 4xx is the prompt's
    d2: ConfigMistakeDetector[str] = ConfigMistakeDetector()
    d2.dismiss(a)
    assert d2.on_rejection(1, a, "p1") == (None, ["p1"])
    assert d2.release() == []


# ---- case 08: a routing outage ----------------------------------------------------------------
class Outage:
    """A switchable routing outage: while ``on``, every chat request gets OpenRouter's 404."""

    def __init__(self) -> None:
        self.on = True

    def __call__(self, req: dict, n: int):
        if self.on:
            return error_reply(404, NO_ENDPOINTS)
        return ok_reply(req, n)


ROUTING = '[provider.routing]\norder = ["groq"]\nallow_fallbacks = false\n'


def test_case08_no_endpoints_outage_pauses_the_run_and_fails_nothing(tmp_path):
    outage = Outage()
    with CaseServer(outage) as srv:
        cfg = case_config(tmp_path, srv.base_url, prompts(60), kind="openrouter", extra=ROUTING)
        run_dir = tmp_path / "run"
        r = run_case(cfg, "--exit-on-pause")
        out = r.stdout + r.stderr
        assert r.returncode == 3, out
        assert f"no provider endpoint can serve the requests (HTTP 404): {NO_ENDPOINTS}" in out
        assert states(run_dir) == {"pending": 60}  # none failed for good
        assert dataset_row(run_dir) == ("active", "")  # not paused "by the anomaly guard"
        assert len(srv.requests) <= 4  # the run paused at the first 404: at most the requests in flight
        assert all(b["provider"] == {"order": ["groq"], "allow_fallbacks": False} for b in srv.requests)
        doc = status(run_dir)
        d = doc["datasets"][0]
        assert (d["failed"], d["pending"], d["done"]) == (0, 60, 0)
        assert d["errors"] == {"route": len(srv.requests)}

        outage.on = False  # the provider is back
        r2 = run_case(cfg)
        assert r2.returncode == 0, r2.stdout + r2.stderr
        assert states(run_dir) == {"done": 60}
        assert status(run_dir)["datasets"][0]["failed"] == 0


def test_a_live_run_paused_by_an_outage_completes_after_ctl_resume(tmp_path):
    outage = Outage()
    with CaseServer(outage) as srv:
        cfg = case_config(tmp_path, srv.base_url, prompts(20), kind="openrouter", extra=ROUTING)
        run_dir = tmp_path / "run"
        proc = start_run(cfg)
        try:
            doc = wait_for(lambda: (d := status_when_there(run_dir)) and d["run"]["state"] == "paused" and d,
                           60, "the run to pause")
            assert NO_ENDPOINTS in doc["run"]["state_reason"]
            assert doc["datasets"][0]["failed"] == 0 and doc["datasets"][0]["state"] == "paused"
            outage.on = False
            r = cli("ctl", str(run_dir), "resume")
            assert r.returncode == 0 and "run resumed" in r.stdout, r.stdout + r.stderr
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, out
        assert states(run_dir) == {"done": 20}


# ---- other shapes: credits, a config mistake, one odd prompt ---------------------------------
def test_402_mid_run_pauses_the_run_not_the_dataset_by_the_anomaly_guard(tmp_path):
    seen: list[str] = []
    lock = threading.Lock()
    many = threading.Event()  # more 402s in flight than the guard's window (a pause holds what is not sent yet)

    def respond(req, n):
        with lock:
            if last_user(req) not in seen:
                seen.append(last_user(req))
            first = seen.index(last_user(req)) < 4
            if len(seen) >= 15:
                many.set()
        if first:
            return ok_reply(req)
        many.wait(10)
        return error_reply(402, "Insufficient credits. This account never purchased credits. Make sure your key "
                                "is on the correct account or org, and if so, purchase more at "
                                "https://openrouter.ai/settings/credits")

    with CaseServer(respond) as srv:
        cfg = case_config(tmp_path, srv.base_url, prompts(40), kind="openrouter", concurrency=16,
                          extra="[spend]\nanomaly_window = 10\n")
        run_dir = tmp_path / "run"
        r = run_case(cfg, "--exit-on-pause")
        out = r.stdout + r.stderr
        assert r.returncode == 3, out
        assert "out of credits (HTTP 402): Insufficient credits" in out
        assert "anomaly guard" not in out
        assert dataset_row(run_dir) == ("active", "")
        st = states(run_dir)
        assert st.get("failed", 0) == 0 and st["done"] == 4 and st["pending"] == 36
        assert events(run_dir, "paused") == []  # the dataset was never paused
        assert len(srv.requests) > 10  # the in-flight 402s (more than the guard's window) all came back


REASONING_REFUSED = "Reasoning is mandatory for this endpoint and cannot be disabled."


def test_the_same_400_on_the_first_prompts_is_a_config_mistake_that_pauses_the_run(tmp_path):
    def respond(req, n):
        if (req.get("reasoning") or {}).get("enabled") is False:
            return error_reply(400, REASONING_REFUSED)
        return ok_reply(req)

    with CaseServer(respond) as srv:
        gen = "[generation]\nreasoning = { enabled = false }\n"
        cfg = case_config(tmp_path, srv.base_url, prompts(30), kind="openrouter", extra=gen)
        run_dir = tmp_path / "run"
        r = run_case(cfg, "--exit-on-pause")
        out = r.stdout + r.stderr
        assert r.returncode == 3, out
        assert "the provider refuses every request the same way" in out and REASONING_REFUSED in out
        assert states(run_dir) == {"pending": 30}  # nothing failed
        assert dataset_row(run_dir) == ("active", "")
        assert 3 <= len(srv.requests) <= 8  # the first distinct prompts, plus those already in flight
        doc = status(run_dir)
        assert doc["datasets"][0]["failed"] == 0 and REASONING_REFUSED in doc["run"]["state_reason"]

        cfg.write_text(cfg.read_text().replace(gen, ""))  # the user fixes the config and runs again
        r2 = run_case(cfg)
        assert r2.returncode == 0, r2.stdout + r2.stderr
        assert states(run_dir) == {"done": 30}


TOO_LONG = ("This endpoint's maximum context length is 262144 tokens. However, you requested about 301000 "
            "tokens. Please reduce the length of either one, or use the \"middle-out\" transform.")


@pytest.mark.slow  # issue 27: long e2e test (>9 s on 2 cores), run by `make slow`
def test_a_400_of_single_prompts_among_successes_fails_only_them_and_retry_failed_brings_them_back(tmp_path):
    bad = {"Give me fun fact number 0.", "Give me fun fact number 1.", "Give me fun fact number 7."}
    rejecting = {"on": True}

    def respond(req, n):
        if rejecting["on"] and last_user(req) in bad:
            return error_reply(400, TOO_LONG)
        if last_user(req) == "Give me fun fact number 9." and rejecting["on"]:
            return error_reply(403, "Your chosen model requires moderation and your input was flagged")
        return ok_reply(req)

    with CaseServer(respond) as srv:
        # concurrency 1: prompts 0 and 1 meet the same 400 first (two, not three, before a success)
        cfg = case_config(tmp_path, srv.base_url, prompts(12), kind="openrouter", concurrency=1)
        run_dir = tmp_path / "run"
        r = run_case(cfg)
        assert r.returncode == 0, r.stdout + r.stderr
        with sqlite3.connect(run_dir / "store.sqlite") as c:
            failed = dict(c.execute("SELECT key, error_class FROM prompts WHERE state='failed'").fetchall())
        assert sorted(failed.values()) == ["bad_request", "bad_request", "bad_request", "forbidden"]
        assert states(run_dir) == {"done": 8, "failed": 4}
        assert srv.requests.__len__() == 12  # each sent once: a 4xx is not retried

        rejecting["on"] = False  # e.g. the provider raised its context limit
        bad_reason = cli("ctl", str(run_dir), "retry-failed", "--reason", "nonsense")
        assert bad_reason.returncode == 1 and "unknown --reason 'nonsense'" in bad_reason.stderr
        bad_ds = cli("ctl", str(run_dir), "retry-failed", "nope")
        assert bad_ds.returncode == 1 and "unknown dataset 'nope'; expected one of: d" in bad_ds.stderr
        r1 = cli("ctl", str(run_dir), "retry-failed", "d", "--reason", "bad_request")
        assert r1.returncode == 0, r1.stderr
        assert r1.stdout.strip() == ("3 failed prompt(s) (bad_request) of d returned to pending: saved, the engine "
                                     "is not running; the next `datagen run` sends them")
        assert states(run_dir) == {"done": 8, "failed": 1, "pending": 3}
        assert status(run_dir)["datasets"][0]["failed"] == 1
        assert events(run_dir, "retry_failed") == ["3 failed prompt(s) (bad_request) of d returned to pending by "
                                                   "retry-failed"]
        r2 = run_case(cfg)
        assert r2.returncode == 0, r2.stdout + r2.stderr
        assert states(run_dir) == {"done": 11, "failed": 1}
        assert len(srv.requests) == 15
        r3 = cli("ctl", str(run_dir), "retry-failed")
        assert r3.returncode == 0 and r3.stdout.startswith("1 failed prompt(s) returned to pending"), r3.stdout
        assert run_case(cfg).returncode == 0
        assert states(run_dir) == {"done": 12}
        r4 = cli("ctl", str(run_dir), "retry-failed")
        assert r4.returncode == 0 and r4.stdout.strip() == "no failed prompts"


def test_retry_failed_on_a_live_run_sends_the_failed_prompts_again(tmp_path):
    def respond(req, n):
        if last_user(req) == "Give me fun fact number 0." and n == 1:
            return error_reply(400, TOO_LONG)
        r = ok_reply(req)
        r.pieces.insert(0, 0.15)  # slow answers keep the run alive for a few seconds
        return r

    with CaseServer(respond) as srv:
        cfg = case_config(tmp_path, srv.base_url, prompts(40), kind="openrouter", concurrency=2)
        run_dir = tmp_path / "run"
        proc = start_run(cfg)
        try:
            wait_for(lambda: (d := status_when_there(run_dir)) and d["datasets"][0]["failed"] == 1, 60,
                     "the first failure")
            r = cli("ctl", str(run_dir), "retry-failed", "d")
            assert r.returncode == 0, r.stdout + r.stderr
            assert r.stdout.strip() == "1 failed prompt(s) of d returned to pending"
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, out
        assert states(run_dir) == {"done": 40}
        assert [last_user(b) for b in srv.requests].count("Give me fun fact number 0.") == 2
        assert events(run_dir, "retry_failed") == ["1 failed prompt(s) of d returned to pending by retry-failed"]


# ---- a rejected key ---------------------------------------------------------------------------
def rejected_key(req, n):
    return error_reply(401, "User not found.")


def test_401_headless_pauses_then_ends_with_exit_2_and_fails_nothing(tmp_path):
    with CaseServer(rejected_key) as srv:
        cfg = case_config(tmp_path, srv.base_url, prompts(20), kind="openrouter")
        run_dir = tmp_path / "run"
        r = run_case(cfg)
        out = r.stdout + r.stderr
        assert r.returncode == 2, out
        assert "API key rejected (HTTP 401): User not found. [code=401]. Check the key in $CASE_KEY." in out
        assert states(run_dir) == {"pending": 20}
        assert len(srv.requests) <= 4
        assert dataset_row(run_dir) == ("active", "")
        assert run_case(cfg, "--exit-on-pause").returncode == 2  # the same code with --exit-on-pause


async def test_401_in_the_dashboard_pauses_the_run_and_waits(tmp_path, monkeypatch):
    from engine.config import load_config
    from tui.app import DashboardApp

    monkeypatch.setenv("CASE_KEY", "case-key-123")
    with CaseServer(rejected_key) as srv:
        cfg = load_config(case_config(tmp_path, srv.base_url, prompts(8), kind="openrouter"))
        app = DashboardApp(cfg)
        async with app.run_test(size=(160, 48)) as pilot:
            end = time.monotonic() + 20
            while not (app.host.scheduler is not None and app.host.scheduler.state == "paused"):
                assert time.monotonic() < end, "the run did not pause"
                await pilot.pause(0.05)
            sched = app.host.scheduler
            assert sched.pause_kind == "auth" and "User not found." in sched.state_reason
            await pilot.pause(1.0)  # it waits: no stop, no exit
            assert app.is_running and sched.state == "paused"
            snap = sched.snapshot()
            assert snap.dataset("d").failed == 0 and snap.dataset("d").pending == 8
            await pilot.press("q")
            end = time.monotonic() + 20
            while app.is_running:
                assert time.monotonic() < end, "the app did not quit"
                await pilot.pause(0.05)
    assert states(tmp_path / "run") == {"pending": 8}


# ---- resuming past a config-mistake pause (in process, real store) -----------------------------
async def test_resume_after_a_config_mistake_pause_fails_those_prompts_one_by_one(tmp_path):
    import asyncio

    from helpers import make_config, seeded_store

    from engine.client.retry import RetryPolicy
    from engine.client.types import RequestError
    from engine.run.controller import Controller
    from engine.run.scheduler import Scheduler
    from engine.storage.writer import StoreWriter

    calls: list[str] = []

    async def complete(req, progress=None):
        calls.append(req.messages[-1]["content"])
        raise RequestError(ErrorClass.BAD_REQUEST, REASONING_REFUSED, status=400)

    cfg = make_config(tmp_path, datasets=[{"name": "a", "path": "a.jsonl"}],
                      classes={"short": {"max_tokens": 10, "concurrency": 1}})
    store = await seeded_store(cfg, {"a": 6})
    writer = StoreWriter(store, 0.05, live=lambda: sched.live())
    sched = Scheduler(cfg, store, writer, complete, policy=RetryPolicy(max_attempts=2, base_s=0.001, max_s=0.002))
    await sched.load()
    stop = asyncio.Event()
    wt = asyncio.create_task(writer.run(stop))
    rt = asyncio.create_task(sched.run())
    for _ in range(200):
        await asyncio.sleep(0.02)
        if sched.state == "paused":
            break
    assert sched.pause_kind == "config" and REASONING_REFUSED in sched.state_reason
    assert calls == ["a prompt 0", "a prompt 1", "a prompt 2"]  # concurrency 1: exactly the streak
    snap = sched.snapshot().dataset("a")
    assert (snap.failed, snap.pending) == (0, 6)
    await asyncio.sleep(0.2)
    assert states(cfg.run.dir) == {"pending": 6}
    await Controller(sched).resume()  # "not the config": the rejection is each prompt's own
    assert await asyncio.wait_for(rt, 10) == 0 and sched.state == "completed"
    stop.set()
    await wt
    assert states(cfg.run.dir) == {"failed": 6}
    assert len(calls) == 9  # the streak's three prompts once more, then the other three; no second pause
    await store.close()
