"""A prompt in several datasets is bought once, or in each on purpose (``[run] cross_dataset_duplicates``).

Real JSONL files through the real ingest (:func:`engine.run.ingest.ingest_all`) into a real SQLite store:
the copies a dataset shares with one earlier in the config are stored as ``dup`` (never pending, not in its
prompt count) with the id of the copy bought, and one line per pair says so; a second ingest of the same run
directory changes nothing; a dataset added later whose prompts were already bought gets none to buy; a copy
asked with another ``max_tokens`` is another request; ``buy_each`` keeps every copy pending; a changed setting,
an owner row that left its file or a skipped owner dataset hands the purchase over; an older store gains the
``dup_of`` column. (The plan on rows alone: tests/engine/datasets/test_overlap_plan.py.)
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from helpers import make_config

from engine.prompts import prompt_key
from engine.run.ingest import ingest_all
from engine.storage.store import Store

ONCE_B = ("ingest: 5 prompt(s) of 'b' also in 'a' (bought once, under 'a'; [run] cross_dataset_duplicates = "
          "\"buy_each\" buys each)")


def _write(path: Path, ids: range | list[int]) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"question {i}: say something about {i}"}) + "\n" for i in ids))
    return path


def _key(i: int) -> str:
    return prompt_key([{"role": "user", "content": f"question {i}: say something about {i}"}])


def _cfg(tmp_path: Path, sets: dict[str, range | list[int]], mode: str = "buy_once", **sections):
    ds = [{"name": n, "path": str(_write(tmp_path / f"{n}.jsonl", ids)), "format": "text"} for n, ids in sets.items()]
    run = {} if mode == "buy_once" else {"cross_dataset_duplicates": mode}  # buy_once: the default
    return make_config(tmp_path, ds, run=run, **sections)


async def _ingest(cfg):
    store = await Store.open(cfg.run.dir)
    try:
        return await ingest_all(cfg, store)
    finally:
        await store.close()


def _rows(cfg) -> dict[tuple[str, str], tuple[int, str, int | None]]:
    with sqlite3.connect(cfg.run.dir / "store.sqlite") as c:
        return {(d, k): (i, s, o) for i, d, k, s, o in c.execute("SELECT id, dataset, key, state, dup_of FROM prompts")}


def _states(cfg) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    with sqlite3.connect(cfg.run.dir / "store.sqlite") as c:
        for d, s, n in c.execute("SELECT dataset, state, COUNT(*) FROM prompts GROUP BY 1, 2"):
            out.setdefault(d, {})[s] = n
    return out


async def test_shared_prompts_are_stored_once_to_buy_and_the_pair_is_reported(tmp_path):
    cfg = _cfg(tmp_path, {"a": range(0, 10), "b": range(5, 15)})
    reps = await _ingest(cfg)
    assert [(r.dataset, r.prompts, r.duplicates) for r in reps] == [("a", 10, 0), ("b", 5, 5)]
    assert reps[0].overlap == [] and reps[1].overlap == [ONCE_B]
    assert _states(cfg) == {"a": {"pending": 10}, "b": {"pending": 5, "dup": 5}}
    rows = _rows(cfg)
    for i in range(5, 10):  # each duplicate names the copy that is bought
        assert rows[("b", _key(i))][1:] == ("dup", rows[("a", _key(i))][0])
    with sqlite3.connect(cfg.run.dir / "store.sqlite") as c:
        assert dict(c.execute("SELECT name, prompts FROM datasets")) == {"a": 10, "b": 5}

    # a second start of the same run directory: nothing re-read, nothing changed, the line said again
    again = await _ingest(cfg)
    assert [(r.dataset, r.skipped_unchanged, r.prompts, r.duplicates) for r in again] == [
        ("a", True, 10, 0), ("b", True, 5, 5)]
    assert again[1].overlap == [ONCE_B]
    assert _rows(cfg) == rows


async def test_a_dataset_added_later_does_not_buy_what_was_bought(tmp_path):
    cfg = _cfg(tmp_path, {"a": range(0, 6)})
    await _ingest(cfg)
    with sqlite3.connect(cfg.run.dir / "store.sqlite") as c:  # the first run bought 0..2, 3..5 still pending
        c.execute("UPDATE prompts SET state='done', attempts=1 WHERE key IN (?,?,?)", tuple(_key(i) for i in range(3)))
    # c comes first in the config now: the copies bought stay bought under 'a', and so do those still in line
    # there (the copy stored first is bought); only c's own prompts are c's to buy
    cfg2 = _cfg(tmp_path, {"c": [0, 1, 2, 3, 4, 100, 101], "a": range(0, 6)})
    reps = await _ingest(cfg2)
    st = _rows(cfg2)
    assert [st[("c", _key(i))][1:] for i in (0, 1, 2, 3, 4)] == [("dup", st[("a", _key(i))][0]) for i in range(5)]
    assert [st[("c", _key(i))][1] for i in (100, 101)] == ["pending"] * 2
    assert [st[("a", _key(i))][1] for i in range(6)] == ["done"] * 3 + ["pending"] * 3
    assert {r.dataset: (r.prompts, r.duplicates) for r in reps} == {"c": (2, 5), "a": (6, 0)}
    assert reps[0].overlap == [
        "ingest: 5 prompt(s) of 'c' also in 'a' (bought once, under 'a'; [run] cross_dataset_duplicates = "
        "\"buy_each\" buys each)"]


async def test_buy_each_keeps_every_copy_to_buy_and_switching_moves_them(tmp_path):
    cfg = _cfg(tmp_path, {"a": range(0, 10), "b": range(5, 15)}, mode="buy_each")
    reps = await _ingest(cfg)
    assert [(r.prompts, r.duplicates) for r in reps] == [(10, 0), (10, 0)]
    assert reps[1].overlap == ["ingest: 5 prompt(s) of 'b' also in 'a' (bought in each: [run] "
                               "cross_dataset_duplicates = \"buy_each\"; \"buy_once\" buys them once)"]
    assert _states(cfg) == {"a": {"pending": 10}, "b": {"pending": 10}}
    # the same run directory under buy_once: b's copies never sent become duplicates
    once = _cfg(tmp_path, {"a": range(0, 10), "b": range(5, 15)})
    assert [r.prompts for r in await _ingest(once)] == [10, 5]
    assert _states(once) == {"a": {"pending": 10}, "b": {"pending": 5, "dup": 5}}
    # and back: they are pending again
    await _ingest(cfg)
    assert _states(cfg) == {"a": {"pending": 10}, "b": {"pending": 10}}


async def test_copies_bought_in_both_are_kept_and_reported(tmp_path):
    cfg = _cfg(tmp_path, {"a": range(0, 4), "b": range(0, 4)}, mode="buy_each")
    await _ingest(cfg)
    with sqlite3.connect(cfg.run.dir / "store.sqlite") as c:
        c.execute("UPDATE prompts SET state='done', attempts=1 WHERE key IN (?,?)", (_key(0), _key(1)))
    reps = await _ingest(_cfg(tmp_path, {"a": range(0, 4), "b": range(0, 4)}))
    assert _states(cfg) == {"a": {"done": 2, "pending": 2}, "b": {"done": 2, "dup": 2}}
    assert reps[1].overlap == [
        ONCE_B.replace("5 prompt(s)", "2 prompt(s)"),
        "ingest: 2 prompt(s) of 'b' also in 'a' were already bought in both (stored before [run] "
        "cross_dataset_duplicates = \"buy_once\", or under \"buy_each\"): both kept, both exported"]


async def test_another_max_tokens_is_another_request(tmp_path):
    classes = {"short": {"max_tokens": 1000, "concurrency": 4},
               "long": {"max_tokens": 2000, "concurrency": 2, "min_prompt_tokens": 1000, "datasets": ["b"]}}
    cfg = _cfg(tmp_path, {"a": range(0, 10), "b": range(5, 15)}, classes=classes)
    reps = await _ingest(cfg)
    assert [(r.prompts, r.duplicates, r.overlap) for r in reps] == [(10, 0, []), (10, 0, [])]
    # the same max_tokens under another class name is the same request
    same = {**classes, "long": {**classes["long"], "max_tokens": 1000}}
    reps = await _ingest(_cfg(tmp_path, {"a": range(0, 10), "b": range(5, 15)}, classes=same))
    assert [(r.prompts, r.duplicates, r.overlap) for r in reps] == [(10, 0, []), (5, 5, [ONCE_B])]


async def test_the_copy_to_buy_leaving_its_file_hands_it_over(tmp_path):
    cfg = _cfg(tmp_path, {"a": range(0, 10), "b": range(5, 15)})
    await _ingest(cfg)
    cfg2 = _cfg(tmp_path, {"a": range(0, 5), "b": range(5, 15)})  # a's rows 5..9 deleted (never sent)
    reps = await _ingest(cfg2)
    assert [(r.prompts, r.duplicates, r.overlap, r.stale_deleted) for r in reps] == [(5, 0, [], 5), (10, 0, [], 0)]
    assert _states(cfg2) == {"a": {"pending": 5}, "b": {"pending": 10}}
    # and b's duplicates leaving b's file are simply deleted
    cfg3 = _cfg(tmp_path, {"a": range(0, 10), "b": range(5, 15)})
    await _ingest(cfg3)
    assert _states(cfg3) == {"a": {"pending": 5, "dup": 5}, "b": {"pending": 10}}  # b's copies are in line now
    reps = await _ingest(_cfg(tmp_path, {"a": range(0, 5), "b": range(5, 15)}))
    assert [(r.prompts, r.stale_deleted, r.stale_kept) for r in reps] == [(5, 5, 0), (10, 0, 0)]


async def test_a_skipped_dataset_hands_its_copies_over(tmp_path):
    cfg = _cfg(tmp_path, {"a": range(0, 10), "b": range(5, 15)})
    await _ingest(cfg)
    store = await Store.open(cfg.run.dir)
    await store.set_dataset_state("a", "skipped", "by hand", 0.0)
    await store.close()
    reps = await _ingest(cfg)
    assert _states(cfg) == {"a": {"pending": 5, "dup": 5}, "b": {"pending": 10}}
    assert reps[0].overlap == [ONCE_B.replace("of 'b' also in 'a'", "of 'a' also in 'b'").replace("under 'a'", "under 'b'")]


async def test_an_older_store_gains_the_column(tmp_path):
    cfg = _cfg(tmp_path, {"a": range(0, 3), "b": range(0, 3)})
    store = await Store.open(cfg.run.dir)
    await store.close()
    with sqlite3.connect(cfg.run.dir / "store.sqlite") as c:
        c.execute("ALTER TABLE prompts DROP COLUMN dup_of")
    assert [r.duplicates for r in await _ingest(cfg)] == [0, 3]
    assert _states(cfg) == {"a": {"pending": 3}, "b": {"dup": 3}}
