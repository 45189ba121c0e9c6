"""Every table of a run's store (``RUN_DIR/store.sqlite``), where it lives and how older stores catch up.

One file per run. Tables (:data:`SCHEMA`; ``validations``: :data:`VALIDATIONS_DDL`):

- ``meta``: schema version, run name, resolved special ids later on.
- ``datasets``: per dataset its position, ingest fingerprint, counts and persisted state
  (``paused`` / ``skipped`` survive a restart); ``revision``: the commit sha an ``hf://`` dataset was
  last ingested at (NULL for a local path); ``ingest_error``: why its last ingest failed (NULL when
  it did not; cleared when the next one starts).
- ``prompts``: one row per unique (dataset, key) with the messages and tools as JSON, the request
  class and ``state`` in ``pending | done | failed | dup``. A prompt stays ``pending`` until its result
  or failure is committed, so a crash only ever re-requests prompts whose result was not stored.
  ``special_text``: the special-token texts typed in its messages (``special_text_in_prompt``,
  :mod:`engine.tokens.promptcheck`), NULL when none or not checked (no ``[tokenizer]``).
  ``state`` ``dup`` with ``dup_of`` (the id of the copy bought, in another dataset): the same request
  stored in several datasets and bought once (``[run] cross_dataset_duplicates``,
  :mod:`engine.datasets.overlap`): never sent, not counted in its dataset's ``prompts``.
- ``results``: exactly one row per completed prompt (PRIMARY KEY prompt_id, UNIQUE dataset+key);
  ``usage_source`` says where its tokens and cost come from (:mod:`engine.money.usage`: ``reported`` |
  ``generation`` | ``counted`` | ``estimated`` | ``implausible``); ``usage_claimed``: with
  ``implausible``, the provider's usage figures that were not believed (JSON text, for the audit;
  NULL otherwise). Attribution (:mod:`engine.client.attribution`): ``provider``, ``model`` (the id the
  response named), ``generation_id``, ``endpoint`` (the ``[provider] base_urls`` entry that served it, ''
  with one ``base_url``), ``system_fingerprint`` ('' when none was sent), ``temperature`` / ``top_p`` (the
  sampling settings the request was sent with; NULL when left to the provider's default or stored before
  they were recorded). Columns added since schema version 1 are added to
  older stores when they are opened for writing (:data:`ADDED_COLUMNS`, :func:`migrate_sql`).
- ``attempts``: one row per finished HTTP attempt (success or error class, status, message).
- ``rejects``: dataset rows that could not become prompts (file:line, reason).
- ``events``: run events (pauses, guards, fatal errors) for the log and the dashboard.
- ``commands``: control commands from other shells (``datagen ctl``), polled by the engine.
- ``runtime``: one row the live engine refreshes at every commit (pid, heartbeat, in-flight per
  dataset), so ``datagen status`` from another shell sees in-flight counts consistent with the
  committed rows.
- ``validations``: one row per validated result (created on first use, :data:`VALIDATIONS_DDL`:
  older run directories gain it then):
  ``validations(prompt_id PRIMARY KEY, dataset, key, provider, finish_reason, ok, reasons JSON,
  notes JSON, prompt_len, completion_len, billed_completion, billing_diff, prompt_diff, tokenizer,
  input_ids BLOB, created_at)``. ``reasons`` / ``notes``: JSON lists (:mod:`engine.tokens.validate`);
  ``billing_diff`` = completion_len - billed completion tokens (NULL when none were billed),
  ``prompt_diff`` likewise for the prompt; ``tokenizer``: the fingerprint of the tokenizer + settings
  that produced the row; ``input_ids``: prompt ids + completion ids as little-endian int32,
  zlib-compressed (level 1, :func:`engine.storage.validations.pack_ids`); the loss mask is
  ``prompt_len`` zeros then ``completion_len`` ones, so it is not stored. A row is replaced when the
  record is validated again (``datagen validate`` after a tokenizer fix).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Iterable

from engine.errors import DatagenError

SCHEMA_VERSION = 1
DB_NAME = "store.sqlite"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS datasets(
  name TEXT PRIMARY KEY, position INTEGER NOT NULL, path TEXT NOT NULL, fingerprint TEXT,
  prompts INTEGER NOT NULL DEFAULT 0, rejected INTEGER NOT NULL DEFAULT 0,
  state TEXT NOT NULL DEFAULT 'active', state_reason TEXT NOT NULL DEFAULT '',
  token_budget INTEGER, updated_at REAL NOT NULL DEFAULT 0, revision TEXT, ingest_error TEXT);
CREATE TABLE IF NOT EXISTS prompts(
  id INTEGER PRIMARY KEY, dataset TEXT NOT NULL, key TEXT NOT NULL, source TEXT NOT NULL,
  class TEXT NOT NULL, est_prompt_tokens INTEGER NOT NULL, messages TEXT NOT NULL, tools TEXT NOT NULL,
  state TEXT NOT NULL DEFAULT 'pending', attempts INTEGER NOT NULL DEFAULT 0,
  error_class TEXT, error TEXT, special_text TEXT, dup_of INTEGER, UNIQUE(dataset, key));
CREATE INDEX IF NOT EXISTS prompts_dispatch ON prompts(dataset, class, state, id);
CREATE TABLE IF NOT EXISTS results(
  prompt_id INTEGER PRIMARY KEY, dataset TEXT NOT NULL, key TEXT NOT NULL,
  reasoning TEXT NOT NULL, content TEXT NOT NULL, tool_calls TEXT NOT NULL,
  finish_reason TEXT NOT NULL, native_finish_reason TEXT, provider TEXT NOT NULL, model TEXT NOT NULL,
  generation_id TEXT NOT NULL, prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,
  reasoning_tokens INTEGER NOT NULL, cost_usd REAL, latency_s REAL NOT NULL, ttft_s REAL,
  attempts INTEGER NOT NULL, created_at REAL NOT NULL, usage_source TEXT NOT NULL DEFAULT 'reported',
  wire_flags TEXT NOT NULL DEFAULT '', token_ids TEXT, usage_claimed TEXT, endpoint TEXT NOT NULL DEFAULT '',
  system_fingerprint TEXT NOT NULL DEFAULT '', temperature REAL, top_p REAL, UNIQUE(dataset, key));
CREATE INDEX IF NOT EXISTS results_recent ON results(dataset, created_at, completion_tokens, prompt_id);
CREATE INDEX IF NOT EXISTS results_usage ON results(dataset, prompt_tokens, completion_tokens, reasoning_tokens, cost_usd);
CREATE TABLE IF NOT EXISTS attempts(
  id INTEGER PRIMARY KEY, prompt_id INTEGER NOT NULL, dataset TEXT NOT NULL, n INTEGER NOT NULL,
  started_at REAL NOT NULL, ended_at REAL NOT NULL, outcome TEXT NOT NULL, error_class TEXT,
  status INTEGER, message TEXT, provider TEXT, generation_id TEXT,
  tokens_received INTEGER NOT NULL DEFAULT 0, cost_usd REAL, cost_source TEXT);
CREATE INDEX IF NOT EXISTS attempts_dataset ON attempts(dataset, outcome, error_class);
CREATE TABLE IF NOT EXISTS rejects(
  id INTEGER PRIMARY KEY, dataset TEXT NOT NULL, source TEXT NOT NULL, reason TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events(
  id INTEGER PRIMARY KEY, ts REAL NOT NULL, level TEXT NOT NULL, kind TEXT NOT NULL,
  dataset TEXT, message TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS commands(
  id INTEGER PRIMARY KEY, ts REAL NOT NULL, verb TEXT NOT NULL, dataset TEXT, arg TEXT,
  done_at REAL, result TEXT, ok INTEGER);
CREATE TABLE IF NOT EXISTS runtime(
  id INTEGER PRIMARY KEY CHECK (id = 1), pid INTEGER, started_at REAL, heartbeat_at REAL,
  state TEXT, state_reason TEXT, elapsed_s REAL, live TEXT);
"""

