"""Field case 04 and its kind: a finished result whose response carried no usage is still accounted.

vLLM/SGLang send a streamed ``usage`` only when the request asks (``stream_options.include_usage``)
and never a ``cost``; a connection closed right after the finish chunk loses the usage chunk; a
gateway may send a zeroed usage object. Before the fix such results were stored with 0 tokens and
$0 and a token budget never tripped. Now each is trued up from ``/generation`` where the provider
has it, else counted with the ``[tokenizer]``, else estimated, marked ``usage_source`` in the store,
``datagen status --json`` and the raw export, and counted in the budgets.

The servers are real loopback HTTP servers (:mod:`casesrv`); the runs are real ``datagen run
--headless`` subprocesses; token counts are checked against an independent count made here with
tiktoken over the fixture tokenizer's files (not the project's tokenizer code).
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from casesrv import CaseServer, Reply, case_config, chunk, last_user, run_case, sse, stream, usage
from fixtures_tokens import kimi_dir, true_count
from fixtures_tokens import kimi_encoding as _enc

from engine.client.types import Completion, ToolCall, Usage
from engine.config import TokenizerSection
from engine.money.usage import (
    COUNTED,
    ESTIMATED,
    GENERATION,
    REPORTED,
    SOURCES,
    account,
    correction,
    count_with_tokenizer,
    estimate_usage,
    from_generation,
    usage_usable,
)

P_IN, P_OUT = 0.6e-6, 2.5e-6  # casesrv.case_config's [pricing], USD per token
R, C = ("Rivers " * 20).strip(), ("Water runs " * 12).strip()  # case 04's texts
PROMPTS = [{"messages": [{"role": "user", "content": f"Write a short poem number {i} about rivers."}]}
           for i in range(12)]


# ---- an independent count (tiktoken over the fixture's files: fixtures_tokens.kimi_encoding) -------------



def est(chars: int) -> int:
    return math.ceil(chars / 4)


def completion(reasoning: str = R, content: str = C, *, calls: tuple = (), finish: str = "stop",
               u: Usage | None = None, reported: bool = False, gid: str = "gen-1") -> Completion:
    return Completion(reasoning, content, tuple(ToolCall(f"call_{i}", n, a) for i, (n, a) in enumerate(calls)),
                      finish, None, u or Usage(), "Scripted", "m", gid, 1.0, 0.1, usage_reported=reported)


def price(p: int, c: int) -> float:
    return p * P_IN + c * P_OUT


@functools.cache
def _tok():
    from engine.tokens.tokenizer import load_tokenizer

    return load_tokenizer(TokenizerSection(path=str(kimi_dir())))


# ---- engine.money.usage, directly -----------------------------------------------------------------------------------
def test_sources_are_the_documented_five():
    assert SOURCES == ("reported", "generation", "counted", "estimated", "implausible")


def test_reported_usage_with_cost_is_kept_as_billed():
    u = Usage(15, 47, 21, 0.0042)
    a = account(completion(u=u, reported=True), est_prompt_tokens=9, price=price)
    assert (a.usage, a.source, a.cost_billed, a.provisional) == (u, REPORTED, True, False)


def test_reported_usage_without_cost_is_priced_not_zero():
    # vLLM with include_usage: tokens, no `cost`
    a = account(completion(u=Usage(15, 47, 21, None), reported=True), est_prompt_tokens=9, price=price)
    assert a.source == REPORTED and not a.cost_billed
    assert a.usage.cost_usd == pytest.approx(15 * P_IN + 47 * P_OUT)


def test_no_price_known_leaves_cost_unknown_not_zero():
    a = account(completion(), est_prompt_tokens=9, price=lambda p, c: None)
    assert a.source == ESTIMATED and a.usage.cost_usd is None and a.usage.completion_tokens > 0


def test_estimate_from_characters():
    a = account(completion(), est_prompt_tokens=12, price=price)
    want = est(len(R)) + est(len(C)) + 2  # + think_end + end_of_turn
    assert (a.source, a.usage.prompt_tokens, a.usage.completion_tokens, a.usage.reasoning_tokens) == (
        ESTIMATED, 12, want, est(len(R)))
    assert a.usage.cost_usd == pytest.approx(price(12, want)) and not a.cost_billed and a.provisional


def test_estimate_counts_tool_calls_and_a_cut_reply_has_no_end_of_turn():
    c = completion("", "", calls=(("get_weather", '{"city": "Paris"}'),), finish="length")
    assert estimate_usage(c, 5) == (5, est(len("get_weather") + len('{"city": "Paris"}')), 0)


def test_zeroed_usage_object_for_generated_text_counts_as_missing():
    zero = completion(u=Usage(0, 0, 0, None), reported=True)
    assert not usage_usable(zero)
    assert account(zero, est_prompt_tokens=3, price=price).source == ESTIMATED
    empty = completion("", "", u=Usage(7, 0, 0, 0.0), reported=True)  # nothing generated: zero is the truth
    assert usage_usable(empty) and account(empty, est_prompt_tokens=3, price=price).source == REPORTED


def test_counted_with_the_tokenizer_matches_an_independent_count():
    tok = _tok()
    msgs = [{"role": "user", "content": "Write a short poem number 0 about rivers."}]
    c = completion()
    p, n, r = count_with_tokenizer(tok, c, msgs, [])
    assert n == true_count(R, C) and r == len(_enc().encode(R)) and p > 0
    a = account(c, est_prompt_tokens=1, price=price, count=lambda: (p, n, r))
    assert (a.source, a.usage.completion_tokens, a.usage.prompt_tokens) == (COUNTED, n, p)
    assert a.usage.cost_usd == pytest.approx(price(p, n))


def test_counted_tool_calls_and_a_cut_reply():
    tok = _tok()
    msgs = [{"role": "user", "content": "weather?"}]
    calls = (("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Oslo"}'))
    _, n, _ = count_with_tokenizer(tok, completion("Let me look.", "", calls=calls, finish="tool_calls"), msgs, [])
    assert n == true_count("Let me look.", "", calls)
    _, cut, _ = count_with_tokenizer(tok, completion(R, C, finish="length"), msgs, [])
    assert cut == true_count(R, C, finished=False)


def test_reasoning_returned_in_thinking_off_mode_is_still_counted():
    from engine.tokens.tokenizer import load_tokenizer

    tok = load_tokenizer(TokenizerSection(path=str(kimi_dir()), thinking=False))
    _, n, r = count_with_tokenizer(tok, completion(), [{"role": "user", "content": "hi"}], [])
    assert r == len(_enc().encode(R)) and n == r + len(_enc().encode(C)) + 1  # + end of turn, no think_end


def test_a_count_that_raises_falls_back_to_the_estimate():
    def boom():
        raise ValueError("cannot encode")

    a = account(completion(), est_prompt_tokens=4, price=price, count=boom)
    assert a.source == ESTIMATED and a.usage.completion_tokens == est(len(R)) + est(len(C)) + 2


def test_from_generation_prefers_native_counts_and_total_cost():
    a = from_generation({"total_cost": 0.0031, "tokens_prompt": 10, "tokens_completion": 40,
                         "native_tokens_prompt": 12, "native_tokens_completion": 47, "native_tokens_reasoning": 21},
                        price)
    assert (a.usage, a.source, a.cost_billed) == (Usage(12, 47, 21, 0.0031), GENERATION, True)
    b = from_generation({"tokens_prompt": 10, "tokens_completion": 40}, price)  # no native, no cost: priced
    assert b.usage == Usage(10, 40, 0, pytest.approx(price(10, 40))) and not b.cost_billed
    assert from_generation({"total_cost": 0.1}, price) is None  # no token figure: nothing to true up with
    assert from_generation(None, price) is None
    assert from_generation({"native_tokens_completion": "x", "tokens_completion": -3}, price) is None
    assert from_generation({"native_tokens_completion": 0, "tokens_completion": 0, "total_cost": 0}, price) is None
    assert from_generation({"native_tokens_completion": 0, "tokens_completion": 9}, price).usage.completion_tokens == 9


def test_correction_is_the_difference():
    assert correction(Usage(9, 70, 35, 0.0002), Usage(12, 47, 21, 0.0031)) == (3, -23, -14, pytest.approx(0.0029))
    assert correction(Usage(1, 2, 0, None), Usage(1, 2, 0, None)) == (0, 0, 0, 0.0)


def test_spend_correct_replaces_a_provisional_figure_without_double_counting(tmp_path):
    from helpers import make_config

    from engine.money.spend import SpendControl

    cfg = make_config(tmp_path, [{"name": "d", "path": "d.jsonl", "token_budget": 1000}])
    spend = SpendControl(cfg)
    cls = next(iter(cfg.classes))
    r = spend.reserve("d", cls, 10)
    spend.settle("d", r, 10, 70, 0.0002, billed=False)
    assert spend.budgets["d"].tokens.used == 70 and spend.observer.n == 0  # ours: not taught to the observer
    spend.correct("d", 2, 7, 0.0001)
    assert spend.budgets["d"].tokens.used == 77
    assert spend.budgets["d"].cost.used == pytest.approx(0.0003) and spend.run_cost.used == pytest.approx(0.0003)
    spend.correct("d", 0, -500, -1.0)
    assert spend.budgets["d"].tokens.used == 0 and spend.budgets["d"].cost.used == 0


# ---- the store: column, migration, readers of older stores -----------------------------------------------------
OLD_RESULTS = """CREATE TABLE results(
  prompt_id INTEGER PRIMARY KEY, dataset TEXT NOT NULL, key TEXT NOT NULL,
  reasoning TEXT NOT NULL, content TEXT NOT NULL, tool_calls TEXT NOT NULL,
  finish_reason TEXT NOT NULL, native_finish_reason TEXT, provider TEXT NOT NULL, model TEXT NOT NULL,
  generation_id TEXT NOT NULL, prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,
  reasoning_tokens INTEGER NOT NULL, cost_usd REAL, latency_s REAL NOT NULL, ttft_s REAL,
  attempts INTEGER NOT NULL, created_at REAL NOT NULL, UNIQUE(dataset, key))"""


def _old_store(run: Path) -> None:
    """A store as datagen wrote it before ``usage_source`` existed, with one result."""
    from engine.storage.store import SCHEMA

    run.mkdir()
    conn = sqlite3.connect(run / "store.sqlite")
    conn.executescript(SCHEMA.replace(SCHEMA[SCHEMA.index("CREATE TABLE IF NOT EXISTS results("):
                                             SCHEMA.index("CREATE INDEX IF NOT EXISTS results_recent")],
                                      OLD_RESULTS + ";\n"))
    conn.execute("INSERT INTO meta VALUES('schema_version', '1')")
    conn.execute("INSERT INTO datasets(name, position, path, prompts) VALUES('d', 0, 'x', 1)")
    conn.execute("INSERT INTO prompts(id, dataset, key, source, class, est_prompt_tokens, messages, tools, state) "
                 "VALUES(1, 'd', 'k1', 'x:1', 'short', 5, '[{\"role\":\"user\",\"content\":\"hi\"}]', '[]', 'done')")
    conn.execute("INSERT INTO results VALUES(1,'d','k1','','hello','[]','stop',NULL,'P','m','g',5,7,0,0.001,1,0.1,1,1)")
    conn.commit()
    conn.close()


def test_an_older_store_reads_as_reported_and_gains_the_column_when_opened(tmp_path):
    from engine.report.export import export_raw
    from engine.report.status import collect_status
    from engine.storage.store import Store

    run = tmp_path / "run"
    _old_store(run)
    doc = collect_status(run)  # read-only: the column is not there yet
    assert doc["datasets"][0]["usage_sources"] == {"reported": 1, "generation": 0, "counted": 0, "estimated": 0,
                                                    "implausible": 0}
    export_raw(run, tmp_path / "raw")
    assert json.loads((tmp_path / "raw" / "d.jsonl").read_text())["usage_source"] == "reported"

    async def reopen():
        s = await Store.open(run)
        try:
            return await s.usage_sources()
        finally:
            await s.close()

    assert asyncio.run(reopen()) == {"d": {"reported": 1}}
    cols = {r[1] for r in sqlite3.connect(run / "store.sqlite").execute("PRAGMA table_info(results)")}
    assert "usage_source" in cols
    assert asyncio.run(reopen()) == {"d": {"reported": 1}}  # a second open adds nothing


def test_writer_stores_the_source_and_a_true_up_replaces_the_figures(tmp_path):
    from engine.storage.store import Store
    from engine.storage.writer import StoreWriter

    async def go():
        s = await Store.open(tmp_path / "run")
        try:
            await s.register_dataset("d", 0, "x", None)
            await s.ingest_batch("d", [("k1", "x:1", "short", 5, '[{"role":"user","content":"hi"}]', "[]")])
            w = StoreWriter(s)
            w.add_result(1, "d", "k1", completion(u=Usage(5, 70, 35, 0.0002)), 1, usage_source=ESTIMATED)
            w.set_result_usage(1, Usage(6, 47, 21, 0.0031), GENERATION)  # same batch: applied after the insert
            await w.flush()
            cur = await s.conn.execute("SELECT prompt_tokens, completion_tokens, reasoning_tokens, cost_usd, "
                                       "usage_source FROM results")
            return await cur.fetchall()
        finally:
            await s.close()

    assert asyncio.run(go()) == [(6, 47, 21, 0.0031, "generation")]


# ---- real runs against scripted servers ------------------------------------------------------------------------
def vllm(req: dict, n: int) -> Reply:
    """Case 04's server: usage only when the request asks for it; never a cost."""
    inc = bool((req.get("stream_options") or {}).get("include_usage"))
    parts = [chunk({"role": "assistant", "reasoning_content": R}), chunk({"content": C}), chunk({}, "stop")]
    if inc:
        parts.append(chunk(None, choices=False, usage=usage(15, true_count(R, C), 20)))
    return stream(*parts)


