"""``datagen status``: the run's figures, from any shell, live or after the run.

While its engine is alive, ``status`` asks it (``RUN_DIR/engine.sock``,
:mod:`engine.report.statusserver`) and reports the engine's own snapshot taken as it answers: the
counts, states and reasons, elapsed, ETA and projections its dashboard shows at the same moment
(``run.source`` is ``"engine"``). Only when no engine answers does it read the store
(``run.source`` ``"store"``): committed rows give done/failed/tokens/cost/errors; the live engine's ``runtime`` row (refreshed
in the same transaction as every commit) gives in-flight counts and the run state. A run whose
engine is gone (no such pid, or no heartbeat for :data:`STALE_S` while another process or none
holds the run directory's lock: :func:`engine.report.liveness.engine_alive`) has nothing in flight.
``spend_rate_usd_per_h`` is computed from the store when the document is read, with the
dashboard's definition: this engine's spend over the last 5 minutes (:func:`engine.report.liveness.spend_rate`).
Invariant of every dataset entry: ``done + failed + skipped + pending + in_flight == prompts``.
``duplicates`` (per dataset and in ``totals``): its prompts also in another dataset and bought there
(``[run] cross_dataset_duplicates = "buy_once"``, :mod:`engine.datasets.overlap`), not in ``prompts``.
``special_text_in_prompt`` (per dataset and in ``totals``) counts prompts flagged at ingest for
special-token text typed in their messages (:mod:`engine.tokens.promptcheck`; 0 without ``[tokenizer]``).
``usage_sources`` (per dataset and in ``totals``) counts the stored results by where their tokens
and cost come from: ``reported`` | ``generation`` | ``counted`` | ``estimated`` (:mod:`engine.money.usage`).

Ages and durations are computed when the document is read: ``credits_age_s`` from the wall-clock
time of the credits reading, ``elapsed_s`` from the last heartbeat while the engine runs (never past
the figure the engine stored once its run has ended, so it does not go backwards at exit); once the
engine is gone, from the later of its last commit and its elapsed file (rewritten every 0.5 s, so a
killed run's elapsed is never below what its screen last showed).

The run's ETA (``eta_s``) is the latest of the datasets' ETAs
(:func:`engine.money.projection.schedule_eta`); when it is null, ``run.eta_reason`` says why
(``"paused"``, ``"run cost cap met"``, ``"all datasets paused"``, ``"measuring rate"``,
``"engine not running"`` ...). A projection never exceeds the cap that binds it: ``projection_capped``
(run-wide, and per dataset) is true when ``projected_total_cost_usd`` (a dataset's
``projected_cost_usd``) was clamped at a cap, and the text then reads ``projected capped at $X``.
Each dataset's ``percent`` is its finished share rounded down (99 until the last prompt ends).
Each dataset entry also names its ``path`` (as configured) and ``revision``: the commit sha an
``hf://`` dataset was last ingested at (null for a local path).
``providers`` come from the live engine, or from the stored results and attempts when it is gone.
``endpoints`` (only for a run over several ``[provider] base_urls``): each endpoint's ``url``,
``state`` (``healthy`` | ``draining`` | ``down``), ``reason``, ``in_flight``, ``concurrency``,
``requests``, ``errors`` by class, ``error_rate``, ``latency_p50_s``/``_p95_s``, ``tok_per_s``,
``completion_tokens`` and ``state_for_s``, as of the engine's last commit (``in_flight`` 0 once it is gone).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from engine.client.conformance import decode_flags
from engine.fidelity.endpoints import quantization_by_provider
from engine.fidelity.looks import combined
from engine.fidelity.summary import summarize
from engine.metrics.rates import fmt_count, fmt_duration
from engine.metrics.stats import UNKNOWN_PROVIDER, nearest_rank
from engine.money.projection import range_text
from engine.money.usage import SOURCES
from engine.proc.runlock import holder
from engine.report.liveness import STALE_S, engine_alive, spend_rate  # noqa: F401 - STALE_S re-exported
from engine.report.snapshot import progress_percent
from engine.report.statusserver import ask_engine, persisted_elapsed, read_runtime
from engine.storage import read, verdicts
from engine.storage.dollars import Dollars, dataset_dollars, provider_dollars
from engine.storage.endpoints import latest_snapshot
from engine.storage.handle import Handle, connect_ro, get_meta, not_ready  # connect_ro re-exported
from engine.storage.handle import NoStoreError as StatusError  # "the run directory has no readable store"
from engine.storage.schema import db_path


def providers_from_store(conn: Handle, excluded: list[str], window: int = 20_000) -> list[dict[str, Any]]:
    """Per-provider figures (the fields of :class:`engine.metrics.stats.ProviderSnapshot`) from stored rows:
    counts, errors and cost over the whole run, latency / TTFT / tokens-per-second percentiles over
    the latest ``window`` results. ``cost_usd`` is everything the provider billed (:func:`provider_costs`).
    Sorted by requests descending, then name."""
    ok = {p or UNKNOWN_PROVIDER: (n, c) for p, (n, c) in read.provider_results(conn).items()}
    billed = provider_costs(conn)
    errs: dict[str, dict[str, int]] = {}
    for prov, cls, n in read.provider_errors(conn):
        errs.setdefault(prov or UNKNOWN_PROVIDER, {})[cls or "other"] = n
    lat: dict[str, tuple[list[float], list[float], list[float]]] = {}
    for prov, latency, ttft, ctok in read.recent_timings(conn, window):
        ls, ts, tps = lat.setdefault(prov or UNKNOWN_PROVIDER, ([], [], []))
        ls.append(latency)
        if ttft is not None:
            ts.append(ttft)
        stream = latency - (ttft or 0.0)
        if stream > 0:
            tps.append(ctok / stream)
    flags: dict[str, dict[str, int]] = {}
    for prov, wf, n in read.provider_wire_flags(conn):
        per = flags.setdefault(prov or UNKNOWN_PROVIDER, {})
        for f in decode_flags(wf):
            per[f] = per.get(f, 0) + n
    out: list[dict[str, Any]] = []
    for name in set(ok) | set(errs) | set(billed):
        n_ok, ctok = ok.get(name, (0, 0))
        e = errs.get(name, {})
        requests = n_ok + sum(e.values())
        ls, ts, tps = (sorted(v) for v in lat.get(name, ([], [], [])))
        out.append({
            "name": name, "requests": requests, "errors": e, "error_rate": sum(e.values()) / requests if requests else 0.0,
            "latency_p50_s": nearest_rank(ls, 0.5), "latency_p95_s": nearest_rank(ls, 0.95),
            "ttft_p50_s": nearest_rank(ts, 0.5), "ttft_p95_s": nearest_rank(ts, 0.95),
            "tok_per_s_per_stream": nearest_rank(tps, 0.5),
            "mean_completion_tokens": ctok / n_ok if n_ok else None, "cost_usd": round(billed.get(name, 0.0), 8),
            "excluded": name in excluded, "flags": dict(sorted(flags.get(name, {}).items())),
        })
    out.sort(key=lambda p: (-p["requests"], p["name"]))
    return out


def with_fidelity(conn: Handle, providers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``providers`` with each one's declared ``quantization`` (OpenRouter's endpoints listing, None when not
    declared or not read) and ``fidelity`` object (docs/fidelity.md; :mod:`engine.storage.verdicts`):
    ``{"verdict": "ok" | "drifting" | "insufficient", "records": N, "tokens", "source", "reason", "acted",
    "cleared", "evidence", "target", "cheap"}``; a provider nobody judged yet reads ``insufficient``,
    "not judged yet". A provider judged but with no row here (its records came from an earlier run's
    store) is added with its fidelity only."""
    fid = verdicts.by_provider(conn)
    quant = quantization_by_provider(latest_snapshot(conn))
    out = []
    for p in providers:
        f = fid.pop(p["name"], None) or combined({}, records_fallback=0)
        out.append(dict(p, fidelity=f, quantization=quant.get(p["name"])))
    out += [{"name": name, "fidelity": f, "quantization": quant.get(name)} for name, f in sorted(fid.items())]
    return out


