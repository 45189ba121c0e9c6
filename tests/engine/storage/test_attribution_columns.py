"""The attribution columns of ``results`` (issue 35, item 1): stored from each completion, and added to a store
written before they existed (``ADDED_COLUMNS``), whose rows then read as unattributed."""

from __future__ import annotations

import dataclasses
import sqlite3

from helpers import completion, make_config, seeded_store, store_rows

from engine.storage.schema import ADDED_COLUMNS
from engine.storage.store import Store
from engine.storage.writer import StoreWriter

NEW = ("endpoint", "system_fingerprint", "temperature", "top_p")


def test_the_new_columns_are_migrations_of_results():
    assert [(t, c) for t, c, _ in ADDED_COLUMNS if c in NEW] == [("results", c) for c in NEW]


async def test_results_store_who_served_them_and_their_sampling_settings(tmp_path):
    cfg = make_config(tmp_path)
    store = await seeded_store(cfg, {"a": 2})
    try:
        w = StoreWriter(store)
        served = dataclasses.replace(completion(), model="moonshotai/kimi-k2.5-0127", endpoint="http://10.0.0.2:8000/v1",
                                     system_fingerprint="fp_44", temperature=0.6, top_p=0.95)
        w.add_result(1, "a", "a-000000", served, 1)
        w.add_result(2, "a", "a-000001", completion(), 1)  # nothing known beyond the provider
        await w.flush()
    finally:
        await store.close()
    assert store_rows(cfg.run.dir, "SELECT model, endpoint, system_fingerprint, temperature, top_p FROM results "
                                   "ORDER BY prompt_id") == [
        ("moonshotai/kimi-k2.5-0127", "http://10.0.0.2:8000/v1", "fp_44", 0.6, 0.95), ("m", "", "", None, None)]


async def test_a_store_from_before_the_columns_gains_them_and_keeps_its_rows(tmp_path):
    cfg = make_config(tmp_path)
    store = await seeded_store(cfg, {"a": 1})
    try:
        w = StoreWriter(store)
        w.add_result(1, "a", "a-000000", completion(), 1)
        await w.flush()
    finally:
        await store.close()
    db = sqlite3.connect(cfg.run.dir / "store.sqlite")
    try:
        for c in NEW:  # the results table as an older datagen wrote it
            db.execute(f"ALTER TABLE results DROP COLUMN {c}")
        db.commit()
        assert not set(NEW) & {r[1] for r in db.execute("PRAGMA table_info(results)")}
    finally:
        db.close()
    store = await Store.open(cfg.run.dir)
    await store.close()
    assert store_rows(cfg.run.dir, "SELECT provider, endpoint, system_fingerprint, temperature, top_p FROM results") == [
        ("P", "", "", None, None)]