def never_usage(req: dict, n: int) -> Reply:
    """A server that never sends usage, asked or not."""
    return stream(chunk({"role": "assistant", "reasoning_content": R}), chunk({"content": C}), chunk({}, "stop"))


def rows(tmp: Path) -> list[tuple]:
    conn = sqlite3.connect(tmp / "run" / "store.sqlite")
    try:
        return conn.execute("SELECT key, prompt_tokens, completion_tokens, reasoning_tokens, cost_usd, usage_source "
                            "FROM results ORDER BY prompt_id").fetchall()
    finally:
        conn.close()


def status_json(tmp: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "datagen", "status", str(tmp / "run"), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def raw_export(tmp: Path) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "datagen", "export", str(tmp / "run"), "--format", "raw",
                          "--out", str(tmp / "raw")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [json.loads(x) for x in (tmp / "raw" / "d.jsonl").read_text().splitlines()]


def budget_case(tmp: Path, respond, *, tokenizer: bool, extra: str = "") -> tuple[CaseServer, dict]:
    """Case 04's shape: 12 prompts, one at a time, max_tokens 100, a 300-token budget."""
    with CaseServer(respond) as srv:
        cfg = case_config(tmp, srv.base_url, PROMPTS, max_tokens=100, concurrency=1,
                          tokenizer=kimi_dir() if tokenizer else None, dataset_extra="token_budget = 300",
                          extra=extra)
        r = run_case(cfg)
        assert r.returncode == 0, r.stdout + r.stderr
    return srv, status_json(tmp)


def assert_budget_tripped(doc: dict, per_result: int, source: str) -> None:
    d = doc["datasets"][0]
    n = d["done"]
    assert d["state"] == "budget_met", d
    assert 0 < n < 12 and d["skipped"] == 12 - n
    assert d["completion_tokens"] == n * per_result
    # the budget held dispatch back when the next request (up to max_tokens) could not fit
    assert d["completion_tokens"] <= 300 < d["completion_tokens"] + 100 + per_result
    assert d["usage_sources"] == {k: (n if k == source else 0) for k in SOURCES}
    assert d["cost_usd"] > 0


def test_case04_no_usage_counted_with_tokenizer_and_budget_trips(tmp_path):
    srv, doc = budget_case(tmp_path, never_usage, tokenizer=True)
    want = true_count(R, C)
    assert_budget_tripped(doc, want, COUNTED)
    got = rows(tmp_path)
    assert {(ct, src) for _, _, ct, _, _, src in got} == {(want, COUNTED)}
    for _, pt, ct, rt, cost, _ in got:
        assert rt == len(_enc().encode(R)) and pt > 0 and cost == pytest.approx(price(pt, ct))
    conn = sqlite3.connect(tmp_path / "run" / "store.sqlite")  # live validation: no billed count to compare
    checks = conn.execute("SELECT ok, notes, billing_diff FROM validations").fetchall()
    conn.close()
    assert checks and all(c == (1, '["no_usage"]', None) for c in checks), checks
    raw = raw_export(tmp_path)
    assert [x["usage_source"] for x in raw] == [COUNTED] * len(got)
    assert all(x["usage"]["completion_tokens"] == want for x in raw)


def test_case04_no_usage_estimated_without_tokenizer_and_budget_trips(tmp_path):
    srv, doc = budget_case(tmp_path, never_usage, tokenizer=False)
    want = est(len(R)) + est(len(C)) + 2
    assert_budget_tripped(doc, want, ESTIMATED)
    assert {(ct, src) for _, _, ct, _, _, src in rows(tmp_path)} == {(want, ESTIMATED)}
    assert {x["usage_source"] for x in raw_export(tmp_path)} == {ESTIMATED}
    # validating later with a tokenizer: an estimate is no billed count to check the rebuilt length against
    tok_cfg = tmp_path / "tok.toml"
    tok_cfg.write_text((tmp_path / "config.toml").read_text().replace(
        "[classes.short]", f'[tokenizer]\npath = "{kimi_dir()}"\nkind = "tiktoken"\n\n[classes.short]'))
    v = subprocess.run([sys.executable, "-m", "datagen", "validate", str(tmp_path / "run"), "--config", str(tok_cfg),
                        "--json", "--workers", "1"], capture_output=True, text=True, timeout=120)
    assert v.returncode == 0, v.stdout + v.stderr
    conn = sqlite3.connect(tmp_path / "run" / "store.sqlite")
    got = conn.execute("SELECT ok, reasons, notes, billed_completion, billing_diff FROM validations").fetchall()
    conn.close()
    assert got and all(r == (1, "[]", '["no_usage"]', 0, None) for r in got), got


def test_case04_stream_usage_false_still_counts(tmp_path):
    """``[provider] stream_usage = false``: the vLLM server sends no usage; the tokens are counted and
    the budget trips all the same."""
    def cfg_off(srv: CaseServer) -> Path:
        cfg = case_config(tmp_path, srv.base_url, PROMPTS, max_tokens=100, concurrency=1, tokenizer=kimi_dir(),
                          dataset_extra="token_budget = 300")
        text = cfg.read_text().replace('api_key_env = "CASE_KEY"\n', 'api_key_env = "CASE_KEY"\nstream_usage = false\n')
        cfg.write_text(text)
        return cfg

    with CaseServer(vllm) as srv:
        r = run_case(cfg_off(srv))
        assert r.returncode == 0, r.stdout + r.stderr
    assert srv.requests and not any((q.get("stream_options") or {}).get("include_usage") for q in srv.requests)
    assert_budget_tripped(status_json(tmp_path), true_count(R, C), COUNTED)


def test_case04_request_asks_for_usage_and_stores_it_as_reported(tmp_path):
    srv, doc = budget_case(tmp_path, vllm, tokenizer=True)
    assert srv.requests and all((r.get("stream_options") or {}).get("include_usage") is True for r in srv.requests)
    want = true_count(R, C)
    assert_budget_tripped(doc, want, REPORTED)
    for _, pt, ct, _, cost, src in rows(tmp_path):
        assert (pt, ct, src) == (15, want, REPORTED) and cost == pytest.approx(price(15, want))  # priced, no cost sent


def test_usage_lost_when_the_connection_closes_after_the_finish_chunk(tmp_path):
    """Three shapes: chunked body cut after the finish chunk (no [DONE], no usage), a close-delimited body
    ending after the finish chunk, and a zeroed usage object. Each result is counted, none is zero."""
    head = [sse(chunk({"role": "assistant", "reasoning_content": R})), sse(chunk({"content": C})),
            sse(chunk({}, "stop"))]

    def respond(req: dict, n: int) -> Reply:
        i = int(last_user(req).split()[5])
        if i % 3 == 0:
            return Reply(pieces=list(head), drop=True)
        if i % 3 == 1:
            return Reply(pieces=list(head), chunked=False)
        return stream(chunk({"role": "assistant", "reasoning_content": R}), chunk({"content": C}),
                      chunk({}, "stop"), chunk(None, choices=False, usage=usage(0, 0)))

    with CaseServer(respond) as srv:
        cfg = case_config(tmp_path, srv.base_url, PROMPTS[:6], max_tokens=100, concurrency=2, tokenizer=kimi_dir())
        r = run_case(cfg)
        assert r.returncode == 0, r.stdout + r.stderr
    want = true_count(R, C)
    got = rows(tmp_path)
    assert len(got) == 6 and {(ct, src) for _, _, ct, _, _, src in got} == {(want, COUNTED)}
    assert len(srv.requests) == 6  # accepted as finished: nothing re-requested
    doc = status_json(tmp_path)
    assert doc["totals"]["completion_tokens"] == 6 * want and doc["totals"]["usage_sources"][COUNTED] == 6


def test_non_streamed_body_without_usage_is_estimated(tmp_path):
    """``stream = false`` against a server whose JSON body has no ``usage``: estimated, not zero."""
    def respond(req: dict, n: int) -> Reply:
        body = {"id": "gen-x", "object": "chat.completion", "model": "m", "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": C, "reasoning_content": R}}]}
        return Reply(headers=[("Content-Type", "application/json")], pieces=[json.dumps(body).encode()], chunked=False)

    with CaseServer(respond) as srv:
        cfg = case_config(tmp_path, srv.base_url, PROMPTS[:2], max_tokens=100)
        cfg.write_text(cfg.read_text().replace('api_key_env = "CASE_KEY"\n', 'api_key_env = "CASE_KEY"\nstream = false\n'))
        r = run_case(cfg)
        assert r.returncode == 0, r.stdout + r.stderr
    assert all(q["stream"] is False for q in srv.requests)
    want = est(len(R)) + est(len(C)) + 2
    got = rows(tmp_path)
    assert len(got) == 2 and {(ct, src) for _, _, ct, _, _, src in got} == {(want, ESTIMATED)}
    assert all(cost == pytest.approx(price(pt, ct)) for _, pt, ct, _, cost, _ in got)


