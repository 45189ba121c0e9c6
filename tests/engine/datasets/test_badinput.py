"""Bad input corpus: every bad dataset row and config costs one row (or one clear error), never the run.

Each case states the exact error: rows are rejected with ``file:line: reason`` (and listed in the
store's ``rejects`` table), configs fail before any request with the file and the key. A real job
over a file mixing good rows with every bad row shows the good ones complete, a prompt longer than
the model's context fails once with ``context_length_exceeded`` (no retry), and a 2 MB prompt
that fits the context completes.
"""

from __future__ import annotations

import io
import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest
from e2e import read_log

from datagen import cli
from engine.config import parse_config
from engine.datasets import DatasetError, iter_prompts
from engine.prompts import Prompt, Reject, prompt_key
from engine.run.headless import run_headless

GOOD1 = json.dumps({"prompt": "good row one"}).encode()
GOOD3 = json.dumps({"messages": [{"role": "user", "content": "good row three"}]}).encode()
UNRECOGNISED = ("expected one of: history (swe_agent); chat (glaive); messages (openai); conversations (sharegpt); "
                "data (ultrachat); instruction (instruction); problem (oss_instruct); input (opencodeinstruct); "
                "prompt (text)")


def _j(obj) -> bytes:
    return json.dumps(obj).encode()


def _user(content="a", **extra):
    return {"messages": [{"role": "user", "content": content}], **extra}


