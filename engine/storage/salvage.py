"""``datagen salvage RUN_DIR``: copy what SQLite can still read of a damaged store into a new one.

The damaged file (and its ``-wal``, which is read through, so what it holds is saved too) is kept
under a new name, ``store.damaged-<UTC time>.sqlite``; the new store takes ``store.sqlite``'s place.

Each table of :data:`engine.storage.schema.SCHEMA` (and ``validations``) is copied row by row in
rowid order. When SQLite fails on a row (a damaged page, a broken overflow chain), the scan looks
for the first rowid after it that reads (galloping, then bisecting: :func:`_next_readable`) and goes
on from there, so one damaged page costs the rows on it, not the table. A row the new store's schema
refuses (NOT NULL, UNIQUE: garbage read from a damaged page) is counted as refused. How many rows
were lost is SQLite's own count where an intact index still gives one (``COUNT(*)``), else unknown.

Then the new store is made consistent, so the next ``datagen run`` picks up where it can:

- a result whose prompt row was lost is dropped (a result without its prompt's messages cannot be
  exported); the prompt comes back from the dataset file (below) and is bought again;
- a prompt marked ``done`` whose result was lost is ``pending`` again: the next run stores its
  completion from the stream workers' journals (``RUN_DIR/journal``) when one is still there, else
  buys it again; a prompt with a result is ``done``;
- validations of results that are gone are dropped (``datagen validate`` recomputes them);
- when prompts or datasets were lost, every dataset's ingest fingerprint is cleared, so the next run
  reads the files again and the lost prompts return as pending (prompts kept are matched by key).

What cannot come back: attempts, events and commands that were lost (spend recorded only in a lost
result or attempt no longer counts in ``status``, the report and the caps, so the dollar caps would
allow that money again: when a table holding spend lost rows, or their count is unknown, the report
says what the new store holds against what the damaged one held (its own ``SUM``, where SQLite can
still compute it, else unknown) and to lower the caps by the provider's figure; no spend figure is
carried over from elsewhere); nothing at all when the first page (the file's header and the schema) is damaged: SQLite then
reads no row, the store is left as it is and the command says to restore a backup.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from engine.storage.dollars import bills_sql
from engine.storage.health import check, problems, summary
from engine.storage.schema import SCHEMA, SCHEMA_VERSION, VALIDATIONS_DDL, StoreError, db_path

#: The tables copied, in this order (what later fixes read first).
TABLES = ("meta", "datasets", "prompts", "results", "attempts", "rejects", "events", "commands", "runtime",
          "validations")

#: The tables whose rows hold the run's spend (:func:`engine.storage.dollars.bills_sql`).
SPEND_TABLES = ("results", "attempts")

#: The largest rowid SQLite allows.
MAX_ROWID = 2**63 - 1


class NothingToSalvage(StoreError):
    """The store passes SQLite's check (or does not exist): nothing was changed."""


class Unsalvageable(StoreError):
    """SQLite reads nothing useful in the damaged store (no prompt row): it is left as it is."""


@dataclass
class TableCopy:
    """One table's copy: ``saved`` rows written to the new store; ``refused`` rows read but refused by
    its schema; ``lost`` rows SQLite could not read (None: unknown, no intact index counts them);
    ``skipped``: the rowid ranges the scan stepped over; ``missing``: the table is in the schema but
    SQLite cannot read it; ``absent``: the damaged store never had it (``validations`` before any)."""

    table: str
    saved: int = 0
    refused: int = 0
    lost: int | None = 0
    skipped: list[tuple[int, int]] = field(default_factory=list)
    missing: bool = False
    absent: bool = False


