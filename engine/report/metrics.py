"""Prometheus metrics built from the immutable snapshots the dashboard reads.

:class:`SnapshotCollector` is a ``prometheus_client`` custom collector: at every scrape it calls its
sources once, a generation :class:`~engine.report.snapshot.RunSnapshot` and an extraction
:class:`~engine.extract.snapshot.ExtractSnapshot` (either may be None: not prepared yet, or not
part of this command), and turns them into metric families (:func:`run_families`,
:func:`extract_families`, pure). It never reads the engine's mutable state itself; the sources are
the same functions the dashboard polls (``Scheduler.snapshot``, ``ExtractRun.snapshot``,
``ExtractChain.snapshot``), called on the engine's event loop by
:mod:`engine.report.metricsserver`.

Names follow Prometheus conventions: base units (seconds, bytes, USD, ratios), ``_total`` on
counters, labels ``dataset``, ``class``, ``provider``, ``endpoint``, ``quantile``, ``state``, ``worker``, ``gpu``,
``source`` (a fidelity verdict's: ``target`` | ``cheap``).
docs/metrics.md lists every metric. A figure that is unknown (credits before the first
reading, an ETA while paused) is left out of the scrape rather than exported as 0.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from engine.extract.snapshot import ExtractSnapshot
from engine.report.snapshot import RunSnapshot

#: Prompt states of ``datagen_prompts`` (they add up to the dataset's prompts).
PROMPT_STATES = ("done", "failed", "skipped", "pending", "in_flight")


def _gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _counter(name: str, doc: str, labels: Iterable[str] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=list(labels))


def _one(family: Metric, value: float | None, *labels: str) -> Metric:
    """``family`` with one sample (none when ``value`` is None: unknown)."""
    if value is not None:
        family.add_metric(list(labels), float(value))  # type: ignore[attr-defined]
    return family


def run_families(snap: RunSnapshot) -> list[Metric]:
    """The generation run's metric families from one snapshot (pure).

    Args:
        snap: the engine's snapshot (``Scheduler.snapshot()``).

    Returns:
        Families in docs/metrics.md order: run-wide figures, then per dataset, per request class, per
        provider and per endpoint (several ``base_urls`` only). USD in dollars, durations in seconds, rates per second (``req_per_s`` is the
        completions per second of the last 60 s, as the dashboard shows).
    """
    fams: list[Metric] = [
        _one(_gauge("datagen_run_info", "The run (always 1): its name and state", ("run", "state")),
             1, snap.name, snap.state),
        _one(_gauge("datagen_run_elapsed_seconds", "Run seconds, earlier processes of the run included"),
             snap.elapsed_s),
        _one(_gauge("datagen_reserved_usd", "Dollars the requests in flight cost when they complete"),
             snap.cost_in_flight_usd),
        _one(_gauge("datagen_abort_cost_usd", "Estimated bill of aborting the requests in flight now"),
             snap.abort_cost_usd),
        _one(_gauge("datagen_credits_usd", "Provider credits left (absent until read)"), snap.credits_usd),
        _one(_gauge("datagen_credits_age_seconds", "Age of the credits reading"), snap.credits_age_s),
        _one(_gauge("datagen_spend_rate_usd_per_hour", "This engine's spend rate over the last 5 min"),
             snap.spend_rate_usd_per_h),
        _one(_gauge("datagen_projected_total_cost_usd", "Projected cost of the whole run"),
             snap.projected_total_cost_usd),
        _one(_gauge("datagen_max_cost_usd", "Run-wide dollar cap ([spend] max_cost_usd; absent: none)"),
             snap.max_cost_usd),
        _one(_gauge("datagen_eta_seconds", "Seconds to finish the run: the latest dataset ETA (absent while "
                    "nothing can progress)"), snap.eta_s),
        _one(_gauge("datagen_projection_capped", "1 when the run's projected cost is clamped at its max_cost_usd"),
             int(snap.projection_capped)),
        _one(_gauge("datagen_loop_lag_seconds", "Event-loop lag of the engine"), snap.loop_lag_ms / 1000.0),
        _one(_gauge("datagen_writer_queue_rows", "Rows waiting for the next store commit"), snap.writer_queue),
    ]
    ds = ("dataset",)
    spend = _counter("datagen_spend_usd_total", "Dollars billed: results, failed and aborted attempts", ds)
    prompt_tok = _counter("datagen_prompt_tokens_total", "Billed prompt tokens of stored results", ds)
    compl_tok = _counter("datagen_completion_tokens_total", "Billed completion tokens of stored results", ds)
    reason_tok = _counter("datagen_reasoning_tokens_total", "Billed reasoning tokens of stored results", ds)
    done = _counter("datagen_completions_total", "Prompts completed (results stored)", ds)
    errors = _counter("datagen_errors_total", "Failed attempts by error class", ("dataset", "class"))
    prompts = _gauge("datagen_prompts", "Prompts by state (they add up to the dataset's prompts)", ("dataset", "state"))
    rejected = _gauge("datagen_rejected_rows", "Dataset rows rejected at ingest", ds)
    in_flight = _gauge("datagen_in_flight", "Requests in flight", ds)
    reserved_tok = _gauge("datagen_reserved_tokens", "Tokens reserved by requests in flight against the budget", ds)
    req_s = _gauge("datagen_requests_per_second", "Completions per second over the last 60 s", ds)
    tok_s = _gauge("datagen_completion_tokens_per_second", "Completion tokens per second over the last 60 s", ds)
    budget = _gauge("datagen_token_budget", "Configured token budget (absent: none)", ds)
    cap = _gauge("datagen_dataset_max_cost_usd", "Configured dollar cap of the dataset (absent: none)", ds)
    projected = _gauge("datagen_projected_cost_usd", "Projected final cost of the dataset (clamped at its cap)", ds)
    capped = _gauge("datagen_dataset_projection_capped", "1 when the dataset's projection is clamped at a cap", ds)
    eta = _gauge("datagen_dataset_eta_seconds", "Seconds to finish the dataset (absent while unknown or paused)", ds)
    state = _gauge("datagen_dataset_info", "The dataset's state (always 1)", ("dataset", "state"))
    for d in snap.datasets:
        spend.add_metric([d.name], d.cost_usd)
        prompt_tok.add_metric([d.name], d.prompt_tokens)
        compl_tok.add_metric([d.name], d.completion_tokens)
        reason_tok.add_metric([d.name], d.reasoning_tokens)
        done.add_metric([d.name], d.done)
        for cls, n in sorted(d.errors.items()):
            errors.add_metric([d.name, cls], n)
        for s in PROMPT_STATES:
            prompts.add_metric([d.name, s], getattr(d, s))
        rejected.add_metric([d.name], d.rejected)
        in_flight.add_metric([d.name], d.in_flight)
        reserved_tok.add_metric([d.name], d.reserved_tokens)
        req_s.add_metric([d.name], d.req_per_s)
        tok_s.add_metric([d.name], d.tok_per_s)
        _one(budget, d.token_budget, d.name)
        _one(cap, d.max_cost_usd, d.name)
        _one(projected, d.projected_cost_usd, d.name)
        capped.add_metric([d.name], int(d.projection_capped))
        _one(eta, d.eta_s, d.name)
        state.add_metric([d.name, d.state], 1)
    fams += [spend, prompt_tok, compl_tok, reason_tok, done, errors, prompts, rejected, in_flight, reserved_tok,
             req_s, tok_s, budget, cap, projected, capped, eta, state]
    conc = _gauge("datagen_class_concurrency", "Concurrency limit of the request class now", ("class",))
    cls_fly = _gauge("datagen_class_in_flight", "Requests of the class in flight", ("class",))
    for c in snap.classes:
        conc.add_metric([c.name], c.concurrency)
        cls_fly.add_metric([c.name], c.in_flight)
    fams += [conc, cls_fly, *provider_families(snap), *endpoint_families(snap)]
    return fams


def provider_families(snap: RunSnapshot) -> list[Metric]:
    """Per-provider families (``provider`` label) of ``snap.providers``: counters since this engine
    started, latency and time-to-first-token percentiles (``quantile`` 0.5, 0.95) over recent successes,
    the fidelity verdict (docs/fidelity.md): drifting 0/1 and the records judged per ``source``
    (``target`` | ``cheap``), absent before a provider's first verdict."""
    pv = ("provider",)
    requests = _counter("datagen_provider_requests_total", "Requests answered (successes and errors)", pv)
    errors = _counter("datagen_provider_errors_total", "Failed requests by error class", ("provider", "class"))
    spend = _counter("datagen_provider_spend_usd_total", "Dollars the provider billed", pv)
    latency = _gauge("datagen_provider_latency_seconds", "Whole-request latency percentile", ("provider", "quantile"))
    ttft = _gauge("datagen_provider_ttft_seconds", "Time to first token percentile", ("provider", "quantile"))
    tps = _gauge("datagen_provider_stream_tokens_per_second", "Median completion tokens per second of one stream", pv)
    excluded = _gauge("datagen_provider_excluded", "1 when the provider is excluded from routing", pv)
    drifting = _gauge("datagen_provider_fidelity_drifting", "1 when the provider's fidelity verdict is drifting "
                      "(not cleared), else 0 (absent: not judged yet)", pv)
    fid_records = _gauge("datagen_provider_fidelity_records", "Records its fidelity verdict rests on, by source "
                         "(target: phase two; cheap: cheap signals)", ("provider", "source"))
    for p in snap.providers:
        requests.add_metric([p.name], p.requests)
        for cls, n in sorted(p.errors.items()):
            errors.add_metric([p.name, cls], n)
        spend.add_metric([p.name], p.cost_usd)
        for q, lat, first in (("0.5", p.latency_p50_s, p.ttft_p50_s), ("0.95", p.latency_p95_s, p.ttft_p95_s)):
            _one(latency, lat, p.name, q)
            _one(ttft, first, p.name, q)
        _one(tps, p.tok_per_s_per_stream, p.name)
        excluded.add_metric([p.name], 1 if p.excluded else 0)
        if p.fidelity is not None:
            f = p.fidelity
            drifting.add_metric([p.name], 1 if f.get("verdict") == "drifting" and not f.get("cleared") else 0)
            for source in ("target", "cheap"):
                if part := f.get(source):
                    fid_records.add_metric([p.name, source], int(part.get("records") or 0))
    return [requests, errors, spend, latency, ttft, tps, excluded, drifting, fid_records]