def test_generation_true_up_replaces_the_count(tmp_path):
    """OpenRouter without usage in the stream: the count settles at once, then `/generation` (native
    counts, total_cost) replaces it in the store, status and export; counted once."""
    def respond(req: dict, n: int) -> Reply:
        i = int(last_user(req).split()[5])
        return stream(chunk({"role": "assistant", "reasoning_content": R}, gid=f"gen-{i}"),
                      chunk({"content": C}, gid=f"gen-{i}"), chunk({}, "stop", gid=f"gen-{i}"))

    with CaseServer(respond) as srv:
        for i in range(4):
            srv.generations[f"gen-{i}"] = {"total_cost": 0.001 * (i + 1), "native_tokens_prompt": 20 + i,
                                           "native_tokens_completion": 50 + i, "native_tokens_reasoning": 22,
                                           "tokens_completion": 40}
        srv.generations["gen-4"] = {"total_cost": 0.5}  # no token figure: nothing to true up with
        cfg = case_config(tmp_path, srv.base_url, PROMPTS[:5], kind="openrouter", max_tokens=100, concurrency=5,
                          tokenizer=kimi_dir())
        r = run_case(cfg)
        assert r.returncode == 0, r.stdout + r.stderr
    assert len(rows(tmp_path)) == 5
    conn = sqlite3.connect(tmp_path / "run" / "store.sqlite")
    st = dict(conn.execute("SELECT r.generation_id, r.usage_source FROM results r").fetchall())
    vals = {g: v for g, *v in conn.execute(
        "SELECT generation_id, prompt_tokens, completion_tokens, reasoning_tokens, cost_usd FROM results")}
    conn.close()
    for i in range(4):
        assert st[f"gen-{i}"] == GENERATION
        assert vals[f"gen-{i}"] == [20 + i, 50 + i, 22, pytest.approx(0.001 * (i + 1))]
    assert st["gen-4"] == COUNTED  # /generation named no tokens: the count stands
    assert vals["gen-4"][1] == true_count(R, C)
    doc = status_json(tmp_path)
    d = doc["datasets"][0]
    assert d["usage_sources"] == {"reported": 0, "generation": 4, "counted": 1, "estimated": 0, "implausible": 0}
    assert d["completion_tokens"] == sum(50 + i for i in range(4)) + true_count(R, C)
    assert d["cost_usd"] == pytest.approx(0.010 + vals["gen-4"][3])
    assert sorted(x["usage_source"] for x in raw_export(tmp_path)) == [COUNTED] + [GENERATION] * 4