def fidelity_by_dataset(conn: Handle) -> dict[str, dict[str, dict[str, Any]]]:
    """``{dataset: {provider: figures}}`` of the records phase two scored (:func:`engine.fidelity.summary.summarize`;
    {} before any extraction scored them): where a provider's drift shows, dataset by dataset."""
    from engine.storage.fidelity import load_scores_by_dataset

    return {ds: {p: summarize(sc) for p, sc in sorted(by.items())} for ds, by in sorted(load_scores_by_dataset(conn).items())}


def provider_costs(conn: Handle) -> dict[str, float]:
    """USD billed per provider over the whole run: results' cost plus failed and aborted attempts'
    (:func:`engine.storage.dollars.provider_dollars`: the same bills as the datasets' ``cost_usd``, so the
    providers add up to the run's spend)."""
    out: dict[str, float] = {}
    for prov, cost in provider_dollars(conn).items():
        name = prov or UNKNOWN_PROVIDER
        out[name] = out.get(name, 0.0) + cost
    return out


def collect_status(run_dir: Path, now: float | None = None) -> dict[str, Any]:
    """Return the status document (see module docstring and docs/commands.md, `datagen status`).

    Raises:
        StatusError: no store in ``run_dir``.
    """
    now = time.time() if now is None else now
    conn = connect_ro(run_dir)
    try:
        why = not_ready(conn)
        if why is not None:
            raise StatusError(f"{run_dir}: the store is not initialised yet (a run is starting, or one was killed "
                              f"while creating it: run it again) ({why})")
        name = get_meta(conn, "run_name") or "?"
        rt = read.runtime(conn)
        pid, started_at, hb, rstate, reason, elapsed, live_json = rt if rt else (None, None, None, None, "", 0.0, None)
        live = json.loads(live_json) if live_json else {}
        lock = holder(Path(run_dir))  # who holds RUN_DIR/run.lock (the live `datagen run` or `validate`), or None
        alive = engine_alive(pid, hb, lock, now)
        # a live engine answers with its own figures (engine.report.statusserver): the dashboard's, now
        served = ask_engine(Path(run_dir)) if alive else None
        if served is not None:
            live = served.get("live") or {}
            rstate, reason, elapsed = served.get("state"), served.get("state_reason", ""), served.get("elapsed_s")
        engine_counts: dict[str, dict[str, Any]] = live.get("counts", {}) if served is not None else {}
        reasons: dict[str, str] = live.get("state_reason", {}) if alive else {}
        counts = read.prompt_states(conn)
        tokens = read.token_totals(conn)
        sources = read.usage_sources(conn)  # older stores: all reported
        special = read.special_text_counts(conn)
        dollars = dataset_dollars(conn)  # its results' and its failed and aborted attempts' bills
        errors = read.error_counts(conn)
        datasets = []
        for row in read.dataset_rows(conn):  # older stores: no Hub datasets, no ingest_error
            dname, control, reason_d, rejected, budget, dpath, revision, fp, ingest_error = (
                row[k] for k in ("name", "state", "state_reason", "rejected", "token_budget", "path", "revision",
                                 "fingerprint", "ingest_error"))
            c = counts.get(dname, {})
            done, failed, pend = c.get("done", 0), c.get("failed", 0), c.get("pending", 0)
            prompts = done + failed + pend
            in_flight = min(int(live.get("in_flight", {}).get(dname, 0)), pend) if alive else 0
            skipped = pend - in_flight if control in ("skipped", "budget_met") else 0
            pending = pend - in_flight - skipped
            p, ct, r = tokens.get(dname, (0, 0, 0))
            usd = dollars.get(dname, Dollars())
            cost, lost_d = usd.results_usd + usd.lost_usd, usd.lost_usd
            ec = engine_counts.get(dname)
            if ec is not None:  # the engine's counters: ahead of the committed rows, as on its dashboard
                prompts, done, failed, skipped, pending, in_flight = (
                    int(ec[k]) for k in ("prompts", "done", "failed", "skipped", "pending", "in_flight"))
                p, ct, r, cost = ec["prompt_tokens"], ec["completion_tokens"], ec["reasoning_tokens"], ec["cost_usd"]
            if alive and dname in reasons:  # the engine's reason: it re-decided states at its start
                reason_d = reasons[dname]
            if alive and dname in live.get("datasets", {}):
                state = live["datasets"][dname]
            elif ingest_error is not None:  # its last ingest failed: nothing of that read was stored
                state, reason_d = "stopped", f"ingest failed: {ingest_error}"
            elif fp is None:  # registered, never ingested (a first ingest going on, or one killed)
                state = "pending"
            elif control in ("skipped", "budget_met") or (control == "paused" and pend):  # paused, nothing left: done
                state = control
            elif pend == 0:
                state = "done"
            elif done or failed:
                state = "stopped"
            else:
                state = "pending"
            datasets.append({
                "name": dname, "path": dpath, "revision": revision,
                "state": state, "state_reason": reason_d, "prompts": prompts, "rejected": rejected,
                "done": done, "failed": failed, "skipped": skipped, "pending": pending, "in_flight": in_flight,
                "duplicates": c.get("dup", 0),
                "percent": progress_percent(done + failed, prompts),
                "prompt_tokens": p, "completion_tokens": ct, "reasoning_tokens": r,
                "cost_usd": round(cost, 8), "lost_cost_usd": round(lost_d, 8),
                "token_budget": budget, "errors": errors.get(dname, {}),
                "usage_sources": _sources(sources.get(dname, {})),
                "special_text_in_prompt": special.get(dname, 0),
                "reserved_tokens": int(live.get("reserved_tokens", {}).get(dname, 0)) if alive else 0,
                "cost_in_flight_usd": float(live.get("cost_in_flight", {}).get(dname, 0.0)) if alive and in_flight else 0.0,
                "projected_cost_usd": live.get("projected_cost_usd", {}).get(dname) if live else None,
                "projection_capped": bool(live.get("projection_capped", {}).get(dname, False)),
                "eta_s": live.get("eta_s", {}).get(dname) if alive else None,
                **_projection(live.get("projection", {}).get(dname), alive),
                "limit_reason": live.get("limit_reason", {}).get(dname, "") if alive else "",
            })
        if served is not None:  # the engine's own figure, taken as it answered
            run_state, elapsed_s = rstate, float(elapsed or 0.0)
        elif alive:
            run_state = rstate
            # extrapolate from the heartbeat while the run goes on; once it has ended the engine's own
            # figure is final (extrapolating past it would go backwards when the process exits)
            ended = rstate in ("completed", "stopped")
            elapsed_s = (elapsed or 0.0) + (0.0 if ended else max(0.0, now - hb))
            if (read_runtime(Path(run_dir)) or {}).get("final"):  # closing down: its socket closed, its last
                # elapsed file written; the last commit may be older than the figure its socket last gave
                elapsed_s = max(elapsed_s, persisted_elapsed(Path(run_dir), started_at, hb, elapsed_s))
        else:
            finished = all(d["state"] in ("done", "skipped", "budget_met") for d in datasets)
            run_state = "completed" if finished else "stopped" if rt else "not started"
            # never below what the engine's screen last showed: its elapsed file, kept every 0.5 s, may
            # be later than its last commit (engine.report.statusserver)
            elapsed_s = persisted_elapsed(Path(run_dir), started_at, hb, float(elapsed or 0.0))
            reason = reason if rstate not in ("running",) else "engine not running"
        if alive:
            eta_reason = live.get("eta_reason", "") if live.get("eta_s_run") is None else ""
        else:
            eta_reason = "" if run_state == "completed" else "engine not running"
        totals: dict[str, Any] = {}
        for k in ("prompts", "rejected", "done", "failed", "skipped", "pending", "in_flight", "duplicates",
                  "prompt_tokens", "completion_tokens", "reasoning_tokens", "special_text_in_prompt"):
            totals[k] = sum(d[k] for d in datasets)
        totals["cost_usd"] = round(sum(d["cost_usd"] for d in datasets), 8)
        totals["lost_cost_usd"] = round(sum(d["lost_cost_usd"] for d in datasets), 8)
        err_tot: dict[str, int] = {}
        for d in datasets:
            for k, v in d["errors"].items():
                err_tot[k] = err_tot.get(k, 0) + v
        totals["errors"] = err_tot
        totals["usage_sources"] = _sources({k: sum(d["usage_sources"][k] for d in datasets) for k in SOURCES})
        excluded = read.excluded_providers(conn)
        providers = live.get("providers") if alive else None
        if not providers:
            providers = providers_from_store(conn, excluded)
        else:  # live counters are since the engine started; dollars are the whole run's, like `spent`
            billed = provider_costs(conn)
            providers = [dict(p, cost_usd=round(billed.pop(p["name"], 0.0), 8)) for p in providers]
            providers += [p for p in providers_from_store(conn, excluded) if p["name"] in billed]
        providers = with_fidelity(conn, providers)
        if live.get("credits_usd") is None:
            credits_age = None
        elif live.get("credits_at") is not None:
            credits_age = max(0.0, now - live["credits_at"])
        else:
            credits_age = (live.get("credits_age_s") or 0.0) + (now - hb) if hb else None
        classes = [dict(c, in_flight=c.get("in_flight", 0) if alive else 0) for c in live.get("classes", [])]
        run_proj = _projection(live.get("run_projection"), alive)
        doc = {
            "run": {"name": name, "state": run_state, "state_reason": reason or "", "elapsed_s": round(elapsed_s, 3),
                    "pid": pid if alive else None, "alive": alive, "eta_reason": eta_reason,
                    "source": "engine" if served is not None else "store"},
            "datasets": datasets,
            "totals": totals,
            "credits_usd": live.get("credits_usd"),
            "credits_age_s": None if credits_age is None else round(credits_age, 3),
            "credits_drift_usd": live.get("credits_drift_usd"),
            **({"credits_endpoints": live["credits_endpoints"]} if live.get("credits_endpoints") else {}),
            "spend_rate_usd_per_h": (live.get("spend_rate_usd_per_h") if served is not None
                                     else spend_rate(conn, live, now, totals["in_flight"]) if alive else 0.0),
            "projected_total_cost_usd": live.get("projected_total_cost_usd"),
            "projection_capped": bool(live.get("projection_capped_run", False)),
            "max_cost_usd": live.get("max_cost_usd"),
            "cost_in_flight_usd": live.get("cost_in_flight_usd", 0.0) if alive else 0.0,
            "abort_cost_usd": live.get("abort_cost_usd", 0.0) if alive else 0.0,  # an estimate; basis below
            "abort_cost_basis": live.get("abort_cost_basis", "") if alive else "",
            "eta_s": live.get("eta_s_run") if alive else None,
            "projected_total_cost_low_usd": run_proj["projected_cost_low_usd"],
            "projected_total_cost_high_usd": run_proj["projected_cost_high_usd"],
            "eta_s_low": run_proj["eta_s_low"],
            "eta_s_high": run_proj["eta_s_high"],
            "calibration": run_proj["calibration"],
            "classes": classes,
            "providers": providers,
            "fidelity_by_dataset": fidelity_by_dataset(conn),
            "excluded_providers": excluded,
            "live": {"cost_in_flight_usd": live.get("cost_in_flight_usd", 0.0) if alive else 0.0},
        }
        if live.get("stream_workers"):  # as the engine last saw them (none alive once it is gone)
            sw = live["stream_workers"]
            doc["stream_workers"] = dict(sw, alive=sw.get("alive", 0) if alive else 0,
                                         frozen=sw.get("frozen", 0) if alive else 0,
                                         workers=[dict(w, alive=w.get("alive") and alive,
                                                       in_flight=w.get("in_flight", 0) if alive else 0,
                                                       frozen=bool(w.get("frozen")) and alive,
                                                       silent_s=w.get("silent_s", 0.0) if alive else 0.0)
                                                  for w in sw.get("workers", [])])
        if live.get("endpoints"):  # several base_urls: as the engine last saw them (nothing in flight once it is gone)
            doc["endpoints"] = [dict(e, in_flight=e.get("in_flight", 0) if alive else 0) for e in live["endpoints"]]
    finally:
        conn.close()
    from engine.extract.status import status_fields

    doc["lock"] = lock.as_dict() if lock is not None else None
    doc.update(status_fields(Path(run_dir)))  # "extract" (per worker) and "gpus" (NVML, or why not)
    return doc


