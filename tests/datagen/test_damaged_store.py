"""A damaged store is refused with one line, never bought into; ``datagen salvage`` copies what is readable
(issue 34), through the real command line against a scripted server that counts requests.

Before: a store truncated to half was refused by ``run`` with ``not a usable store: database disk image is
malformed`` (no way out) while ``status`` said ``the store is not initialised yet ... run it again``; random
bytes in the middle gave tracebacks (``status``: 17 lines), and in one trial ``run`` bought all 447 pending
prompts into the damaged file; a damaged file found while running was retried at every commit.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import sqlite3
import threading
from pathlib import Path

import pytest
from casesrv import CaseServer, case_config, cli, ok_reply, prompts, run_case, states

ADVICE = "datagen salvage"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A run of 40 prompts, completed and closed (every result in the database file)."""
    tmp = tmp_path_factory.mktemp("finished")
    with CaseServer(ok_reply) as srv:
        r = run_case(case_config(tmp, srv.base_url, prompts(40), concurrency=8))
        assert r.returncode == 0, r.stderr
    return tmp


def copy_of(finished: Path, tmp: Path) -> Path:
    tmp.mkdir(exist_ok=True)
    shutil.copytree(finished / "run", tmp / "run")
    return tmp / "run"


def damage(db: Path, how: str) -> None:
    """Truncate ``db`` to half, or write 8 KiB of (seeded) random bytes at its header page, middle or end."""
    size = db.stat().st_size
    if how == "truncated":
        os.truncate(db, size // 2)
        return
    off = {"header": 0, "middle": size // 2 // 4096 * 4096, "end": size - 8192}[how]
    with open(db, "r+b") as f:
        f.seek(off)
        f.write(random.Random(how).randbytes(8192))


def truncate_before(db: Path, table: str) -> None:
    """Truncate ``db`` just before ``table``'s root page: none of its rows can be read, nor counted (where
    half the file ends depends on every table's layout, which new tables and columns move)."""
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        # the whole schema on page 1 (64 KiB pages), so the cut leaves it readable: with 4 KiB pages the schema
        # spills into a page that may lie after the table's root, and nothing at all could be read
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.execute("PRAGMA page_size=65536")
        conn.execute("VACUUM")
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name=?", (table,)).fetchone()
        (page,) = conn.execute("PRAGMA page_size").fetchone()
    finally:
        conn.close()
    os.truncate(db, (root - 1) * page)


def one_line_refusal(r, db: Path, code: int) -> str:
    out = (r.stdout + r.stderr).strip()
    assert r.returncode == code, out
    assert "Traceback" not in out
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"error: {db} is damaged (") and f"`{ADVICE} {db.parent}`" in line, line
    assert "restore it from a backup" in line.lower()
    return line


@pytest.mark.parametrize("how", ["truncated", "header", "middle", "end"])
def test_every_command_refuses_a_damaged_store_with_one_line_and_nothing_is_bought(finished, tmp_path, how):
    run_dir = copy_of(finished, tmp_path)
    db = run_dir / "store.sqlite"
    damage(db, how)
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    one_line_refusal(cli("status", str(run_dir)), db, 1)
    one_line_refusal(cli("status", str(run_dir), "--json"), db, 1)
    one_line_refusal(cli("ctl", str(run_dir), "pause", "d"), db, 1)
    one_line_refusal(cli("validate", str(run_dir)), db, 2)
    one_line_refusal(cli("export", str(run_dir), "--out", str(tmp_path / "out")), db, 2)
    with CaseServer(ok_reply) as srv:  # 60 prompts in the file now: 20 new, pending
        r = run_case(case_config(tmp_path, srv.base_url, prompts(60)))
        one_line_refusal(r, db, 1)
        assert srv.requests == []
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest  # nothing written into it


def test_status_tells_a_missing_store_a_store_being_created_and_a_damaged_one_apart(finished, tmp_path):
    r = cli("status", str(tmp_path / "never"))
    assert (r.returncode, r.stderr.strip()) == (1, f"error: {tmp_path / 'never'}: no run store here (expected "
                                                   f"{tmp_path / 'never' / 'store.sqlite'})")
    (tmp_path / "starting").mkdir()
    (tmp_path / "starting" / "store.sqlite").touch()  # a run killed while creating it
    r = cli("status", str(tmp_path / "starting"))
    assert r.returncode == 1 and "the store is not initialised yet" in r.stderr and "damaged" not in r.stderr
    run_dir = copy_of(finished, tmp_path)
    damage(run_dir / "store.sqlite", "truncated")
    line = one_line_refusal(cli("status", str(run_dir)), run_dir / "store.sqlite", 1)
    assert "not initialised" not in line


def test_salvage_copies_what_is_readable_and_the_next_run_buys_only_what_was_lost(tmp_path):
    with CaseServer(ok_reply) as srv:
        r = run_case(case_config(tmp_path, srv.base_url, prompts(300), concurrency=16))
        assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "run"
    db = run_dir / "store.sqlite"
    with sqlite3.connect(db) as c:  # the second leaf page of the results table, and how many rows it holds
        pages = c.execute("SELECT pageno, ncell FROM dbstat WHERE name='results' AND pagetype='leaf' "
                          "ORDER BY pageno").fetchall()
        page_size = c.execute("PRAGMA page_size").fetchone()[0]
    c.close()
    pageno, ncell = pages[1]
    assert len(pages) >= 3 and ncell > 5
    with open(db, "r+b") as f:
        f.seek((pageno - 1) * page_size)
        f.write(bytes(page_size))
    one_line_refusal(cli("status", str(run_dir)), db, 1)

    r = cli("salvage", str(run_dir))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert re.search(r"^  prompts\s+300 saved, 0 lost$", out, re.M), out
    assert re.search(rf"^  results\s+{300 - ncell} saved, {ncell} lost$", out, re.M), out
    assert f"{ncell} prompt(s) whose result was lost are pending again" in out
    assert (f"spend: the salvaged store holds ${(300 - ncell) * 0.0001:.4f} of bills, the damaged one held $0.0300: "
            f"${ncell * 0.0001:.4f} already paid no longer counts") in out
    kept = re.search(r"the damaged store is kept as (\S+)", out).group(1)
    assert Path(kept).exists() and Path(kept).name.startswith("store.damaged-")
    assert states(run_dir) == {"done": 300 - ncell, "pending": ncell}
    with sqlite3.connect(db) as c:
        assert c.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    c.close()
    assert cli("status", str(run_dir)).returncode == 0
    assert cli("salvage", str(run_dir)).returncode == 1  # healthy now: nothing to salvage

    with CaseServer(ok_reply) as srv:  # the journals were pruned at the end: the lost ones are bought again
        r = run_case(case_config(tmp_path, srv.base_url, prompts(300), concurrency=16))
        assert r.returncode == 0, r.stderr
        assert len(srv.requests) == ncell
    assert states(run_dir) == {"done": 300}


def test_salvage_that_loses_spend_says_what_the_caps_no_longer_count(finished, tmp_path):
    # 40 results of $0.0001 each; before, salvage said nothing of it and the run's spend fell to $0
    # (in a trial: $24.87 -> $0.12), so the dollar caps allowed money already paid again
    run_dir = copy_of(finished, tmp_path / "end")
    damage(run_dir / "store.sqlite", "end")  # the results' rows; their covering index still sums them
    r = cli("salvage", str(run_dir))
    assert r.returncode == 0, r.stderr
    m = re.search(r"^  results\s+(\d+) saved, (\d+) lost$", r.stdout, re.M)  # how many: where the rows lay
    assert m and int(m[1]) + int(m[2]) == 40 and int(m[2]) > 0, r.stdout
    kept, lost = int(m[1]) * 0.0001, int(m[2]) * 0.0001
    assert (f"spend: the salvaged store holds ${kept:.4f} of bills, the damaged one held $0.0040: ${lost:.4f} already "
            "paid no longer counts in status, the report and the dollar caps; before the next `datagen run`, lower "
            f"[spend] max_cost_usd and the datasets' caps by ${lost:.4f} (check the provider's dashboard: rows SQLite "
            "could not read may hold more)") in r.stdout.splitlines()

    run_dir = copy_of(finished, tmp_path / "truncated")
    truncate_before(run_dir / "store.sqlite", "results")  # as in the trial: results, attempts 0 saved, nothing sums
    r = cli("salvage", str(run_dir))
    assert r.returncode == 0, r.stderr
    assert re.search(r"^  attempts\s+0 saved, lost: unknown$", r.stdout, re.M), r.stdout
    assert ("spend: the salvaged store holds $0.0000 of bills; what the damaged one held is unknown (SQLite cannot "
            "sum its bills), and rows holding spend were lost: status, the report and the dollar caps count only "
            "$0.0000, so money already paid would be allowed again: before the next `datagen run`, lower [spend] "
            "max_cost_usd and the datasets' caps by what the provider's dashboard says this key spent"
            ) in r.stdout.splitlines()
    assert "attempts were lost" in r.stdout  # before: not said when their count was unknown


def test_salvage_leaves_a_store_it_cannot_read_at_all_as_it_is(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    db = run_dir / "store.sqlite"
    with open(db, "r+b") as f:
        f.write(bytes(16))  # the header's magic string
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    r = cli("salvage", str(run_dir))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "SQLite reads no row in it: nothing to salvage" in r.stderr and "Restore it from a backup" in r.stderr
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in run_dir.glob("store*")) == ["store.sqlite"]


def test_a_store_damaged_while_running_stops_the_run_and_salvage_buys_nothing_twice(tmp_path):
    """The store is damaged after the 60th request: the run stops (exit 1, one line), the streams in flight
    finish into the journals; after `datagen salvage`, the next run stores them from there and buys only
    the prompts never bought."""
    db = tmp_path / "run" / "store.sqlite"
    hit = threading.Event()

    def respond(req, n):
        if "number 60." in req["messages"][-1]["content"] and not hit.is_set():
            hit.set()
            with sqlite3.connect(db, isolation_level=None) as c:  # everything into the database file
                c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            c.close()
            with sqlite3.connect(db) as c:  # the prompts table's leaf pages but its first (ids 1 to ~13)
                leaves = [p for (p,) in c.execute("SELECT pageno FROM dbstat WHERE name='prompts' AND "
                                                  "pagetype='leaf' ORDER BY pageno")][1:]
            c.close()
            with open(db, "r+b") as f:
                for p in leaves:
                    f.seek((p - 1) * 4096)
                    f.write(random.Random(p).randbytes(4096))
            with sqlite3.connect(db, isolation_level=None) as c:  # a commit beside the engine's: its cache goes
                c.execute("INSERT INTO meta VALUES('poke', '1')")
            c.close()
        return ok_reply()

    with CaseServer(respond) as srv:
        r = run_case(case_config(tmp_path, srv.base_url, prompts(200), concurrency=4))
        bought = {m["messages"][-1]["content"] for m in srv.requests}
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert re.search(rf"^run stopped: {re.escape(str(db))} is damaged \(.*`{ADVICE} {re.escape(str(db.parent))}`",
                     r.stdout, re.M), r.stdout
    assert 60 <= len(bought) < 200

    r = cli("salvage", str(db.parent))
    assert r.returncode == 0, r.stderr
    with CaseServer(ok_reply) as srv:
        r = run_case(case_config(tmp_path, srv.base_url, prompts(200), concurrency=16))
        assert r.returncode == 0, r.stderr
        again = [m["messages"][-1]["content"] for m in srv.requests]
    assert not set(again) & bought  # nothing bought twice: the journals held every completion bought
    assert len(again) == 200 - len(bought)
    assert states(db.parent) == {"done": 200}