# ---- the scheduler, with a scripted `complete` on a real store ---------------------------------------------------
class _SlowTok:
    """The real fixture tokenizer, whose first ``encode`` waits (signalling that counting started)."""

    def __init__(self, tok, wait_s: float) -> None:
        import threading

        self._tok, self._wait_s = tok, wait_s
        self.started = threading.Event()

    def encode(self, text: str) -> list[int]:
        if not self.started.is_set():
            self.started.set()
            import time

            time.sleep(self._wait_s)
        return self._tok.encode(text)

    def __getattr__(self, name: str):
        return getattr(self._tok, name)


class _Recon:
    def __init__(self, tok) -> None:
        self.tok = tok
        self.submitted: list[Completion] = []

    def submit(self, prompt_id, dataset, key, messages, tools, c) -> None:
        self.submitted.append(c)


async def _sched(tmp_path, n: int, complete, *, get_json=None, recon=None, budget: int | None = None):
    from helpers import make_config, seeded_store

    from engine.client.retry import RetryPolicy
    from engine.run.scheduler import Scheduler
    from engine.storage.writer import StoreWriter

    cfg = make_config(tmp_path, [{"name": "a", "path": "a.jsonl", "token_budget": budget}],
                      pricing={"prompt_usd_per_m": 0.6, "completion_usd_per_m": 2.5})
    store = await seeded_store(cfg, {"a": n})
    writer = StoreWriter(store, 0.05, live=lambda: sched.live())
    sched = Scheduler(cfg, store, writer, complete, policy=RetryPolicy(max_attempts=2, base_s=0.001, max_s=0.002),
                      get_json=get_json, recon=recon)
    await sched.load()
    return store, writer, sched


