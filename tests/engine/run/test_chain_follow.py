"""``[extract] after_run = "follow"``: extraction follows generation in increments of newly validated
records. The rules (pure), then a real run: the simulator on 127.0.0.1, a real tokenizer (validated
records) and real extraction workers on the tiny model (CPU), three datasets at ``follow_records = 20``:
several extractions append to one output directory while generation still buys, and the final
manifest lists every validated record exactly once, each readable."""

from __future__ import annotations

import asyncio
import io
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from extract_jobs import manifest_ids
from follow_jobs import follow_config, stored

from engine.extract.loader import ExtractedDataset
from engine.extract.snapshot import ExtractSnapshot
from engine.run.chain import ExtractChain, run_headless_chained
from engine.run.chainfollow import FollowRow, increment_line, pick_increment, waiting_text
from engine.run.ctl import send
from engine.tokens.exports import iter_token_records

pytestmark = pytest.mark.usefixtures("one_thread")  # the workers: the machine is shared

TINY_VOCAB = 4200  # the shared `tiny` fixture's vocabulary
N = 30  # prompts per dataset in the real run


def row(valid: int, covered: int = 0, *, finished: bool = False, unvalidated: int = 0, invalid: int = 0,
        total: int = 100) -> FollowRow:
    """A dataset's figures: ``valid`` records passed, ``covered`` already extracted or handed."""
    committed = valid + invalid + unvalidated
    return FollowRow(finished=finished, done=committed, total=total, committed=committed, unvalidated=unvalidated,
                     validated=valid + invalid, invalid=invalid, covered=covered)


def pick(rows: dict[str, FollowRow], final: bool = False, skipped: tuple[str, ...] = ()) -> Any:
    return pick_increment(rows, 20, final=final, max_failure_rate=0.2, failure_window=200, skipped=skipped)


# ------------------------------------------------------------------------------------------ pure parts

def test_an_extraction_starts_at_follow_records_and_takes_every_dataset_waiting() -> None:
    below = pick({"a1": row(19), "a2": row(5)})
    assert below.take == () and below.waiting == {"a1": 19, "a2": 5} and below.complete == ()
    at = pick({"a1": row(20), "a2": row(5), "a3": row(7, covered=7)})
    assert at.take == ("a1", "a2") and at.waiting == {"a1": 20, "a2": 5, "a3": 0}  # a2 rides along; a3 has none
    # covered records do not count again: 45 valid, 30 covered -> 15 waiting
    assert pick({"a1": row(45, covered=30)}).take == ()
    assert pick({"a1": row(50, covered=30)}).take == ("a1",)


def test_an_ended_dataset_takes_its_rest_and_then_is_complete() -> None:
    # finished and every result validated: the rest goes, whatever its size
    assert pick({"a1": row(33, covered=20, finished=True), "a2": row(3)}).take == ("a1", "a2")
    # finished but 2 results not validated yet: it waits (a running dataset's rule)
    assert pick({"a1": row(33, covered=20, finished=True, unvalidated=2)}).take == ()
    done = pick({"a1": row(33, covered=33, finished=True), "a2": row(3)})
    assert done.take == () and done.complete == ("a1",)
    # generation ended: every dataset is at its end, finished or not
    assert pick({"a2": row(3)}, final=True).take == ("a2",)
    assert pick({"a2": row(3, covered=3)}, final=True).complete == ("a2",)
    left = pick({"a2": row(3, covered=3, unvalidated=2)}, final=True)
    assert left.complete == () and left.leave == {
        "a2": "2 result(s) not validated when generation ended (a rerun extracts them)"}


def test_a_dataset_past_the_failure_rate_or_skipped_is_left_out() -> None:
    bad = pick({"a1": row(40, invalid=13), "a2": row(25)})
    assert bad.take == ("a2",) and "13 of 53 records (25% > max_failure_rate 20%)" in bad.leave["a1"]
    assert pick({"a1": row(48, invalid=12)}).leave == {}  # 20%: not past it
    skipped = pick({"a1": row(40), "a2": row(25)}, skipped=("a1",))
    assert skipped.take == ("a2",) and skipped.leave == {"a1": "skipped in the extraction (control file)"}


def test_lines() -> None:
    assert increment_line("a2", 200, 400, 1000) == "200 new records of a2 (400/1,000 extracted)"
    assert increment_line("a1", 1, 1, 1) == "1 new record of a1 (1/1 extracted)"
    assert waiting_text({"a1": 12, "a2": 0}, 200) == "a1 12/200, a2 0/200 new records"


