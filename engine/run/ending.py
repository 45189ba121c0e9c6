"""How a run ends: stop, abort of the streams in flight, a drain with a deadline, and what the
streams in flight cost (USD) while that is decided.

The :class:`~engine.run.scheduler.Scheduler` owns one (``Scheduler.ending``); the controller, the
runner, the headless signal handlers and the snapshot builder call it directly.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable

from engine.config import Config
from engine.money.flightcache import FlightCache, price_key
from engine.money.inflight import InFlightCost, LengthModel, abort_basis, abort_line, streams_cost, streams_total
from engine.money.spend import SpendControl
from engine.run.runstate import RunPhase, RunState

log = logging.getLogger(__name__)

#: Seconds the run may still take once everything was aborted (tasks that ignore cancellation).
ABORT_GRACE_S = 5.0


@dataclass(frozen=True)
class CutStream:
    """A stream cut before it finished, read as :func:`engine.money.inflight.streams_cost` reads a
    stream's progress: ``tokens_received`` (completion tokens it had streamed) and ``provider``
    (``""``: unknown)."""

    tokens_received: float
    provider: str = ""


class RunEnding:
    """Stops, aborts and drains one run; prices the streams in flight.

    Args:
        cfg: validated config (``run.drain_timeout_s``, ``provider.timeouts.total_s``, class ``max_tokens``).
        runstate: the run's state: its datasets' streams and tasks, phase, exit code, ``done`` event
            (its :meth:`~engine.run.runstate.RunState.notify` wakes the dispatchers, its
            :meth:`~engine.run.runstate.RunState.check_finished` ends the run when nothing is left).
        spend: the money ledger (prices, observed lengths, abort billing).
        clock: monotonic clock in seconds.
        event: ``event(level, kind, dataset, message)`` records a run event.
        on_stop: called in the step that stops the run (the scheduler's hold of the stream workers:
            what was handed to them and not sent yet returns to pending, nothing new leaves).
    """

    def __init__(self, cfg: Config, runstate: RunState, spend: SpendControl, clock: Callable[[], float],
                 event: Callable[[str, str, str | None, str], None],
                 on_stop: Callable[[], None] | None = None) -> None:
        self.cfg = cfg
        self._on_stop = on_stop
        self.run = runstate
        self.spend = spend
        self.clock = clock
        self._event = event
        #: the cost figures of each stream at its abort (keyed by the id() of its StreamProgress), taken
        #: by :meth:`abort_cost` when the aborted outcome is applied: its estimated bill is accounted
        #: at once and trued up from ``/generation``.
        self.abort_costs: dict[int, tuple[Any, InFlightCost]] = {}
        #: the task that ends the run within the grace after an abort of everything (None: none yet).
        self.ender: asyncio.Task | None = None
        #: each dataset's dollars in flight between reads (:meth:`in_flight_cost`): at most
        #: :data:`engine.money.flightcache.MAX_AGE_S` seconds of ``clock`` old.
        self.flight = FlightCache()
        self._aborts = 0  # aborts so far: a figure priced before one is not given back after it

    # ---- dollars in flight ------------------------------------------------------------------
    def in_flight_cost(self, dataset: str | None = None, *, fresh: bool = False) -> InFlightCost:
        """Dollars of the streams in flight (of ``dataset`` or all), from :mod:`engine.money.inflight`: what
        was generated so far, what they cost when completed, and what an abort now is estimated to
        bill (each provider's observed billing of aborted streams). Zero dollars while no price is known.

        For display and guards: each dataset's figure is kept between reads
        (:class:`engine.money.flightcache.FlightCache`) and is at most
        :data:`~engine.money.flightcache.MAX_AGE_S` (1 s) of the run's ``clock`` old, within about 1%
        for the streams that started or ended since (none below 100 streams: exact); new prices, a bill
        of an aborted stream, an abort or a class's first completion recompute at once. ``fresh``: priced
        now, past the cache. The dollars an abort or a cut accounts never come from here: :meth:`abort`
        prices per stream (:meth:`stream_costs`), cut streams by :meth:`cut_costs`."""
        prices = self.spend.prices()
        total = InFlightCost()
        key: tuple | None = None
        now = 0.0
        for rt in self.run.datasets.values():
            if (dataset is not None and rt.name != dataset) or not rt.streams:
                continue
            if prices is None:
                total = total + InFlightCost(len(rt.streams))
                continue
            if fresh:
                total = total + self._priced(rt, prices)
                continue
            if key is None:
                key, now = self._flight_key(prices), self.clock()
            got = self.flight.get(rt.name, now, key, rt.streams.keys())
            if got is None:
                got = self.flight.put(rt.name, now, key, rt.streams.keys(), self._priced(rt, prices))
            total = total + got
        return total

    def _flight_key(self, prices: Any) -> tuple:
        """What moves the dollars in flight at once (:class:`~engine.money.flightcache.FlightCache`'s
        key): the prices (to 4 significant digits: observed prices are refitted at every result,
        :func:`~engine.money.flightcache.price_key`), the abort billing learned (its version), the
        aborts, and which classes of which datasets have a completion (the length model leaves its
        ``max_tokens`` bound)."""
        known = tuple(est.count > 0 for b in self.spend.budgets.values() for est in b.estimators.values())
        return price_key(prices), self.spend.aborts.version, self._aborts, known

    def _priced(self, rt: Any, prices: Any) -> InFlightCost:
        """The dollars of ``rt``'s streams in flight priced now (:func:`engine.money.inflight.streams_total`)."""
        return streams_total(
            rt.streams.values(), functools.partial(self.spend.observed_lengths, rt.name),
            lambda cls: self.cfg.classes[cls].max_tokens, prices.prompt_usd_per_token,
            prices.completion_usd_per_token, self.spend.abort_share,
            model=functools.partial(self.spend.length_model, rt.name))

    def cost_in_flight_usd(self, dataset: str | None = None) -> float:
        """Expected USD of the streams in flight (of ``dataset`` or all): what they cost when completed
        (as :meth:`in_flight_cost`: at most a second of the run's clock old)."""
        return self.in_flight_cost(dataset).expected_usd

    def stream_costs(self, dataset: str | None = None) -> list[tuple[Any, InFlightCost]]:
        """``(progress, InFlightCost)`` per stream in flight (of ``dataset`` or all)."""
        prices = self.spend.prices()
        out: list[tuple[Any, InFlightCost]] = []
        for rt in self.run.datasets.values():
            if (dataset is not None and rt.name != dataset) or not rt.streams:
                continue
            if prices is None:
                out += [(prog, InFlightCost(1)) for _c, prog, _p in rt.streams.values()]
                continue
            out += streams_cost(
                rt.streams.values(), functools.partial(self.spend.observed_lengths, rt.name),
                lambda cls: self.cfg.classes[cls].max_tokens, prices.prompt_usd_per_token,
                prices.completion_usd_per_token, self.spend.abort_share,
                model=functools.partial(self.spend.length_model, rt.name))
        return out

    def cut_costs(self, dataset: str, streams: list[tuple[str, str, int, int]]) -> list[InFlightCost]:
        """Cost figures (:class:`~engine.money.inflight.InFlightCost`, USD) of streams of ``dataset``
        cut before they finished, one per ``(class, provider, prompt tokens, completion tokens
        received)``: what was generated, the expected completion, and the estimated bill
        (``abort_usd``: its provider's observed share of the rest, billed in full before any
        observation). The cut streams are the length model's censored observations. Zero dollars
        while no price is known; what was generated when the dataset or class is no longer configured."""
        prices = self.spend.prices()
        if prices is None:
            return [InFlightCost(1) for _ in streams]
        if dataset not in self.spend.budgets:
            return [InFlightCost(1, g, g, g) for g in (prices.cost(p, t) for _c, _pv, p, t in streams)]
        top = max(k.max_tokens for k in self.cfg.classes.values())
        got = streams_cost(
            [(cls, CutStream(float(tokens), provider), prompt) for cls, provider, prompt, tokens in streams],
            lambda cls: self.spend.observed_lengths(dataset, cls) if cls in self.cfg.classes else [],
            lambda cls: self.cfg.classes[cls].max_tokens if cls in self.cfg.classes else top,
            prices.prompt_usd_per_token, prices.completion_usd_per_token, self.spend.abort_share,
            model=lambda cls, r: (self.spend.length_model(dataset, cls, r) if cls in self.cfg.classes
                                  else LengthModel([], r, top)))
        return [c for _p, c in got]

    def abort_cost(self, dataset: str, cls: str, progress: Any, prompt_tokens: int) -> InFlightCost:
        """The cost figures of an aborted stream (USD): those taken by :meth:`abort` when it cut it,
        else (a stream cut otherwise: its worker died, the run's end) estimated now (:meth:`cut_costs`)."""
        got = self.abort_costs.pop(id(progress), None)
        if got is not None and got[0] is progress:
            return got[1]
        return self.cut_costs(dataset, [(cls, progress.provider or "", prompt_tokens, progress.tokens_received)])[0]

    # ---- commands ---------------------------------------------------------------------------
    def abort(self, dataset: str | None = None) -> int:
        """Cancel in-flight requests (of ``dataset`` or all); they return to pending. Returns the count.

        Logs one line (and a run event) when anything is aborted (:func:`engine.money.inflight.abort_line`):
        how many streams, the dollars generated so far and what they cost if billed in full. While
        the run is stopping, the run ends within :data:`ABORT_GRACE_S` of an abort of everything even
        if a request ignores its cancellation."""
        cost = InFlightCost()
        self._aborts += 1
        live = {id(prog) for rt in self.run.datasets.values() for _c, prog, _p in rt.streams.values()}
        for k in [k for k in self.abort_costs if k not in live]:  # applied, or finished within the cut's grace
            del self.abort_costs[k]
        for prog, c in self.stream_costs(dataset):
            cost = cost + c
            self.spend.aborts.note(prog.generation_id, prog.provider, c)  # its bill teaches the abort estimate
            self.abort_costs[id(prog)] = (prog, c)  # its estimated bill, accounted when its outcome is applied
        n = 0
        for rt in self.run.datasets.values():
            if dataset is None or rt.name == dataset:
                for t in list(rt.tasks):
                    if not t.done():
                        t.cancel()
                        n += 1
        if n:
            self._event("warning", "abort", dataset, abort_line(n, dataset, cost, abort_basis(cost, self.spend.aborts)))
        if dataset is None and self.run.stopping:
            self.end_soon(ABORT_GRACE_S)
        return n

    def end_soon(self, grace_s: float) -> None:
        """End the run within ``grace_s`` seconds even if aborted tasks do not finish (a hard limit)."""
        done = self.run.done
        if done.is_set() or self.ender is not None:
            return

        async def end() -> None:
            tasks = [t for rt in self.run.datasets.values() for t in rt.tasks if not t.done()]
            if tasks:
                await asyncio.wait(tasks, timeout=grace_s)
            if not done.is_set():
                left = sum(1 for rt in self.run.datasets.values() for t in rt.tasks if not t.done())
                if left:
                    log.error("%d aborted request(s) did not finish within %.0f s; ending the run anyway", left, grace_s)
                done.set()

        try:
            self.ender = asyncio.get_running_loop().create_task(end(), name="end-soon")
        except RuntimeError:  # no loop running (a synchronous caller): the run bounds its own wait
            pass

    def stop(self, reason: str, exit_code: int = 0, abort: bool = True) -> None:
        """Stop the run: no more dispatch; abort in-flight requests unless ``abort`` is False (drain).
        The first non-zero ``exit_code`` given is kept (a later stop does not hide an earlier failure)."""
        self.run.stopping = True
        self.run.lifecycle, self.run.reason = RunPhase.STOPPING, reason
        if self._on_stop is not None:
            self._on_stop()  # the stream workers hold what they have not sent (a drain sends nothing new)
        if not self.run.exit_code:
            self.run.exit_code = exit_code
        self._event("error" if exit_code and exit_code != 130 else "info", "stop", None, f"run stopping: {reason}")
        if abort:
            self.abort()
        self.run.notify()
        self.run.check_finished()

    def drain_limit_s(self) -> float:
        """Seconds a drain waits for in-flight requests: ``run.drain_timeout_s``, or with ``"auto"``
        (the default) the requests' own bound, ``provider.timeouts.total_s``: every attempt in flight
        ends by then, so a drain never cuts a stream that could still finish."""
        v = self.cfg.run.drain_timeout_s
        return float(self.cfg.provider.timeouts.total_s if v == "auto" else v)

    def drain_left_s(self) -> float | None:
        """Seconds left before a drain in progress aborts what is still in flight (None: no drain)."""
        if self.run.drain_deadline is None or self.run.done.is_set():
            return None
        return max(0.0, self.run.drain_deadline - self.clock())

    async def drain(self, timeout_s: float | None = None, *, reason: str = "drain requested",
                    exit_code: int = 0) -> None:
        """Stop dispatching, wait up to ``timeout_s`` (default :meth:`drain_limit_s`) for in-flight
        requests, then abort the rest; the run ends within :data:`ABORT_GRACE_S` of the limit in every case.

        Args:
            reason: shown as the state reason; exit_code: the run's exit code (130: interrupted).
        """
        limit = self.drain_limit_s() if timeout_s is None else float(timeout_s)
        self.run.drain_deadline = self.clock() + limit
        self.stop(reason, exit_code=exit_code, abort=False)
        n = sum(rt.in_flight for rt in self.run.datasets.values())
        if n:
            log.info("draining %d in-flight request(s) (est. $%.4f) for up to %.0f s", n,
                     self.in_flight_cost().expected_usd, limit)
        try:
            await asyncio.wait_for(self.run.done.wait(), limit)
        except TimeoutError:
            self.abort()
            self.end_soon(ABORT_GRACE_S)