#: id -> (bytes of line 2, exact reject reason; None = the row is accepted).
ROW_CASES: dict[str, tuple[bytes, str | None]] = {
    "invalid_json": (b'{"prompt": "x",', "invalid JSON: Expecting property name enclosed in double quotes (column 16)"),
    "invalid_json_single_quotes": (b"{'prompt': 'x'}", "invalid JSON: Expecting property name enclosed in double quotes (column 2)"),
    "trailing_garbage": (b'{"prompt": "x"} trailing', "invalid JSON: Extra data (column 17)"),
    "latin1_bytes": ('{"prompt": "caf\u00e9 cr\u00e8me"}'.encode("latin-1"), "not UTF-8: byte 0xe9 at column 16"),
    "nested_too_deeply": (b"[" * 100_000, "invalid JSON: nested too deeply"),
    "not_an_object": (b"[1, 2]", "row is a list, expected a JSON object"),
    "json_string_row": (b'"just a string"', "row is a str, expected a JSON object"),
    "json_number_row": (b"42", "row is an int, expected a JSON object"),
    "json_null_row": (b"null", "row is null, expected a JSON object"),
    "unrecognised_format": (_j({"foo": 1, "bar": 2}), f"unrecognised row format: keys ['foo', 'bar']; {UNRECOGNISED}"),
    "format_key_wrong_type": (_j({"system": "", "chat": 5}), "unrecognised row format: field 'chat' is an int, expected a string (glaive)"),
    "empty_messages": (_j({"messages": []}), "openai: empty conversation"),
    "roles_out_of_order": (_j({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "s"},
                                            {"role": "assistant", "content": "b"}]}),
                           "openai: roles out of order: prompt ends with a system turn (message 2)"),
    "only_assistant": (_j({"messages": [{"role": "assistant", "content": "b"}]}), "openai: no user turn before the last assistant turn"),
    "unknown_role": (_j({"messages": [{"role": "wizard", "content": "a"}]}), "openai: message 1: unknown role 'wizard'"),
    "missing_role": (_j({"messages": [{"content": "a"}]}), "openai: message 1: missing field 'role'"),
    "null_content": (_j({"messages": [{"role": "user", "content": None}]}), "openai: message 1: null content"),
    "missing_content": (_j({"messages": [{"role": "user"}]}), "openai: message 1: missing field 'content'"),
    "number_content": (_j({"messages": [{"role": "user", "content": 42}]}), "openai: message 1: content is an int, expected a string"),
    "blank_user_turn": (_j(_user("   ")), "openai: message 1: final user turn is empty"),
    "empty_text_prompt": (_j({"prompt": ""}), "text: message 1: final user turn is empty"),
    "lone_surrogate": (b'{"prompt": "a\\ud800b"}', "text: text holds a lone surrogate escape (e.g. \\ud800), not encodable as UTF-8"),
    "tools_not_a_list": (_j(_user(tools=7)), "openai: field 'tools' is an int, expected a list"),
    "tools_string_not_json": (_j(_user(tools="[{bad")), "openai: field 'tools' is a string but not JSON: Expecting property name "
                              "enclosed in double quotes: line 1 column 3 (char 2)"),
    "tool_without_name": (_j(_user(tools=[{"type": "function", "function": {"parameters": {"type": "object"}}}])),
                          "openai: tool 1: function name is missing, expected a non-empty string"),
    "tool_parameters_string": (_j(_user(tools=[{"type": "function", "function": {"name": "get_weather",
                                                                                 "parameters": '{"type": "object"}'}}])),
                               "openai: tool 1 (get_weather): 'parameters' is a str, expected a JSON Schema object"),
    "tool_parameters_not_object_type": (_j(_user(tools=[{"name": "f", "parameters": {"type": "string"}}])),
                                        "openai: tool 1 (f): 'parameters' has type 'string', expected 'object'"),
    "tool_wrong_type": (_j(_user(tools=[{"type": "retrieval"}])), "openai: tool 1: type 'retrieval', expected 'function'"),
    "tool_properties_list": (_j(_user(tools=[{"name": "f", "parameters": {"type": "object", "properties": ["a"]}}])),
                             "openai: tool 1 (f): 'parameters.properties' is a list, expected an object"),
    "sharegpt_unknown_role": (_j({"conversations": [{"from": "alien", "value": "x"}]}), "sharegpt: message 1: unknown role 'alien'"),
    "sharegpt_missing_value": (_j({"conversations": [{"from": "human"}]}), "sharegpt: message 1: missing field 'value'"),
    "glaive_bad_function_call": (_j({"system": "", "chat": "USER: a\n\n\nASSISTANT: <functioncall> {garbage\n\n\n"
                                                           "FUNCTION RESPONSE: {}\n\n\nASSISTANT: b"}),
                                 "glaive: message 2: unparseable <functioncall> payload: '{garbage'"),
    "instruction_input_not_string": (_j({"instruction": "do it", "input": 3}), "instruction: field 'input' is an int, expected a string"),
    "swe_agent_unknown_role": (_j({"history": [{"role": "ai", "content": "x"}]}), "swe_agent: message 1: unknown role 'ai'"),
    # Accepted: a byte-order mark where two files with one were concatenated, NUL characters, CRLF.
    "bom_mid_file": (b"\xef\xbb\xbf" + _j({"prompt": "after a BOM"}), None),
    "nul_character": (b'{"prompt": "a\\u0000b"}', None),
    "crlf": (_j({"prompt": "crlf line"}) + b"\r", None),
}


@pytest.mark.parametrize("case", list(ROW_CASES))
def test_bad_row(tmp_path, case):
    line, reason = ROW_CASES[case]
    path = tmp_path / "rows.jsonl"
    path.write_bytes(GOOD1 + b"\n" + line + b"\n" + GOOD3 + b"\n")
    items = list(iter_prompts(path))
    assert len(items) == 3
    assert isinstance(items[0], Prompt) and items[0].source == f"{path}:1"
    assert isinstance(items[2], Prompt) and items[2].source == f"{path}:3"  # the run goes on after the bad row
    if reason is None:
        assert isinstance(items[1], Prompt) and items[1].source == f"{path}:2"
    else:
        assert items[1] == Reject(f"{path}:2", reason)
        assert str(items[1]) == f"{path}:2: {reason}"