def test_between_increments_the_view_says_what_is_waiting(tmp_path: Path) -> None:
    from follow_jobs import follow_data

    from engine.config import parse_config

    cfg = parse_config(follow_data(tmp_path, tmp_path / "model"), tmp_path / "config.toml", check_files=False)
    chain = ExtractChain(cfg, say=lambda line: None)
    assert chain.follow is not None
    def snap() -> ExtractSnapshot:
        s = chain.snapshot()
        assert s is not None
        return s

    assert (snap().state, snap().reason) == ("not_started", "waiting for validated records")
    chain.follow.last = pick({"a1": row(12), "a2": row(3, covered=3)})
    assert snap().reason == "waiting for new validated records: a1 12/20, a2 0/20 new records"
    chain.paused = True
    assert snap().state == "paused" and snap().reason.startswith(
        "paused: no extraction starts until resumed; waiting for new validated records: a1 12/20")
    chain.paused = False
    chain.follow.complete = ["a1"]
    chain.request_quit("drain")
    chain.exit_code = 0
    assert chain.waiting_for() == ["a2", "a3"]
    assert chain.incomplete_line() == "extraction incomplete: a2, a3 not fully extracted yet (rerun to resume)"


# ------------------------------------------------------------------------------------------ real runs

def test_follow_extracts_increments_while_generation_buys(tmp_path: Path, tiny: Path) -> None:
    """a3 is held (``datagen ctl pause``) until the first extraction ended, so that generation still
    buys after it however slow the shared machine extracts."""
    cfg = follow_config(tmp_path, tiny, prompts=N, latency_ms=150)
    out = io.StringIO()
    chains: list[ExtractChain] = []
    run_dir = tmp_path / "run"

    async def main() -> int:
        task = asyncio.create_task(run_headless_chained(cfg, out, install_signals=False, on_chain=chains.append))
        deadline = time.monotonic() + 120
        while not stored(run_dir, "a3"):  # a3 is being bought
            assert time.monotonic() < deadline and not task.done(), out.getvalue()[-3000:]
            await asyncio.sleep(0.05)
        held = await asyncio.to_thread(send, run_dir, "pause", "a3")
        assert held.ok, held.text
        while not chains[0].follow.finished_at:
            assert time.monotonic() < deadline and not task.done(), out.getvalue()[-3000:]
            await asyncio.sleep(0.05)
        resumed = await asyncio.to_thread(send, run_dir, "resume", "a3")
        assert resumed.ok, resumed.text
        return await task

    code = asyncio.run(main())
    text = out.getvalue()
    assert code == 0, text[-4000:]
    chain = chains[0]
    assert chain.follow is not None and chain.exit_code == 0
    conn = sqlite3.connect(tmp_path / "run" / "store.sqlite")
    (last_stored,) = conn.execute("SELECT MAX(created_at) FROM results").fetchone()
    conn.close()
    ends = chain.follow.finished_at
    assert len(chain.runs) >= 2 and len(ends) == len(chain.runs), text[-4000:]
    # an extraction ended while generation still bought
    assert ends[0] < last_stored, ([e - chain.starts[0][0] for e in ends], last_stored - chain.starts[0][0])
    assert chain.starts[0][0] < last_stored
    # the output: every validated record once, in a manifest that several extractions appended to
    validated = sorted(r.id for r in iter_token_records(cfg.run.dir))
    assert len(validated) == 3 * N  # all valid
    ids = manifest_ids(tmp_path / "run" / "extract")
    assert Counter(ids).most_common(1)[0][1] == 1 and sorted(ids) == validated
    ds = ExtractedDataset(tmp_path / "run" / "extract")
    assert len(ds) == 3 * N and len({e["shard"] for e in ds.entries}) >= len(chain.runs)
    for i in (0, len(ds) // 2, len(ds) - 1):  # early, middle and last increments' shards read back
        s = ds[i]
        assert s["aux_hidden_states"].shape[0] == s["input_ids"].shape[0] == s["loss_mask"].shape[0]
    # headless lines: what each increment extracted; the counts add up to each dataset's N
    for n in ("a1", "a2", "a3"):
        assert f"of {n} ({N}/{N} extracted)" in text, text[-4000:]
        news = [int(line.split(" new record")[0].rsplit(" ", 1)[-1]) for line in text.splitlines()
                if line.startswith("extract: ") and " new record" in line and f" of {n} (" in line
                and "extracting" not in line]
        assert sum(news) == N, (n, news)
    assert sorted(chain.follow.complete) == ["a1", "a2", "a3"]
    assert not list((tmp_path / "run" / "extract" / "status" / "follow-input").glob("*"))  # frozen inputs removed
    assert chain.waiting_for() == [] and chain.incomplete_line() is None
    assert chain.end_lines()[0].startswith(f'extraction (after_run = "follow"): exit code 0, {len(chain.runs)}')
