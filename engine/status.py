"""``datagen status``: the run's figures read from its store, from any shell, live or after the run.

Committed rows give done/failed/tokens/cost/errors; the live engine's ``runtime`` row (refreshed
in the same transaction as every commit) gives in-flight counts and the run state. A run whose
engine is gone (no such pid, or no heartbeat for :data:`STALE_S`) has nothing in flight.
Invariant of every dataset entry: ``done + failed + skipped + pending + in_flight == prompts``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from engine.rates import fmt_count, fmt_duration
from engine.store import db_path

#: Seconds without a heartbeat after which a run is considered not running.
STALE_S = 15.0


class StatusError(Exception):
    """The run directory has no readable store."""


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def connect_ro(run_dir: Path) -> sqlite3.Connection:
    """Open the run's store read-only.

    Raises:
        StatusError: no store in ``run_dir``.
    """
    path = db_path(Path(run_dir))
    if not path.exists():
        raise StatusError(f"{run_dir}: no run store here (expected {path})")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    conn.execute("PRAGMA busy_timeout=10000")
    return conn


def collect_status(run_dir: Path, now: float | None = None) -> dict[str, Any]:
    """Return the status document (see module docstring and README 'datagen status').

    Raises:
        StatusError: no store in ``run_dir``.
    """
    now = time.time() if now is None else now
    conn = connect_ro(run_dir)
    try:
        try:
            conn.execute("SELECT 1 FROM meta, datasets, prompts, results, attempts, runtime LIMIT 0")
        except sqlite3.DatabaseError as e:
            raise StatusError(f"{run_dir}: the store is not initialised yet (a run is starting, or one was killed "
                              f"while creating it: run it again) ({e})") from None
        name = (conn.execute("SELECT value FROM meta WHERE key='run_name'").fetchone() or ["?"])[0]
        rt = conn.execute("SELECT pid, started_at, heartbeat_at, state, state_reason, elapsed_s, live FROM runtime").fetchone()
        pid, started_at, hb, rstate, reason, elapsed, live_json = rt if rt else (None, None, None, None, "", 0.0, None)
        live = json.loads(live_json) if live_json else {}
        alive = bool(rt) and _alive(pid) and hb is not None and now - hb < STALE_S
        counts: dict[str, dict[str, int]] = {}
        for d, s, n in conn.execute("SELECT dataset, state, COUNT(*) FROM prompts GROUP BY 1, 2"):
            counts.setdefault(d, {})[s] = n
        usage = {
            d: (p or 0, c or 0, r or 0, cost or 0.0)
            for d, p, c, r, cost in conn.execute(
                "SELECT dataset, SUM(prompt_tokens), SUM(completion_tokens), SUM(reasoning_tokens), "
                "SUM(COALESCE(cost_usd,0)) FROM results GROUP BY dataset"
            )
        }
        lost = {d: c or 0.0 for d, c in conn.execute(
            "SELECT dataset, SUM(cost_usd) FROM attempts WHERE outcome!='ok' AND cost_usd IS NOT NULL GROUP BY dataset")}
        errors: dict[str, dict[str, int]] = {}
        for d, c, n in conn.execute("SELECT dataset, error_class, COUNT(*) FROM attempts WHERE outcome='error' GROUP BY 1, 2"):
            errors.setdefault(d, {})[c] = n
        datasets = []
        for dname, control, reason_d, rejected, budget in conn.execute(
            "SELECT name, state, state_reason, rejected, token_budget FROM datasets ORDER BY position"
        ):
            c = counts.get(dname, {})
            done, failed, pend = c.get("done", 0), c.get("failed", 0), c.get("pending", 0)
            prompts = done + failed + pend
            in_flight = min(int(live.get("in_flight", {}).get(dname, 0)), pend) if alive else 0
            skipped = pend - in_flight if control in ("skipped", "budget_met") else 0
            pending = pend - in_flight - skipped
            if alive and dname in live.get("datasets", {}):
                state = live["datasets"][dname]
            elif control in ("skipped", "paused", "budget_met"):
                state = control
            elif pend == 0:
                state = "done"
            elif done or failed:
                state = "stopped"
            else:
                state = "pending"
            p, ct, r, cost = usage.get(dname, (0, 0, 0, 0.0))
            lost_d = lost.get(dname, 0.0)
            datasets.append({
                "name": dname, "state": state, "state_reason": reason_d, "prompts": prompts, "rejected": rejected,
                "done": done, "failed": failed, "skipped": skipped, "pending": pending, "in_flight": in_flight,
                "prompt_tokens": p, "completion_tokens": ct, "reasoning_tokens": r,
                "cost_usd": round(cost + lost_d, 8), "lost_cost_usd": round(lost_d, 8),
                "token_budget": budget, "errors": errors.get(dname, {}),
                "reserved_tokens": int(live.get("reserved_tokens", {}).get(dname, 0)) if alive else 0,
                "projected_cost_usd": live.get("projected_cost_usd", {}).get(dname) if live else None,
                "eta_s": live.get("eta_s", {}).get(dname) if alive else None,
            })
        if alive:
            run_state = rstate
            elapsed_s = (elapsed or 0.0) + (now - hb)
        else:
            finished = all(d["state"] in ("done", "skipped", "budget_met") for d in datasets)
            run_state = "completed" if finished else "stopped" if rt else "not started"
            elapsed_s = elapsed or 0.0
            reason = reason if rstate not in ("running",) else "engine not running"
        totals: dict[str, Any] = {}
        for k in ("prompts", "rejected", "done", "failed", "skipped", "pending", "in_flight",
                  "prompt_tokens", "completion_tokens", "reasoning_tokens"):
            totals[k] = sum(d[k] for d in datasets)
        totals["cost_usd"] = round(sum(d["cost_usd"] for d in datasets), 8)
        totals["lost_cost_usd"] = round(sum(d["lost_cost_usd"] for d in datasets), 8)
        err_tot: dict[str, int] = {}
        for d in datasets:
            for k, v in d["errors"].items():
                err_tot[k] = err_tot.get(k, 0) + v
        totals["errors"] = err_tot
        doc = {
            "run": {"name": name, "state": run_state, "state_reason": reason or "", "elapsed_s": round(elapsed_s, 3),
                    "pid": pid if alive else None, "alive": alive},
            "datasets": datasets,
            "totals": totals,
            "credits_usd": live.get("credits_usd"),
            "credits_age_s": (live.get("credits_age_s") or 0.0) + (now - hb) if live.get("credits_usd") is not None and hb else None,
            "credits_drift_usd": live.get("credits_drift_usd"),
            "spend_rate_usd_per_h": live.get("spend_rate_usd_per_h", 0.0) if alive else 0.0,
            "projected_total_cost_usd": live.get("projected_total_cost_usd"),
            "cost_in_flight_usd": live.get("cost_in_flight_usd", 0.0) if alive else 0.0,
            "eta_s": live.get("eta_s_run") if alive else None,
            "providers": live.get("providers", []),
            "excluded_providers": json.loads((conn.execute("SELECT value FROM meta WHERE key='excluded_providers'")
                                              .fetchone() or ["[]"])[0]),
            "live": {"cost_in_flight_usd": live.get("cost_in_flight_usd", 0.0) if alive else 0.0},
        }
    finally:
        conn.close()
    from engine.extract.status import status_fields

    doc.update(status_fields(Path(run_dir)))  # "extract" (per worker) and "gpus" (NVML, or why not)
    return doc


def format_status(doc: dict[str, Any]) -> str:
    """Human-readable rendering of :func:`collect_status`'s document."""
    r = doc["run"]
    lines = [f"run {r['name']}: {r['state']}" + (f" ({r['state_reason']})" if r["state_reason"] else "")
             + f", elapsed {fmt_duration(r['elapsed_s'])}"]
    hdr = f"{'dataset':<24} {'state':<9} {'done':>7} {'failed':>6} {'skip':>6} {'pend':>7} {'infl':>5} {'rej':>4} {'compl tok':>10} {'cost $':>9}  errors"
    lines.append(hdr)
    for d in doc["datasets"] + [dict(doc["totals"], name="TOTAL", state="")]:
        errs = ", ".join(f"{k} {v}" for k, v in sorted(d["errors"].items()))
        lines.append(
            f"{d['name'][:24]:<24} {d['state']:<9} {d['done']:>7} {d['failed']:>6} {d['skipped']:>6} {d['pending']:>7} "
            f"{d['in_flight']:>5} {d['rejected']:>4} {fmt_count(d['completion_tokens']):>10} {d['cost_usd']:>9.4f}  {errs}"
        )
    return "\n".join(lines)
