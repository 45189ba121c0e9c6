"""The SpecForge export survives SpecForge's own parser (issue 11 §4, field case 10).

SpecForge's ``GeneralParser.parse`` drops leading non-user turns and truncates a conversation at the
first assistant turn that does not follow a user/tool turn (or tool turn that does not follow an
assistant/tool turn); docs/specforge-roles.md. Ingest normalises every adapter's conversation to that
order with one rule (``engine.datasets.roles``), or rejects the row with the reason; every exported
row of every sample dataset is checked here against a transcription of the parser's rules.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from casesrv import DONE, CaseServer, Reply, case_config, chunk, run_case, sse, usage
from e2e import SAMPLE_DATASETS, SCHEMA_ROWS
from fixtures_tokens import kimi_dir

from engine.datasets import iter_prompts, row_to_prompt
from engine.datasets.roles import SEPARATOR, normalise, specforge_parse, specforge_problem
from engine.prompts import Prompt, Reject

PY = sys.executable


def roles(msgs: list[dict]) -> str:
    return "".join(m["role"][0] for m in msgs)


def conv(spec: str) -> list[dict]:
    names = {"s": "system", "u": "user", "a": "assistant", "t": "tool"}
    return [{"role": names[c], "content": f"{c}{i}"} for i, c in enumerate(spec)]


# ----------------------------------------------------------------------------- the parser's rules


@pytest.mark.parametrize("spec, kept, dropped, cut", [
    ("ua", "ua", "", None),
    ("sua", "sua", "", None),
    ("aua", "ua", "a", None),            # leading non-user dropped
    ("saua", "sua", "a", None),          # ... after the kept first system turn
    ("ssua", "sua", "s", None),          # a second leading system turn is a non-user turn: dropped
    ("uaau", "ua", "", 2),               # assistant after assistant: truncated there
    ("uua", "uua", "", None),            # user after user is accepted
    ("uasua", "uasua", "", None),        # a later system turn is accepted...
    ("uasa", "uas", "", 3),              # ... but an assistant after it is cut
    ("uatta", "uatta", "", None),        # tool after assistant or tool
    ("uta", "u", "", 1),                 # tool after user: truncated
    ("a", "", "a", None),
])
def test_checker_follows_specforge_parse(spec, kept, dropped, cut):
    c = conv(spec)
    r = specforge_parse(c)
    assert "".join(spec[i] for i in r.kept) == kept
    assert "".join(spec[i] for i in r.dropped) == dropped
    assert r.truncated_at == cut
    assert (specforge_problem(c) is None) == (not dropped and cut is None)


def test_checker_reads_sharegpt_roles():
    c = [{"from": "gpt", "value": "hi"}, {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]
    r = specforge_parse(c)
    assert r.dropped == [0] and r.kept == [1, 2] and r.truncated_at is None


# ----------------------------------------------------------------------------- the normalisation rule


def test_normalise_head_and_runs():
    msgs = [{"role": "system", "content": "A"}, {"role": "assistant", "content": "hello"},
            {"role": "system", "content": "B"}, {"role": "user", "content": "q1"}, {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "x"}, {"role": "assistant", "content": "",
                                                    "tool_calls": [{"id": "c1"}]},
            {"role": "tool", "content": "r1", "tool_call_id": "c1"}, {"role": "tool", "content": "r2"}]
    out, nums, notes = normalise(msgs, [None, 1, 2, 3, 4, 5, 6, 7, 8])
    assert out == [{"role": "system", "content": "A" + SEPARATOR + "B"}, {"role": "user", "content": "q1\n\nq2"},
                   {"role": "assistant", "content": "x", "tool_calls": [{"id": "c1"}]},
                   {"role": "tool", "content": "r1", "tool_call_id": "c1"}, {"role": "tool", "content": "r2"}]
    assert nums == [None, 3, 5, 7, 8]
    assert notes == ["dropped message 1 (assistant) before the first user turn",
                     "merged the 'system' field and message 2 (system)", "merged messages 3-4 (user)",
                     "merged messages 5-6 (assistant)"]
    assert msgs[0] == {"role": "system", "content": "A"}  # inputs untouched


def test_normalise_leaves_a_conversation_without_user_turn_and_content_parts():
    msgs = conv("sa")
    assert normalise(msgs, [1, 2]) == (msgs, [1, 2], [])
    parts = [{"role": "user", "content": [{"type": "text", "text": "x"}]}, {"role": "user", "content": "y"}]
    assert normalise(parts, [1, 2])[0] == parts  # content parts never merge


CASE10 = [
    {"id": "a1", "conversations": [{"from": "gpt", "value": "Hello! How can I help you today?"},
                                   {"from": "human", "value": "Tell me a joke about cats."},
                                   {"from": "gpt", "value": "old answer"}]},
    {"id": "a2", "conversations": [{"from": "human", "value": "Write a haiku about rain."},
                                   {"from": "gpt", "value": "Soft rain on the roof"},
                                   {"from": "gpt", "value": "continued: drops in the gutter"},
                                   {"from": "human", "value": "Now one about snow."}, {"from": "gpt", "value": "old answer"}]},
    {"id": "a3", "conversations": [{"from": "human", "value": "Translate 'thank you' to German."},
                                   {"from": "human", "value": "And to Italian."}, {"from": "gpt", "value": "old answer"}]},
    {"id": "a4", "system": "You are a terse assistant.",
     "conversations": [{"from": "human", "value": "What is 2+2?"}, {"from": "gpt", "value": "4"},
                       {"from": "system", "value": "From now on answer in French."},
                       {"from": "human", "value": "What is 3+3?"}, {"from": "gpt", "value": "old"}]},
    {"id": "a5", "conversations": [{"from": "human", "value": "Line one\u2028line two\u2029para. Explain U+2028."},
                                   {"from": "gpt", "value": None}]},
    {"id": "a6", "conversations": [{"from": "human", "value": "Tell me a joke about cats."}, {"from": "gpt", "value": "x"}]},
    {"id": "a7", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": None},
                                   {"from": "human", "value": "Are you there?"}, {"from": "gpt", "value": "yes"}]},
]


def test_case10_rows_at_ingest(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(CASE10))
    items = list(iter_prompts(path, "sharegpt"))
    by = {i.source.rsplit(":", 1)[1]: i for i in items}
    assert roles(by["1"].messages) == "u" and by["1"].notes == ("dropped message 1 (assistant) before the first user turn",)
    assert roles(by["2"].messages) == "uau"
    assert by["2"].messages[1]["content"] == "Soft rain on the roof\n\ncontinued: drops in the gutter"
    assert by["2"].notes == ("merged messages 2-3 (assistant)",)
    assert by["3"].messages == [{"role": "user", "content": "Translate 'thank you' to German.\n\nAnd to Italian."}]
    assert roles(by["4"].messages) == "suasu" and by["4"].notes == ()  # a later system turn followed by a user turn
    assert by["6"].key == by["1"].key  # a1 without its greeting is a6's prompt: one key, one purchase
    assert isinstance(by["7"], Reject) and by["7"].reason == "sharegpt: message 2: null content"
    for item in items:
        if isinstance(item, Prompt):
            assert specforge_problem([*item.messages, {"role": "assistant", "content": "gen"}]) is None


@pytest.mark.parametrize("row, reason", [
    ({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}]},
     "openai: message 2: roles out of SpecForge's order: A 'tool' message must follow an 'assistant' or 'tool' "
     "message, but was preceded by 'user' (SpecForge's parser would cut the conversation there, before the "
     "generated turn)"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "system", "content": "s"},
                   {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"},
                   {"role": "assistant", "content": "old"}]},
     "openai: message 3: roles out of SpecForge's order: An 'assistant' message must follow a 'user' or 'tool' "
     "message, but was preceded by 'system' (SpecForge's parser would cut the conversation there, before the "
     "generated turn)"),
])
def test_rows_the_rule_cannot_repair_are_rejected_with_the_reason(row, reason):
    r = row_to_prompt(row, "f.jsonl:9", "openai")
    assert isinstance(r, Reject) and r.source == "f.jsonl:9" and r.reason == reason


def _row(fmt: str, spec: str) -> dict:
    """A row of format ``fmt`` whose turn list has the roles of ``spec`` (u/a/s/t)."""
    names = {"s": "system", "u": "user", "a": "assistant", "t": "tool"}
    if fmt == "openai":
        return {"messages": [{"role": names[c], "content": f"{c}{i}"} for i, c in enumerate(spec)]}
    if fmt == "sharegpt":
        sg = {"s": "system", "u": "human", "a": "gpt", "t": "observation"}
        return {"conversations": [{"from": sg[c], "value": f"{c}{i}"} for i, c in enumerate(spec)]}
    if fmt == "swe_agent":
        return {"history": [{"role": names[c], "content": f"{c}{i}"} for i, c in enumerate(spec)]}
    if fmt == "glaive":
        gl = {"u": "USER", "a": "ASSISTANT", "t": "FUNCTION RESPONSE"}
        return {"system": "SYSTEM: be brief", "chat": "\n\n\n".join(f"{gl[c]}: {c}{i}" for i, c in enumerate(spec)
                                                                     if c != "s")}
    raise AssertionError(fmt)


@pytest.mark.parametrize("fmt", ["openai", "sharegpt", "swe_agent", "glaive"])
def test_every_adapter_yields_specforge_order_or_a_reason(fmt):
    """The whole kind: random role sequences through each multi-turn adapter; every prompt, followed
    by the generated turn, keeps every turn under SpecForge's rules; everything else is a Reject."""
    rng = random.Random(11)
    prompts = rejects = 0
    for _ in range(400):
        spec = "".join(rng.choice("uuaast" if fmt != "glaive" else "uuaat") for _ in range(rng.randint(1, 7)))
        item = row_to_prompt(_row(fmt, spec), "f:1", fmt)
        if isinstance(item, Reject):
            rejects += 1
            assert item.reason
            continue
        prompts += 1
        assert specforge_problem([*item.messages, {"role": "assistant", "content": "gen"}]) is None, (spec, item)
        # strict user/assistant alternation (older SpecForge) holds too when there are no tool or later system turns
        body = [m["role"] for m in item.messages if m["role"] != "system" or m is not item.messages[0]]
        if not {"tool", "system"} & set(body):
            assert all(r == ("user" if k % 2 == 0 else "assistant") for k, r in enumerate(body)), (spec, body)
    assert prompts > 100 and rejects > 10


