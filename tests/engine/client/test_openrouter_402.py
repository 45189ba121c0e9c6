"""OpenRouter's HTTP 402 variants: the in-flight spending budget is not the account's credits.

OpenRouter (``docs/api_reference/limits``, "In-flight spending budget") answers 402 in three cases,
told apart by ``error.metadata``:

- ``reason: in_flight_budget_exhausted`` / ``limit_source: openrouter_in_flight_budget``: running and
  recently settled requests fill the budget; transient, with ``Retry-After``. Here: ``rate_limit``,
  retried after ``Retry-After``; the run goes on and the prompt does not fail.
- ``reason: weight_exceeds_budget`` / ``limit_source: openrouter_credits``: this one request's
  estimated cost is larger than the whole budget; retrying cannot help. Here: ``bad_request``, the
  prompt fails at once with a message naming the ``max_tokens`` that would fit; the run goes on.
- a plain 402 (insufficient credits, the key's limit): ``credits``, the run pauses (as before).

Unit tests classify realistic bodies and headers (HTTP and in-stream); the end-to-end tests run a
real ``datagen run --headless`` against a scripted loopback server (:mod:`casesrv`) and read the
store and ``datagen status --json``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from casesrv import (
    CaseServer,
    Reply,
    case_config,
    chunk,
    error_reply,
    last_user,
    ok_reply,
    prompts,
    run_case,
    states,
    status,
    stream,
)

from engine.client.chat import ChatClient
from engine.client.errors import (
    IN_FLIGHT_EXHAUSTED,
    WEIGHT_EXCEEDS,
    budget_402_reason,
    classify_error_object,
    classify_http_error,
    for_request,
    is_weight_exceeds_budget,
)
from engine.client.retry import RetryPolicy, call_with_retries
from engine.client.types import ChatRequest, ErrorClass, RequestError
from engine.run.runwide import condition_of, is_rejection

# ---- realistic bodies (OpenRouter's documented shapes) -------------------------------------------
IN_FLIGHT_MSG = ("This request would exceed your available credits given your current in-flight requests. "
                 "Retry after in-flight requests settle, or add credits.")
IN_FLIGHT_META = {
    "reason": "in_flight_budget_exhausted",
    "limit_source": "openrouter_in_flight_budget",
    "remedy_hint": "Retry after your in-flight requests settle (see the Retry-After header). Adding credits at "
                   "https://openrouter.ai/settings/credits raises your in-flight budget, up to a capped ceiling.",
}
WEIGHT_MSG = ("This request's estimated cost is larger than your in-flight spending budget. Lower max_tokens or "
              "the prompt size, or add credits.")
WEIGHT_META = {
    "reason": "weight_exceeds_budget",
    "limit_source": "openrouter_credits",
    "remedy_hint": "Lower max_tokens or the prompt size, or add credits at https://openrouter.ai/settings/credits.",
}
CREDITS_MSG = ("Insufficient credits. This account never purchased credits. Make sure your key is on the correct "
               "account or org, and if so, purchase more at https://openrouter.ai/settings/credits")


def body(code: int | str, message: str, meta: dict | None = None) -> str:
    err: dict = {"code": code, "message": message}
    if meta is not None:
        err["metadata"] = meta
    return json.dumps({"error": err})


# ---- classification: in_flight_budget_exhausted -------------------------------------------------
def test_in_flight_budget_exhausted_is_a_rate_limit_retried_after_retry_after():
    e = classify_http_error(402, {"Retry-After": "1", "Content-Type": "application/json"},
                            body(402, IN_FLIGHT_MSG, IN_FLIGHT_META))
    assert e.error_class is ErrorClass.RATE_LIMIT
    assert e.retryable and not e.error_class.fatal
    assert e.status == 402 and e.retry_after_s == 1.0
    assert e.message.startswith("in-flight budget exhausted (OpenRouter 402 in_flight_budget_exhausted: transient, "
                                "retried after Retry-After 1s like a rate limit): ")
    assert IN_FLIGHT_MSG in e.message
    assert str(e).startswith("rate_limit HTTP 402: in-flight budget exhausted")
    # not the run's (no pause), not a rejection (no config-mistake streak), not a weight error
    assert condition_of(e.error_class.value, e.status, e.message) is None
    assert not is_rejection(e.error_class.value, e.status, e.message)
    assert not is_weight_exceeds_budget(e)
    # the retry waits what the server asked (no jitter: exactly)
    assert RetryPolicy(retry_after_jitter=0).wait_s(1, e) == 1.0
    assert 1.0 <= RetryPolicy().wait_s(1, e) <= 1.1


@pytest.mark.parametrize("meta, headers, why", [
    ({"limit_source": "openrouter_in_flight_budget"}, {"Retry-After": "3"}, "limit_source alone"),
    ({"reason": "in_flight_budget_exhausted"}, {"retry-after": "3"}, "reason alone, lower-case header"),
    ({}, {"Retry-After": "3"}, "message only, with Retry-After"),
    ({"error_type": "in_flight_budget_exhausted"}, {"Retry-After": "3"}, "named in error_type"),
])
def test_in_flight_budget_exhausted_is_recognised_from_each_marker(meta, headers, why):
    e = classify_http_error(402, headers, body(402, IN_FLIGHT_MSG, meta))
    assert e.error_class is ErrorClass.RATE_LIMIT and e.retry_after_s == 3.0, why
    assert "in-flight budget exhausted" in e.message


def test_in_flight_budget_exhausted_without_retry_after_backs_off_exponentially():
    e = classify_http_error(402, {}, body(402, IN_FLIGHT_MSG, IN_FLIGHT_META))
    assert e.error_class is ErrorClass.RATE_LIMIT and e.retry_after_s is None
    assert "retried with backoff like a rate limit" in e.message
    waits = [RetryPolicy(base_s=1.0, max_s=60.0).wait_s(n, e) for n in (1, 2, 3)]
    assert 0 <= waits[0] <= 1.0 and 0 <= waits[1] <= 2.0 and 0 <= waits[2] <= 4.0


def test_in_flight_budget_exhausted_as_an_in_stream_error_chunk_is_classified_the_same():
    err = {"code": 402, "message": IN_FLIGHT_MSG, "metadata": {**IN_FLIGHT_META, "headers": {"Retry-After": "2"}}}
    e = classify_error_object(err, generation_id="gen-9")
    assert e.error_class is ErrorClass.RATE_LIMIT and e.status == 402 and e.retry_after_s == 2.0
    assert e.generation_id == "gen-9"
    assert e.message.startswith("in-flight budget exhausted (OpenRouter 402")
    assert e.message.endswith("(error object in an HTTP 200 response)")
    # a code that is the reason's name (no number) stands for 402 too
    e2 = classify_error_object({"code": "in_flight_budget_exhausted", "message": IN_FLIGHT_MSG})
    assert e2.error_class is ErrorClass.RATE_LIMIT and e2.status == 402


async def test_call_with_retries_sleeps_retry_after_then_succeeds():
    e = classify_http_error(402, {"Retry-After": "1"}, body(402, IN_FLIGHT_MSG, IN_FLIGHT_META))
    outcomes: list = [e, e, "ok"]
    slept: list[float] = []
    seen: list[tuple] = []

    async def fn():
        o = outcomes.pop(0)
        if isinstance(o, RequestError):
            raise o
        return o

    async def sleep(s: float) -> None:
        slept.append(s)

    r = await call_with_retries(fn, RetryPolicy(max_attempts=6, retry_after_jitter=0),
                                on_attempt=lambda n, err, w: seen.append((n, err.error_class.value if err else None, w)),
                                sleep=sleep)
    assert r == "ok" and slept == [1.0, 1.0]
    assert seen == [(1, "rate_limit", 1.0), (2, "rate_limit", 1.0), (3, None, None)]


# ---- classification: weight_exceeds_budget ------------------------------------------------------
def test_weight_exceeds_budget_fails_the_prompt_and_says_to_lower_max_tokens():
    e = classify_http_error(402, {"Content-Type": "application/json"}, body(402, WEIGHT_MSG, WEIGHT_META))
    assert e.error_class is ErrorClass.BAD_REQUEST
    assert not e.retryable and not e.error_class.fatal
    assert e.status == 402 and e.retry_after_s is None
    assert e.message == (
        "weight_exceeds_budget: this one request's estimated cost is larger than the whole OpenRouter in-flight "
        "budget, so retrying it will not help; lower max_tokens for this class (or shorten the prompt, or add "
        f"credits). OpenRouter: {WEIGHT_MSG} [code=402]")
    assert is_weight_exceeds_budget(e)
    assert condition_of(e.error_class.value, e.status, e.message) is None  # never pauses the run
    assert not is_rejection(e.error_class.value, e.status, e.message)  # nor counts as a config mistake
    # the run completes the message with the request's class and max_tokens
    for_request(e, 8192, "long")
    assert ("lower max_tokens for class 'long' (now 8,192; or shorten the prompt, or add credits). OpenRouter: "
            in e.message)
    assert str(e).startswith("bad_request HTTP 402: weight_exceeds_budget: this one request's estimated cost")
    assert "class 'long'" in str(e)
    assert for_request(e, 8192, "long").message.count("class 'long'") == 1  # idempotent


def test_weight_exceeds_budget_with_budget_and_estimate_gives_the_max_tokens_that_fit():
    meta = {**WEIGHT_META, "in_flight_budget_usd": 0.0035, "estimated_cost_usd": 0.0061,
            "estimated_prompt_cost_usd": 0.0010}
    e = classify_http_error(402, {}, body(402, WEIGHT_MSG, meta))
    assert e.error_class is ErrorClass.BAD_REQUEST
    assert ("lower max_tokens for this class (estimated cost $0.0061 (prompt $0.001) > in-flight budget $0.0035)"
            in e.message)
    for_request(e, 2048, "short")
    # estimate = prompt + max_tokens * price: (0.0035 - 0.0010) / ((0.0061 - 0.0010) / 2048) = 1003.9
    assert "; max_tokens <= 1,003 would fit; class 'short' sends max_tokens 2,048. OpenRouter: " in e.message
    assert "lower max_tokens for this class" not in e.message


def test_weight_exceeds_budget_without_the_prompt_part_gives_an_upper_bound():
    meta = {**WEIGHT_META, "budget_usd": "0.05", "estimated_cost_usd": "0.2", "max_tokens": 8000}
    e = classify_http_error(402, {}, body(402, WEIGHT_MSG, meta))
    assert ("max_tokens <= 2,000 would fit at most (less by the prompt's share of the estimate); the request asked "
            "for 8,000. OpenRouter: ") in e.message
    for_request(e, 8000, "long")
    assert "the request asked for 8,000 (class 'long'). OpenRouter: " in e.message


def test_weight_exceeds_budget_reads_can_only_afford_from_the_message_in_stream_too():
    err = {"code": 402, "message": "This request requires more credits, or fewer max_tokens. You requested up to "
                                   "16384 tokens, but can only afford 5021.", "metadata": WEIGHT_META}
    e = classify_error_object(err)
    assert e.error_class is ErrorClass.BAD_REQUEST and e.status == 402 and not e.retryable
    assert "max_tokens <= 5,021 would fit; the request asked for 16,384. OpenRouter: " in e.message
    assert e.message.endswith("(error object in an HTTP 200 response)")


def test_weight_exceeds_budget_named_only_in_the_message():
    e = classify_http_error(402, {}, body(402, "weight_exceeds_budget: estimated cost exceeds in-flight budget"))
    assert e.error_class is ErrorClass.BAD_REQUEST and is_weight_exceeds_budget(e)
    # an in-flight budget message whose limit_source is the credits is the too-expensive request
    e2 = classify_http_error(402, {}, body(402, WEIGHT_MSG, {"limit_source": "openrouter_credits"}))
    assert e2.error_class is ErrorClass.BAD_REQUEST and is_weight_exceeds_budget(e2)


def test_the_same_weight_error_on_the_first_prompts_is_not_a_config_mistake():
    e = classify_http_error(402, {}, body(402, WEIGHT_MSG, WEIGHT_META))
    # failures.py asks is_rejection before the config-mistake detector: a weight error never reaches it
    assert not is_rejection("bad_request", 402, e.message)
    assert not is_rejection("bad_request", 402, for_request(e, 4096, "short").message)
    assert is_rejection("bad_request", 402, "This endpoint's maximum context length is 262144 tokens")
    assert is_rejection("bad_request", 400)  # the message is optional (the other callers)


async def test_weight_exceeds_budget_is_not_retried():
    e = classify_http_error(402, {}, body(402, WEIGHT_MSG, WEIGHT_META))
    calls = 0

    async def fn():
        nonlocal calls
        calls += 1
        raise e

    with pytest.raises(RequestError) as ei:
        await call_with_retries(fn, RetryPolicy(max_attempts=6), sleep=lambda s: None)
    assert calls == 1 and ei.value.attempts == 1 and ei.value.error_class is ErrorClass.BAD_REQUEST


# ---- classification: the plain 402 stays credits -------------------------------------------------
@pytest.mark.parametrize("err_body", [
    body(402, CREDITS_MSG),
    body(402, CREDITS_MSG, {"limit_source": "openrouter_credits",
                            "remedy_hint": "Add credits at https://openrouter.ai/settings/credits."}),
    body(402, "Key limit exceeded (total limit). Manage it at https://openrouter.ai/settings/keys",
         {"limit_source": "openrouter_key_limit"}),
    body("payment_required", "Payment required"),
    body(402, "This request requires more credits, or fewer max_tokens. You requested up to 65536 tokens, but can "
              "only afford 12040. To increase, visit https://openrouter.ai/settings/credits and add more credits"),
])
def test_plain_402_is_credits_and_pauses_the_run(err_body):
    e = classify_http_error(402, {"Content-Type": "application/json"}, err_body)
    assert e.error_class is ErrorClass.CREDITS and e.error_class.fatal and not e.retryable
    assert e.retry_after_s is None
    assert budget_402_reason(json.loads(err_body)["error"], e.message) is None
    cond = condition_of(e.error_class.value, e.status, e.message)
    assert cond is not None and cond.kind == "credits" and cond.reason.startswith("out of credits (HTTP 402): ")


def test_a_message_about_the_in_flight_budget_with_no_marker_and_no_retry_after_stays_credits():
    # no reason, no limit_source, no Retry-After: nothing says it is transient; pausing is the safe side
    e = classify_http_error(402, {}, body(402, IN_FLIGHT_MSG))
    assert e.error_class is ErrorClass.CREDITS


def test_budget_reasons_only_change_a_402():
    e = classify_http_error(429, {"Retry-After": "2"}, body(429, IN_FLIGHT_MSG, IN_FLIGHT_META))
    assert e.error_class is ErrorClass.RATE_LIMIT and e.message.startswith(IN_FLIGHT_MSG)
    e = classify_http_error(400, {}, body(400, WEIGHT_MSG, WEIGHT_META))
    assert e.error_class is ErrorClass.BAD_REQUEST and not is_weight_exceeds_budget(e)
    assert budget_402_reason({"metadata": {"reason": WEIGHT_EXCEEDS}}) == WEIGHT_EXCEEDS
    assert budget_402_reason({"metadata": {"reason": IN_FLIGHT_EXHAUSTED}}) == IN_FLIGHT_EXHAUSTED


# ---- through the real client on a loopback socket --------------------------------------------------
def in_flight_402(retry_after: str | None = "1") -> Reply:
    r = error_reply(402, IN_FLIGHT_MSG, metadata=IN_FLIGHT_META)
    if retry_after is not None:
        r.headers.append(("Retry-After", retry_after))
    return r


def in_flight_chunk() -> Reply:
    """The 402 as an error chunk of a 200 stream (finish_reason ``error``)."""
    err = {"code": 402, "message": IN_FLIGHT_MSG, "metadata": IN_FLIGHT_META}
    return stream(chunk({"role": "assistant", "content": ""}), chunk({"content": ""}, "error", error=err))


def weight_402(meta: dict | None = None) -> Reply:
    return error_reply(402, WEIGHT_MSG, metadata=meta or WEIGHT_META)


async def test_chat_client_classifies_the_402_variants_from_the_wire():
    replies = {"http": in_flight_402("1"), "chunk": in_flight_chunk(), "weight": weight_402(),
               "credits": error_reply(402, CREDITS_MSG, metadata={"limit_source": "openrouter_credits"})}

    with CaseServer(lambda req, n: replies[last_user(req)]) as srv:
        async with ChatClient(srv.base_url, "sk-or-v1-test", trust_env=False) as c:
            got = {}
            for k in replies:
                with pytest.raises(RequestError) as ei:
                    await c.complete(ChatRequest(messages=[{"role": "user", "content": k}], max_tokens=64,
                                                 body={"model": "m"}))
                got[k] = ei.value
    assert (got["http"].error_class, got["http"].status, got["http"].retry_after_s) == (ErrorClass.RATE_LIMIT, 402, 1.0)
    assert (got["chunk"].error_class, got["chunk"].status) == (ErrorClass.RATE_LIMIT, 402)
    assert "in-flight budget exhausted" in got["chunk"].message
    assert (got["weight"].error_class, got["weight"].status) == (ErrorClass.BAD_REQUEST, 402)
    assert is_weight_exceeds_budget(got["weight"])
    assert got["credits"].error_class is ErrorClass.CREDITS


# ---- end to end: a real headless run ----------------------------------------------------------------
def fact(i: int) -> str:
    return f"Give me fun fact number {i}."


def sql(run_dir: Path, q: str, *args) -> list[tuple]:
    with sqlite3.connect(run_dir / "store.sqlite") as c:
        return c.execute(q, args).fetchall()


def pause_events(run_dir: Path) -> list[str]:
    return [m for (m,) in sql(run_dir, "SELECT message FROM events WHERE message LIKE '%paused%' ORDER BY id")]


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
def test_in_flight_budget_402s_are_retried_after_retry_after_and_every_prompt_completes(tmp_path):
    """Prompt i meets ``i % 3`` in-flight 402s (HTTP, ``Retry-After: 1``; prompt 7's as an error chunk in
    a 200 stream) before a 200: all done, none failed, the run and the dataset never paused, although
    7 errors in 15 attempts would trip a 10-attempt anomaly window if they counted."""
    n_402 = {fact(i): i % 3 for i in range(8)}
    times: dict[str, list[float]] = {}
    lock = threading.Lock()

    def respond(req, n):
        key = last_user(req)
        with lock:
            times.setdefault(key, []).append(time.monotonic())
        if n <= n_402[key]:
            return in_flight_chunk() if key == fact(7) else in_flight_402("1")
        return ok_reply()

    with CaseServer(respond) as srv:
        cfg = case_config(tmp_path, srv.base_url, prompts(8), kind="openrouter", concurrency=8, max_attempts=4,
                          extra="[spend]\nanomaly_window = 10\n")
        run_dir = tmp_path / "run"
        r = run_case(cfg, "--exit-on-pause")
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert "out of credits" not in out and "anomaly guard" not in out
        assert states(run_dir) == {"done": 8}
        assert len(srv.requests) == 8 + 7
        assert {k: len(v) for k, v in times.items()} == {fact(i): 1 + i % 3 for i in range(8)}
        for i in range(7):  # HTTP 402s: the retry waited Retry-After (1 s, +10% jitter at most), not more
            ts = times[fact(i)]
            gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]  # consecutive pairs: one shorter by design
            assert all(0.95 <= g < 5.0 for g in gaps), (i, gaps)

        rows = sql(run_dir, "SELECT error_class, status, message FROM attempts WHERE outcome='error'")
        assert len(rows) == 7
        assert {(ec, st) for ec, st, _ in rows} == {("rate_limit", 402)}
        assert all(m.startswith("in-flight budget exhausted (OpenRouter 402 in_flight_budget_exhausted") for *_, m in rows)
        assert sum("retried after Retry-After 1s" in m for *_, m in rows) == 6
        assert sum("(error object in an HTTP 200 response)" in m for *_, m in rows) == 1

        doc = status(run_dir)
        d = doc["datasets"][0]
        assert (d["done"], d["failed"], d["pending"]) == (8, 0, 0)
        assert d["errors"] == {"rate_limit": 7}
        assert d["state"] == "done"
        assert doc["run"]["state"] == "completed"
        assert pause_events(run_dir) == []
        assert sql(run_dir, "SELECT state, state_reason FROM datasets WHERE name='d'") == [("active", "")]


def test_weight_exceeds_budget_fails_only_its_prompts_and_the_run_goes_on(tmp_path):
    """Prompts 0-2 (the first three, one at a time: the same message would look like a config mistake)
    meet OpenRouter's documented weight_exceeds_budget body; prompt 5 one whose metadata gives the
    budget and the estimate. Each is sent once and fails with the reason and what to do; the other 8
    are done; the run completes without a pause, and the dataset without an anomaly-guard pause (4
    of 12 would trip a 10-attempt window if these counted: refused before any provider saw them)."""
    numbers = {**WEIGHT_META, "in_flight_budget_usd": 0.0035, "estimated_cost_usd": 0.0061,
               "estimated_prompt_cost_usd": 0.0010}

    def respond(req, n):
        key = last_user(req)
        if key in (fact(0), fact(1), fact(2)):
            return weight_402()
        if key == fact(5):
            return weight_402(numbers)
        return ok_reply()

    with CaseServer(respond) as srv:
        cfg = case_config(tmp_path, srv.base_url, prompts(12), kind="openrouter", concurrency=1, max_attempts=3,
                          max_tokens=2048, extra="[spend]\nanomaly_window = 10\n")
        run_dir = tmp_path / "run"
        r = run_case(cfg, "--exit-on-pause")
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert "run paused" not in out and "refuses every request the same way" not in out
        assert states(run_dir) == {"done": 8, "failed": 4}
        assert len(srv.requests) == 12  # not retried
        assert sorted(last_user(b) for b in srv.requests) == sorted(fact(i) for i in range(12))

        failed = dict(((k, (ec, err, a)) for k, ec, err, a in sql(
            run_dir, "SELECT key, error_class, error, attempts FROM prompts WHERE state='failed'")))
        keys = {k: i for i, (k,) in enumerate(sql(run_dir, "SELECT key FROM prompts ORDER BY id"))}
        by_prompt = {keys[k]: v for k, v in failed.items()}
        assert sorted(by_prompt) == [0, 1, 2, 5]
        for i in (0, 1, 2):
            ec, err, attempts = by_prompt[i]
            assert (ec, attempts) == ("bad_request", 1)
            assert err == ("bad_request HTTP 402: weight_exceeds_budget: this one request's estimated cost is larger "
                           "than the whole OpenRouter in-flight budget, so retrying it will not help; lower "
                           "max_tokens for class 'short' (now 2,048; or shorten the prompt, or add credits). "
                           f"OpenRouter: {WEIGHT_MSG} [code=402]")
        ec, err, attempts = by_prompt[5]
        assert (ec, attempts) == ("bad_request", 1)
        assert ("so retrying it will not help; max_tokens <= 1,003 would fit; class 'short' sends max_tokens 2,048. "
                "OpenRouter: ") in err

        doc = status(run_dir)
        d = doc["datasets"][0]
        assert (d["done"], d["failed"], d["pending"]) == (8, 4, 0)
        assert d["errors"] == {"bad_request": 4}
        assert doc["run"]["state"] == "completed"
        assert pause_events(run_dir) == []
        assert sql(run_dir, "SELECT state, state_reason FROM datasets WHERE name='d'") == [("active", "")]
        rows = sql(run_dir, "SELECT error_class, status, message FROM attempts WHERE outcome='error'")
        assert len(rows) == 4 and {(ec, st) for ec, st, _ in rows} == {("bad_request", 402)}
        assert all("class 'short'" in m for *_, m in rows)  # the attempt rows carry the completed message too


def test_plain_402_with_limit_source_still_pauses_the_run(tmp_path):
    def respond(req, n):
        if last_user(req) == fact(0):
            return ok_reply()
        return error_reply(402, CREDITS_MSG, metadata={"limit_source": "openrouter_credits",
                                                        "remedy_hint": "Add credits."})

    with CaseServer(respond) as srv:
        cfg = case_config(tmp_path, srv.base_url, prompts(6), kind="openrouter", concurrency=1, max_attempts=3)
        run_dir = tmp_path / "run"
        r = run_case(cfg, "--exit-on-pause")
        out = r.stdout + r.stderr
        assert r.returncode == 3, out
        assert f"out of credits (HTTP 402): {CREDITS_MSG}" in out
        st = states(run_dir)
        assert st.get("failed", 0) == 0 and st["done"] == 1 and st["pending"] == 5
        assert len(srv.requests) == 2  # no retry loop: the first 402 paused the run
        assert any(m.startswith("run paused: out of credits (HTTP 402)") for m in pause_events(run_dir))
