"""Shared pieces of the ingest-check and export tests: rows the Kimi-layout template cannot render,
rows with typed special-token text, and a simulated run configuration with the Kimi fixture."""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
from pathlib import Path

from engine.config import load_config
from engine.run.headless import run_headless

DONE = {"role": "assistant", "content": "Done."}
GOOD_CALL = {"id": "c1", "type": "function", "function": {"name": "open", "arguments": "{\"path\": \"a.py\"}"}}


def agent_row(tool_calls, tool: dict | None = None) -> dict:
    """An OpenAI-shape agent row: user, assistant with ``tool_calls``, tool result, final assistant
    (the prompt is everything before the final assistant turn)."""
    return {"messages": [{"role": "user", "content": "Open a.py"},
                         {"role": "assistant", "content": "", "tool_calls": tool_calls},
                         tool or {"role": "tool", "tool_call_id": "c1", "content": "print(1)"}, DONE]}


#: Rows whose prompt the Kimi-layout chat template cannot render (each a different way), with the
#: template's complaint.
UNRENDERABLE = [
    # "function" given as a list (a string-stored tool_calls is parsed by the adapter now, see
    # test_openai_tool_calls_stored_as_text_are_parsed)
    (agent_row([{"id": "c1", "type": "function", "function": ["open"]}]), "not JSON serializable"),
    # a flat call without the "function" object
    (agent_row([{"id": "c1", "name": "open", "arguments": "{}"}]), "'dict object' has no attribute 'function'"),
    # "function" given as a call expression string
    (agent_row([{"id": "c1", "type": "function", "function": "open(path='a.py')"}]), "not JSON serializable"),
    # a single call object instead of a list
    (agent_row({"id": "c1", "type": "function", "function": {"name": "open", "arguments": "{}"}}),
     "has no attribute 'function'"),
]

#: Rows that render.
RENDERABLE = [
    {"messages": [{"role": "user", "content": "What is the capital of Italy?"}]},
    agent_row([GOOD_CALL]),
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."}, DONE]},
]

#: Rows with special-token text typed in their messages: (row, token text, message number, role).
SPECIAL = [
    ({"messages": [{"role": "user", "content": "What does <|im_end|> mean in a chat template?"}]},
     "<|im_end|>", 1, "user"),
    ({"messages": [{"role": "system", "content": "Put your reasoning inside <think> tags."},
                   {"role": "user", "content": "Why is the sky blue?"}]}, "<think>", 1, "system"),
    (agent_row([GOOD_CALL], {"role": "tool", "tool_call_id": "c1", "content": "log line </think> end"}),
     "</think>", 3, "tool"),
]

#: A template that refuses a system message after the first turn (as many published templates do,
#: with ``raise_exception``), otherwise the Kimi layout.
RAISING_PREFIX = ("{%- for m in messages -%}{%- if m.role == 'system' and not loop.first -%}"
                  "{{ raise_exception('System message must be at the beginning.') }}{%- endif -%}{%- endfor -%}")
LATE_SYSTEM = {"messages": [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Late rules."},
                            {"role": "user", "content": "Now answer."}]}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_config(tmp: Path, tok: Path, datasets: list[tuple[str, Path] | tuple[str, Path, str]], *,
                 tokenizer_extra: str = "", sim_extra: str = "", classes: str = "", with_tokenizer: bool = True,
                 name: str = "promptcheck") -> Path:
    """A simulated-run config over ``datasets`` (``(name, path)`` in OpenAI format, or ``(name, path,
    format)``), the simulator counting with the Kimi-layout tokenizer ``tok`` and logging every request
    to ``tmp/sim.jsonl``; ``[tokenizer]`` on ``tok`` (thread executor) plus ``tokenizer_extra`` lines;
    ``sim_extra``: more ``[provider.sim]`` lines; ``classes``: the ``[classes.*]`` sections (default:
    short, 4000 max tokens, 8 in flight). Returns the config path (``tmp/config.toml``)."""
    ds = "".join(f'\n[[datasets]]\nname = "{d[0]}"\npath = "{d[1]}"\nformat = "{d[2] if len(d) > 2 else "openai"}"\n'
                 for d in datasets)
    tk = f'[tokenizer]\npath = "{tok}"\nexecutor = "thread"\n{tokenizer_extra}\n' if with_tokenizer else ""
    cfg = tmp / "config.toml"
    cfg.write_text(f"""
[run]
name = "{name}"
dir = "{tmp / 'run'}"
commit_interval_s = 0.2
progress_interval_s = 30
[provider]
kind = "simulated"
[provider.sim]
seed = 3
mean_completion_tokens = 60
tokenizer = "{tok}"
log = "{tmp / 'sim.jsonl'}"
{sim_extra}
{classes or '[classes.short]' + chr(10) + 'max_tokens = 4000' + chr(10) + 'concurrency = 8'}
{tk}{ds}""", encoding="utf-8")
    return cfg


def run(cfg_path: Path) -> str:
    """Run the config headless to its end; returns what it printed."""
    out = io.StringIO()
    code = asyncio.run(run_headless(load_config(cfg_path), out, install_signals=False))
    assert code == 0, out.getvalue()
    return out.getvalue()


def sim_requests(tmp: Path) -> list[dict]:
    p = tmp / "sim.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def rejects(run_dir: Path) -> list[tuple[str, str, str]]:
    db = sqlite3.connect(run_dir / "store.sqlite")
    try:
        return db.execute("SELECT dataset, source, reason FROM rejects ORDER BY id").fetchall()
    finally:
        db.close()
