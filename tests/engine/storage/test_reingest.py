"""A dataset file edited between runs: the stored prompts whose row is gone are never bought.

Before: ``ingested 4 prompts (1 new)`` for a 3-row file whose row 2 was edited; the old prompt stayed
pending beside the new one and was sent (and exported) too."""

from __future__ import annotations

import json
import os

from helpers import make_config

from engine.run.ingest import ingest_all
from engine.storage.store import Store, failed_filter


def rows(*texts: str) -> str:
    return "".join(json.dumps({"messages": [{"role": "user", "content": t}]}) + "\n" for t in texts)


async def test_an_edited_row_replaces_its_pending_prompt_and_results_are_kept(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(rows("one", "two", "three", "four"))
    cfg = make_config(tmp_path, [{"name": "d", "path": str(data)}])
    store = await Store.open(cfg.run.dir)
    try:
        (rep,) = await ingest_all(cfg, store)
        assert (rep.prompts, rep.inserted, rep.stale_summary()) == (4, 4, None)
        ids = {json.loads(m)[0]["content"]: i for i, m in await (await store.conn.execute(
            "SELECT id, messages FROM prompts")).fetchall()}
        # "one" was answered, "three" had a billed attempt that failed transiently and is pending again
        await store.conn.execute("UPDATE prompts SET state='done' WHERE id=?", (ids["one"],))
        await store.conn.execute("UPDATE prompts SET attempts=1 WHERE id=?", (ids["three"],))
        await store.conn.commit()

        data.write_text(rows("one EDITED", "two EDITED", "three EDITED", "four"))
        os.utime(data, (1, 1))  # a different mtime: the file is read again
        (rep,) = await ingest_all(cfg, store)
        assert (rep.inserted, rep.stale_deleted, rep.stale_failed, rep.stale_kept) == (3, 1, 1, 1)
        assert rep.prompts == 6  # 4 rows now + the kept answered "one" + the failed "three"
        assert rep.stale_summary() == (
            "3 stored prompt(s) no longer in the file (row edited, deleted or now rejected): 1 pending removed "
            "(never sent), 1 pending with billed attempts marked failed (removed), 1 with stored results kept "
            "(still exported)")
        state = {json.loads(m)[0]["content"]: (st, ec) for m, st, ec in await (await store.conn.execute(
            "SELECT messages, state, error_class FROM prompts")).fetchall()}
        assert state == {"one": ("done", None), "three": ("failed", "removed"), "four": ("pending", None),
                         "one EDITED": ("pending", None), "two EDITED": ("pending", None),
                         "three EDITED": ("pending", None)}
        where, args = failed_filter("d", None)
        n = (await (await store.conn.execute(f"SELECT COUNT(*) FROM prompts WHERE {where}", args)).fetchone())[0]
        assert n == 0  # retry-failed never sends a removed row's old prompt again
    finally:
        await store.close()
