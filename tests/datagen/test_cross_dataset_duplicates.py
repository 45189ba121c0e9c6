"""The same prompt in two datasets is bought once, or in each on purpose (issue 36).

Before, a prompt in two datasets was bought twice. Real runs (``datagen run --headless``) against the
simulator on 127.0.0.1 (``[provider.sim] log``: one line per request it served), a real SQLite store:
two datasets sharing 4 prompts send 4 fewer requests, the ingest line names the pair, ``status`` (text and
``--json``) counts the duplicates, the export holds each bought record once; a rerun of the run directory sends
nothing; a dataset added later with 2 prompts already bought sends only its 2 new ones;
``cross_dataset_duplicates = "buy_each"`` buys both copies.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from e2e import PY, read_log, run_cmd, status_json
from helpers import REPO

LINE = ("ingest: 4 prompt(s) of 'b' also in 'a' (bought once, under 'a'; [run] cross_dataset_duplicates = "
        "\"buy_each\" buys each)")


def _data(path: Path, ids) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"Question {i}: explain topic {i} briefly."}) + "\n" for i in ids))
    return path


def _config(tmp: Path, sets: dict[str, range | list[int]], mode: str = "buy_once") -> Path:
    ds = "".join(f'[[datasets]]\nname = "{n}"\npath = "{_data(tmp / f"{n}.jsonl", ids)}"\nformat = "text"\n'
                 for n, ids in sets.items())
    cfg = tmp / "config.toml"
    cfg.write_text(f"""
[run]
name = "dups"
dir = "{tmp / 'run'}"
commit_interval_s = 0.1
progress_interval_s = 30
{'' if mode == "buy_once" else f'cross_dataset_duplicates = "{mode}"'}
[provider]
kind = "simulated"
[provider.sim]
seed = 3
latency_ms = 0
tokens_per_s = 0
mean_completion_tokens = 12
log = "{tmp / 'sim.jsonl'}"
[classes.short]
max_tokens = 64
concurrency = 8
{ds}""")
    return cfg


def _run(cfg: Path) -> str:
    p = subprocess.run(run_cmd(cfg), capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return p.stdout


def _requests(tmp: Path) -> list[str]:
    """The prompt keys of the chat requests the simulator served, in order."""
    log = tmp / "sim.jsonl"
    return [e["prompt_key"] for e in read_log(log)] if log.exists() else []


def _counts(doc: dict) -> dict[str, tuple[int, int, int]]:
    return {d["name"]: (d["prompts"], d["done"], d["duplicates"]) for d in doc["datasets"]}


def test_a_prompt_in_two_datasets_is_bought_once_across_reruns_and_added_datasets(tmp_path):
    cfg = _config(tmp_path, {"a": range(0, 8), "b": range(4, 12)})
    out = _run(cfg)
    sent = _requests(tmp_path)
    assert len(sent) == 12 and len(set(sent)) == 12  # 16 copies, 4 shared: 12 requests, none twice
    assert LINE in out.splitlines()
    assert "[b] ingested 4 prompts + 4 bought under another dataset (8 new), 0 rejected rows" in out.splitlines()
    doc = status_json(tmp_path / "run")
    assert doc["run"]["state"] == "completed"
    assert _counts(doc) == {"a": (8, 8, 0), "b": (4, 4, 4)}
    assert doc["totals"]["duplicates"] == 4 and doc["totals"]["prompts"] == doc["totals"]["done"] == 12
    text = subprocess.run([PY, "-m", "datagen", "status", str(tmp_path / "run")], capture_output=True, text=True,
                          check=True, cwd=REPO).stdout
    assert ("duplicates: b 4 prompt(s) also in another dataset, bought there once (not in these prompts; [run] "
            "cross_dataset_duplicates)") in text.splitlines()

    # the same run directory again: nothing sent, nothing counted twice, the line said again
    out = _run(cfg)
    assert len(_requests(tmp_path)) == 12
    assert LINE in out.splitlines()
    assert _counts(status_json(tmp_path / "run")) == {"a": (8, 8, 0), "b": (4, 4, 4)}

    # a dataset added later (first in the config) with 2 prompts already bought (one under a, one under b)
    # and 2 new: 2 requests
    cfg = _config(tmp_path, {"c": [0, 9, 100, 101], "a": range(0, 8), "b": range(4, 12)})
    out = _run(cfg)
    assert len(_requests(tmp_path)) == 14
    assert [s for s in out.splitlines() if s.startswith("ingest: ")] == [
        "ingest: 1 prompt(s) of 'c' also in 'a' (bought once, under 'a'; [run] cross_dataset_duplicates = "
        "\"buy_each\" buys each)",
        "ingest: 1 prompt(s) of 'c' also in 'b' (bought once, under 'b'; [run] cross_dataset_duplicates = "
        "\"buy_each\" buys each)", LINE]
    assert _counts(status_json(tmp_path / "run")) == {"c": (2, 2, 2), "a": (8, 8, 0), "b": (4, 4, 4)}

    # the export holds each bought record once, under the dataset that bought it
    dest = tmp_path / "export"
    subprocess.run([PY, "-m", "datagen", "export", str(tmp_path / "run"), "--format", "raw", "--out", str(dest)],
                   check=True, capture_output=True, cwd=REPO)
    recs = [json.loads(s) for f in sorted(dest.glob("*.jsonl")) for s in f.read_text().splitlines() if s]
    keys = [r["key"] for r in recs]
    assert len(keys) == len(set(keys)) == 14
    assert sorted(r["dataset"] for r in recs) == ["a"] * 8 + ["b"] * 4 + ["c"] * 2


def test_buy_each_buys_both_copies(tmp_path):
    out = _run(_config(tmp_path, {"a": range(0, 8), "b": range(4, 12)}, mode="buy_each"))
    sent = _requests(tmp_path)
    assert len(sent) == 16 and len(set(sent)) == 12  # the 4 shared prompts twice, on purpose
    assert ("ingest: 4 prompt(s) of 'b' also in 'a' (bought in each: [run] cross_dataset_duplicates = "
            "\"buy_each\"; \"buy_once\" buys them once)") in out.splitlines()
    assert _counts(status_json(tmp_path / "run")) == {"a": (8, 8, 0), "b": (8, 8, 0)}
