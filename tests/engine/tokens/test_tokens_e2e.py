"""Token reconstruction end to end: the eight sample datasets through the simulator counting usage with
the fixture tokenizers, then ``datagen validate`` and ``datagen export`` over the finished run."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import sqlite3
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from e2e import TOOLS, read_log, write_run_config
from fixtures_tokens import HF_MARKERS, KIMI_OFFSETS, TEKKEN_BASE, hf_dir, kimi_dir
from helpers import completion, make_config, seeded_store

from datagen.cli import main
from engine.client.types import ToolCall
from engine.config import load_config
from engine.prompts import prompt_key
from engine.run.headless import run_headless
from engine.sim.generator import DATA_FAULTS
from engine.tokens.reconstruct import count_tool_calls, native_tool_calls
from engine.tokens.service import ReconstructionService
from engine.tokens.template import render
from engine.tokens.tokenizer import load_tokenizer
from engine.tokens.validate import REASONS, structural


def run(cfg_path: Path) -> None:
    out = io.StringIO()
    assert asyncio.run(run_headless(load_config(cfg_path), out, install_signals=False)) == 0, out.getvalue()


def cli(capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(args))
    return code, capsys.readouterr().out


def results(run_dir: Path) -> dict[int, dict]:
    db = sqlite3.connect(run_dir / "store.sqlite")
    q = ("SELECT r.prompt_id, r.dataset, r.key, p.messages, p.tools, r.reasoning, r.content, r.tool_calls, r.finish_reason, "
         "v.ok, v.reasons, v.notes, v.billing_diff FROM results r JOIN prompts p ON p.id = r.prompt_id "
         "LEFT JOIN validations v ON v.prompt_id = r.prompt_id")
    out = {}
    for pid, ds, key, m, t, rs, c, tc, fin, ok, reasons, notes, bd in db.execute(q):
        out[pid] = dict(dataset=ds, key=key, messages=json.loads(m), tools=json.loads(t), reasoning=rs, content=c,
                        tool_calls=json.loads(tc), finish=fin, ok=ok, reasons=json.loads(reasons or "[]"),
                        notes=json.loads(notes or "[]"), billing_diff=bd)
    db.close()
    return out


@pytest.mark.parametrize("family", ["kimi", "hf"])
def test_eight_datasets_canonical_zero_errors_exact_billing_and_token_export(tmp_path, capsys, family):
    tok_dir, markers = (kimi_dir(), {}) if family == "kimi" else (hf_dir(), HF_MARKERS)
    cfg = write_run_config(tmp_path, tok_dir, markers)
    run(cfg)
    run_dir = tmp_path / "run"
    # The live run reconstructed every result as it arrived (no validate step needed)
    live = results(run_dir)
    assert len(live) == 134 and all(r["ok"] == 1 for r in live.values()), [r["reasons"] for r in live.values() if r["ok"] != 1][:3]
    code, out = cli(capsys, "validate", str(run_dir), "--config", str(cfg), "--json")
    assert code == 0
    doc = json.loads(out)
    n = len(results(run_dir))
    assert doc["records"] == n == 134 and doc["unvalidated"] == 0 and set(doc["checks"]) == set(REASONS)
    assert len(doc["datasets"]) == 9 and set(doc["providers"]) == {"SimA", "SimB", "SimC"}
    assert doc["structural_errors"] == 0 and doc["ok"] == n, doc["checks"]
    b = doc["billing"]
    assert b["rows"] == n and b["exact"] == n and b["mean"] == 0 and b["mean_abs"] == 0 and b["p99_abs"] == 0
    assert doc["prompt_diff"]["mean_abs"] == 0 and doc["zero_supervised"] == 0
    assert doc["tokenizer"]["special_ids"][markers.get("end_of_turn", "<|im_end|>")] > 0
    if family == "kimi":  # the whole-run path in a process pool gives the same verdicts
        code, out = cli(capsys, "validate", str(run_dir), "--config", str(cfg), "--json", "--workers", "2")
        again = json.loads(out)
        assert code == 0 and again["checks"] == doc["checks"] and again["billing"] == b and again["ok"] == n
    with capsys.disabled():
        print(f"\n{family}: {n} records, structural errors {doc['structural_errors']}, billing exact {b['exact']}/{b['rows']}")

    # Done means 2: the tokens export decodes back to exactly the rendered prompt and the completion
    code, out = cli(capsys, "export", str(run_dir), "--format", "tokens", "--out", str(tmp_path / "tok"))
    assert code == 0 and "b7_sharegpt.parquet: 98 rows" in out
    tok = load_tokenizer(load_config(cfg).tokenizer)
    m = {k: tok.markers[k] for k in tok.markers}
    by_id = {f"{r['dataset']}:{r['key']}": r for r in results(run_dir).values()}
    rows = 0
    for f in sorted((tmp_path / "tok").glob("*.parquet")):
        t = pq.read_table(f)
        assert str(t.schema.field("input_ids").type) == "list<element: int32>"
        assert str(t.schema.field("loss_mask").type) == "list<element: int8>"
        for row in t.to_pylist():
            r = by_id[row["id"]]
            ids, mask = row["input_ids"], row["loss_mask"]
            assert mask == [0] * row["prompt_len"] + [1] * row["completion_len"] and len(ids) == len(mask)
            calls, _ = native_tool_calls(r["tool_calls"], count_tool_calls(r["messages"]), tok.section.tool_id_format)
            tc = "".join(f"{m['tool_call_begin']}{c['id']}{m['tool_call_argument_begin']}{c['function']['arguments']}"
                         f"{m['tool_call_end']}" for c in calls)
            want = r["reasoning"] + m["think_end"] + r["content"] + (f"{m['tool_calls_begin']}{tc}{m['tool_calls_end']}"
                                                                     if calls else "") + m["end_of_turn"]
            assert tok.decode([i for i, k in zip(ids, mask, strict=True) if k == 1]) == want
            prompt = tok.decode([i for i, k in zip(ids, mask, strict=True) if k == 0])
            assert prompt == render(tok, r["messages"], r["tools"], add_generation_prompt=True)
            if family == "kimi" and r["dataset"] == "b6_ultrachat":  # earlier assistant turns: <think></think>
                assert "<|im_assistant|>assistant<|im_middle|><think></think>Sure.<|im_end|>" in prompt
            rows += 1
    assert rows == n


def test_injected_faults_are_flagged_with_the_right_reason(tmp_path, capsys):
    cfg = write_run_config(tmp_path, kimi_dir(), {}, faults="toolid:0.15,leak:0.1,split:0.1,badargs:0.15",
                           max_tokens=900, tools_rows=100)
    run(cfg)
    run_dir = tmp_path / "run"
    code, out = cli(capsys, "validate", str(run_dir), "--config", str(cfg))
    assert code == 1 and "records 234" in out and "billing difference over" in out  # 1: some records invalid
    fault = {rec["prompt_key"]: rec["fault"] for rec in read_log(tmp_path / "sim.jsonl") if rec["outcome"] == "completed"}
    applied = {k: 0 for k in DATA_FAULTS}
    for r in results(run_dir).values():
        f, cut, calls = fault.get(r["key"]), r["finish"] == "length", bool(r["tool_calls"])
        assert r["key"] == prompt_key(r["messages"], r["tools"])
        if cut:
            assert r["reasons"][0] == "truncated" and not r["ok"]
        if f == "toolid" and calls:
            applied[f] += 1
            assert r["ok"] and r["notes"] == ["tool_id_rebuilt"] and r["billing_diff"] == 0  # rebuilt native ids bill 0
            assert r["tool_calls"][0]["id"].startswith("call_")
        elif f == "leak" and "</think>" in r["content"]:
            applied[f] += 1
            assert r["reasoning"] == "" and {"reasoning_leak", "reasoning_missing"} <= set(r["reasons"])
        elif f == "split" and not cut:
            applied[f] += 1
            assert r["reasons"] == ["billing_diff"] and r["billing_diff"] <= -3
        elif f == "badargs" and calls:
            applied[f] += 1
            assert r["reasons"] == ["bad_tool_args"] and r["billing_diff"] == 0
        elif not cut:
            assert r["ok"], (f, r["reasons"])  # canonical output: zero errors
        else:
            assert not structural(r["reasons"]), r["reasons"]
    with capsys.disabled():
        print(f"\ninjected and flagged: {applied}")
    assert all(applied.values()), applied

    # invalid records stay in the store and are left out of exports unless asked
    res = results(run_dir)
    n_ok = sum(1 for r in res.values() if r["ok"])
    for fmt in ("specforge", "openai"):
        code, out = cli(capsys, "export", str(run_dir), "--format", fmt, "--out", str(tmp_path / fmt), "--force")
        assert code == 0 and f"left out: {sum(1 for r in res.values() if not r['ok'])} invalid record(s) (" in out
        lines = [json.loads(x) for f in sorted((tmp_path / fmt).glob("*.jsonl")) for x in f.read_text().split("\n") if x]
        assert len(lines) == n_ok < len(res)
    sf = [json.loads(x) for x in (tmp_path / "specforge" / "tools.jsonl").read_text().split("\n") if x]
    # tool calls and tools as JSON text, every message with the same keys (test_export_loads.py)
    turn = next(x for x in sf if x["conversations"][-1]["tool_calls"] != "[]")["conversations"][-1]
    assert set(turn) == {"role", "content", "reasoning_content", "tool_calls", "tool_call_id", "name"}
    calls = json.loads(turn["tool_calls"])
    assert calls[0]["id"].startswith("functions.") and calls[0]["function"]["name"]
    oa = [json.loads(x) for x in (tmp_path / "openai" / "tools.jsonl").read_text().split("\n") if x]
    assert all(json.loads(x["tools"]) == TOOLS and x["messages"][-1]["role"] == "assistant" for x in oa)
    code, _ = cli(capsys, "export", str(run_dir), "--format", "tokens", "--out", str(tmp_path / "all"), "--include-invalid")
    assert sum(pq.read_metadata(f).num_rows for f in (tmp_path / "all").glob("*.parquet")) == len(res)
    before = (tmp_path / "openai" / "b7_sharegpt.jsonl").read_bytes()
    cli(capsys, "export", str(run_dir), "--format", "openai", "--out", str(tmp_path / "openai"))
    assert (tmp_path / "openai" / "b7_sharegpt.jsonl").read_bytes() == before  # deterministic


def test_validate_needs_a_tokenizer_and_export_validates_first(tmp_path, capsys):
    cfg = make_config(tmp_path, datasets=[{"name": "a", "path": "a.jsonl"}])
    store = asyncio.run(seeded_store(cfg, {"a": 0}))
    asyncio.run(store.close())
    code = main(["validate", str(cfg.run.dir)])
    assert code == 2 and "stores no [tokenizer]" in capsys.readouterr().err
    code = main(["export", str(tmp_path / "nope"), "--format", "tokens", "--out", str(tmp_path / "o")])
    assert code == 2


async def test_live_service_off_the_loop_stores_verdicts_and_feeds_the_guard(tmp_path):
    msgs = [{"role": "user", "content": "Weather in Rome?"}]
    for executor, n in (("thread", 60), ("process", 4)):
        d = tmp_path / executor
        cfg = make_config(d, datasets=[{"name": "a", "path": "a.jsonl"}],
                          tokenizer={"path": str(kimi_dir()), "executor": executor, "failure_window": 10,
                                     "max_failure_rate": 0.3})
        store = await seeded_store(cfg, {"a": n})
        await store.close()
        verdicts = []
        svc = ReconstructionService(cfg.tokenizer, cfg.run.dir, commit_interval_s=0.05,
                                    on_verdict=lambda ds, ok, reasons, verdicts=verdicts: verdicts.append((ds, ok, reasons)))
        info = await svc.start()
        assert info["special_ids"]["<|im_end|>"] == TEKKEN_BASE + KIMI_OFFSETS["<|im_end|>"]
        call = ToolCall(id="call_9", name="get_weather", arguments='{"city":"Rome"}')
        for i in range(n):
            c = completion("It is sunny.", completion_tokens=0)
            if i % 2:
                c = dataclasses.replace(c, finish_reason="length")
            elif i % 4 == 0:
                c = dataclasses.replace(c, tool_calls=(call,), finish_reason="tool_calls")
            svc.submit(i + 1, "a", f"k{i}", msgs, TOOLS, c)
        await svc.close()
        db = sqlite3.connect(cfg.run.dir / "store.sqlite")
        rows = db.execute("SELECT ok, reasons, notes FROM validations ORDER BY prompt_id").fetchall()
        meta = json.loads(db.execute("SELECT value FROM meta WHERE key='tokenizer'").fetchone()[0])
        db.close()
        assert len(rows) == n == len(verdicts) and meta["info"]["special_ids"]["</think>"] == TEKKEN_BASE + KIMI_OFFSETS["</think>"]
        assert rows[0] == (1, "[]", '["tool_id_rebuilt", "no_usage"]') and json.loads(rows[1][1]) == ["truncated"]
        if executor == "thread":
            # half the records are invalid, all of them only cut at max_tokens: not an anomaly, the guard holds
            assert [ok for _, ok, _ in verdicts].count(False) == n // 2
            assert svc.failure_rate("a") == 0.0 and svc.guard("a") is None and svc.guard("b") is None


async def test_the_guard_counts_anomalies_and_not_a_tail_of_cuts_at_max_tokens(tmp_path):
    """A billed count the rebuilt ids disagree with trips the validation guard; a dataset's tail of
    completions cut at max_tokens (they finish last) does not: the window is judged without them."""
    msgs = [{"role": "user", "content": "Weather in Rome?"}]
    n = 60
    cfg = make_config(tmp_path, datasets=[{"name": "a", "path": "a.jsonl"}],
                      tokenizer={"path": str(kimi_dir()), "executor": "thread", "failure_window": 10,
                                 "max_failure_rate": 0.3})
    store = await seeded_store(cfg, {"a": n})
    await store.close()
    verdicts: list[tuple[str, bool, list[str]]] = []
    svc = ReconstructionService(cfg.tokenizer, cfg.run.dir, commit_interval_s=0.05,
                                on_verdict=lambda ds, ok, reasons: verdicts.append((ds, ok, reasons)))
    await svc.start()
    for i in range(40):  # every other one billed 999 tokens for a short answer
        svc.submit(i + 1, "a", f"k{i}", msgs, None, completion("It is sunny.", completion_tokens=999 if i % 2 else 0))
    await svc.flush()
    while len(verdicts) < 40:
        await asyncio.sleep(0.01)
    assert [r for _, ok, r in verdicts if not ok] == [["billing_diff"]] * 20
    assert svc.failure_rate("a") == 0.5 and "billing_diff 20" in (svc.guard("a") or "")
    for i in range(40, n):  # the tail: cut at max_tokens, invalid
        c = dataclasses.replace(completion("It is sunny and", completion_tokens=0), finish_reason="length")
        svc.submit(i + 1, "a", f"k{i}", msgs, None, c)
    await svc.close()
    assert len(verdicts) == n and all(not ok and "truncated" in r for _, ok, r in verdicts[40:])
    assert svc.failure_rate("a") == 0.0 and svc.guard("a") is None


def test_a_restarted_run_validates_what_an_earlier_process_stored_without_a_verdict(tmp_path):
    # an earlier process stored results and was killed before validating them (or they were recovered from
    # the stream workers' journals at start): the next start validates them as live ones, not only an export
    cfg = write_run_config(tmp_path, kimi_dir(), {})
    run(cfg)
    run_dir = tmp_path / "run"
    db = sqlite3.connect(run_dir / "store.sqlite")
    db.execute("DELETE FROM validations WHERE prompt_id % 3 = 0")
    db.commit()
    (gone,) = db.execute("SELECT COUNT(*) FROM results WHERE prompt_id NOT IN (SELECT prompt_id FROM validations)").fetchone()
    db.close()
    assert gone >= 40
    out = io.StringIO()
    assert asyncio.run(run_headless(load_config(cfg), out, install_signals=False)) == 0, out.getvalue()
    assert f"validating {gone} result(s) stored without a verdict by an earlier process" in out.getvalue()
    live = results(run_dir)
    assert len(live) == 134 and all(r["ok"] == 1 for r in live.values())  # before: `gone` of them had no verdict