#: The ``validations`` table (validation's verdicts, :mod:`engine.storage.validations`), created on
#: first use by whoever validates (older run directories gain it then).
VALIDATIONS_DDL = """
CREATE TABLE IF NOT EXISTS validations(
  prompt_id INTEGER PRIMARY KEY, dataset TEXT NOT NULL, key TEXT NOT NULL, provider TEXT NOT NULL,
  finish_reason TEXT NOT NULL, ok INTEGER NOT NULL, reasons TEXT NOT NULL, notes TEXT NOT NULL,
  prompt_len INTEGER NOT NULL, completion_len INTEGER NOT NULL, billed_completion INTEGER NOT NULL,
  billing_diff INTEGER, prompt_diff INTEGER, tokenizer TEXT NOT NULL, input_ids BLOB NOT NULL,
  created_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS validations_dataset ON validations(dataset, ok);
"""

#: Columns added to schema version 1 after its release: ``(table, column, SQL type and default)``.
#: Older stores get them (``ALTER TABLE ... ADD COLUMN``) when opened for writing; existing rows take
#: the default (results stored before ``usage_source`` existed count as ``reported``).
ADDED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("results", "usage_source", "TEXT NOT NULL DEFAULT 'reported'"),
    ("prompts", "special_text", "TEXT"),
    ("datasets", "revision", "TEXT"),
    ("datasets", "ingest_error", "TEXT"),
    ("results", "wire_flags", "TEXT NOT NULL DEFAULT ''"),
    ("results", "token_ids", "TEXT"),
    ("commands", "ok", "INTEGER"),  # whether the command was applied (1) or not (0), as the engine decided
    # an attempt's cost_usd: NULL as billed (reported, or set by a /generation true-up: 'generation');
    # 'estimate' our estimate of a cut stream's bill, trued up from /generation when it answers
    ("attempts", "cost_source", "TEXT"),
    # the provider's usage figures of a result whose usage was not believed (usage_source 'implausible')
    ("results", "usage_claimed", "TEXT"),
    # who served a result (engine.client.attribution): the base_urls entry ('' with one base_url), the
    # chunks' system_fingerprint; the sampling settings it was bought with (NULL: left to the provider,
    # or stored before these columns existed)
    ("results", "endpoint", "TEXT NOT NULL DEFAULT ''"),
    ("results", "system_fingerprint", "TEXT NOT NULL DEFAULT ''"),
    ("results", "temperature", "REAL"),
    ("results", "top_p", "REAL"),
    # a prompt also stored in another dataset, not bought here ([run] cross_dataset_duplicates =
    # "buy_once", engine.datasets.overlap): state 'dup' and the id of the copy bought; NULL otherwise
    ("prompts", "dup_of", "INTEGER"),
)