def endpoint_families(snap: RunSnapshot) -> list[Metric]:
    """Per-endpoint families (``endpoint`` label: the replica's url as figures show it, a
    ``user:password@`` masked ``***@``) of ``snap.endpoints``, only with several ``[provider]
    base_urls`` (none otherwise): state, in flight and cap, counters since this engine started,
    latency percentiles over recent successes, tokens per second over the last 60 s."""
    ep = ("endpoint",)
    info = _gauge("datagen_endpoint_info", "The endpoint's state (always 1): healthy, draining or down", ("endpoint", "state"))
    up = _gauge("datagen_endpoint_up", "1 when the endpoint is healthy (takes new requests), else 0", ep)
    in_flight = _gauge("datagen_endpoint_in_flight", "Requests in flight on the endpoint", ep)
    cap = _gauge("datagen_endpoint_concurrency", "The endpoint's cap on requests in flight (absent: none)", ep)
    requests = _counter("datagen_endpoint_requests_total", "Requests sent to the endpoint (completed and failed)", ep)
    errors = _counter("datagen_endpoint_errors_total", "The endpoint's failed requests by error class", ("endpoint", "class"))
    latency = _gauge("datagen_endpoint_latency_seconds", "Whole-request latency percentile of recent successes",
                     ("endpoint", "quantile"))
    tps = _gauge("datagen_endpoint_completion_tokens_per_second", "Completion tokens per second it returned, last 60 s", ep)
    tokens = _counter("datagen_endpoint_completion_tokens_total", "Completion tokens of its successes", ep)
    state_s = _gauge("datagen_endpoint_state_seconds", "Seconds in the current state", ep)
    for e in snap.endpoints:
        info.add_metric([e.url, e.state], 1)
        up.add_metric([e.url], 1 if e.state == "healthy" else 0)
        in_flight.add_metric([e.url], e.in_flight)
        _one(cap, e.concurrency, e.url)
        requests.add_metric([e.url], e.requests)
        for cls, n in sorted(e.errors.items()):
            errors.add_metric([e.url, cls], n)
        _one(latency, e.latency_p50_s, e.url, "0.5")
        _one(latency, e.latency_p95_s, e.url, "0.95")
        tps.add_metric([e.url], e.tok_per_s)
        tokens.add_metric([e.url], e.completion_tokens)
        state_s.add_metric([e.url], e.state_for_s)
    return [info, up, in_flight, cap, requests, errors, latency, tps, tokens, state_s]


