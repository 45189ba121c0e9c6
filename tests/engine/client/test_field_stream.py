"""Field cases 01, 09 and 11 (stream assembly and in-stream errors) as tests, each with more shapes of its kind:
a real ``datagen run --headless`` against a scripted loopback server (tests/support/casesrv.py), then the stored rows,
the raw and training exports, validation with a real Kimi-layout tokenizer, and the request bodies sent."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

from casesrv import DONE, CaseServer, Reply, case_config, chunk, last_user, run_case, sse, stream, usage
from fixtures_tokens import kimi_dir, true_count
from fixtures_tokens import kimi_encoding as _enc

PY = sys.executable



def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "datagen", *args], capture_output=True, text=True, timeout=120)


def rows(run: Path, sql: str, *params) -> list[tuple]:
    db = sqlite3.connect(run / "store.sqlite")
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


def by_prompt(run: Path, sql: str) -> dict[str, tuple]:
    """``{last user message: row}`` for ``sql`` selecting ``p.messages`` first, from prompts ``p``."""
    out = {}
    for msgs, *rest in rows(run, sql):
        out[[m for m in json.loads(msgs) if m["role"] == "user"][-1]["content"]] = tuple(rest)
    return out


def export(run: Path, fmt: str, out: Path) -> dict[str, dict]:
    r = cli("export", str(run), "--format", fmt, "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    got = {}
    for line in (out / "d.jsonl").read_text().splitlines():
        rec = json.loads(line)
        msgs = rec.get("messages") or rec.get("conversations")
        if isinstance(msgs, str):  # raw: the stored messages as JSON text
            msgs = json.loads(msgs)
        user = [m for m in msgs if m.get("role", m.get("from")) in ("user", "human")][-1]
        got[user.get("content", user.get("value"))] = rec
    return got


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "weather for a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
PARIS, OSLO = '{"city": "Paris"}', '{"city": "Oslo"}'


# ------------------------------------------------------------------------------------------------ case 01


def tcd(**kw) -> dict:
    """A delta carrying one tool-call fragment."""
    fn = {k: kw.pop(k) for k in ("name", "arguments") if k in kw}
    return {"tool_calls": [{**kw, **({"function": fn} if fn else {})}]}


def respond_01(req: dict, n: int) -> Reply:
    u = last_user(req)
    r = "Two cities, two calls."
    if "Paris and in Oslo" in u:  # case 01 verbatim: both calls at index 0, distinct ids
        frags = [tcd(index=0, id="functions.get_weather:0", type="function", name="get_weather", arguments=""),
                 tcd(index=0, arguments=PARIS),
                 tcd(index=0, id="functions.get_weather:1", type="function", name="get_weather", arguments=""),
                 tcd(index=0, arguments=OSLO)]
        calls = [("get_weather", PARIS), ("get_weather", OSLO)]
    elif "Rome and Lima" in u:  # no index at all, ids repeated on every fragment
        frags = [tcd(id="c1", name="get_weather", arguments='{"city": '), tcd(id="c1", arguments='"Rome"}'),
                 tcd(id="c2", name="get_weather", arguments='{"city": "Lima"}')]
        calls = [("get_weather", '{"city": "Rome"}'), ("get_weather", '{"city": "Lima"}')]
    elif "Kyiv and Baku" in u:  # whole calls at index 0 without ids
        frags = [tcd(index=0, name="get_weather", arguments='{"city": "Kyiv"}'),
                 tcd(index=0, name="get_weather", arguments='{"city": "Baku"}')]
        calls = [("get_weather", '{"city": "Kyiv"}'), ("get_weather", '{"city": "Baku"}')]
    else:  # "Cairo": the model calls a function the request never declared
        frags = [tcd(index=0, id="functions.get_wether:0", name="get_wether", arguments='{"city": "Cairo"}')]
        calls = [("get_wether", '{"city": "Cairo"}')]
    pieces = [chunk({"role": "assistant", "reasoning": r})] + [chunk(f) for f in frags]
    pieces.append(chunk({}, finish="tool_calls", usage=usage(40, true_count(r, "", calls), 6, cost=0.0001)))
    return stream(*pieces)


def test_case01_tool_calls_at_a_reused_index_are_separate_calls(tmp_path):
    questions = ["What is the weather in Paris and in Oslo?", "Weather in Rome and Lima?",
                 "Weather in Kyiv and Baku?", "Weather in Cairo?"]
    with CaseServer(respond_01) as srv:
        cfg = case_config(tmp_path, srv.base_url, [{"messages": [{"role": "user", "content": q}], "tools": [WEATHER]}
                                                   for q in questions], tokenizer=kimi_dir())
        r = run_case(cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    run = tmp_path / "run"
    stored = by_prompt(run, "SELECT p.messages, r.tool_calls, r.finish_reason FROM results r JOIN prompts p "
                            "ON p.id = r.prompt_id")

    def calls(q):
        return [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in json.loads(stored[q][0])]

    assert calls(questions[0]) == [("functions.get_weather:0", "get_weather", PARIS),
                                   ("functions.get_weather:1", "get_weather", OSLO)]
    assert calls(questions[1]) == [("c1", "get_weather", '{"city": "Rome"}'), ("c2", "get_weather", '{"city": "Lima"}')]
    assert calls(questions[2]) == [("call_0", "get_weather", '{"city": "Kyiv"}'),
                                   ("call_1", "get_weather", '{"city": "Baku"}')]
    assert calls(questions[3]) == [("functions.get_wether:0", "get_wether", '{"city": "Cairo"}')]
    # validation with the real tokenizer: the three well-formed ones pass (billing matches to the token);
    # the undeclared function fails the new check and stays out of training exports
    checks = by_prompt(run, "SELECT p.messages, v.ok, v.reasons FROM validations v JOIN prompts p ON p.id = v.prompt_id")
    assert {q: (ok, json.loads(rs)) for q, (ok, rs) in checks.items()} == {
        questions[0]: (1, []), questions[1]: (1, []), questions[2]: (1, []), questions[3]: (0, ["unknown_tool"])}
    raw = export(run, "raw", tmp_path / "raw")
    assert [c["function"]["arguments"] for c in json.loads(raw[questions[0]]["response"]["tool_calls"])] == [PARIS, OSLO]
    assert len(raw) == 4
    train = export(run, "openai", tmp_path / "openai")
    assert set(train) == set(questions[:3])
    assert [c["function"]["arguments"] for c in json.loads(train[questions[0]]["messages"][-1]["tool_calls"])] == [PARIS, OSLO]
    # every streamed request asked for usage
    assert srv.requests and all(b["stream"] is True and b["stream_options"] == {"include_usage": True}
                                for b in srv.requests)


# ------------------------------------------------------------------------------------------------ case 09


def respond_09(req: dict, n: int) -> Reply:
    u = last_user(req)
    if "one to five" in u:
        r, c, fin = "Simple counting.", "One, two, three, four, five.", "stop"
    elif "sea" in u:
        r, c, fin = "Describe waves.", "The sea is vast and restless, its waves", "length"
    elif "colours" in u:
        r, c, fin = "List colours.", "Red, green, and", None
    elif "planets" in u:  # first attempt: [DONE] arrives but no finish (finish_reason "" throughout)
        r, c, fin = "Planets.", "Mercury, Venus, Earth.", ("done" if n == 1 else "stop")
    elif "rivers" in u:  # first attempt: null finish, clean end of the body without [DONE]
        r, c, fin = "Rivers.", "Nile, Amazon.", ("end" if n == 1 else "stop")
    elif "metals" in u:  # first attempt: the finish chunk is left unterminated (no blank line) at the end
        r, c, fin = "Metals.", "Iron, gold.", ("unterminated" if n == 1 else "stop")
    else:  # "trees": a finish reason outside the known set, kept verbatim
        r, c, fin = "Trees.", "Oak, elm.", "halted"
    head = [sse(chunk({"role": "assistant", "reasoning_content": r}, finish="")), sse(chunk({"content": c}, finish=""))]
    if fin is None:
        return Reply(pieces=head + [0.05], drop=True)
    if fin == "done":
        return Reply(pieces=head + [DONE])
    if fin == "end":
        return Reply(pieces=[sse(chunk({"content": c}, finish=None))])
    if fin == "unterminated":
        return Reply(pieces=head + [sse(chunk({}, finish="stop", usage=usage(12, true_count(r, c), 4)))[:-2]])
    billed = true_count(r, c, finished=(fin != "length"))
    return Reply(pieces=head + [sse(chunk({}, finish=fin, usage=usage(12, billed, 4))), DONE])


def test_case09_empty_finish_reason_never_finishes(tmp_path):
    qs = ["Count from one to five.", "Describe the sea in one paragraph.", "Name three colours.",
          "Name three planets.", "Name two rivers.", "Name two metals.", "Name two trees."]
    with CaseServer(respond_09) as srv:
        cfg = case_config(tmp_path, srv.base_url, [{"messages": [{"role": "user", "content": q}]} for q in qs],
                          tokenizer=kimi_dir(), max_attempts=2)
        r = run_case(cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    run = tmp_path / "run"
    state = by_prompt(run, "SELECT messages, state, attempts, error_class FROM prompts")
    assert state == {qs[0]: ("done", 1, None), qs[1]: ("done", 1, None), qs[2]: ("failed", 2, "disconnect"),
                     qs[3]: ("done", 2, None), qs[4]: ("done", 2, None), qs[5]: ("done", 2, None),
                     qs[6]: ("done", 1, None)}
    # every unfinished attempt is a (retried) disconnect, never a stored result
    errs = rows(run, "SELECT error_class, status, COUNT(*) FROM attempts WHERE outcome='error' GROUP BY 1, 2")
    assert errs == [("disconnect", 200, 5)]
    stored = by_prompt(run, "SELECT p.messages, r.finish_reason, r.content FROM results r JOIN prompts p "
                            "ON p.id = r.prompt_id")
    assert {q: v[0] for q, v in stored.items()} == {qs[0]: "stop", qs[1]: "length", qs[3]: "stop", qs[4]: "stop",
                                                    qs[5]: "stop", qs[6]: "halted"}
    assert stored[qs[3]][1] == "Mercury, Venus, Earth."
    checks = by_prompt(run, "SELECT p.messages, v.reasons FROM validations v JOIN prompts p ON p.id = v.prompt_id")
    assert {q: json.loads(v[0]) for q, v in checks.items()} == {
        qs[0]: [], qs[1]: ["truncated"], qs[3]: [], qs[4]: [], qs[5]: [], qs[6]: ["unknown_finish"]}
    raw = export(run, "raw", tmp_path / "raw")
    assert {q: rec["response"]["finish_reason"] for q, rec in raw.items()} == {q: v[0] for q, v in stored.items()}
    # training exports: only finished answers with a known finish; each token row ends its turn exactly once
    openai = export(run, "openai", tmp_path / "openai")
    assert set(openai) == {qs[0], qs[3], qs[4], qs[5]}
    r = cli("export", str(run), "--format", "tokens", "--out", str(tmp_path / "tok"))
    assert r.returncode == 0, r.stdout + r.stderr
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "tok" / "d.parquet").to_pylist()
    im_end = _enc().encode("<|im_end|>", allowed_special="all")[0]
    assert len(table) == 4
    for rec in table:
        ids, mask = rec["input_ids"], rec["loss_mask"]
        supervised = [t for t, m in zip(ids, mask, strict=True) if m]
        assert supervised[-1] == im_end and supervised.count(im_end) == 1


# ------------------------------------------------------------------------------------------------ case 11

ERR = {"message": "Provider returned error", "code": 429,
       "metadata": {"raw": "{\"error\":{\"code\":429,\"message\":\"Resource has been exhausted (e.g. check quota).\","
                           "\"status\":\"RESOURCE_EXHAUSTED\"}}", "provider_name": "Scripted"}}


def respond_11(req: dict, n: int) -> Reply:
    if n == 1:
        num = int(last_user(req).split()[3])
        err = json.loads(json.dumps(ERR))
        if num % 3 == 1:
            err["code"] = "429"  # a numeric string (LiteLLM-style gateways)
        elif num % 3 == 2:
            err["metadata"]["headers"] = {"Retry-After": "0"}  # OpenRouter forwards upstream headers here
        return Reply(pieces=[b": OPENROUTER PROCESSING\n\n",
                             sse({"id": "gen-x", "object": "chat.completion.chunk", "created": 1,
                                  "model": "moonshotai/kimi-k2.5", "provider": "Scripted", "error": err,
                                  "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}]}),
                             DONE])
    r, c = "Spell it.", "Forty-two."
    return stream(chunk({"role": "assistant", "reasoning": r}), chunk({"content": c}),
                  chunk({}, finish="stop", usage=usage(12, 9, 3, cost=0.00001)))


def test_case11_rate_limit_inside_a_200_stream_is_a_rate_limit(tmp_path):
    n = 70  # more than the anomaly guard's window (50): an error-rate pause would show
    prompts = [{"messages": [{"role": "user", "content": f"Spell the number {i} in words."}]} for i in range(n)]
    with CaseServer(respond_11) as srv:
        cfg = case_config(tmp_path, srv.base_url, prompts, max_attempts=4)
        r = run_case(cfg, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "anomaly guard" not in r.stdout + r.stderr
    run = tmp_path / "run"
    doc = json.loads(cli("status", str(run), "--json").stdout)
    assert doc["run"]["state"] == "completed"
    d = doc["datasets"][0]
    assert (d["done"], d["failed"], d["pending"], d["state"]) == (n, 0, 0, "done")
    assert doc["totals"]["errors"] == {"rate_limit": n}
    assert rows(run, "SELECT outcome, error_class, status, COUNT(*) FROM attempts GROUP BY 1, 2, 3") == [
        ("error", "rate_limit", 429, n), ("ok", None, None, n)]
    assert len(srv.requests) == 2 * n


def test_unknown_tool_never_reaches_a_training_export_without_a_tokenizer(tmp_path):
    # Training exports always validate first: without a [tokenizer] they refuse; validated later with one,
    # the undeclared call fails unknown_tool and nothing is exported.
    def respond(req, n):
        return stream(chunk({"role": "assistant", "reasoning": "Check the weather."}),  # a thinking-mode reply
                      chunk(tcd(index=0, id="a", name="get_wether", arguments='{"city": "Rome"}')),
                      chunk({}, finish="tool_calls",
                            usage=usage(10, true_count("Check the weather.", "", [("get_wether", '{"city": "Rome"}')]))))

    prompts = [{"messages": [{"role": "user", "content": "Weather in Rome?"}], "tools": [WEATHER]}]
    with CaseServer(respond) as srv:
        cfg = case_config(tmp_path, srv.base_url, prompts)
        assert run_case(cfg).returncode == 0
    run = tmp_path / "run"
    r = cli("export", str(run), "--format", "openai", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "not validated" in r.stderr and not (tmp_path / "o" / "d.jsonl").exists()
    with_tok = case_config(tmp_path, srv.base_url, None, tokenizer=kimi_dir())
    assert cli("validate", str(run), "--config", str(with_tok)).returncode in (0, 1)
    assert [json.loads(x) for (x,) in rows(run, "SELECT reasons FROM validations")] == [["unknown_tool"]]
    r = cli("export", str(run), "--format", "openai", "--out", str(tmp_path / "o"))
    assert r.returncode == 1 and "unknown_tool" in r.stdout + r.stderr
    assert not (tmp_path / "o" / "d.jsonl").exists()
