"""Whose journal file is whose: recovery at start and pruning never touch a running worker's files
(issue 34), and a worker whose open segment is unlinked anyway writes where it can be found.

Real parts: worker processes started by the pool, a real SQLite store, the files and ``/proc/PID/fd``.
"""

from __future__ import annotations

import os

from helpers import completion, make_config, seeded_store

from engine.stream import journal
from engine.stream.pool import StreamWorkerPool
from engine.stream.recover import prune, recover_cut_streams, recover_results


def _open_journal_targets(pid: int) -> list[str]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            t = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if "/journal/" in t:
            out.append(t)
    return out


def test_file_owner_reads_slot_and_pid_from_every_journal_name():
    assert journal.file_owner("w3-4242-0007.jsonl") == (3, 4242)
    assert journal.file_owner("/x/journal/inflight-w1-77.json") == (1, 77)
    assert journal.file_owner("inflight-w1-77.tmp") == (1, 77)
    assert [journal.file_owner(n) for n in ("w3-4242.jsonl", "stacks.txt", "inflight-w1-77.json.bak", "wx-1-0.jsonl")] == [
        None, None, None, None]


async def test_recovery_at_start_reads_and_deletes_only_earlier_processes_files(tmp_path):
    cfg = make_config(tmp_path)
    store = await seeded_store(cfg, {"a": 3})
    pool = StreamWorkerPool(2, ["http://127.0.0.1:9/v1"], "k", {"max_connections": 16}, run_dir=cfg.run.dir)
    try:
        jdir = journal.journal_dir(cfg.run.dir)
        states = await store.prompt_states([("a", f"a-{i:06d}") for i in range(3)])
        ids = {i: states[("a", f"a-{i:06d}")][0] for i in range(3)}
        # an earlier process's worker: one completion journaled, one stream open at its kill
        old = journal.JournalWriter(jdir, 0, 999_999)
        old.write([journal.record_line(1, (ids[0], "a", "a-000000"), 1.0, 2.0, completion("from before"))])
        old.close()
        journal.write_ledger(journal.ledger_path(jdir, 0, 999_999), [[ids[1], "a", "a-000001", 50, "gen-old", "P", 1.0]])
        await pool.start()  # as the run does: its workers first (each opens its segment), recovery after
        pids = [w.pid for w in pool.figures().workers]
        ours = [journal.segments(jdir, f"w{w.slot}-{w.pid}-") for w in pool.figures().workers]
        assert [len(s) for s in ours] == [1, 1] and all(pool.owns(s[0]) for s in ours)
        # this run's worker wrote a ledger too (as it does every second while streams are open)
        journal.write_ledger(journal.ledger_path(jdir, 1, pids[1]), [[ids[2], "a", "a-000002", 9, "gen-now", "P", 5.0]])
        price = lambda p, c: (p + c) * 1e-6  # noqa: E731
        rec = await recover_results(cfg.run.dir, store, price, live=pool.owns)
        cut, _streams = await recover_cut_streams(cfg.run.dir, store, price, live=pool.owns)
        assert (rec.stored, rec.segments, cut.lost_streams) == (1, 1, 1)  # the earlier process's, only
        left = sorted(p.name for p in jdir.iterdir())
        assert left == sorted([s[0].name for s in ours] + [f"inflight-w1-{pids[1]}.json"])
        for pid in pids:  # the workers' open segments still have their names
            targets = _open_journal_targets(pid)
            assert len(targets) == 1 and not targets[0].endswith(" (deleted)") and os.path.exists(targets[0])
        cur = await store.conn.execute("SELECT key FROM attempts JOIN prompts ON prompts.id = attempts.prompt_id "
                                       "WHERE outcome = 'aborted'")
        assert [k for (k,) in await cur.fetchall()] == ["a-000001"]  # the live worker's stream is not "cut"
        # pruning while they run: an empty open segment is "all committed" but still being written
        assert await prune(cfg.run.dir, store, keep=pool.is_open_segment) == 0
        assert all(s[0].exists() for s in ours)
    finally:
        await pool.aclose()
        await store.close()
    assert not any(pool.is_open_segment(s[0]) for s in ours)  # exited: nothing of them is open any more


def test_a_segment_unlinked_under_the_writer_is_written_again_where_it_can_be_found(tmp_path, caplog):
    w = journal.JournalWriter(tmp_path, 0, 4242)
    first = w.path
    w.write([journal.record_line(1, (1, "a", "a-000001"), 1.0, 2.0, completion("one"))])
    first.unlink()  # e.g. removed by hand while the run runs
    w.write([journal.record_line(2, (2, "a", "a-000002"), 1.0, 2.0, completion("two"))])
    w.close()
    assert w.unlinked == 1 and w.path.name == "w0-4242-0001.jsonl"
    assert [r["k"] for r in journal.read_records(w.path)] == ["a-000002"]
    assert "was deleted while this worker had it open" in caplog.text

