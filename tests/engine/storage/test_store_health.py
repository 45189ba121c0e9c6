"""The store's health (issue 34): a commit that finds the file damaged is never retried, and a lost
``-wal`` loses no result bought (journal segments are deleted only once their results are checkpointed
into the database file itself).

Before: the writer retried a damaged store at every commit; ``prune`` deleted a segment as soon as its
results were committed into the WAL, so a ``-wal`` deleted after a kill lost 93-103 results that were
then bought again without a word.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import sqlite3
import time

from casesrv import CaseServer, case_config, ok_reply, prompts, run_case, states
from helpers import completion, make_config, seeded_store

from engine.storage.health import DamagedStoreError, is_damage
from engine.storage.store import Store
from engine.storage.writer import StoreWriter
from engine.stream import journal
from engine.stream.recover import prune


async def test_a_damaged_store_is_reported_once_and_never_retried(tmp_path):
    cfg = make_config(tmp_path)
    store = await seeded_store(cfg, {"a": 300})
    errors: list[BaseException] = []
    writer = StoreWriter(store, interval_s=0.05, on_error=errors.append)
    for i in range(1, 50):
        writer.add_result(i, "a", f"a-{i - 1:06d}", completion(), 1)
    await writer.flush()
    await store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = store.path.stat().st_size
    with open(store.path, "r+b") as f:  # the second half of the file: the prompts still pending
        f.seek(size // 2)
        f.write(random.Random(0).randbytes(size - size // 2))
    with sqlite3.connect(store.path, isolation_level=None) as other:  # a commit beside ours: our page cache goes
        other.execute("INSERT INTO meta VALUES('poke', '1')")
    other.close()
    for i in range(50, 300):
        writer.add_result(i, "a", f"a-{i - 1:06d}", completion(), 1)
    stop = asyncio.Event()
    task = asyncio.create_task(writer.run(stop))
    await asyncio.wait_for(task, 5)  # it ends by itself: nothing more is tried
    assert len(errors) == 1 and is_damage(errors[0]) and writer.damaged is errors[0]
    assert (writer.commits, writer.queued) == (1, 250)  # the first batch only; the rest kept in memory
    try:
        await writer.flush()
        raise AssertionError("a flush after damage must refuse")
    except DamagedStoreError as e:
        assert str(e).startswith(f"{store.path} is damaged (database disk image is malformed)")
    await store.close()  # closes a damaged store without raising


async def test_a_lost_wal_after_a_prune_loses_no_result(tmp_path):
    with CaseServer(ok_reply) as srv:  # 20 prompts, ingested with their real keys, then reset to pending
        r = run_case(case_config(tmp_path, srv.base_url, prompts(20)))
        assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "run"
    store = await Store.open(run_dir)
    await store.conn.execute("UPDATE prompts SET state='pending'")
    await store.conn.execute("DELETE FROM results")
    await store.conn.execute("DELETE FROM attempts")
    await store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    await store.conn.execute("PRAGMA wal_autocheckpoint=0")  # what is committed now stays in the -wal
    rows = await (await store.conn.execute("SELECT id, dataset, key FROM prompts ORDER BY id LIMIT 15")).fetchall()
    jw = journal.JournalWriter(journal.journal_dir(run_dir), 0, 4_000_000)  # a worker of a process now gone
    writer = StoreWriter(store)
    now = time.time()
    for pid, ds, key in rows:  # 15 completions journaled, then committed, as a stream worker and the run do
        jw.write([journal.record_line(pid, (pid, ds, key), now, now, completion())])
        writer.add_result(pid, ds, key, completion(), 1, now=now)
    jw.close()
    await writer.flush()
    removed = await prune(run_dir, store)  # the run's periodic prune: all 15 are committed
    assert removed == 1
    # the run is killed now, and its -wal deleted: only the database file is left, with the journals
    lost = tmp_path / "lost"
    (lost / "run").mkdir(parents=True)
    shutil.copy(run_dir / "store.sqlite", lost / "run" / "store.sqlite")
    shutil.copytree(run_dir / "journal", lost / "run" / "journal")
    await store.close()

    with CaseServer(ok_reply) as srv:
        r = run_case(case_config(lost, srv.base_url, prompts(20)))
        assert r.returncode == 0, r.stderr
        assert len(srv.requests) == 5  # the 5 never bought; before: 20
    assert states(lost / "run") == {"done": 20}
