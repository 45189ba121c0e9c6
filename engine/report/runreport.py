"""``datagen report``: a run's figures gathered from its store (data only; :mod:`engine.report.plots`
draws them and :mod:`engine.report.page` writes the HTML).

Read-only: the store is opened ``mode=ro`` (a live run may go on writing) and nothing in the run
directory is changed. :func:`gather` returns one JSON-able dict:

- ``status``: :func:`engine.report.status.collect_status`'s document, unchanged, so every figure the
  report's status table shows equals ``datagen status --json``.
- ``settings``: what reservations are computed with (``[spend]`` ``reserve_percentile``,
  ``calibrate_after``, ``hard_cap``, ``reservation``; each class's ``max_tokens``) and where they came
  from: ``--config``, the settings ``datagen run`` stores with the run, or the config schema's
  defaults (:mod:`engine.report.settings`).
- ``timeline``: completions, completion tokens, spend (USD: results at their commit time, failed and
  aborted attempts at their end) and errors by class (attempts with ``outcome = 'error'``), binned
  over the run's wall-clock span (first attempt start to last event; :mod:`engine.report.series`).
- ``lengths``: per dataset, a histogram of stored completion lengths (tokens) and per request class
  the configured percentile of them and the reservation the next request would hold
  (:class:`engine.money.estimator.CompletionEstimator` seeded as a restart seeds it: the dataset's
  last :data:`SEED_LIMIT` lengths).
- ``validation``: :func:`engine.tokens.report.summarize` of the ``validations`` table (None when it
  does not exist) plus ``billing_diffs``: ``{difference: records}`` of validation's billing
  difference (rebuilt completion length minus billed completion tokens) over the billed, untruncated
  records, the same rows as ``datagen validate``'s ``billing``.
- ``fidelity``: ``{provider: fidelity object}`` of every provider judged, from the store's
  ``provider_verdicts`` (:func:`engine.storage.verdicts.by_provider`; drawn by
  :mod:`engine.report.fidelityreport`; docs/fidelity.md).
- ``extraction``: the linked extraction's progress (None when none): ``status`` (``collect_status``'s
  ``extract``), and ``timeline`` of samples and tokens committed, from ``manifest.jsonl`` and the
  modification time of each listed shard or file.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from engine.config import Config
from engine.errors import DatagenError
from engine.extract.shards import MANIFEST
from engine.extract.snapshot import JobState
from engine.extract.status import collect as collect_extract
from engine.extract.status import run_dir_out_dir
from engine.metrics.stats import nearest_rank
from engine.money.estimator import CompletionEstimator
from engine.report.series import bin_count, bin_width, binned_sum, cumulative, histogram
from engine.report.settings import resolve_settings
from engine.report.status import collect_status
from engine.storage import read, validations, verdicts
from engine.storage.dollars import bills
from engine.storage.handle import Handle, connect_ro

#: Completion lengths per dataset a restart seeds its estimators with
#: (:meth:`engine.storage.store.Store.recent_completion_tokens`), and each estimator's window
#: (:class:`engine.money.budget.DatasetBudgets`).
SEED_LIMIT = 2000
#: Bins of the length histograms.
LENGTH_BINS = 30


class ReportError(DatagenError):
    """The report cannot be made: no run directory, or matplotlib (the `report` extra) missing."""


def gather(run_dir: Path, config: Config | None = None, now: float | None = None) -> dict[str, Any]:
    """Every figure of the report of ``run_dir`` (see the module docstring).

    Raises:
        ReportError: ``run_dir`` does not exist, or is not a directory (each said so).
        engine.report.status.StatusError: it has no (initialised) store.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: " + ("not a directory (expected a run directory)" if run_dir.exists()
                                            else "no such run directory"))
    now = time.time() if now is None else now
    status = collect_status(run_dir, now=now)
    conn = connect_ro(run_dir)
    try:
        settings = resolve_settings(conn, config, status)
        doc = {
            "run_dir": str(run_dir), "generated_at": now, "status": status, "settings": settings,
            "timeline": timeline(conn),
            "lengths": lengths(conn, settings),
            "validation": validation(conn),
            "fidelity": verdicts.by_provider(conn),
        }
    finally:
        conn.close()
    doc["extraction"] = extraction(run_dir, settings, status.get("extract"))
    return doc


