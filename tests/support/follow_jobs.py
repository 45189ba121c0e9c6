"""The follow-mode chain's test setup (``[extract] after_run = "follow"``): three datasets of short
prompts on the simulator, the tiny model as the target, as a config object or a TOML file (for a
``datagen run`` subprocess), and a read-only look at the run's store."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from fixtures_tokens import HF_MARKERS, hf_dir

from engine.config import parse_config


def follow_data(tmp: Path, tiny: Path, follow_records: int = 20, prompts: int = 36, latency_ms: int = 250,
                **extract: Any) -> dict[str, Any]:
    """a1, a2, a3 (``prompts`` short sharegpt prompts each) bought 4, 2 and 1 at a time, so a1
    ends first and a3 goes on longest."""
    tok = hf_dir()
    for n in ("a1", "a2", "a3"):  # short prompts: each increment's forward is quick, its start-up dominates
        (tmp / f"short-{n}.json").write_text(json.dumps([{"id": f"q{i}", "conversations": [  # distinct per dataset
            {"from": "human", "value": f"Question {i} of {n}: name a colour and a number."}]} for i in range(prompts)]))
    classes = {f"c{n}": {"max_tokens": 300, "concurrency": c, "datasets": [n]}
               for n, c in (("a1", 4), ("a2", 2), ("a3", 1))}
    data = {
        "run": {"name": "x", "dir": str(tmp / "run"), "commit_interval_s": 0.1, "progress_interval_s": 1},
        "provider": {"kind": "simulated", "sim": {"tokenizer": str(tok), "mean_completion_tokens": 30,
                                                  "latency_ms": latency_ms, "tokens_per_s": 0}},
        "classes": {**classes, "rest": {"max_tokens": 300, "concurrency": 1}},
        "tokenizer": {"path": str(tok), "executor": "thread", **HF_MARKERS},
        "datasets": [{"name": n, "path": str(tmp / f"short-{n}.json"), "format": "sharegpt"} for n in ("a1", "a2", "a3")],
        "extract": {"model": str(tiny), "aux_layers": [0, 1, 2], "max_tokens_per_batch": 4096, "disk_margin_gb": 0,
                    "workers": 1, "after_run": "follow", "follow_records": follow_records, **extract},
    }
    return data


def follow_config(tmp: Path, tiny: Path, **kw: Any) -> Any:
    """:func:`follow_data` as a validated config (``kw``: its arguments)."""
    return parse_config(follow_data(tmp, tiny, **kw), tmp / "config.toml")


def write_toml(path: Path, data: dict[str, Any]) -> Path:
    """``data`` (tables of strings, numbers, booleans, lists; lists of tables) as a TOML file."""
    lines: list[str] = []

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        return "[" + ", ".join(value(x) for x in v) + "]"

    def table(d: dict[str, Any], name: str) -> None:
        plain = {k: v for k, v in d.items() if not isinstance(v, dict)
                 and not (isinstance(v, list) and v and isinstance(v[0], dict))}
        if name and plain:
            lines.append(f"[{name}]")
        lines.extend(f"{k} = {value(v)}" for k, v in plain.items())
        for k, v in d.items():
            if isinstance(v, dict):
                table(v, f"{name}.{k}" if name else k)
            elif isinstance(v, list) and v and isinstance(v[0], dict):
                for item in v:
                    lines.append(f"[[{name + '.' if name else ''}{k}]]")
                    lines.extend(f"{kk} = {value(vv)}" for kk, vv in item.items())

    table(data, "")
    path.write_text("\n".join(lines) + "\n")
    return path


def stored(run_dir: Path, dataset: str) -> int:
    """Results of ``dataset`` in the run's store so far (0 before it exists)."""
    if not (run_dir / "store.sqlite").exists():
        return 0
    conn = sqlite3.connect(f"file:{run_dir / 'store.sqlite'}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute("SELECT COUNT(*) FROM results WHERE dataset=?", (dataset,)).fetchone()[0]
    except sqlite3.Error:  # the schema is being created
        return 0
    finally:
        conn.close()


