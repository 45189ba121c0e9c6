"""Reads of a run's store for ``datagen status``, the report, ``export --format raw`` and ``ctl``:
plain values (dicts, lists, tuples) from a :class:`~engine.storage.handle.Handle`.

Stores written by an older datagen and not reopened for writing since lack some columns
(:data:`engine.storage.schema.ADDED_COLUMNS`): each read here answers for them as the column's
default would (results ``reported``, no wire flags, no Hub revision, nothing flagged).
Dollars are read by :mod:`engine.storage.dollars` (one definition of what counts).
"""

from __future__ import annotations

import json
from typing import Any, Iterator

from engine.storage.handle import Handle, columns, get_meta


# ---- the run -------------------------------------------------------------------------------------
def runtime(h: Handle) -> tuple | None:
    """The ``runtime`` row: ``(pid, started_at, heartbeat_at, state, state_reason, elapsed_s, live)``
    (``live``: its JSON text), None before an engine wrote one."""
    row = h._db.execute("SELECT pid, started_at, heartbeat_at, state, state_reason, elapsed_s, live FROM runtime").fetchone()
    return None if row is None else tuple(row)


def runtime_live(h: Handle) -> dict[str, Any]:
    """The live figures the engine last committed (the ``runtime`` row's ``live``), ``{}`` when none."""
    row = h._db.execute("SELECT live FROM runtime").fetchone()
    return json.loads(row[0]) if row and row[0] else {}


def excluded_providers(h: Handle) -> list[str]:
    """Providers excluded from this run (``meta['excluded_providers']``), ``[]`` when none."""
    value = get_meta(h, "excluded_providers")
    return json.loads(value) if value is not None else []


# ---- datasets and prompts ------------------------------------------------------------------------
def dataset_names(h: Handle) -> list[str]:
    """The run's datasets in their configured order."""
    return [n for (n,) in h._db.execute("SELECT name FROM datasets ORDER BY position")]


def dataset_states(h: Handle) -> list[tuple[str, str]]:
    """``(name, persisted control state)`` of each dataset, in order."""
    return [(n, s) for n, s in h._db.execute("SELECT name, state FROM datasets ORDER BY position")]


def dataset_rows(h: Handle) -> list[dict[str, Any]]:
    """Each dataset's row, in order: ``{name, state, state_reason, rejected, token_budget, path,
    revision, fingerprint, ingest_error}`` (``revision`` and ``ingest_error`` None on a store older
    than them)."""
    cols = columns(h, "datasets")
    keys = ("name", "state", "state_reason", "rejected", "token_budget", "path", "revision", "fingerprint", "ingest_error")
    sql = ("SELECT name, state, state_reason, rejected, token_budget, path, "
           + ", ".join(c if c in cols else "NULL" for c in ("revision", "fingerprint", "ingest_error"))
           + " FROM datasets ORDER BY position")
    return [dict(zip(keys, row, strict=True)) for row in h._db.execute(sql)]


def prompt_states(h: Handle, dataset: str | None = None) -> dict[str, dict[str, int]]:
    """``{dataset: {state: prompts}}`` (only ``dataset``'s with one)."""
    out: dict[str, dict[str, int]] = {}
    sql = "SELECT dataset, state, COUNT(*) FROM prompts" + (" WHERE dataset=?" if dataset is not None else "") + " GROUP BY 1, 2"
    for d, s, n in h._db.execute(sql, () if dataset is None else (dataset,)):
        out.setdefault(d, {})[s] = n
    return out


def prompt_count(h: Handle) -> int:
    """Prompts ingested, all datasets."""
    (n,) = h._db.execute("SELECT COUNT(*) FROM prompts").fetchone()
    return n


def special_text_counts(h: Handle) -> dict[str, int]:
    """Prompts per dataset flagged ``special_text_in_prompt`` at ingest (special-token text typed in
    their messages, :mod:`engine.tokens.promptcheck`); ``{}`` for a store without the column."""
    if "special_text" not in columns(h, "prompts"):
        return {}
    return {d: n for d, n in h._db.execute(
        "SELECT dataset, COUNT(*) FROM prompts WHERE special_text IS NOT NULL GROUP BY dataset")}


def failed_error_classes(h: Handle) -> set[str]:
    """The error classes failed prompts have (for ``retry-failed --reason``)."""
    return {c for (c,) in h._db.execute(
        "SELECT DISTINCT error_class FROM prompts WHERE state='failed' AND error_class IS NOT NULL")}


# ---- results and attempts ------------------------------------------------------------------------
def result_count(h: Handle, dataset: str | None = None) -> int:
    """Results stored (of ``dataset``; None: all datasets)."""
    (n,) = h._db.execute("SELECT COUNT(*) FROM results" + (" WHERE dataset=?" if dataset is not None else ""),
                         () if dataset is None else (dataset,)).fetchone()
    return n


def token_totals(h: Handle) -> dict[str, tuple[int, int, int]]:
    """``{dataset: (prompt_tokens, completion_tokens, reasoning_tokens)}`` of its results."""
    return {d: (p or 0, c or 0, r or 0) for d, p, c, r in h._db.execute(
        "SELECT dataset, SUM(prompt_tokens), SUM(completion_tokens), SUM(reasoning_tokens) FROM results GROUP BY dataset")}


def usage_sources(h: Handle) -> dict[str, dict[str, int]]:
    """``{dataset: {usage_source: results}}`` (:mod:`engine.money.usage`; a store older than the
    column: all ``reported``)."""
    out: dict[str, dict[str, int]] = {}
    if "usage_source" in columns(h, "results"):
        for d, src, n in h._db.execute("SELECT dataset, usage_source, COUNT(*) FROM results GROUP BY 1, 2"):
            out.setdefault(d, {})[src] = n
    else:
        for d, n in h._db.execute("SELECT dataset, COUNT(*) FROM results GROUP BY 1"):
            out[d] = {"reported": n}
    return out


