"""Run telemetry: O(1)-per-event counters that snapshots read (no I/O).

Holds what the dashboard and ``status`` show beyond the per-dataset counters: provider stats, the
anomaly guard, the latest error message per class, recent events, throughput history for
sparklines, the event-loop lag, and the latest completion per dataset for the sample inspector.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any

from engine.client.types import Completion
from engine.metrics.rates import SPEND_WINDOW_S, RateWindow
from engine.metrics.stats import ProviderStats
from engine.report.snapshot import SampleSnapshot
from engine.run.anomaly import AnomalyGuard
from engine.run.runwide import RUN_WIDE_CLASSES

#: Samples kept for the throughput sparklines (one every ``HISTORY_EVERY_S``).
HISTORY_LEN = 120
HISTORY_EVERY_S = 5.0
#: Event lines kept for the log pane.
EVENTS_LEN = 200
#: Guard-pause notices kept for readers that poll (the dashboard's toasts, headless lines).
NOTICES_LEN = 20


class Telemetry:
    """Observability state of one run.

    Args:
        anomaly_error_rate / anomaly_window: the anomaly guard's threshold (0 disables) and window.
    """

    def __init__(self, anomaly_error_rate: float = 0.2, anomaly_window: int = 200) -> None:
        self.providers = ProviderStats()
        self.anomaly = (
            AnomalyGuard(anomaly_error_rate, anomaly_window, min_requests=min(50, anomaly_window))
            if anomaly_error_rate > 0 else None
        )
        self.latest_errors: dict[str, str] = {}
        self.events: collections.deque[str] = collections.deque(maxlen=EVENTS_LEN)
        #: run events appended so far (readers of the sliding ``events`` window count new lines with it).
        self.events_total = 0
        #: ``(sequence number, text)`` of pauses made by a guard, oldest first (see :meth:`notice`).
        self.notices: collections.deque[tuple[int, str]] = collections.deque(maxlen=NOTICES_LEN)
        self._notice_seq = 0
        self.history: collections.deque[tuple[float, float, float]] = collections.deque(maxlen=HISTORY_LEN)
        self.samples: dict[str, tuple[str, str, Completion]] = {}
        #: the latest result stored by an earlier process, per dataset (shown until a new one arrives).
        self.restored: dict[str, SampleSnapshot] = {}
        #: latest validation verdict per dataset ("valid" / "INVALID: reasons"), when reconstruction runs.
        self.validation: dict[str, str] = {}
        #: each provider's fidelity object as the last look saved it (:class:`engine.run.fidelity.FidelityWatch`)
        self.fidelity: dict[str, dict[str, Any]] = {}
        self.loop_lag_ms = 0.0
        self.req_rate = RateWindow(60)
        #: completion tokens streamed per second over the run (the datasets' streamed tokens, see
        #: :meth:`engine.run.runstate.DatasetRuntime.note_streamed`)
        self.tok_rate = RateWindow(180)
        self.usd_rate = RateWindow(SPEND_WINDOW_S)
        self._last_history = -HISTORY_EVERY_S

    def on_event(self, level: str, dataset: str | None, message: str) -> None:
        """Keep a display line for a run event."""
        ts = time.strftime("%H:%M:%S")
        self.events.append(f"{ts} {level.upper():7} {'[' + dataset + '] ' if dataset else ''}{message}")
        self.events_total += 1

    def notice(self, text: str) -> None:
        """Announce ``text`` (a pause made by a guard, not by the user): readers show each notice
        whose sequence number is above the last they showed, as loudly as a user's own pause."""
        self._notice_seq += 1
        self.notices.append((self._notice_seq, text))

    def dispatched(self, dataset: str) -> int:
        """Note that an attempt of ``dataset`` was sent; returns its dispatch sequence number, to be
        passed to :meth:`on_error` / :meth:`on_success` / :meth:`attempt_over` (0 with the guard off).
        The anomaly guard judges attempts in dispatch order (:mod:`engine.run.anomaly`)."""
        return self.anomaly.dispatch(dataset) if self.anomaly is not None else 0

    def attempt_ok(self, dataset: str, seq: int) -> str | None:
        """Count attempt ``seq`` of ``dataset`` as a success as soon as its response is complete
        (before accounting, which may await); returns an anomaly-guard pause reason, or None."""
        return self.anomaly.resolve(dataset, seq, False) if self.anomaly is not None else None

    def attempt_over(self, dataset: str, seq: int) -> None:
        """Close attempt ``seq`` of ``dataset`` without counting it (aborted, internal error); a no-op
        when :meth:`on_error` or :meth:`on_success` already resolved it."""
        if self.anomaly is not None:
            self.anomaly.resolve(dataset, seq, None)

    def on_error(self, dataset: str, provider: str | None, error_class: str, message: str,
                 guard: bool = True, seq: int | None = None) -> str | None:
        """Record a failed attempt (dispatch sequence number ``seq`` from :meth:`dispatched`; None:
        one with nothing else in flight); returns an anomaly-guard pause reason for ``dataset``, or None.

        Rate limits (429) and connect failures cost nothing and say little about the provider's
        output (a burst of 2,000 connects on a busy loop times some out): they are counted by class
        but do not feed the anomaly guard. Neither do errors of the account, the route or the
        config (``credits``, ``auth``, ``route``, see :mod:`engine.run.runwide`), nor any attempt the
        caller says is run-wide (``guard=False``): they pause the whole run with their own reason
        and say nothing about the dataset's prompts.
        """
        self.providers.record_error(provider or None, error_class)
        self.latest_errors[error_class] = message[:300]
        if self.anomaly is None:
            return None
        counts = not (not guard or error_class in ("rate_limit", "connect") or error_class in RUN_WIDE_CLASSES)
        if seq is None:
            return self.anomaly.record(dataset, True) if counts else None
        return self.anomaly.resolve(dataset, seq, True if counts else None)

    def on_success(self, dataset: str, key: str, prompt_tail: str, c: Completion, now: float,
                   seq: int | None = None) -> str | None:
        """Record a completed request (monotonic ``now`` in seconds; dispatch sequence number ``seq``
        as in :meth:`on_error`); returns an anomaly-guard pause reason for ``dataset``, or None (the
        window can first hold enough attempts on a success, with the error rate already above the
        threshold)."""
        u = c.usage
        stream_s = (c.latency_s - c.ttft_s) if c.ttft_s is not None else None
        self.providers.record_success(c.provider or None, c.latency_s, c.ttft_s, u.completion_tokens, u.cost_usd,
                                      stream_s, c.flags)
        reason = None
        if self.anomaly is not None:
            reason = (self.anomaly.record(dataset, False) if seq is None
                      else self.anomaly.resolve(dataset, seq, False))
        self.samples[dataset] = (key, prompt_tail, c)
        self.req_rate.add(now)
        if u.cost_usd:
            self.usd_rate.add(now, u.cost_usd)
        return reason

    def on_cost(self, provider: str | None, cost_usd: float, now: float) -> None:
        """Record spend (USD) billed for an attempt that produced no result (failed, aborted, or a
        ``/generation`` true-up) at monotonic ``now``: the provider's ``cost_usd`` and the spend rate
        count every billed attempt, not only successes."""
        if cost_usd > 0:
            self.providers.record_cost(provider or None, cost_usd)
            self.usd_rate.add(now, cost_usd)

    def spend_rate_usd_per_h(self, now: float, in_flight: int) -> float | None:
        """This engine's spend over the last 5 minutes (USD per hour), counted from its first dispatch
        (see :meth:`engine.metrics.rates.RateWindow.start`); None ("not known yet") while nothing was billed
        since this engine started and requests are in flight (after a restart the first results can
        be minutes away: 0 would read as "spending nothing")."""
        if self.usd_rate.since_start <= 0:
            return None if in_flight else 0.0
        return self.usd_rate.rate(now) * 3600.0

    def restore_sample(self, dataset: str, row: dict) -> None:
        """Keep ``row`` (one value of :meth:`engine.storage.store.Store.latest_results`) as ``dataset``'s
        latest completion until this process stores one."""
        self.restored[dataset] = SampleSnapshot(
            key=row["key"], prompt_tail=row["prompt_tail"][-500:], reasoning=row["reasoning"][:2000],
            content=row["content"][:2000], tool_calls=tuple(row["tool_names"]), finish_reason=row["finish_reason"],
            provider=row["provider"], completion_tokens=row["completion_tokens"], restored=True)

    def sample(self, dataset: str) -> SampleSnapshot | None:
        """The latest completion of ``dataset``, trimmed for display: this process's, else the one
        restored from the store (:meth:`restore_sample`); None when there is none."""
        s = self.samples.get(dataset)
        if s is None:
            r = self.restored.get(dataset)
            v = self.validation.get(dataset, "")
            return r if r is None or not v else dataclasses.replace(r, validation=v)
        key, tail, c = s
        return SampleSnapshot(
            key=key, prompt_tail=tail[-500:], reasoning=c.reasoning[:2000], content=c.content[:2000],
            tool_calls=tuple(t.name for t in c.tool_calls), finish_reason=c.finish_reason, provider=c.provider,
            completion_tokens=c.usage.completion_tokens, validation=self.validation.get(dataset, ""),
        )

    def tick(self, elapsed_s: float, now: float) -> None:
        """Append a throughput history sample every ``HISTORY_EVERY_S`` seconds."""
        if elapsed_s - self._last_history >= HISTORY_EVERY_S:
            self._last_history = elapsed_s
            self.history.append((elapsed_s, self.req_rate.rate(now), self.tok_rate.rate(now)))