def _sources(counts: dict[str, int]) -> dict[str, int]:
    """Results per ``usage_source`` (every source of :data:`engine.money.usage.SOURCES`, 0 when none)."""
    return {k: int(counts.get(k, 0)) for k in SOURCES}


def _projection(p: dict[str, Any] | None, alive: bool) -> dict[str, Any]:
    """A live row's projection range as status fields (ETAs only while the engine runs)."""
    p = p or {}
    cal = p.get("calibration")
    return {
        "projected_cost_low_usd": p.get("cost_low_usd"), "projected_cost_high_usd": p.get("cost_high_usd"),
        "eta_s_low": p.get("eta_s_low") if alive else None, "eta_s_high": p.get("eta_s_high") if alive else None,
        "calibration": {"observed": cal[0], "needed": cal[1]} if cal else None,
    }


def _usd(v: float | None) -> str:
    return "--" if v is None else f"${v:,.4f}" if abs(v) < 1 else f"${v:,.2f}"


def _cal(d: dict[str, Any]) -> tuple[int, int] | None:
    c = d.get("calibration")
    return (c["observed"], c["needed"]) if c else None


def format_status(doc: dict[str, Any]) -> str:
    """Human-readable rendering of :func:`collect_status`'s document: the run line, money and time
    (spent, spend rate, projection or ``capped at $X``, ETA or ``-- (why)``, credits), class limits,
    a line per stream worker up but not answering (frozen), then one row per dataset (its percentage rounded
    down), and the extraction's line when one ran."""
    r = doc["run"]
    lines = [f"run {r['name']}: {r['state']}" + (f" ({r['state_reason']})" if r["state_reason"] else "")
             + f", elapsed {fmt_duration(r['elapsed_s'])}"]
    if doc.get("lock"):
        k = doc["lock"]
        lines.append(f"run directory held by pid {k['pid']} on {k['host']} since {k['since_utc']} ({k['command']})")
    t = doc["totals"]
    cal = _cal(doc)
    proj = range_text(doc.get("projected_total_cost_usd"), doc.get("projected_total_cost_low_usd"),
                      doc.get("projected_total_cost_high_usd"), cal, _usd)
    if doc.get("projection_capped"):  # spend cannot pass the cap: never a projection above it
        at = doc.get("projected_total_cost_usd") if cal is None else doc.get("projected_total_cost_high_usd")
        cap = doc.get("max_cost_usd")
        if at is not None and cap is not None and at > cap + 0.005:  # the streams in flight pass the cap
            proj = f"{_usd(at)} (over the {_usd(cap)} cap: streams in flight)"
        else:
            proj = f"capped at {_usd(at if at is not None else cap)}"
    if not r["alive"] and r["state"] == "completed":
        eta = "0s"
    elif doc.get("eta_s") is None:
        eta = f"-- ({r.get('eta_reason') or r['state']})"
    else:
        eta = range_text(doc.get("eta_s"), doc.get("eta_s_low"), doc.get("eta_s_high"), cal, fmt_duration, short=True)
    credits = "--"
    if doc.get("credits_usd") is not None:
        credits = _usd(doc["credits_usd"])
        ce = doc.get("credits_endpoints")
        if ce and ce["missing"]:
            credits += f" (partial: {ce['read']} of {ce['of']} endpoints)"
        if doc.get("credits_age_s") is not None:
            credits += f" (read {fmt_duration(doc['credits_age_s'])} ago)"
    lines.append(f"spent {_usd(t['cost_usd'])}  rate {_usd(doc.get('spend_rate_usd_per_h'))}/h  "
                 f"projected {proj}  ETA {eta}  credits {credits}")
    if doc.get("classes"):
        lines.append("concurrency " + "  ".join(
            f"{c['name']} {c['in_flight']}/{c['concurrency']}" + (f" (configured {c['configured']}, max {c['max']})"
                                                                  if c.get("configured") and c["concurrency"] != c["configured"] else "")
            for c in doc["classes"]))
    for e in doc.get("endpoints") or ():
        errs = ", ".join(f"{k} {v}" for k, v in sorted(e["errors"].items()))
        cap = "" if e.get("concurrency") is None else f"/{e['concurrency']}"
        lines.append(f"endpoint {e['url']}: {e['state']}" + (f" ({e['reason']})" if e.get("reason") else "")
                     + f", in flight {e['in_flight']}{cap}, requests {e['requests']}"
                     + (f", errors {errs}" if errs else "") + f", {e['tok_per_s']:.0f} tok/s")
    for w in (doc.get("stream_workers") or {}).get("workers", ()):
        if w.get("frozen"):  # up, and silent: stopped (SIGSTOP, a debugger) or its loop blocked
            lines.append(f"stream worker {w['slot']} (pid {w['pid']}): not answering for "
                         f"{fmt_duration(w.get('silent_s') or 0)} (stopped or frozen); {w['in_flight']} stream(s) "
                         f"wait for it")
    src = t.get("usage_sources") or {}
    other = {k: n for k, n in src.items() if k != "reported" and n}
    if other:
        lines.append(f"usage: {sum(other.values())} result(s) accounted at our own figures, not the provider's "
                     "reported usage: " + ", ".join(f"{n} {k}" for k, n in other.items()) + " (usage_source)")
    hdr = (f"{'dataset':<24} {'state':<9} {'%':>4} {'done':>7} {'failed':>6} {'skip':>6} {'pend':>7} {'infl':>5} "
           f"{'rej':>4} {'compl tok':>10} {'cost $':>9} {'ETA':>11}  errors")
    lines.append(hdr)
    for d in doc["datasets"] + [dict(doc["totals"], name="TOTAL", state="")]:
        errs = ", ".join(f"{k} {v}" for k, v in sorted(d["errors"].items()))
        note = d.get("limit_reason") or ""
        if d["name"] == "TOTAL" or d["state"] in ("done", "skipped", "budget_met"):
            eta_d = ""
        elif d["state"] not in ("running", "pending") or not r["alive"] or d.get("eta_s") is None and not _cal(d):
            eta_d = "--"
        else:
            eta_d = range_text(d.get("eta_s"), d.get("eta_s_low"), d.get("eta_s_high"), _cal(d), fmt_duration, short=True)
            if eta_d.startswith("calibrating"):
                eta_d = "cal {observed}/{needed}".format(**d["calibration"])
        pct = f"{progress_percent(d['done'] + d['failed'], d['prompts'])}%"  # 99% until the last one ends
        lines.append(
            f"{d['name'][:24]:<24} {d['state']:<9} {pct:>4} {d['done']:>7} {d['failed']:>6} {d['skipped']:>6} "
            f"{d['pending']:>7} {d['in_flight']:>5} {d['rejected']:>4} {fmt_count(d['completion_tokens']):>10} {d['cost_usd']:>9.4f} "
            f"{eta_d:>11}  {errs}" + (f"  [{note}]" if note else "")
        )
    from engine.extract.snapshot import JobState

    ex = doc.get("extract") or {}
    if ex.get("state") not in (None, JobState.NOT_STARTED):  # its rate: the last minute's, else "avg ... tok/s"
        from engine.extract.status import format_line

        lines.append(format_line(ex))
    flagged = [(d["name"], d["special_text_in_prompt"]) for d in doc["datasets"] if d.get("special_text_in_prompt")]
    if flagged:
        lines.append("special_text_in_prompt: " + ", ".join(f"{name} {n}" for name, n in flagged)
                     + " prompt(s) with special-token text typed in their messages (sent as special ids; "
                       "[tokenizer] prompt_special_text = \"reject\" rejects them at ingest)")
    dups = [(d["name"], d["duplicates"]) for d in doc["datasets"] if d.get("duplicates")]
    if dups:
        lines.append("duplicates: " + ", ".join(f"{name} {n}" for name, n in dups) + " prompt(s) also in another "
                     "dataset, bought there once (not in these prompts; [run] cross_dataset_duplicates)")
    return "\n".join(lines)