async def _run(sched, writer, during=None):
    stop = asyncio.Event()
    wt = asyncio.create_task(writer.run(stop))
    run = asyncio.create_task(sched.run())
    if during is not None:
        await during()
    code = await asyncio.wait_for(run, 60)
    stop.set()
    await wt
    return code


async def test_an_abort_while_counting_keeps_the_paid_result(tmp_path):
    async def complete(req, progress=None):
        return completion(gid="gen-a")

    tok = _SlowTok(_tok(), 0.5)
    recon = _Recon(tok)
    store, writer, sched = await _sched(tmp_path, 1, complete, recon=recon)

    async def abort_while_counting():
        await asyncio.to_thread(tok.started.wait, 10)
        assert sched.ending.abort() == 1

    await _run(sched, writer, abort_while_counting)
    cur = await store.conn.execute("SELECT completion_tokens, usage_source FROM results")
    got = await cur.fetchall()
    cur = await store.conn.execute("SELECT state FROM prompts")
    state = await cur.fetchall()
    await store.close()
    want = est(len(R)) + est(len(C)) + 2
    assert got == [(want, ESTIMATED)] and state == [("done",)]
    assert sched.spend.budgets["a"].tokens.used == want
    assert recon.submitted[0].usage == Usage() and not recon.submitted[0].usage_reported  # as received