# ----------------------------------------------------------------------------- exports, checked row by row


def _check_export(path: Path) -> int:
    n = 0
    for line in path.read_text(encoding="utf-8").split("\n"):  # not splitlines(): U+2028 is inside rows
        if not line:
            continue
        row = json.loads(line)
        c = row["conversations"]
        gen = c[-1]
        assert gen["role"] == "assistant" and "reasoning_content" in gen, row["id"]
        cut = specforge_parse(c)
        assert cut.truncated_at is None and not cut.dropped, (row["id"], roles(c), cut)
        assert cut.kept[-1] == len(c) - 1  # the generated turn is trained on
        n += 1
    return n


def test_every_exported_row_of_every_sample_dataset_passes_specforge(tmp_path):
    from e2e import write_run_config

    cfg = write_run_config(tmp_path, kimi_dir(), {})
    text = cfg.read_text().replace("mean_completion_tokens = 250", "mean_completion_tokens = 40")
    case10 = tmp_path / "case10.json"
    case10.write_text(json.dumps(CASE10))
    cfg.write_text(text + f'\n[[datasets]]\nname = "case10"\npath = "{case10}"\nformat = "sharegpt"\n')
    r = subprocess.run([PY, "-m", "datagen", "run", str(cfg), "--headless"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "[b7_sharegpt] 24 prompt(s) brought into SpecForge's role order" in r.stdout
    assert "[b8_swe_agent] 1 prompt(s) brought into SpecForge's role order" in r.stdout
    assert "[case10] 3 prompt(s) brought into SpecForge's role order" in r.stdout
    x = subprocess.run([PY, "-m", "datagen", "export", str(tmp_path / "run"), "--format", "specforge", "--force", "--out",
                        str(tmp_path / "sf")], capture_output=True, text=True, timeout=300)
    assert x.returncode == 0, x.stderr
    files = sorted((tmp_path / "sf").glob("*.jsonl"))
    names = {n for n, _, _ in SAMPLE_DATASETS} | set(SCHEMA_ROWS) | {"case10"}
    assert {f.stem for f in files} == names
    counts = {f.stem: _check_export(f) for f in files}
    assert counts["b7_sharegpt"] == 98 and counts["b8_swe_agent"] == 5 and counts["case10"] == 5
    assert sum(counts.values()) == 134 + 5


# ----------------------------------------------------------------------------- case 10 against a scripted server


def test_case10_sharegpt_roles_scripted_server(tmp_path):
    from engine.config import TokenizerSection
    from engine.tokens.tokenizer import load_tokenizer

    tok = load_tokenizer(TokenizerSection(path=str(kimi_dir()), kind="tiktoken"))

    def respond(req: dict, n: int) -> Reply:
        user = [m["content"] for m in req["messages"] if m["role"] == "user"][-1]
        r, c = "Answer briefly.", "Here is my answer to: " + user[:40]
        billed = len(tok.encode_chat(r + "</think>" + c + "<|im_end|>"))
        return Reply(pieces=[sse(chunk({"role": "assistant", "reasoning": r})), sse(chunk({"content": c})),
                             sse(chunk({}, finish="stop", usage=usage(20, billed, 3, cost=0.00001))), DONE])

    (tmp_path / "sharegpt.json").write_text(json.dumps(CASE10))
    with CaseServer(respond) as srv:
        cfg = case_config(tmp_path, srv.base_url, tokenizer=kimi_dir(), dataset_path="sharegpt.json",
                          dataset_format="sharegpt")
        r = run_case(cfg)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        sent = sorted(roles(q["messages"]) for q in srv.requests)
    assert sent == ["suasu", "u", "u", "u", "uau"]  # five prompts: a1=a6 once, a7 rejected
    haiku = next(q for q in srv.requests if roles(q["messages"]) == "uau")
    assert haiku["messages"][1]["content"] == "Soft rain on the roof\n\ncontinued: drops in the gutter"
    assert "[d] 3 prompt(s) brought into SpecForge's role order" in r.stdout
    st = json.loads(subprocess.run([PY, "-m", "datagen", "status", str(tmp_path / "run"), "--json"],
                                   capture_output=True, text=True, check=True).stdout)
    d = st["datasets"][0]
    assert (d["done"], d["failed"], d["rejected"]) == (5, 0, 2)
    x = subprocess.run([PY, "-m", "datagen", "export", str(tmp_path / "run"), "--format", "specforge", "--force", "--out",
                        str(tmp_path / "sf")], capture_output=True, text=True, timeout=120)
    assert x.returncode == 0, x.stderr
    rows = [json.loads(line) for line in (tmp_path / "sf" / "d.jsonl").read_text(encoding="utf-8").split("\n") if line]
    assert len(rows) == 5 and _check_export(tmp_path / "sf" / "d.jsonl") == 5
    for row in rows:  # the generated turn is the server's answer to the row's last user turn
        c = row["conversations"]
        assert c[-1]["content"] == "Here is my answer to: " + c[-2]["content"][:40]

    # A store ingested before the rule (the haiku prompt stored with its two assistant turns): the export
    # leaves that row out and says so, instead of a row SpecForge would cut before the generated turn.
    import sqlite3

    db = sqlite3.connect(tmp_path / "run" / "store.sqlite")
    old = [{"role": "user", "content": "Write a haiku about rain."}, {"role": "assistant", "content": "Soft rain on the roof"},
           {"role": "assistant", "content": "continued: drops in the gutter"}, {"role": "user", "content": "Now one about snow."}]
    (n,) = db.execute("SELECT COUNT(*) FROM prompts WHERE messages LIKE '%Now one about snow.%'").fetchone()
    db.execute("UPDATE prompts SET messages=? WHERE messages LIKE '%Now one about snow.%'", (json.dumps(old),))
    db.commit()
    db.close()
    assert n == 1
    x = subprocess.run([PY, "-m", "datagen", "export", str(tmp_path / "run"), "--format", "specforge", "--force", "--out",
                        str(tmp_path / "sf2")], capture_output=True, text=True, timeout=120)
    assert x.returncode == 0, x.stderr
    assert "left out: 1 row(s) whose turns SpecForge's parser would drop or cut" in x.stdout
    assert "truncated before turn 2: An 'assistant' message must follow a 'user' or 'tool' message" in x.stdout
    assert _check_export(tmp_path / "sf2" / "d.jsonl") == 4