def test_truncated_last_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(GOOD1 + b"\n" + b'{"messages": [{"role": "user", "content": "cut')
    items = list(iter_prompts(path))
    assert isinstance(items[0], Prompt)
    assert items[1] == Reject(f"{path}:2", "truncated last line: Unterminated string starting at (column 43)")


def test_bom_at_start(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD1 + b"\n")
    (p,) = iter_prompts(path)
    assert p.source == f"{path}:1" and p.messages == [{"role": "user", "content": "good row one"}]
    assert p.key == prompt_key([{"role": "user", "content": "good row one"}])


def test_truncated_json_array(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("[" + GOOD1.decode() + ", " + GOOD3.decode() + ', {"prompt": "cu')
    items = list(iter_prompts(path))
    assert [type(i) for i in items] == [Prompt, Prompt, Reject]
    assert items[2] == Reject(f"{path}:3", "truncated JSON array at element 3: Unterminated string starting at (char 103)")


def test_latin1_in_json_array(tmp_path):
    path = tmp_path / "a.json"
    path.write_bytes(b"[" + '{"prompt": "caf\u00e9"}'.encode("latin-1") + b", " + GOOD1 + b"]")
    items = list(iter_prompts(path))
    assert items[0] == Reject(f"{path}:1", "not UTF-8: undecodable byte in array element 1")
    assert isinstance(items[1], Prompt) and items[1].source == f"{path}:2"


def test_binary_file_is_a_whole_file_error(tmp_path):
    path = tmp_path / "image.json"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    with pytest.raises(DatasetError) as e:
        iter_prompts(path)
    assert str(e.value) == (f"{path}: not a dataset file (starts with b'\\x89'); expected a .jsonl/.ndjson (JSON lines), "
                            ".json (JSON array or JSON lines) or .parquet file")


def _locked_dir(tmp_path, monkeypatch):
    """A dataset inside a directory nobody may enter. Root bypasses permissions, so for root the
    kernel's answer (EACCES on stat) is simulated for paths under that directory."""
    locked = tmp_path / "locked"
    locked.mkdir()
    data = locked / "d.jsonl"
    data.write_bytes(GOOD1 + b"\n")
    locked.chmod(0)
    if os.access(data, os.R_OK):  # root
        real_stat = os.stat

        def stat_(p, *a, **k):
            if str(p).startswith(str(locked) + os.sep):
                raise PermissionError(13, "Permission denied", str(p))
            return real_stat(p, *a, **k)

        monkeypatch.setattr(os, "stat", stat_)
        monkeypatch.setattr(os, "access", lambda p, mode, **k: not str(p).startswith(str(locked) + os.sep))
    return locked, data


def test_unreadable_directory_dataset_reader(tmp_path, monkeypatch):
    locked, data = _locked_dir(tmp_path, monkeypatch)
    try:
        with pytest.raises(DatasetError) as e:
            iter_prompts(data)
        assert str(e.value) == (f"{data}: cannot access (Permission denied); expected a .jsonl/.ndjson (JSON lines), "
                                ".json (JSON array or JSON lines) or .parquet file")
    finally:
        locked.chmod(stat.S_IRWXU)


# ---------------------------------------------------------------------------------------- config

BASE = """[run]
dir = "{tmp}/run"
[provider]
kind = "openai"
base_url = "http://127.0.0.1:9/api/v1"
api_key_env = "BADINPUT_KEY"
[classes.short]
max_tokens = 100
concurrency = 4
[[datasets]]
name = "a"
path = "{tmp}/d.jsonl"
"""

#: id -> (edit of BASE as (old, new) or an appended text, exact error lines after "CONFIG: ").
CONFIG_CASES = {
    "unknown_key": (("[run]\n", "[run]\nnmae = 'x'\n"),
                    "invalid configuration:\n  run.nmae: unknown key (check the spelling; see docs/configuration.md)"),
    "unknown_section": ("[bogus]\nx = 1\n", "invalid configuration:\n  bogus: unknown key (check the spelling; see docs/configuration.md)"),
    "wrong_type": (("concurrency = 4", 'concurrency = "four"'),
                   "invalid configuration:\n  classes.short.concurrency: Input should be a valid integer, unable to parse "
                   "string as an integer (got 'four')"),
    "negative_token_budget": ("token_budget = -5\n",
                              "invalid configuration:\n  datasets[0].token_budget: Input should be greater than or equal to 1 (got -5)"),
    "negative_dataset_cost_cap": ("max_cost_usd = -1.0\n",
                                  "invalid configuration:\n  datasets[0].max_cost_usd: Input should be greater than 0 (got -1.0)"),
    "negative_run_budget": ("[spend]\nmax_cost_usd = -3\n",
                            "invalid configuration:\n  spend.max_cost_usd: Input should be greater than 0 (got -3)"),
    "zero_concurrency": (("concurrency = 4", "concurrency = 0"),
                         "invalid configuration:\n  classes.short.concurrency: Input should be greater than or equal to 1 (got 0)"),
    "zero_commit_interval": (("[run]\n", "[run]\ncommit_interval_s = 0\n"),
                             "invalid configuration:\n  run.commit_interval_s: Input should be greater than 0 (got 0)"),
    "missing_dataset_file": (("{tmp}/d.jsonl", "{tmp}/nope.jsonl"),
                             "invalid configuration:\n  datasets[0].path (a): file not found: {tmp}/nope.jsonl"),
    "dataset_directory_without_data_files": (("{tmp}/d.jsonl", "{tmp}/shards"),
                                             "invalid configuration:\n  datasets[0].path (a): {tmp}/shards: no dataset files "
                                             "in the directory; expected .jsonl/.ndjson/.json/.traj/.parquet (optionally "
                                             ".gz/.zst) files"),
    "dataset_glob_matching_nothing": (("{tmp}/d.jsonl", "{tmp}/*.parquet"),
                                      "invalid configuration:\n  datasets[0].path (a): {tmp}/*.parquet: the glob matches "
                                      "no file; expected one or more .jsonl/.ndjson/.json/.traj/.parquet (optionally "
                                      ".gz/.zst) files"),
    "hub_path_malformed": (("{tmp}/d.jsonl", "hf://datasets/just-a-name"),
                           "invalid configuration:\n  datasets[0].path: expected hf://datasets/ORG/NAME (a Hub dataset "
                           "id), got 'hf://datasets/just-a-name'"),
    "hub_keys_on_a_local_path": ('split = "train"\n',
                                 "invalid configuration:\n  datasets[0]: split: only for a path = \"hf://datasets/ORG/NAME\" "
                                 "(a local path names its files itself: a file, a directory or a glob)"),
    "base_url_ftp": (("http://127.0.0.1:9/api/v1", "ftp://example.com/v1"),
                     "invalid configuration:\n  provider.base_url: expected an http(s) URL like https://openrouter.ai/api/v1, "
                     "got 'ftp://example.com/v1'"),
    "base_url_without_scheme": (("http://127.0.0.1:9/api/v1", "openrouter.ai/api/v1"),
                                "invalid configuration:\n  provider.base_url: expected an http(s) URL like "
                                "https://openrouter.ai/api/v1, got 'openrouter.ai/api/v1'"),
    "openai_without_base_url": (('base_url = "http://127.0.0.1:9/api/v1"\n', ""),
                                "invalid configuration:\n  provider: kind 'openai' needs base_url (e.g. http://127.0.0.1:8000/v1)"),
    "key_instead_of_env_name": (('api_key_env = "BADINPUT_KEY"', 'api_key_env = "sk-or-v1-0123456789abcdef"'),
                                "invalid configuration:\n  provider.api_key_env: expected the NAME of an environment variable "
                                "(e.g. OPENROUTER_API_KEY), got 'sk-or-'..."),
    "toml_syntax_error": (("concurrency = 4", "concurrency = = 4"), "TOML syntax error: Invalid value (at line 9, column 15)"),
    "duplicate_dataset_names": ('[[datasets]]\nname = "a"\npath = "{tmp}/d.jsonl"\n',
                                "invalid configuration:\n  (top level): dataset names must be unique; repeated: a"),
    "unknown_format": ('format = "csv"\n',
                       "invalid configuration:\n  datasets[0].format: expected one of auto, glaive, instruction, openai, "
                       "opencodeinstruct, oss_instruct, sharegpt, swe_agent, text, ultrachat, got 'csv'"),
    "no_class_for_short_prompts": (("concurrency = 4", "concurrency = 4\nmin_prompt_tokens = 5"),
                                   "invalid configuration:\n  (top level): one class must have min_prompt_tokens = 0 so every "
                                   "prompt has a class"),
}


def _write_config(tmp_path, case) -> Path:
    (tmp_path / "d.jsonl").write_bytes(GOOD1 + b"\n")
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "notes.txt").write_text("no data here")
    edit, _ = CONFIG_CASES[case]
    text = BASE
    if isinstance(edit, tuple):
        assert edit[0] in text
        text = text.replace(edit[0], edit[1])
    else:
        text += edit
    cfg = tmp_path / "config.toml"
    cfg.write_text(text.replace("{tmp}", str(tmp_path)))
    return cfg


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_bad_config(tmp_path, case, capsys, monkeypatch):
    monkeypatch.setenv("BADINPUT_KEY", "sk-test")
    cfg = _write_config(tmp_path, case)
    rc = cli.main(["run", str(cfg), "--headless"])
    err = capsys.readouterr().err
    expected = CONFIG_CASES[case][1].replace("{tmp}", str(tmp_path))
    assert rc == 1
    assert err == f"error: {cfg}: {expected}\n"
    assert not (tmp_path / "run").exists()  # refused before anything was created or sent