def error_counts(h: Handle) -> dict[str, dict[str, int]]:
    """``{dataset: {error_class: failed attempts}}``."""
    out: dict[str, dict[str, int]] = {}
    for d, c, n in h._db.execute("SELECT dataset, error_class, COUNT(*) FROM attempts WHERE outcome='error' GROUP BY 1, 2"):
        out.setdefault(d, {})[c] = n
    return out


def seen_providers(h: Handle) -> set[str]:
    """Every provider named by a stored result or attempt."""
    return {p for (p,) in h._db.execute(
        "SELECT DISTINCT provider FROM results UNION SELECT DISTINCT provider FROM attempts") if p}


# ---- per provider (status when no engine answers) ------------------------------------------------
def provider_results(h: Handle) -> dict[str | None, tuple[int, int]]:
    """``{provider as stored: (results, completion tokens)}``."""
    return {p: (n, c or 0) for p, n, c in h._db.execute(
        "SELECT provider, COUNT(*), SUM(completion_tokens) FROM results GROUP BY provider")}


def provider_errors(h: Handle) -> list[tuple[str | None, str | None, int]]:
    """``(provider, error class, failed attempts)`` rows."""
    return [tuple(r) for r in h._db.execute(
        "SELECT provider, error_class, COUNT(*) FROM attempts WHERE outcome='error' GROUP BY 1, 2")]


def recent_timings(h: Handle, window: int) -> list[tuple[str | None, float, float | None, int]]:
    """The latest ``window`` results' ``(provider, latency_s, ttft_s, completion_tokens)``, newest first."""
    return [tuple(r) for r in h._db.execute(
        "SELECT provider, latency_s, ttft_s, completion_tokens FROM results ORDER BY created_at DESC LIMIT ?", (window,))]


def provider_wire_flags(h: Handle) -> list[tuple[str | None, str, int]]:
    """``(provider, encoded wire flags, results)`` of results with flags (:mod:`engine.client.conformance`;
    ``[]`` for a store older than the column)."""
    if "wire_flags" not in columns(h, "results"):
        return []
    return [tuple(r) for r in h._db.execute(
        "SELECT provider, wire_flags, COUNT(*) FROM results WHERE wire_flags != '' GROUP BY 1, 2")]


# ---- over time (the report) ----------------------------------------------------------------------
def completion_times(h: Handle) -> list[tuple[float, int]]:
    """Every result's ``(created_at, completion_tokens)`` (wall clock, s; tokens)."""
    return [(t, k) for t, k in h._db.execute("SELECT created_at, completion_tokens FROM results")]


def error_times(h: Handle) -> list[tuple[float, str]]:
    """Every failed attempt's ``(ended_at, error class or 'other')``."""
    return [(t, c) for t, c in h._db.execute(
        "SELECT ended_at, COALESCE(error_class, 'other') FROM attempts WHERE outcome = 'error'")]


def attempt_span(h: Handle) -> tuple[float | None, float | None]:
    """``(first attempt's start, last attempt's end)`` (None, None before any)."""
    first, last = h._db.execute("SELECT MIN(started_at), MAX(ended_at) FROM attempts").fetchone()
    return first, last


def completion_lengths(h: Handle) -> list[tuple[str, str, int]]:
    """Every result's ``(dataset, request class, completion_tokens)``, in commit order."""
    return [(d, c, int(k)) for d, c, k in h._db.execute(
        "SELECT r.dataset, p.class, r.completion_tokens FROM results r "
        "JOIN prompts p ON p.id = r.prompt_id ORDER BY r.created_at, r.prompt_id")]


def recent_lengths(h: Handle, dataset: str, limit: int) -> list[tuple[str, int]]:
    """The last ``limit`` results of ``dataset`` as ``(class, completion_tokens)``, newest first (what a
    restart seeds its estimators with: :meth:`engine.storage.store.Store.recent_completion_tokens`)."""
    return [(c, int(k)) for c, k in h._db.execute(
        "SELECT p.class, r.completion_tokens FROM results r JOIN prompts p ON p.id = r.prompt_id "
        "WHERE r.dataset = ? ORDER BY r.created_at DESC LIMIT ?", (dataset, limit))]


# ---- export --format raw -------------------------------------------------------------------------
def raw_rows(h: Handle, dataset: str) -> Iterator[tuple]:
    """``dataset``'s results with their prompts, in prompt-id order: ``(dataset, key, messages, tools,
    reasoning, content, tool_calls, finish_reason, prompt_tokens, completion_tokens, reasoning_tokens,
    cost_usd, provider, model, generation_id, usage_source, wire_flags)`` (JSON columns as stored
    text; a store older than ``usage_source`` / ``wire_flags``: ``reported`` / "")."""
    cols = columns(h, "results")
    source = "r.usage_source" if "usage_source" in cols else "'reported'"
    flags = "r.wire_flags" if "wire_flags" in cols else "''"
    for row in h._db.execute(  # not `yield from`: closing it early would close the cursor of a closed handle
        "SELECT r.dataset, r.key, p.messages, p.tools, r.reasoning, r.content, r.tool_calls, r.finish_reason, "
        "r.prompt_tokens, r.completion_tokens, r.reasoning_tokens, r.cost_usd, r.provider, r.model, "
        f"r.generation_id, {source}, {flags} FROM results r JOIN prompts p ON p.id = r.prompt_id WHERE r.dataset=? "
        "ORDER BY r.prompt_id", (dataset,)):
        yield row