def timeline(conn: Handle, target_bins: int = 60) -> dict[str, Any] | None:
    """Completions, completion tokens, spend and errors over time (None before any attempt).

    Returns:
        ``{"t0" (epoch s), "t1", "bin_s", "bins", "completions": [...], "completion_tokens": [...],
        "spend_usd": [...] (per bin), "spend_usd_cum": [...], "errors": {class: [...]}}``.
    """
    done = read.completion_times(conn)
    billed = bills(conn)  # results' and failed and aborted attempts' (engine.storage.dollars)
    errs = read.error_times(conn)
    first, last = read.attempt_span(conn)
    times = [t for t, _ in billed] + [t for t, _ in errs] + [x for x in (first, last) if x is not None]
    if not times:
        return None
    t0, t1 = min(times), max(times)
    bin_s = bin_width(t1 - t0, target_bins)
    n = bin_count(t0, t1, bin_s)
    spend = binned_sum(billed, t0, bin_s, n)
    by_class: dict[str, list[tuple[float, float]]] = {}
    for t, cls in errs:
        by_class.setdefault(cls, []).append((t, 1.0))
    return {
        "t0": t0, "t1": t1, "bin_s": bin_s, "bins": n,
        "completions": binned_sum(((t, 1.0) for t, _ in done), t0, bin_s, n),
        "completion_tokens": binned_sum(((t, float(k)) for t, k in done), t0, bin_s, n),
        "spend_usd": spend, "spend_usd_cum": cumulative(spend),
        "errors": {c: binned_sum(ev, t0, bin_s, n) for c, ev in sorted(by_class.items(), key=lambda kv: -len(kv[1]))},
    }


def reservation(lengths_oldest_first: list[int], max_tokens: int, spend: dict[str, Any]) -> dict[str, Any]:
    """What the next request of one (dataset, class) reserves, given its stored lengths (tokens,
    oldest first; at most :data:`SEED_LIMIT` are used, as a restart would).

    Returns:
        ``{"tokens", "q" (the percentile reserved, None when not from lengths), "calibrated",
        "basis"}``: ``max_tokens`` with ``hard_cap`` or until ``calibrate_after`` lengths, 0 for
        ``reservation = "none"``, else the estimator's upper-bound percentile.
    """
    est = CompletionEstimator(max_tokens, spend["calibrate_after"], spend["reserve_percentile"], SEED_LIMIT)
    for v in lengths_oldest_first[-SEED_LIMIT:]:
        est.observe(v)
    if spend.get("reservation") == "none":
        return {"tokens": 0, "q": None, "calibrated": est.calibrated, "basis": 'reservation = "none"'}
    if spend.get("hard_cap"):
        return {"tokens": max_tokens, "q": None, "calibrated": est.calibrated, "basis": "hard_cap: max_tokens"}
    if not est.calibrated:
        return {"tokens": max_tokens, "q": None, "calibrated": False,
                "basis": f"max_tokens until {est.calibrate_after} completions ({est.count} so far)"}
    q = est.reservation_percentile()
    return {"tokens": est.expected(), "q": q, "calibrated": True,
            "basis": f"p{100 * q:.1f}: p{100 * est.percentile:g} raised to its 95% upper bound over {est.count}"}