@dataclass
class Salvage:
    """What :func:`salvage` did: per table (:class:`TableCopy`), the damage SQLite reported, the
    results dropped for want of their prompt, the prompts pending again, whether datasets are read
    again, the new store and where the damaged one was kept."""

    damage: str
    tables: list[TableCopy]
    orphans: int
    reopened: int
    reingest: bool
    store: Path
    kept_as: Path
    #: The run's spend the new store holds (USD, :func:`engine.storage.dollars.bills_sql` summed).
    spend_usd: float = 0.0
    #: The spend the damaged store held, summed by SQLite through what it can still read (an intact
    #: covering index, or every row); None: SQLite could not sum it (USD).
    spend_before_usd: float | None = None

    def spend_lost(self) -> bool:
        """Whether a table holding spend (:data:`SPEND_TABLES`) lost rows or cannot say how many."""
        return any(t.table in SPEND_TABLES and not t.absent and (t.missing or t.lost is None or t.lost > 0)
                   for t in self.tables)

    def spend_line(self) -> str | None:
        """The line saying what spend the salvage lost and what to do (None when no spend row was lost):
        the dollar caps count only what the store holds, so money already paid would be allowed again."""
        if not self.spend_lost():
            return None
        now = f"${self.spend_usd:.4f}"
        if self.spend_before_usd is None:
            return (f"spend: the salvaged store holds {now} of bills; what the damaged one held is unknown (SQLite "
                    f"cannot sum its bills), and rows holding spend were lost: status, the report and the dollar "
                    f"caps count only {now}, so money already paid would be allowed again: before the next "
                    f"`datagen run`, lower [spend] max_cost_usd and the datasets' caps by what the provider's "
                    f"dashboard says this key spent" + (f", less {now}" if self.spend_usd else ""))
        gone = self.spend_before_usd - self.spend_usd
        if gone < 0.00005:
            return (f"spend: the salvaged store holds {now} of bills, all the damaged one held ({now}): the rows "
                    f"lost carried no bill")
        return (f"spend: the salvaged store holds {now} of bills, the damaged one held ${self.spend_before_usd:.4f}: "
                f"${gone:.4f} already paid no longer counts in status, the report and the dollar caps; before the "
                f"next `datagen run`, lower [spend] max_cost_usd and the datasets' caps by ${gone:.4f} (check the "
                f"provider's dashboard: rows SQLite could not read may hold more)")

    def lines(self) -> list[str]:
        """The report ``datagen salvage`` prints (one line per table, then what it means)."""
        out = [f"{self.store} was damaged ({self.damage}); what SQLite could read is in a new store there:"]
        for t in self.tables:
            if t.absent:
                continue
            if t.missing:
                out.append(f"  {t.table:<12} not readable (all its rows lost)")
                continue
            lost = "lost: unknown" if t.lost is None else f"{t.lost:,} lost"
            extra = f", {t.refused:,} refused (unreadable values)" if t.refused else ""
            out.append(f"  {t.table:<12} {t.saved:>9,} saved, {lost}{extra}")
        if self.orphans:
            out.append(f"{self.orphans:,} result(s) whose prompt row was lost were dropped: the prompt is read again "
                       f"from its dataset file and bought again")
        if self.reopened:
            out.append(f"{self.reopened:,} prompt(s) whose result was lost are pending again: the next `datagen run` "
                       f"stores those still in {self.store.parent / 'journal'} and buys the rest again")
        if self.reingest:
            out.append("prompts or datasets were lost: the next `datagen run` reads every dataset file again, and the "
                       "lost prompts return as pending")
        att = next((t for t in self.tables if t.table == "attempts"), None)
        if att is not None and (att.missing or att.lost is None or att.lost):
            out.append("attempts were lost: the spend they recorded no longer counts in status, the report and the caps")
        spend = self.spend_line()
        if spend is not None:
            out.append(spend)
        out.append(f"the damaged store is kept as {self.kept_as}")
        return out


