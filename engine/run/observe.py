"""Building the engine's immutable snapshot and the store's live row from scheduler counters.

Pure reads of in-memory state: no I/O, no awaits. Kept apart from :mod:`engine.run.scheduler` so the
dispatch logic and the reporting logic can be read separately.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Protocol

from engine.metrics.stats import ProviderSnapshot
from engine.money.inflight import abort_basis
from engine.money.projection import EtaRow, project_run, schedule_eta
from engine.report.snapshot import ClassSnapshot, DatasetSnapshot, RunSnapshot
from engine.run.drainview import outlook
from engine.run.limiter import concurrency_cap
from engine.run.runstate import TERMINAL_CONTROLS, Control, DatasetState, RunPhase, RunState

if TYPE_CHECKING:
    from engine.config import Config
    from engine.money.spend import SpendControl
    from engine.run.ending import RunEnding
    from engine.run.limiter import AdjustableLimiter
    from engine.run.seams import EndpointsFn, WorkersFn
    from engine.run.telemetry import Telemetry
    from engine.storage.writer import StoreWriter


class RunView(Protocol):
    """What the snapshot builder reads of a run (:class:`engine.run.scheduler.Scheduler` fits it):
    the run state, the config, the spend ledger, the telemetry, the class limiters, the writer's
    queue and the run's ending (the dollars in flight, a drain's deadline). Reads only."""

    runstate: RunState
    cfg: "Config"
    spend: "SpendControl"
    telemetry: "Telemetry"
    limiters: "dict[str, AdjustableLimiter]"
    writer: "StoreWriter"
    clock: Callable[[], float]

    endpoints: "EndpointsFn | None"
    workers: "WorkersFn | None"
    ending: "RunEnding"

    def elapsed_s(self) -> float: ...

#: Seconds after its budget last held dispatch back that a dataset still reads "budget-limited".
LIMITED_HOLD_S = 2.0
#: Run states in which the run makes progress (an ETA counts down only in these).
PROGRESSING = (RunPhase.STARTING, RunPhase.RUNNING)


_ENDED_AT: "weakref.WeakKeyDictionary[RunView, float]" = weakref.WeakKeyDictionary()


def run_elapsed_s(sched: "RunView") -> float:
    """The run's elapsed seconds (``Scheduler.elapsed_s``), frozen once the run has ended (its done
    event set: completed, or stopped with nothing left in flight), so the dashboard's header, the
    store's runtime row and ``datagen status`` read the same figure after the end instead of a clock
    that keeps counting. The first snapshot taken after the end fixes the value."""
    ended = _ENDED_AT.get(sched)
    if ended is not None:
        return ended
    now = sched.elapsed_s()
    if sched.runstate.done.is_set():
        _ENDED_AT[sched] = now
    return now


_LIVE: "weakref.WeakKeyDictionary[RunView, tuple[float, tuple, dict[str, Any]]]" = weakref.WeakKeyDictionary()
#: Seconds the live row's figures (projections, dollars, providers) are reused between commits; the
#: in-flight counts and the state are always the commit's own (``status`` adds them to committed rows).
LIVE_TTL_S = 0.25


def live_row(sched: "RunView") -> dict[str, Any]:
    """Fields of the store's ``runtime`` row written at every commit (see :class:`~engine.storage.writer.StoreWriter`):
    pid, start, state, elapsed and the live figures ``datagen status`` merges with committed rows.

    Under load a commit follows every group of results (up to 20 a second): the figures built from a
    snapshot are reused for :data:`LIVE_TTL_S` unless the run's or a dataset's control state, or the
    credits reading, changed since; the in-flight counts, the datasets' states, the run state and
    elapsed are taken at each call (``datagen status`` adds the counts to the committed rows:
    ``done + failed + skipped + pending + in_flight == prompts`` holds at every commit)."""
    now = sched.clock()
    cached = _LIVE.get(sched)
    rs = sched.runstate
    # what changes the figures at once: a pause, resume, skip or stop, a new credits reading
    key = (rs.phase, rs.reason, rs.paused, rs.done.is_set(), id(sched.spend.credits),
           tuple((rt.control, rt.reason) for rt in rs.datasets.values()))
    if cached is not None and now - cached[0] < LIVE_TTL_S and cached[1] == key:
        row = dict(cached[2])
        live = dict(row["live"])
        live["in_flight"] = {name: rt.in_flight for name, rt in rs.datasets.items()}
        live["datasets"] = {name: stopping_state(rt.state(rs.paused), rs.phase, rt.in_flight)
                            for name, rt in rs.datasets.items()}
        row.update(state=rs.phase, state_reason=rs.reason, elapsed_s=run_elapsed_s(sched), live=live)
        return row
    row = _live_row(sched)
    _LIVE[sched] = (now, key, row)
    return row


def engine_status(sched: "RunView") -> dict[str, Any]:
    """What the live engine answers ``datagen status`` with (:mod:`engine.report.statusserver`): the
    fields of :func:`live_row`, built afresh from one snapshot taken now (never the cached figures),
    plus ``live["counts"]``: per dataset the snapshot's ``done``, ``failed``, ``skipped``,
    ``pending``, ``in_flight`` (they sum to its prompts), its tokens and ``cost_usd`` (USD): the
    figures the dashboard shows at the same moment, ahead of the committed rows."""
    snap = build_snapshot(sched)
    row = _live_row(sched, snap)
    row["live"]["counts"] = {
        d.name: {"prompts": d.prompts, "done": d.done, "failed": d.failed, "skipped": d.skipped, "pending": d.pending,
                 "in_flight": d.in_flight, "prompt_tokens": d.prompt_tokens, "completion_tokens": d.completion_tokens,
                 "reasoning_tokens": d.reasoning_tokens, "cost_usd": d.cost_usd}
        for d in snap.datasets}
    row["live"]["in_flight_total"] = snap.in_flight
    return row


def _live_row(sched: "RunView", snap: RunSnapshot | None = None) -> dict[str, Any]:
    snap = snap if snap is not None else build_snapshot(sched)
    cr = sched.spend.credits
    routing = sched.cfg.provider.routing
    return {
        "pid": os.getpid(),
        "started_at": sched.runstate.started_wall,
        "state": sched.runstate.phase,
        "state_reason": sched.runstate.reason,
        "elapsed_s": snap.elapsed_s,
        "live": {
            "in_flight": {d.name: d.in_flight for d in snap.datasets},
            "cost_in_flight": {d.name: sched.ending.cost_in_flight_usd(d.name) for d in snap.datasets if d.in_flight},
            "datasets": {d.name: d.state for d in snap.datasets},
            "state_reason": {d.name: d.state_reason for d in snap.datasets},
            "reserved_tokens": {d.name: d.reserved_tokens for d in snap.datasets},
            "projected_cost_usd": {d.name: d.projected_cost_usd for d in snap.datasets},
            "projection_capped": {d.name: d.projection_capped for d in snap.datasets},
            "eta_s": {d.name: d.eta_s for d in snap.datasets},
            "projection": {d.name: {"cost_low_usd": d.projected_cost_low_usd, "cost_high_usd": d.projected_cost_high_usd,
                                    "eta_s_low": d.eta_s_low, "eta_s_high": d.eta_s_high,
                                    "calibration": list(d.calibration) if d.calibration else None}
                           for d in snap.datasets},
            "limit_reason": {d.name: d.limit_reason for d in snap.datasets},
            "concurrency": {c.name: c.concurrency for c in snap.classes},
            "classes": [{"name": c.name, "concurrency": c.concurrency, "configured": c.configured,
                         "max": c.max_concurrency, "in_flight": c.in_flight, "max_tokens": c.max_tokens}
                        for c in snap.classes],
            "credits_usd": snap.credits_usd,
            "credits_age_s": snap.credits_age_s,
            "credits_at": (time.time() - (sched.clock() - cr.at)) if cr else None,
            "credits_drift_usd": sched.spend.drift_usd(),
            **({"credits_endpoints": {"read": cr.endpoints - len(cr.missing), "of": cr.endpoints,
                                      "missing": list(cr.missing)}} if cr is not None and cr.endpoints > 1 else {}),
            "spend_rate_usd_per_h": snap.spend_rate_usd_per_h,
            # wall-clock start of the spend rate's window (the first dispatch): `status` computes the
            # rate from the store at read time, as the dashboard does from the same window
            "spend_rate_since": (None if (t0 := sched.telemetry.usd_rate.started) is None
                                 else time.time() - (sched.clock() - t0)),
            "projected_total_cost_usd": snap.projected_total_cost_usd,
            "max_cost_usd": snap.max_cost_usd,
            "cost_in_flight_usd": snap.cost_in_flight_usd,
            "abort_cost_usd": snap.abort_cost_usd,
            "abort_cost_basis": snap.abort_cost_basis,
            "eta_s_run": snap.eta_s,
            "eta_reason": snap.eta_reason,
            "projection_capped_run": snap.projection_capped,
            "run_projection": {"cost_low_usd": snap.projected_cost_low_usd, "cost_high_usd": snap.projected_cost_high_usd,
                               "eta_s_low": snap.eta_s_low, "eta_s_high": snap.eta_s_high,
                               "calibration": list(snap.calibration) if snap.calibration else None},
            "providers": [dataclasses.asdict(p) for p in snap.providers],
            "excluded_providers": list(sched.runstate.excluded_providers),
            "routing_providers": sorted({n for lst in (routing.order, routing.only, routing.ignore) for n in lst or ()}),
            **({"endpoints": [dataclasses.asdict(e) for e in snap.endpoints]} if snap.endpoints else {}),
            **({"stream_workers": _workers_live(sched)} if sched.workers is not None else {}),
        },
    }

def with_judged(providers: tuple[ProviderSnapshot, ...], fidelity: dict[str, dict[str, Any]],
                excluded: set[str]) -> tuple[ProviderSnapshot, ...]:
    """``providers`` (this engine's since its start) with their fidelity objects, plus a row for every judged
    provider that has not answered since: a provider a drift excluded before a restart answers no more, yet
    its verdict must stay on the screen (``i``) and in ``x``'s list, where it can be cleared."""
    seen = {p.name for p in providers}
    out = [dataclasses.replace(p, fidelity=fidelity.get(p.name)) for p in providers]
    out += [ProviderSnapshot(name=name, requests=0, errors={}, error_rate=0.0, latency_p50_s=None, latency_p95_s=None,
                             ttft_p50_s=None, ttft_p95_s=None, tok_per_s_per_stream=None, mean_completion_tokens=None,
                             cost_usd=0.0, excluded=name in excluded, fidelity=f)
            for name, f in sorted(fidelity.items()) if name not in seen]
    return tuple(out)


def _workers_live(sched: "RunView") -> dict[str, Any]:
    """``status --json``'s ``stream_workers``: configured, alive, restarts, requests returned to
    pending by a worker's death, completions recovered from a dead worker's journal, workers up but
    not answering (``frozen``), requests held back unsent by a pause, skip or stop since start
    (``held_back``), the most one worker had waiting unsent at once (``unsent_peak``), per worker
    (``frozen``, ``silent_s``: seconds not heard from, ``unsent``: handed to it and not sent yet, as of
    its last heartbeat)."""
    workers = sched.workers
    assert workers is not None  # the caller checks
    f = workers()
    return {"configured": f.configured, "alive": f.alive, "restarts": f.restarts, "lost_requests": f.lost_requests,
            "recovered": f.recovered, "frozen": f.frozen, "held_back": f.held_back, "unsent_peak": f.unsent_peak,
            "workers": [{"slot": w.slot, "pid": w.pid, "alive": w.alive, "in_flight": w.in_flight, "frozen": w.frozen,
                         "silent_s": w.silent_s, "unsent": w.unsent} for w in f.workers]}


def build_snapshot(sched: "RunView") -> RunSnapshot:
    """Return an immutable snapshot of the scheduler's run (O(datasets + classes + providers))."""
    now = sched.clock()
    tel = sched.telemetry
    run = sched.runstate
    dss = []
    projections = []
    errors: collections.Counter = collections.Counter()
    n_done = sum(rt.done for rt in run.datasets.values())
    run_mean = sum(rt.completion_tokens for rt in run.datasets.values()) / n_done if n_done else None
    run_prompt = sum(rt.prompt_tokens for rt in run.datasets.values()) / n_done if n_done else 0.0
    rc = sched.spend.run_cost
    run_room = None if rc.limit is None else rc.limit - rc.used  # what the run's dollar cap leaves (USD)
    parts = []
    for rt in run.datasets.values():
        terminal = rt.control in TERMINAL_CONTROLS
        pending = 0 if terminal else rt.pending_total
        proj = sched.spend.project(
            rt.name, prompts_left=pending, in_flight=rt.in_flight, cost_so_far=sched.spend.dataset_usd[rt.name],
            completion_tokens=rt.completion_tokens, recent_tok_per_s=rt.tok_rate.rate(now),
            since_start_tok_per_s=rt.tok_rate.rate_since_start(now), fallback_mean_tokens=run_mean,
            mean_prompt_tokens=(rt.prompt_tokens / rt.done) if rt.done else run_prompt,
            pending_by_class=rt.pending, run_room_usd=run_room,
            stream_tok_per_s=rt.tok_rate.rate(now) / rt.in_flight if rt.in_flight else 0.0,
        )
        projections.append(proj)
        state = stopping_state(rt.state(run.paused), run.phase, rt.in_flight)
        parts.append((rt, proj, state))
    # the rows' ETAs and the run's: one schedule (engine.money.projection.schedule_eta), so they agree
    sched_eta = schedule_eta([EtaRow.of(rt.name, state, lane_of(sched, rt), proj, rt.tok_rate.rate(now),
                                        limited=bool(_limit_reason(sched, rt, state, now)))
                              for rt, proj, state in parts], blocked=eta_blocked(sched))
    for rt, proj, state in parts:
        terminal = rt.control in TERMINAL_CONTROLS
        skipped = rt.pending_total if terminal else 0
        pending = 0 if terminal else rt.pending_total
        b = sched.spend.budgets[rt.name]
        recent = [m for e in b.estimators.values() if (m := e.mean()) is not None]
        eta, eta_low, eta_high = sched_eta.rows.get(rt.name, (None, None, None))  # none: it does not progress
        calibration = None if proj.calibrated or proj.tokens_to_come_high <= 0 else (proj.observed, proj.calibrate_after)
        dss.append(
            DatasetSnapshot(
                name=rt.name, state=state, state_reason=rt.reason, prompts=rt.prompts,
                rejected=rt.rejected, done=rt.done, failed=rt.failed, skipped=skipped, pending=pending,
                in_flight=rt.in_flight, prompt_tokens=rt.prompt_tokens, completion_tokens=rt.completion_tokens,
                reasoning_tokens=rt.reasoning_tokens, cost_usd=sched.spend.dataset_usd[rt.name], token_budget=rt.token_budget,
                errors=dict(rt.errors), req_per_s=rt.rate.rate(now), req_per_s_since_start=rt.rate.rate_since_start(now),
                tok_per_s=rt.tok_rate.rate(now),
                avg_completion_tokens=(rt.completion_tokens / rt.done) if rt.done else 0.0,
                eta_s=eta,
                eta_s_since_start=proj.eta_s_since_start if rt.name in sched_eta.rows else None,
                avg_completion_tokens_recent=(sum(recent) / len(recent)) if recent else 0.0,
                reserved_tokens=sched.spend.reserved_tokens(rt.name), max_cost_usd=b.cost.limit,
                projected_cost_usd=proj.projected_cost_usd, latest_sample=tel.sample(rt.name),
                projected_cost_low_usd=proj.cost_low_usd, projected_cost_high_usd=proj.cost_high_usd,
                eta_s_low=eta_low, eta_s_high=eta_high,
                calibration=calibration, limit_reason=_limit_reason(sched, rt, state, now),
                projection_capped=proj.capped, projected_cost_uncapped_usd=proj.uncapped_cost_usd,
            )
        )
        errors.update(rt.errors)
    classes = tuple(
        ClassSnapshot(c, lim.capacity, lim.in_use, sched.cfg.classes[c].max_tokens, sched.cfg.classes[c].concurrency,
                      concurrency_cap(sched.cfg.classes[c].concurrency))
        for c, lim in sched.limiters.items()
    )
    spend_rate = tel.spend_rate_usd_per_h(now, sum(d.in_flight for d in dss))
    cost = sum(d.cost_usd for d in dss)
    run_proj = project_run(projections, spend_rate, cost, cost_cap=rc.limit)
    cr = sched.spend.credits
    fly = sched.ending.in_flight_cost()
    providers, drain_left = tel.providers.snapshot(), sched.ending.drain_left_s()
    if tel.fidelity:
        providers = with_judged(providers, tel.fidelity, set(run.excluded_providers))
    waiting = fly.streams and (drain_left is not None or run.phase == RunPhase.PAUSED)  # the streams' outlook
    return RunSnapshot(
        name=sched.cfg.run.name, state=run.phase, state_reason=run.reason, elapsed_s=run_elapsed_s(sched),
        datasets=tuple(dss), classes=classes, in_flight=sum(d.in_flight for d in dss),
        req_per_s=run.rate.rate(now), cost_usd=cost, errors=dict(errors), writer_queue=sched.writer.queued,
        credits_usd=cr.remaining_usd if cr else None, credits_age_s=(now - cr.at) if cr else None,
        spend_rate_usd_per_h=spend_rate, projected_total_cost_usd=run_proj.projected_cost_usd,
        max_cost_usd=sched.spend.run_cost.limit, cost_in_flight_usd=fly.expected_usd,
        abort_cost_usd=fly.abort_usd, abort_cost_basis=abort_basis(fly, sched.spend.aborts),
        eta_s=sched_eta.eta_s, eta_reason=sched_eta.reason, projection_capped=run_proj.capped,
        tok_per_s=tel.tok_rate.rate(now), loop_lag_ms=tel.loop_lag_ms,
        providers=providers, latest_errors=dict(tel.latest_errors), history=tuple(tel.history),
        events=tuple(list(tel.events)[-50:]), notices=tuple(tel.notices), drain_left_s=drain_left,
        drain=outlook(sched, providers, drain_left) if waiting else None, run_dir=str(sched.cfg.run.dir),
        events_total=tel.events_total,
        projected_cost_low_usd=run_proj.cost_low_usd, projected_cost_high_usd=run_proj.cost_high_usd,
        eta_s_low=sched_eta.eta_s_low, eta_s_high=sched_eta.eta_s_high,
        calibration=run_proj.calibration, endpoints=sched.endpoints() if sched.endpoints is not None else (),
        **_worker_fields(sched),
    )


def lane_of(sched: "RunView", rt: Any) -> str:
    """The request class whose dispatcher serves dataset ``rt`` in the run's ETA
    (:class:`engine.money.projection.EtaRow`): the class most of its pending prompts use, else the
    class most of its in-flight requests use, else the config's first class."""
    if rt.pending and max(rt.pending.values()) > 0:
        return max(rt.pending, key=lambda c: rt.pending[c])
    flying = collections.Counter(cls for cls, _p, _e in rt.streams.values())
    if flying:
        return flying.most_common(1)[0][0]
    return next(iter(sched.cfg.classes), "")


def eta_blocked(sched: "RunView") -> str:
    """Why nothing in the run can progress now, whatever the datasets say ("" when something can):
    ``"paused"`` (the whole run), ``"stopping"`` / ``"stopped"`` / ``"completed"`` (the run's phase),
    or ``"run cost cap met"`` (its ``max_cost_usd`` spent, or a dataset refused by it with none
    running: in-flight requests may end, nothing more is sent)."""
    run = sched.runstate
    if run.phase in (RunPhase.STOPPING, RunPhase.STOPPED, RunPhase.COMPLETED):
        return str(run.phase)
    if run.paused:
        return "paused"
    rc = sched.spend.run_cost
    if rc.limit is not None:
        if rc.used >= rc.limit:
            return "run cost cap met"
        by_cap = any(rt.control == Control.BUDGET_MET and rt.reason.startswith("run cost cap")
                     for rt in run.datasets.values())
        if by_cap and not any(rt.state(run.paused) == DatasetState.RUNNING for rt in run.datasets.values()):
            return "run cost cap met"
    return ""


def _worker_fields(sched: "RunView") -> dict[str, int]:
    """The stream workers' figures for the snapshot (none when the run has no pool)."""
    if sched.workers is None:
        return {}
    f = sched.workers()
    return {"stream_workers": f.configured, "stream_workers_alive": f.alive, "stream_worker_restarts": f.restarts,
            "stream_workers_frozen": f.frozen}


def stopping_state(state: str, run_state: str, in_flight: int) -> str:
    """A dataset's shown state while the run stops (display only: the store's states are unchanged):
    ``"draining"`` when it still has requests in flight, ``"stopping"`` (``"stopped"`` once the run
    has stopped) for a running or pending one with none; otherwise (run not stopping, or a
    finished/paused dataset with nothing in flight) ``state``."""
    if run_state not in (RunPhase.STOPPING, RunPhase.STOPPED) or state in (
            DatasetState.DONE, DatasetState.SKIPPED, DatasetState.BUDGET_MET):
        return state
    if in_flight:
        return DatasetState.DRAINING
    return DatasetState(run_state) if state in (DatasetState.RUNNING, DatasetState.PENDING) else state


def _limit_reason(sched: "RunView", rt: Any, state: str, now: float) -> str:
    """``"budget-limited 5/24"`` (in flight / class slots) while the dataset's token budget holds its
    dispatch below the class's concurrency (now, or within the last :data:`LIMITED_HOLD_S`); "" otherwise."""
    if state != DatasetState.RUNNING or rt.control != Control.ACTIVE:
        return ""
    for cls, at in rt.limited_at.items():
        lim = sched.limiters.get(cls)
        held = cls in rt.blocked or now - at <= LIMITED_HOLD_S  # blocked now, or moments ago (no flicker)
        if lim is not None and held and rt.in_flight < lim.capacity and rt.pending.get(cls):
            return f"budget-limited {rt.in_flight}/{lim.capacity}"
    return ""