def extract_families(snap: ExtractSnapshot) -> list[Metric]:
    """The extraction job's metric families from one snapshot (pure): job-wide progress, per
    dataset, per worker and per GPU (NVML readings; none without a driver). Samples and tokens are
    gauges: a chained extraction's successive jobs each report their own datasets."""
    fams: list[Metric] = [
        _one(_gauge("datagen_extract_info", "The extraction job (always 1): its state and model", ("state", "model")),
             1, snap.state, snap.model),
        _one(_gauge("datagen_extract_elapsed_seconds", "Seconds since the workers started"), snap.elapsed_s),
        _one(_gauge("datagen_extract_tokens_per_second", "Tokens per second, all workers, last minute"),
             snap.tokens_per_s),
        _one(_gauge("datagen_extract_eta_seconds", "Seconds to finish (absent while unknown)"), snap.eta_s),
        _one(_gauge("datagen_extract_written_bytes", "Bytes of hidden states written"), snap.bytes_written),
        _one(_gauge("datagen_extract_projected_bytes", "Bytes the plan projects for what was left at start"),
             snap.bytes_projected),
        _one(_gauge("datagen_extract_disk_free_bytes", "Free space of the output file system"), snap.disk_free_bytes),
    ]
    ds = ("dataset",)
    samples = _gauge("datagen_extract_samples_done", "Samples extracted", ds)
    samples_plan = _gauge("datagen_extract_samples_planned", "Samples to extract in all (done included)", ds)
    tokens = _gauge("datagen_extract_tokens_done", "Tokens extracted", ds)
    tokens_plan = _gauge("datagen_extract_tokens_planned", "Tokens to extract in all (done included)", ds)
    skipped = _gauge("datagen_extract_dataset_skipped", "1 when the dataset was skipped", ds)
    for d in snap.datasets:
        samples.add_metric([d.name], d.samples_done)
        samples_plan.add_metric([d.name], d.samples_total)
        tokens.add_metric([d.name], d.tokens_done)
        tokens_plan.add_metric([d.name], d.tokens_total)
        skipped.add_metric([d.name], 1 if d.skipped else 0)
    fams += [samples, samples_plan, tokens, tokens_plan, skipped]
    wk = ("worker",)
    w_state = _gauge("datagen_extract_worker_info", "A worker's state (always 1)", ("worker", "state"))
    w_samples = _gauge("datagen_extract_worker_samples_done", "Samples the worker extracted", wk)
    w_tps = _gauge("datagen_extract_worker_tokens_per_second", "The worker's tokens per second, last minute", wk)
    w_restarts = _gauge("datagen_extract_worker_restarts", "Times the launcher restarted the worker", wk)
    for w in snap.workers:
        r = str(w.rank)
        w_state.add_metric([r, w.state], 1)
        w_samples.add_metric([r], w.samples_done)
        w_tps.add_metric([r], w.tokens_per_s)
        w_restarts.add_metric([r], w.restarts)
    fams += [w_state, w_samples, w_tps, w_restarts]
    gp = ("gpu",)
    util = _gauge("datagen_gpu_utilization_ratio", "GPU utilisation (0 to 1)", gp)
    mem = _gauge("datagen_gpu_memory_used_bytes", "GPU memory used", gp)
    mem_total = _gauge("datagen_gpu_memory_total_bytes", "GPU memory in all", gp)
    temp = _gauge("datagen_gpu_temperature_celsius", "GPU temperature", gp)
    power = _gauge("datagen_gpu_power_watts", "GPU power draw", gp)
    for g in snap.gpus:
        i = str(g.index)
        _one(util, g.util_pct / 100.0 if g.util_pct is not None else None, i)
        _one(mem, g.mem_used_bytes, i)
        _one(mem_total, g.mem_total_bytes, i)
        _one(temp, g.temp_c, i)
        _one(power, g.power_w, i)
    return fams + [util, mem, mem_total, temp, power]


class SnapshotCollector(Collector):
    """A ``prometheus_client`` collector over snapshot sources, read at each scrape.

    Args:
        run: returns the generation run's snapshot now (None: not prepared yet); None: this command
            runs no generation.
        extract: returns the extraction's snapshot now (None: none yet); None: no extraction.

    Both are called on the engine's event loop (:class:`engine.report.metricsserver.MetricsServer`
    renders there), once per scrape; their snapshots are immutable, so nothing else is read.
    """

    def __init__(self, run: Callable[[], RunSnapshot | None] | None = None,
                 extract: Callable[[], ExtractSnapshot | None] | None = None) -> None:
        self._run = run
        self._extract = extract

    def collect(self) -> Iterator[Metric]:
        """The families of both snapshots taken now (generation first); a family without a sample
        (no error yet, no GPU, unknown credits) is left out."""
        fams: list[Metric] = []
        run = self._run() if self._run is not None else None
        if run is not None:
            fams += run_families(run)
        ext = self._extract() if self._extract is not None else None
        if ext is not None:
            fams += extract_families(ext)
        return (f for f in fams if f.samples)


__all__ = ["PROMPT_STATES", "SnapshotCollector", "endpoint_families", "extract_families", "provider_families",
           "run_families"]