def _connect_src(path: Path) -> sqlite3.Connection:
    """The damaged store, read-only; ``writable_schema`` makes SQLite load what it can of a damaged
    schema instead of refusing every statement (nothing is written: the connection is read-only)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    conn.execute("PRAGMA writable_schema=ON")
    return conn


def _scan(src: sqlite3.Connection, table: str, cols: list[str], copy: TableCopy) -> Iterator[tuple]:
    """Every readable row of ``table`` (``cols``), in rowid order, stepping over unreadable ones
    (recorded in ``copy.skipped``). After an error the next row is read alone: Python's cursor reads
    one row ahead, so the row before a damaged one is not lost with it."""
    sel = f"SELECT rowid, {', '.join(cols)} FROM {table} WHERE rowid >= ? ORDER BY rowid"
    one = sel + " LIMIT 1"
    start = -MAX_ROWID - 1
    while True:
        try:
            for row in src.execute(sel, (start,)):
                yield row[1:]
                if row[0] >= MAX_ROWID:
                    return
                start = row[0] + 1
            return
        except sqlite3.DatabaseError:
            pass
        try:
            rows = src.execute(one, (start,)).fetchall()
        except sqlite3.DatabaseError:
            nxt = _next_readable(src, one, start)
            copy.skipped.append((start, MAX_ROWID if nxt is None else nxt - 1))
            if nxt is None:
                return
            start = nxt
            continue
        if not rows:
            return
        yield rows[0][1:]
        if rows[0][0] >= MAX_ROWID:
            return
        start = rows[0][0] + 1


def _next_readable(src: sqlite3.Connection, probe_sql: str, bad: int) -> int | None:
    """The smallest rowid ``x > bad`` from which ``probe_sql`` (``WHERE rowid >= ? ... LIMIT 1``)
    reads without error (None: none does): gallop, then bisect. Rowids on one damaged page fail
    together, so this skips about that page's range."""

    def reads(x: int) -> bool:
        try:
            src.execute(probe_sql, (x,)).fetchall()
            return True
        except sqlite3.DatabaseError:
            return False

    lo, step = bad, 1  # reads(lo) is False
    while True:
        hi = min(lo + step, MAX_ROWID)
        if reads(hi):
            break
        if hi == MAX_ROWID:
            return None
        lo, step = hi, step * 2
    while hi - lo > 1:  # reads(hi), not reads(lo)
        mid = (lo + hi) // 2
        if reads(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _count(src: sqlite3.Connection, table: str) -> int | None:
    """The table's row count as SQLite gives it (through any intact index), or None."""
    tries = [f"SELECT COUNT(*) FROM {table}"]
    with contextlib.suppress(sqlite3.DatabaseError):
        tries += [f"SELECT COUNT(*) FROM {table} INDEXED BY {r[1]}" for r in src.execute(f"PRAGMA index_list({table})")]
    for sql in tries:
        try:
            return int(src.execute(sql).fetchone()[0])
        except sqlite3.DatabaseError:
            continue
    return None


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]


def _copy_table(src: sqlite3.Connection, dst: sqlite3.Connection, table: str, names: set[str]) -> TableCopy:
    copy = TableCopy(table)
    if table not in names:
        copy.absent = True
        return copy
    try:
        have = _columns(src, table)
    except sqlite3.DatabaseError:
        have = []
    if not have:
        copy.missing, copy.lost = True, None
        return copy
    cols = [c for c in _columns(dst, table) if c in have]
    ins = f"INSERT INTO {table}({', '.join(cols)}) VALUES({', '.join('?' * len(cols))})"
    read = 0
    for row in _scan(src, table, cols, copy):
        read += 1
        try:
            dst.execute(ins, row)
            copy.saved += 1
        except sqlite3.DatabaseError:  # NOT NULL, UNIQUE, a type SQLite cannot bind: garbage from a damaged page
            copy.refused += 1
    expected = _count(src, table) if copy.skipped else read
    copy.lost = None if expected is None else max(0, expected - read)
    return copy


def _make_consistent(dst: sqlite3.Connection, tables: dict[str, TableCopy]) -> tuple[int, int, bool]:
    """The fixes of the module docstring; returns (results dropped, prompts pending again, datasets read again)."""
    orphans = dst.execute("DELETE FROM results WHERE NOT EXISTS (SELECT 1 FROM prompts p WHERE p.id=results.prompt_id "
                          "AND p.dataset=results.dataset AND p.key=results.key)").rowcount
    reopened = dst.execute("UPDATE prompts SET state='pending' WHERE state='done' "
                           "AND id NOT IN (SELECT prompt_id FROM results)").rowcount
    dst.execute("UPDATE prompts SET state='done', error_class=NULL, error=NULL WHERE state!='done' "
                "AND id IN (SELECT prompt_id FROM results)")
    if tables["validations"].saved:
        dst.execute("DELETE FROM validations WHERE prompt_id NOT IN (SELECT prompt_id FROM results)")
    reingest = any(tables[t].missing or tables[t].lost is None or tables[t].lost or tables[t].refused
                   for t in ("prompts", "datasets"))
    if reingest:
        dst.execute("UPDATE datasets SET fingerprint=NULL")
    dst.execute("INSERT OR IGNORE INTO meta VALUES('schema_version', ?)", (str(SCHEMA_VERSION),))
    return orphans, reopened, reingest