def test_missing_config_file(tmp_path, capsys):
    rc = cli.main(["run", str(tmp_path / "nope.toml")])
    assert rc == 1 and capsys.readouterr().err == f"error: {tmp_path / 'nope.toml'}: config file not found\n"


def test_unreadable_dataset_directory_config(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BADINPUT_KEY", "sk-test")
    (tmp_path / "d.jsonl").write_bytes(GOOD1 + b"\n")
    locked, data = _locked_dir(tmp_path, monkeypatch)
    cfg = tmp_path / "config.toml"
    cfg.write_text(BASE.replace("{tmp}/d.jsonl", str(data)).replace("{tmp}", str(tmp_path)))
    try:
        rc = cli.main(["run", str(cfg), "--headless"])
    finally:
        locked.chmod(stat.S_IRWXU)
    assert rc == 1
    assert capsys.readouterr().err == (f"error: {cfg}: invalid configuration:\n  datasets[0].path (a): "
                                       f"cannot access {data}: Permission denied\n")


def test_run_dir_cannot_be_created(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BADINPUT_KEY", "sk-test")
    (tmp_path / "d.jsonl").write_bytes(GOOD1 + b"\n")
    cfg = tmp_path / "config.toml"
    cfg.write_text(BASE.replace("{tmp}/run", "{tmp}/d.jsonl/run").replace("{tmp}", str(tmp_path)))
    rc = cli.main(["run", str(cfg), "--headless"])
    assert rc == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "run.dir" in err and str(tmp_path / "d.jsonl" / "run") in err


# ------------------------------------------------------------------------------ a real mixed job

CJK = "\u6f22\u5b57\u306e\u8a66\u9a13\u6587\u3002"  # 8 characters, 3 UTF-8 bytes each


async def test_mixed_file_job_good_rows_complete(tmp_path):
    """One file: 20 good rows, every bad row above, a duplicate, a 2 MB prompt that fits the context
    and a prompt longer than the context (262,144 tokens: the simulator answers 400)."""
    good = [_j({"prompt": f"mixed good prompt {i}"}) for i in range(20)]
    lines: list[bytes] = []
    expected_rejects: list[tuple[int, str]] = []
    bad = [(name, line, reason) for name, (line, reason) in ROW_CASES.items() if reason is not None]
    for i, g in enumerate(good):
        lines.append(g)
        if i < len(bad):
            lines.append(bad[i][1])
            expected_rejects.append((len(lines), bad[i][2]))
    for _, line, reason in bad[len(good):]:
        lines.append(line)
        expected_rejects.append((len(lines), reason))
    lines.append(good[3])  # duplicate of a good row
    expected_rejects.append((len(lines), f"duplicate prompt (same key as {tmp_path / 'mixed.jsonl'}:{lines.index(good[3]) + 1})"))
    big = CJK * (2 * 1024 * 1024 // len(CJK.encode()))  # 2 MB of UTF-8, ~175,000 estimated tokens
    lines.append(_j({"prompt": big}))
    big_line = len(lines)
    too_long = "word " * 220_000  # 1.1 MB: ~275,000 tokens + max_tokens > 262,144
    lines.append(_j({"prompt": too_long}))
    long_line = len(lines)
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert len(json.loads(lines[big_line - 1])["prompt"].encode()) >= 2 * 1024 * 1024 - len(CJK.encode())

    log = tmp_path / "sim.jsonl"
    cfg = parse_config({
        "run": {"name": "mixed", "dir": str(tmp_path / "run"), "commit_interval_s": 0.2, "progress_interval_s": 1},
        "provider": {"kind": "simulated", "sim": {"seed": 5, "mean_completion_tokens": 50, "log": str(log)}},
        "classes": {"short": {"max_tokens": 1024, "concurrency": 8}},
        "datasets": [{"name": "mixed", "path": str(path)}],
    }, tmp_path / "config.toml")
    out = io.StringIO()
    code = await run_headless(cfg, out, install_signals=False)
    text = out.getvalue()
    assert code == 0, text
    n_bad = len(expected_rejects)
    assert f"[mixed] ingested 22 prompts (22 new), {n_bad} rejected rows" in text
    assert f"    rejected {path}:{expected_rejects[0][0]}: {expected_rejects[0][1]}" in text

    db = sqlite3.connect(tmp_path / "run" / "store.sqlite")
    rejects = db.execute("SELECT source, reason FROM rejects ORDER BY id").fetchall()
    assert rejects == [(f"{path}:{n}", r) for n, r in expected_rejects]
    rows = {src: (state, ec, err, att) for src, state, ec, err, att in
            db.execute("SELECT source, state, error_class, error, attempts FROM prompts")}
    assert len(rows) == 22
    failed = {s: v for s, v in rows.items() if v[0] != "done"}
    # Only the over-long prompt failed: at once (one attempt), with the provider's reason.
    assert list(failed) == [f"{path}:{long_line}"]
    state, ec, err, att = failed[f"{path}:{long_line}"]
    assert (state, ec, att) == ("failed", "bad_request", 1)
    assert "maximum context length is 262144 tokens" in err and "error_type=context_length_exceeded" in err
    assert rows[f"{path}:{big_line}"][0] == "done"
    (n_results,) = db.execute("SELECT COUNT(*) FROM results").fetchone()
    assert n_results == 21
    entries = read_log(log)
    long_key = prompt_key([{"role": "user", "content": too_long}])
    assert [e["outcome"] for e in entries if e["prompt_key"] == long_key] == ["400"]
    big_key = prompt_key([{"role": "user", "content": big}])
    assert [e["outcome"] for e in entries if e["prompt_key"] == big_key] == ["completed"]


def test_status_of_a_store_being_created(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "store.sqlite").write_bytes(b"")  # what Store.open creates before the schema
    rc = cli.main(["status", str(run_dir)])
    assert rc in (0, 1)
    out = capsys.readouterr()
    assert "not started" in out.out or out.err.startswith("error: ")