class StoreError(DatagenError):
    """The store cannot be opened or used (wrong schema version, not a run directory...)."""


def migrate_sql(columns: dict[str, set[str]]) -> list[str]:
    """The ``ALTER TABLE`` statements that bring a store with ``columns`` (``{table: column names}``,
    from ``PRAGMA table_info``) up to :data:`ADDED_COLUMNS` (empty when nothing is missing)."""
    return [f"ALTER TABLE {t} ADD COLUMN {c} {decl}" for t, c, decl in ADDED_COLUMNS
            if t in columns and c not in columns[t]]


def table_columns(conn: sqlite3.Connection, tables: Iterable[str] | None = None) -> dict[str, set[str]]:
    """``{table: column names}`` of an open (synchronous) connection, for ``tables`` (default: the
    tables of :data:`ADDED_COLUMNS`)."""
    names = set(tables) if tables is not None else {t for t, _, _ in ADDED_COLUMNS}
    return {t: {r[1] for r in conn.execute(f"PRAGMA table_info({t})")} for t in names}


def migrate(conn: sqlite3.Connection) -> None:
    """Add the missing :data:`ADDED_COLUMNS` to a store open read-write (synchronous connection)."""
    for stmt in migrate_sql(table_columns(conn)):
        conn.execute(stmt)


def db_path(run_dir: Path) -> Path:
    """Path of the store inside ``run_dir``."""
    return Path(run_dir) / DB_NAME


def make_run_dir(run_dir: Path) -> None:
    """Create ``run_dir`` owner-only (0700); tighten it if it already exists and is ours."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        os.chmod(run_dir, 0o700)
    except PermissionError:
        pass
