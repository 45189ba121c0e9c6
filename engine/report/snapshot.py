"""Immutable snapshots of the engine's state: what the TUI, the headless reporter and tests read.

The engine builds a :class:`RunSnapshot` on demand from O(1) counters; nothing in it is shared
with the engine, so a reader can keep it as long as it likes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.client.endpoints import EndpointSnapshot  # part of the snapshot API
from engine.metrics.stats import ProviderSnapshot  # part of the snapshot API
from engine.money.drain import DrainOutlook  # part of the snapshot API


@dataclass(frozen=True, slots=True)
class DatasetSnapshot:
    """One dataset's figures.

    Attributes:
        name: dataset name.
        state: ``pending`` (not started) | ``running`` | ``paused`` | ``skipped`` | ``budget_met`` |
            ``done``; while the run stops (display only, the store keeps its state): ``draining``
            (requests in flight) | ``stopping`` | ``stopped`` (see ``engine.run.observe.stopping_state``).
        state_reason: why it is paused/skipped ("" otherwise).
        prompts: valid prompts ingested; rejected: rows rejected at ingest.
        done, failed, skipped, pending, in_flight: prompt counts; they sum to ``prompts``.
        prompt_tokens, completion_tokens, reasoning_tokens: billed tokens of stored results.
        cost_usd: summed ``usage.cost`` of stored results (USD).
        token_budget: configured completion-token budget or None.
        errors: failed attempts by error class.
        req_per_s: completions per second over the recent window (60 s).
        req_per_s_since_start: completions per second since this process started the dataset.
        tok_per_s: completion tokens per second over the recent window.
        avg_completion_tokens: mean completion tokens of stored results (since start of the run).
        eta_s: seconds to finish at the recent token rate (None when unknown).
        avg_completion_tokens_recent: mean completion tokens of the last ~200 results.
        eta_s_since_start: seconds to finish at the since-start token rate.
        reserved_tokens: tokens reserved by in-flight requests against the budget.
        max_cost_usd: the dataset's dollar cap, if any; projected_cost_usd: projected final cost.
        latest_sample: the most recent stored completion (for the sample inspector).
        projected_cost_low_usd / projected_cost_high_usd, eta_s_low / eta_s_high: the projection's
            range while calibrating (equal to the point figures once calibrated; None where unknown).
        calibration: ``(observed, needed)`` completions while the projection is calibrating, else None.
        limit_reason: why the dataset runs below its class's concurrency, e.g. ``"budget-limited
            5/24"`` (in flight / slots) when its token budget holds dispatch back; "" otherwise.
        projection_capped: a cap bound the projection: ``projected_cost_usd`` (and the range's high
            end) is clamped at the dataset's ``max_cost_usd`` or at what the run's ``max_cost_usd``
            leaves it (spend cannot pass a cap), or its token budget bound the tokens to come.
            Show "capped at $X" (X: ``projected_cost_usd``, or ``projected_cost_high_usd`` while
            calibrating) rather than a projection above the cap.
        projected_cost_uncapped_usd: the projection before any dollar clamp (USD): what the work
            would cost; the calibration gate compares it with ``max_cost_usd``.

    The ETAs (``eta_s`` and its range) are the dataset's finish in the run's schedule
    (:func:`engine.money.projection.schedule_eta`): its own ``tokens / recent rate`` while it runs
    alone in its request class, behind the datasets before it in its class otherwise; None while it
    does not progress (paused, finished, the run paused, stopping or at its cost cap).
    """

    name: str
    state: str
    state_reason: str
    prompts: int
    rejected: int
    done: int
    failed: int
    skipped: int
    pending: int
    in_flight: int
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cost_usd: float
    token_budget: int | None
    errors: dict[str, int] = field(default_factory=dict)
    req_per_s: float = 0.0
    req_per_s_since_start: float = 0.0
    tok_per_s: float = 0.0
    avg_completion_tokens: float = 0.0
    eta_s: float | None = None
    avg_completion_tokens_recent: float = 0.0
    eta_s_since_start: float | None = None
    reserved_tokens: int = 0
    max_cost_usd: float | None = None
    projected_cost_usd: float | None = None
    latest_sample: "SampleSnapshot | None" = None
    projected_cost_low_usd: float | None = None
    projected_cost_high_usd: float | None = None
    eta_s_low: float | None = None
    eta_s_high: float | None = None
    calibration: tuple[int, int] | None = None
    limit_reason: str = ""
    projection_capped: bool = False
    projected_cost_uncapped_usd: float | None = None

    @property
    def percent(self) -> int:
        """The finished share (done or failed) as a whole percentage (:func:`progress_percent`)."""
        return progress_percent(self.done + self.failed, self.prompts)


def progress_percent(finished: int, total: int) -> int:
    """``finished`` of ``total`` as a whole percentage, rounded down: 100 only once every one has
    finished (``4975/5000`` with 25 in flight reads 99, never 100); 0 when ``total`` is 0.

    Every percentage of a dataset printed (the dashboard's progress cell, ``datagen status``, the
    extraction view) goes through this."""
    if total <= 0:
        return 0
    return max(0, min(100, (max(0, finished) * 100) // total))


@dataclass(frozen=True, slots=True)
class SampleSnapshot:
    """The latest completion of a dataset, trimmed for display.

    Attributes:
        key: prompt key; prompt_tail: the end of the last prompt message (<= 500 chars);
        reasoning, content: trimmed to <= 2,000 chars each; tool_calls: names of called tools;
        finish_reason; provider; completion_tokens; validation: validation result text ("" until
        reconstruction runs); restored: True when it was stored by an earlier process of the run
        (read back from the store at start).
    """

    key: str
    prompt_tail: str
    reasoning: str
    content: str
    tool_calls: tuple[str, ...]
    finish_reason: str
    provider: str
    completion_tokens: int
    validation: str = ""
    restored: bool = False


@dataclass(frozen=True, slots=True)
class ClassSnapshot:
    """A request class: ``concurrency`` limit now, ``in_flight`` now, ``max_tokens`` cap (tokens),
    the ``configured`` concurrency and the highest one ``+`` / ``ctl concurrency`` may set
    (``max_concurrency``, see :func:`engine.run.limiter.concurrency_cap`; 0 = unknown)."""

    name: str
    concurrency: int
    in_flight: int
    max_tokens: int
    configured: int = 0
    max_concurrency: int = 0


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    """The whole run.

    Attributes:
        name: run name; state: ``starting`` | ``running`` | ``paused`` | ``draining`` |
            ``stopping`` | ``completed`` | ``stopped``; state_reason: why (pause, fatal error).
        elapsed_s: run seconds (earlier processes of the run included); stops counting when the run
            ends, so every reader (header, ``datagen status``) agrees afterwards.
        datasets, classes: per-dataset and per-class snapshots, in config order.
        in_flight: requests in flight; req_per_s: recent completions/s over all datasets.
        cost_usd: summed cost of stored results (USD); errors: failed attempts by class.
        writer_queue: rows waiting for the next commit.
        credits_usd / credits_age_s: provider credits left (USD) and the age of that reading (s).
        spend_rate_usd_per_h: recent spend rate (USD per hour; None until this engine billed anything
            while requests are in flight); projected_total_cost_usd: projected
            cost of the whole run; max_cost_usd: run-wide cap; cost_in_flight_usd: reserved dollars of
            in-flight requests (what an abort would save at most); abort_cost_usd: estimated bill of
            aborting them now (USD, :attr:`engine.money.inflight.InFlightCost.abort_usd`) and
            abort_cost_basis: how it was estimated (observed billing or the prior); eta_s: run ETA (s):
            the latest of the datasets' ETAs (:func:`engine.money.projection.schedule_eta`), so
            what the rows add up to; None when nothing can progress, and eta_reason says why
            (``"paused"``: the whole run, ``"run cost cap met"``, ``"all datasets paused"``,
            ``"measuring rate"``, ``"stopping"``, ``"completed"`` ...; "" while eta_s is known);
        projection_capped: the run's ``max_cost_usd`` clamped ``projected_total_cost_usd`` (or the
            range's high end): show "capped at $X" (X: the clamped figure) instead of a higher one;
        projected_cost_low_usd / projected_cost_high_usd, eta_s_low / eta_s_high, calibration: the
            run's projection range while a dataset is calibrating (see :class:`DatasetSnapshot`);
        tok_per_s: recent completion tokens per second; loop_lag_ms: event-loop lag (ms);
        providers: per-provider figures; latest_errors: latest message per error class;
        history: ``(elapsed_s, req_per_s, tok_per_s)`` samples, oldest first (for sparklines);
        events: the most recent run events as display lines, oldest first.
        notices: pauses made by a guard (anomaly guard, calibration gate, credits, price, store)
            as ``(sequence number, text)``, oldest first (the last 20); a reader announces those
            numbered above the last it announced.
        drain_left_s: seconds before a drain in progress aborts the requests still in flight
            (None when no drain runs).
        endpoints: with several endpoints (``[provider] base_urls``), each one's figures in config
            order (state, in flight, requests, errors, latency, tok/s); ``()`` with one.
        stream_workers: the stream-worker processes holding the HTTP streams (``[run] stream_workers``;
            0: none, e.g. a test's scheduler alone); stream_workers_alive: those up now;
            stream_worker_restarts: workers that died and were replaced since start;
            stream_workers_frozen: workers up but not answering (stopped or frozen: no heartbeat for
            :data:`engine.stream.liveness.SILENT_S`).
        drain: while the run is paused or draining with streams in flight, how long they are expected
            to take and, draining, what the abort at the end of the countdown would bill
            (:class:`engine.money.drain.DrainOutlook`); None otherwise.
        run_dir: the run directory (what ``datagen ctl RUN_DIR ...`` takes).
    """

    name: str
    state: str
    state_reason: str
    elapsed_s: float
    datasets: tuple[DatasetSnapshot, ...]
    classes: tuple[ClassSnapshot, ...]
    in_flight: int
    req_per_s: float
    cost_usd: float
    errors: dict[str, int]
    writer_queue: int = 0
    credits_usd: float | None = None
    credits_age_s: float | None = None
    spend_rate_usd_per_h: float | None = 0.0
    projected_total_cost_usd: float | None = None
    max_cost_usd: float | None = None
    cost_in_flight_usd: float = 0.0
    abort_cost_usd: float = 0.0
    abort_cost_basis: str = ""
    eta_s: float | None = None
    tok_per_s: float = 0.0
    loop_lag_ms: float = 0.0
    providers: tuple[ProviderSnapshot, ...] = ()
    latest_errors: dict[str, str] = field(default_factory=dict)
    history: tuple[tuple[float, float, float], ...] = ()
    events: tuple[str, ...] = ()
    projected_cost_low_usd: float | None = None
    projected_cost_high_usd: float | None = None
    eta_s_low: float | None = None
    eta_s_high: float | None = None
    calibration: tuple[int, int] | None = None
    notices: tuple[tuple[int, str], ...] = ()
    #: seconds before a drain in progress aborts what is still in flight (None: not draining).
    drain_left_s: float | None = None
    #: run events appended since the start (``events`` is the window of the latest; 0: unknown).
    events_total: int = 0
    endpoints: tuple[EndpointSnapshot, ...] = ()
    stream_workers: int = 0
    stream_workers_alive: int = 0
    stream_worker_restarts: int = 0
    stream_workers_frozen: int = 0
    eta_reason: str = ""
    projection_capped: bool = False
    drain: DrainOutlook | None = None
    run_dir: str = ""

    def dataset(self, name: str) -> DatasetSnapshot:
        """Return the snapshot of dataset ``name`` (KeyError if unknown)."""
        for d in self.datasets:
            if d.name == name:
                return d
        raise KeyError(name)
