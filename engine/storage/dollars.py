"""A run's dollars from its store: what each dataset (provider, time window) was billed, one definition.

What counts is what :class:`engine.money.spend.SpendControl` counts in memory as the bills arrive
(its ``dataset_usd``: :meth:`~engine.money.spend.SpendControl.settle` adds a result's cost,
:meth:`~engine.money.spend.SpendControl.release` and :meth:`~engine.money.spend.SpendControl.add_partial`
a failed or aborted attempt's, :meth:`~engine.money.spend.SpendControl.correct` a ``/generation``
true-up; its ``lost_usd`` is the part that produced no result), so a restart seeded from here
(:meth:`engine.storage.store.Store.dataset_dollars`) and ``datagen status`` read from here say what the
engine said:

- every stored result's ``cost_usd``, NULL counted as 0 (a result whose bill is unknown);
- every attempt that produced no result (``outcome != 'ok'``: failed and aborted) whose bill is known
  (``cost_usd`` not NULL; a true-up sets it after the fact). An attempt that produced a result is not
  counted again: its bill is the result's.

:func:`bills_sql` is that definition, one row per bill; every figure here sums it: per dataset
(:func:`dataset_dollars`, ``datagen status``'s ``cost_usd`` / ``lost_cost_usd`` and the restart's
seed), per provider (:func:`provider_dollars`), over a time window (:func:`spend_window`, the spend
rate) and over time (:func:`bills`, the report's timeline). USD throughout.
"""

from __future__ import annotations

from typing import NamedTuple

from engine.storage.handle import Handle


def bills_sql(key: str = "dataset", timed: bool = False) -> str:
    """Every bill of the run (see the module docstring), one row each: ``key`` (a column both
    ``results`` and ``attempts`` have: ``dataset`` or ``provider``), ``at`` (wall clock, s: a result's
    ``created_at``, an attempt's ``ended_at``; 0 unless ``timed``: without it SQLite reads the
    results' costs from their covering index), ``usd`` and ``result`` (1 for a result's bill, 0 for a
    lost one)."""
    r_at, a_at = ("created_at", "ended_at") if timed else ("0", "0")
    return (f"SELECT {key} AS key, {r_at} AS at, COALESCE(cost_usd, 0) AS usd, 1 AS result FROM results "
            f"UNION ALL SELECT {key}, {a_at}, cost_usd, 0 FROM attempts WHERE outcome != 'ok' AND cost_usd IS NOT NULL")


#: ``(dataset, results' USD, lost USD)`` per dataset with a bill: the query of :func:`dataset_dollars`
#: and of the engine's :meth:`engine.storage.store.Store.dataset_dollars`.
DATASET_DOLLARS = (f"SELECT key, SUM(CASE WHEN result THEN usd ELSE 0 END), SUM(CASE WHEN result THEN 0 ELSE usd END) "
                   f"FROM ({bills_sql('dataset')}) GROUP BY key")


class Dollars(NamedTuple):
    """One dataset's bills (USD): ``results_usd`` (its results' costs) and ``lost_usd`` (failed and
    aborted attempts', which produced no result)."""

    results_usd: float = 0.0
    lost_usd: float = 0.0

    @property
    def usd(self) -> float:
        """Everything the dataset was billed."""
        return self.results_usd + self.lost_usd


def dollars_from_rows(rows: list[tuple]) -> dict[str, Dollars]:
    """:data:`DATASET_DOLLARS`'s rows as ``{dataset: Dollars}``."""
    return {d: Dollars(r or 0.0, lost or 0.0) for d, r, lost in rows}


def dataset_dollars(h: Handle) -> dict[str, Dollars]:
    """``{dataset: Dollars}`` of every dataset billed anything (see the module docstring)."""
    return dollars_from_rows(h._db.execute(DATASET_DOLLARS).fetchall())


def provider_dollars(h: Handle) -> dict[str | None, float]:
    """USD billed per provider over the whole run, the same bills as :func:`dataset_dollars` (so the
    providers add up to the run's spend); the provider as stored (None or "" when unknown)."""
    return {p: usd or 0.0 for p, usd in h._db.execute(f"SELECT key, SUM(usd) FROM ({bills_sql('provider')}) GROUP BY key")}


def spend_window(h: Handle, t0: float, since: float) -> tuple[float, float]:
    """``(USD billed at or after since, USD billed at or after t0)`` (wall clock, s)."""
    (window, total), = h._db.execute(
        f"SELECT COALESCE(SUM(CASE WHEN at >= ? THEN usd END), 0), COALESCE(SUM(usd), 0) "
        f"FROM ({bills_sql('dataset', timed=True)}) WHERE at >= ?", (since, t0))
    return window, total


def bills(h: Handle) -> list[tuple[float, float]]:
    """Every bill as ``(at, usd)`` (wall clock, s; USD): results first, then lost attempts."""
    return [(at, usd) for at, usd in h._db.execute(f"SELECT at, usd FROM ({bills_sql('dataset', timed=True)})")]