def _kept_name(path: Path, now: float) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    return path.with_name(f"{path.stem}.damaged-{stamp}{path.suffix}")


def _swap(path: Path, new: Path, kept: Path) -> None:
    """Keep the damaged ``path`` (and its ``-wal``) as ``kept``, then put ``new`` in its place. The
    damaged ``-wal`` and ``-shm`` leave ``path``'s name before the new file takes it (SQLite would
    apply a ``-wal`` left there to the new store)."""
    for suffix in ("", "-wal"):
        src = Path(f"{path}{suffix}")
        if src.exists():
            os.link(src, f"{kept}{suffix}")
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    os.replace(new, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def salvage(run_dir: Path, now: float | None = None) -> Salvage:
    """Copy what is readable of ``run_dir``'s damaged store into a new store in its place (see the
    module docstring); the caller holds the run directory's lock.

    Raises:
        NothingToSalvage: no store, or one that passes ``integrity_check`` (nothing changed).
        Unsalvageable: SQLite reads no row in it (nothing changed).
        OSError: the new store cannot be written beside it (nothing changed).
    """
    path = db_path(Path(run_dir))
    if not path.exists():
        raise NothingToSalvage(f"{run_dir}: no run store here (expected {path}): nothing to salvage")
    damage = _damage(path)
    new = path.with_name(f".{path.name}.salvage")
    new.unlink(missing_ok=True)
    fd = os.open(new, os.O_CREAT | os.O_WRONLY, 0o600)
    os.close(fd)
    src, dst = _connect_src(path), sqlite3.connect(new, isolation_level=None)
    try:
        dst.executescript(SCHEMA + VALIDATIONS_DDL)
        try:
            names = {r[0] for r in src.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.DatabaseError as e:  # the first page (the schema) is damaged
            raise Unsalvageable(_nothing(path, f"{damage}; its schema cannot be read: {e}")) from None
        dst.execute("BEGIN")
        tables = {t: _copy_table(src, dst, t, names) for t in TABLES}
        if not any(t.saved for t in tables.values()):
            dst.execute("ROLLBACK")
            raise Unsalvageable(_nothing(path, damage))
        orphans, reopened, reingest = _make_consistent(dst, tables)
        dst.execute("COMMIT")
        spend_after, spend_before = _spend(dst), _spend(src)
        left = problems(dst, thorough=True)
        if left:  # pragma: no cover - a store just written by SQLite itself
            raise StoreError(f"{new}: the new store fails SQLite's integrity_check ({summary(left)}); {path} is unchanged")
    except BaseException:
        src.close()
        dst.close()
        new.unlink(missing_ok=True)
        raise
    src.close()
    dst.close()
    kept = _kept_name(path, time.time() if now is None else now)
    _swap(path, new, kept)
    return Salvage(damage, list(tables.values()), orphans, reopened, reingest, path, kept,
                   spend_after or 0.0, spend_before)


def _spend(conn: sqlite3.Connection) -> float | None:
    """The run's spend in ``conn``'s store (USD: :func:`engine.storage.dollars.bills_sql` summed); None
    when SQLite cannot read it (a damaged page, a missing table)."""
    try:
        (usd,), = conn.execute(f"SELECT COALESCE(SUM(usd), 0) FROM ({bills_sql()})")
    except sqlite3.DatabaseError:
        return None
    return float(usd)


def _nothing(path: Path, damage: str) -> str:
    return (f"{path} is damaged ({damage}) and SQLite reads no row in it: nothing to salvage (it is left as it "
            f"is). Restore it from a backup; to start over instead, move it away and run again (every prompt is "
            f"bought again)")


def _damage(path: Path) -> str:
    """SQLite's words for what is wrong with ``path``.

    Raises:
        NothingToSalvage: it passes ``integrity_check``.
    """
    from engine.storage.health import DamagedStoreError

    try:
        check(path, thorough=True)
    except DamagedStoreError as e:
        return e.detail
    raise NothingToSalvage(f"{path} passes SQLite's integrity_check: nothing to salvage")


__all__ = ["NothingToSalvage", "Salvage", "TableCopy", "Unsalvageable", "salvage"]