def watch_status(run_dir: Path, interval_s: float, *, as_json: bool = False, out: TextIO | None = None,
                 max_updates: int | None = None) -> int:
    """``datagen status --watch``: print the status every ``interval_s`` seconds until the engine
    exits (the last document shows the run's end), ``max_updates`` prints, or Ctrl-C.

    Text mode redraws the screen on a terminal (and separates frames with a blank line otherwise);
    ``as_json`` prints one JSON document per line. Returns 0, or 1 when the run directory has no store.
    """
    out = out or sys.stdout
    tty = out.isatty()
    seen_alive = False
    n = 0
    while True:
        try:
            doc = collect_status(Path(run_dir))
        except StatusError as e:
            if not Path(db_path(Path(run_dir))).exists():
                print(f"error: {e}", file=sys.stderr)
                return 1
            doc = None  # the store is being created: wait for it
        if doc is not None:
            if as_json:
                out.write(json.dumps(doc) + "\n")
            else:
                out.write(("\x1b[H\x1b[2J" if tty else ("\n" if n else "")) + format_status(doc) + "\n")
            out.flush()
            n += 1
            alive = doc["run"]["alive"]
            seen_alive = seen_alive or alive
            if not alive or (max_updates is not None and n >= max_updates):
                return 0
        time.sleep(interval_s)