async def test_trueup_in_the_scheduler_counts_once(tmp_path):
    """Settled with the count at once, corrected to /generation's figures: the budget, the counters and
    the row hold the provider's numbers, never the sum of both."""
    asked: list[str] = []

    async def complete(req, progress=None):
        i = req.messages[-1]["content"].split()[-1]
        return completion(gid=f"gen-{i}")

    async def get_json(path, params=None):
        asked.append(params["id"])
        i = int(params["id"].split("-")[1])
        return {"data": {"native_tokens_prompt": 30, "native_tokens_completion": 40 + i, "total_cost": 0.01}}

    recon = _Recon(_tok())
    store, writer, sched = await _sched(tmp_path, 3, complete, get_json=get_json, recon=recon, budget=10_000)
    await _run(sched, writer)
    cur = await store.conn.execute("SELECT completion_tokens, prompt_tokens, cost_usd, usage_source FROM results "
                                   "ORDER BY prompt_id")
    got = await cur.fetchall()
    await store.close()
    assert sorted(asked) == ["gen-0", "gen-1", "gen-2"]
    assert got == [(40 + i, 30, 0.01, GENERATION) for i in range(3)]
    rt = sched.datasets["a"]
    assert (rt.completion_tokens, rt.prompt_tokens) == (123, 90) and sched.spend.dataset_usd["a"] == pytest.approx(0.03)
    assert sched.spend.budgets["a"].tokens.used == 123
    assert sched.spend.budgets["a"].cost.used == pytest.approx(0.03)
