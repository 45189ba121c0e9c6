"""Shared test helpers: configs, a prepared store, fake completions, streamed chunks accumulated."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from engine.client.accumulate import StreamAccumulator
from engine.client.types import Completion, Usage
from engine.config import Config, parse_config
from engine.storage.store import Store

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "engine" / "samples"
SHARED_DATASETS = REPO.parent / "shared" / "datasets"


def make_config(tmp_path: Path, datasets: list[dict[str, Any]] | None = None, **sections: Any) -> Config:
    """A valid Config rooted in ``tmp_path`` (dataset files need not exist)."""
    data: dict[str, Any] = {
        "run": {"name": "t", "dir": str(tmp_path / "run"), "commit_interval_s": 0.05, "progress_interval_s": 0.2},
        "provider": {"kind": "simulated"},
        "classes": {"short": {"max_tokens": 1000, "concurrency": 4},
                    "long": {"max_tokens": 2000, "concurrency": 2, "min_prompt_tokens": 1000}},
        "datasets": datasets or [{"name": "a", "path": "a.jsonl"}, {"name": "b", "path": "b.jsonl"}],
    }
    for k, v in sections.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
    return parse_config(data, tmp_path / "config.toml", check_files=False)


async def seeded_store(cfg: Config, per_dataset: dict[str, int], long_every: int = 0) -> Store:
    """Open the run store and insert ``n`` synthetic prompts per dataset (every ``long_every``-th long)."""
    store = await Store.open(cfg.run.dir)
    await store.set_meta("run_name", cfg.run.name)
    for pos, d in enumerate(cfg.datasets):
        await store.register_dataset(d.name, pos, str(d.path), d.token_budget)
        rows = []
        for i in range(per_dataset.get(d.name, 0)):
            cls = "long" if long_every and i % long_every == 0 else "short"
            est = 5000 if cls == "long" else 10
            msgs = [{"role": "user", "content": f"{d.name} prompt {i}"}]
            rows.append((f"{d.name}-{i:06d}", f"{d.name}.jsonl:{i + 1}", cls, est, json.dumps(msgs), "[]"))
        await store.ingest_batch(d.name, rows)
        await store.finish_ingest(d.name, "fp", 0)
    return store


def completion(text: str = "hello world", completion_tokens: int = 10, cost: float = 0.001, provider: str = "P") -> Completion:
    """A canned completion."""
    return Completion(
        reasoning="think", content=text, tool_calls=(), finish_reason="stop", native_finish_reason="stop",
        usage=Usage(prompt_tokens=5, completion_tokens=completion_tokens, reasoning_tokens=1, cost_usd=cost),
        provider=provider, model="m", generation_id="gen-1", latency_s=0.01, ttft_s=0.005,
    )


def acc_of(*chunks: dict) -> StreamAccumulator:
    """A StreamAccumulator fed ``chunks`` in order (``.completion()`` assembles them)."""
    acc = StreamAccumulator()
    for c in chunks:
        acc.feed(c)
    return acc


def store_rows(run_dir: Path, sql: str) -> list[tuple]:
    """The rows of ``sql`` on ``run_dir``'s store (a fresh read-only-minded connection, closed after)."""
    db = sqlite3.connect(Path(run_dir) / "store.sqlite")
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def tool_fragment(index: int | None = None, id: str | None = None, name: str | None = None,
                  args: Any = None, type: str | None = None, **extra: Any) -> dict[str, Any]:
    """One streamed ``delta.tool_calls`` entry; a parameter left None is left out of the entry."""
    d: dict[str, Any] = dict(extra)
    for k, v in (("index", index), ("id", id), ("type", type)):
        if v is not None:
            d[k] = v
    fn = {k: v for k, v in (("name", name), ("arguments", args)) if v is not None}
    if fn:
        d["function"] = fn
    return d