def lengths(conn: Handle, settings: dict[str, Any]) -> list[dict[str, Any]]:
    """Per dataset (store order) with results: ``{"dataset", "n", "mean", "hist", "classes": [{"class",
    "n", "max_tokens", "percentile", "percentile_tokens", "reservation": {...}}]}`` (tokens)."""
    order = read.dataset_names(conn)
    per: dict[str, dict[str, list[int]]] = {}
    for ds, cls, k in read.completion_lengths(conn):
        per.setdefault(ds, {}).setdefault(cls, []).append(k)
    seeds: dict[str, dict[str, list[int]]] = {}
    for ds in per:  # exactly what a restart seeds: the dataset's last SEED_LIMIT lengths, per class
        for cls, k in reversed(read.recent_lengths(conn, ds, SEED_LIMIT)):
            seeds.setdefault(ds, {}).setdefault(cls, []).append(int(k))
    spend, classes = settings["spend"], settings["classes"]
    p = float(spend["reserve_percentile"])
    out = []
    for ds in [n for n in order if n in per] + sorted(n for n in per if n not in order):
        everything = [k for v in per[ds].values() for k in v]
        cls_docs = []
        for cls in sorted(per[ds]):
            vals = sorted(per[ds][cls])
            mt = int((classes.get(cls) or {}).get("max_tokens") or max(vals) or 1)
            cls_docs.append({"class": cls, "n": len(vals), "max_tokens": mt, "percentile": p,
                             "percentile_tokens": nearest_rank(vals, p),
                             "reservation": reservation(seeds.get(ds, {}).get(cls, []), mt, spend)})
        out.append({"dataset": ds, "n": len(everything), "mean": sum(everything) / len(everything),
                    "hist": histogram([float(x) for x in everything], LENGTH_BINS), "classes": cls_docs})
    return out


def validation(conn: Handle) -> dict[str, Any] | None:
    """Validation's report (:func:`engine.tokens.report.summarize`) plus ``billing_diffs``
    (``{str(difference): records}``, tokens), or None without a ``validations`` table."""
    if not validations.has_validations(conn):
        return None
    from engine.tokens.report import summarize

    doc = summarize(conn)
    diffs: Counter[int] = Counter()
    for bdiff, reasons in validations.billing_diffs(conn):
        if "truncated" not in reasons:  # the rows of validate's `billing` (engine.tokens.report)
            diffs[bdiff] += 1
    first_fail: dict[str, Counter[str]] = {}
    for prov, r in validations.invalid_reasons(conn):
        first_fail.setdefault(prov or "(unknown)", Counter())[r[0] if r else "other"] += 1
    return {"summary": doc, "billing_diffs": {str(k): n for k, n in sorted(diffs.items())},
            "invalid_by_first_check": {p: dict(c.most_common()) for p, c in sorted(first_fail.items())}}


def extraction(run_dir: Path, settings: dict[str, Any], status: dict[str, Any] | None) -> dict[str, Any] | None:
    """The linked extraction's progress, or None when there is none: ``{"out_dir", "status",
    "timeline": {"t": [epoch s], "samples_cum": [...], "tokens_cum": [...]}, "datasets": {name:
    {"samples", "tokens"}}}`` (committed samples from ``manifest.jsonl``; ``t``: each listed file's
    modification time, i.e. when it was committed)."""
    out = run_dir_out_dir(run_dir)
    if not (run_dir / "extract.json").exists() and settings.get("extract_out_dir"):
        out = Path(settings["extract_out_dir"])  # configured elsewhere and never linked by a run-dir extraction
        status = collect_extract(out)  # `datagen status` looks in RUN_DIR/extract only
    manifest = out / MANIFEST
    if not manifest.exists() and not (status and status.get("state") != JobState.NOT_STARTED):
        return None
    when: dict[str, float] = {}
    events: list[tuple[float, int]] = []
    per_ds: dict[str, dict[str, int]] = {}
    try:
        lines = manifest.read_bytes().split(b"\n")
    except OSError:
        lines = []
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:  # a torn last line (recovery truncates it) or the trailing empty one
            continue
        f = str(e.get("shard") or e.get("file") or "")
        if f not in when:
            try:
                when[f] = os.stat(out / f).st_mtime
            except OSError:
                when[f] = float("nan")
        n = int(e.get("length") or 0)
        events.append((when[f], n))
        d = per_ds.setdefault(str(e.get("dataset", "?")), {"samples": 0, "tokens": 0})
        d["samples"] += 1
        d["tokens"] += n
    events = sorted(ev for ev in events if ev[0] == ev[0])  # NaN: a listed file gone since (not plotted)
    return {
        "out_dir": str(out), "status": status,
        "timeline": {"t": [t for t, _ in events], "samples_cum": cumulative(1.0 for _ in events),
                     "tokens_cum": cumulative(float(n) for _, n in events)},
        "datasets": per_ds,
    }
