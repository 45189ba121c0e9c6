"""Nothing unrenderable is bought: with a ``[tokenizer]``, ingest renders every prompt through the
code validation uses and rejects, with its reason, a prompt the chat template cannot render: before
any request is sent (issue 17, section 2)."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest
from fixtures_tokens import kimi_dir
from promptcheck_helpers import (
    LATE_SYSTEM,
    RAISING_PREFIX,
    RENDERABLE,
    UNRENDERABLE,
    rejects,
    run,
    sim_requests,
    write_config,
    write_jsonl,
)

from datagen.cli import main
from engine.datasets import Reject, iter_prompts
from engine.prompts import prompt_key
from engine.tokens.demo_tokenizer import KIMI_TEMPLATE
from engine.tokens.promptcheck import PromptChecker
from engine.tokens.reconstruct import prompt_ids
from engine.tokens.tokenizer import load_tokenizer


def _prompts(path):
    return [p for p in iter_prompts(path, "openai", None) if not isinstance(p, Reject)]


def test_checker_rejects_each_unrenderable_kind_and_counts_renderable_ones(tmp_path):
    tok = load_tokenizer(kimi_dir())
    checker = PromptChecker(tok)
    bad = _prompts(write_jsonl(tmp_path / "bad.jsonl", [r for r, _ in UNRENDERABLE]))
    assert len(bad) == len(UNRENDERABLE)  # the adapter accepts them: only rendering finds the problem
    for p, (_, why) in zip(bad, UNRENDERABLE, strict=True):
        v = checker.check(p.messages, p.tools)
        assert v.tokens is None and v.error is not None
        assert v.error.startswith("chat template failed: ") and why in v.error, v.error
        assert checker.reject_reason(v) == v.error
    good = _prompts(write_jsonl(tmp_path / "good.jsonl", RENDERABLE))
    assert len(good) == len(RENDERABLE)
    for p in good:
        v = checker.check(p.messages, p.tools)
        assert v.error is None and checker.reject_reason(v) is None
        assert v.tokens == len(prompt_ids(tok, p.messages, p.tools)[1]) > 10  # validation's own prompt ids


def test_template_raise_exception_is_a_reject_reason(tmp_path):
    d = tmp_path / "tok"
    shutil.copytree(kimi_dir(), d)
    tmpl = tmp_path / "strict.jinja"
    tmpl.write_text(RAISING_PREFIX + KIMI_TEMPLATE, encoding="utf-8")
    from engine.config import TokenizerSection

    checker = PromptChecker(load_tokenizer(TokenizerSection(path=str(d), chat_template=tmpl)))
    (late,) = _prompts(write_jsonl(tmp_path / "late.jsonl", [LATE_SYSTEM]))
    v = checker.check(late.messages, late.tools)
    assert v.error == "chat template failed: TemplateError: System message must be at the beginning."


def test_run_rejects_unrenderable_rows_at_ingest_and_buys_nothing_for_them(tmp_path, capsys):
    """A real headless run against the simulator: the unrenderable rows are rejected at ingest with
    file:line and the template's reason, never requested, never paid; status counts them rejected;
    every prompt that was sent validates."""
    tok = kimi_dir()
    tmpl = tmp_path / "strict.jinja"
    tmpl.write_text(RAISING_PREFIX + KIMI_TEMPLATE, encoding="utf-8")
    rows = [r for r, _ in UNRENDERABLE] + [LATE_SYSTEM] + RENDERABLE
    data = write_jsonl(tmp_path / "agent.jsonl", rows)
    cfg = write_config(tmp_path, tok, [("agent", data)], tokenizer_extra=f'chat_template = "{tmpl}"')
    printed = run(cfg)
    n_bad = len(UNRENDERABLE) + 1
    assert f"[agent] ingested {len(RENDERABLE)} prompts ({len(RENDERABLE)} new), {n_bad} rejected rows" in printed
    got = rejects(tmp_path / "run")
    assert [s for _, s, _ in got] == [f"{data}:{i}" for i in range(1, n_bad + 1)]
    for (_, _, reason), (_, why) in zip(got[:-1], UNRENDERABLE, strict=True):  # got[-1] is LATE_SYSTEM, checked below
        assert reason.startswith("chat template failed: ") and why in reason
    assert got[-1][2] == "chat template failed: TemplateError: System message must be at the beginning."
    # the simulator received exactly the renderable prompts, none of the rejected ones
    bad_keys = {prompt_key(p.messages, p.tools) for p in iter_prompts(data, "openai", None)
                if not isinstance(p, Reject)} - {prompt_key(p.messages, p.tools) for p in _prompts(
                    write_jsonl(tmp_path / "good.jsonl", RENDERABLE))}
    assert len(bad_keys) == n_bad
    reqs = sim_requests(tmp_path)
    assert len(reqs) == len(RENDERABLE) and not {r["prompt_key"] for r in reqs} & bad_keys
    assert main(["status", str(tmp_path / "run"), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    (ds,) = st["datasets"]
    assert (ds["prompts"], ds["rejected"], ds["done"], ds["failed"]) == (len(RENDERABLE), n_bad, len(RENDERABLE), 0)
    assert ds["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in reqs)) and ds["cost_usd"] > 0
    db = sqlite3.connect(tmp_path / "run" / "store.sqlite")
    try:
        verdicts = db.execute("SELECT ok, reasons FROM validations").fetchall()
        est = dict(db.execute("SELECT key, est_prompt_tokens FROM prompts").fetchall())
    finally:
        db.close()
    assert len(verdicts) == len(RENDERABLE) and all(ok == 1 for ok, _ in verdicts), verdicts
    # the class-routing estimate is the rendered prompt's real length
    t = load_tokenizer(tok)
    for p in _prompts(tmp_path / "good.jsonl"):
        assert est[p.key] == len(prompt_ids(t, p.messages, p.tools)[1])


def test_without_a_tokenizer_nothing_is_rendered_at_ingest(tmp_path):
    """No ``[tokenizer]``: no render check (documented); the rows are ingested as before."""
    data = write_jsonl(tmp_path / "agent.jsonl", [r for r, _ in UNRENDERABLE])
    cfg = write_config(tmp_path, kimi_dir(), [("agent", data)], with_tokenizer=False)
    printed = run(cfg)
    assert f"[agent] ingested {len(UNRENDERABLE)} prompts ({len(UNRENDERABLE)} new), 0 rejected rows" in printed
