"""What the streams in flight cost: one estimator for every in-flight dollar figure.

Used by the dashboard header while draining, the ``draining N ...`` log line, the abort line,
``ctl abort`` / ``ctl skip --abort`` confirmations, ``status`` (``cost_in_flight_usd``) and the
credits floor. Pure functions (no I/O, no clocks).

Per stream, with ``r`` the completion tokens received so far and ``P`` its prompt tokens:

- ``generated_usd`` = ``price_prompt * P + price_completion * r``: what a provider bills for an
  abort now if it stops generating when the client disconnects (a lower bound of the bill).
- ``expected_usd`` = ``price_prompt * P + price_completion * E[min(L, max_tokens) | L > r]``: what
  the stream costs when it completes, which is also what an abort costs on providers that keep
  generating after a disconnect (they bill the whole completion). The length distribution is
  :class:`engine.metrics.lengths.LengthDistribution`: Kaplan-Meier over the completed lengths with
  the requests in flight as right-censored observations (so the first, short completions do not
  make the long streams still in flight look cheap), with an exponential tail beyond the longest
  completed length whose mean ``theta`` is the censored maximum-likelihood one (sum of completed
  lengths + sum of tokens streamed so far by the requests in flight, over completed requests).
  While nothing has completed the answer is ``max_tokens`` (an upper bound).

Spend of aborted or failed attempts plays no part (it was the source of estimates that grew after
every restart).

What an abort costs NOW (``abort_usd``, an estimate) depends on the provider: one that stops
generating bills ``generated_usd``, one that keeps generating bills the whole completion. The
:class:`AbortBilling` learns it per provider from the ``/generation`` true-ups of streams this
engine aborted: ``share`` = (billed - generated) / (expected - generated), summed over that
provider's aborted streams (0: stops billing at the disconnect; 1: bills the completion in full),
and ``abort_usd = generated_usd + share x (expected_usd - generated_usd)`` per stream. Before a
provider has :data:`MIN_ABORT_OBSERVATIONS` billed aborts, the prior is :data:`PRIOR_SHARE` = 1
(billed in full: the upper figure), and streams whose provider is not known yet take the share
pooled over every provider's observations (else the prior).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from engine.metrics.lengths import LengthDistribution

MIN_ABORT_OBSERVATIONS = 5
"""Billed aborted streams of a provider before its observed share replaces the prior."""

PRIOR_SHARE = 1.0
"""Share of the rest of a stream billed when it is aborted, before any observation: billed in full."""

KEPT_BILLING = 1.25
"""A stream an earlier process aborted counts as billed beyond what it generated (its provider kept
generating) when its bill exceeds this multiple of the generated estimate."""

MAX_SHARE = 3.0
"""Cap of an observed share (a provider billing far above the length model is capped at 3x it)."""


@dataclass(frozen=True)
class InFlightCost:
    """Dollars of a set of streams in flight.

    Attributes:
        streams: how many streams.
        generated_usd: billed if aborted now by providers that stop generating (USD, lower bound).
        expected_usd: billed when they complete, or if aborted by providers that keep generating
            after a disconnect (USD).
        abort_usd: estimated bill of aborting them now (USD): per stream, ``generated_usd`` plus its
            provider's observed share of the rest (:class:`AbortBilling`); the prior bills in full.
        abort_observed: how many of the streams' ``abort_usd`` rest on observed billing (the others
            on the prior).
    """

    streams: int = 0
    generated_usd: float = 0.0
    expected_usd: float = 0.0
    abort_usd: float = 0.0
    abort_observed: int = 0

    def __add__(self, other: "InFlightCost") -> "InFlightCost":
        return InFlightCost(self.streams + other.streams, self.generated_usd + other.generated_usd,
                            self.expected_usd + other.expected_usd, self.abort_usd + other.abort_usd,
                            self.abort_observed + other.abort_observed)


class LengthModel:
    """Expected final completion length of a stream given the tokens it has streamed.

    Args:
        observed: completion lengths (tokens) of finished requests of one dataset+class.
        censored: tokens streamed so far by that dataset+class's requests in flight.
        max_tokens: the class's ``max_tokens`` (tokens, >= 1): the answer while nothing completed,
            and the cap of every answer.

    The distribution is :class:`engine.metrics.lengths.LengthDistribution` (Kaplan-Meier with the
    in-flight streams as censored lengths, an exponential tail beyond the longest finished one).
    """

    def __init__(self, observed: Iterable[float], censored: Iterable[float], max_tokens: int) -> None:
        self.max_tokens = int(max_tokens)
        self.dist = LengthDistribution(sorted(observed), sorted(max(0.0, c) for c in censored), self.max_tokens)
        #: the exponential tail's mean (tokens), censoring accounted for; None before any completion.
        self.theta: float | None = self.dist.theta

    def expected_total(self, received: float) -> float:
        """``E[min(L, max_tokens) | L > received]`` (tokens), at least ``received``."""
        return self.dist.expected_total(received)


def stream_cost(prompt_tokens: float, received: float, model: LengthModel, prompt_usd_per_token: float,
                completion_usd_per_token: float, abort_share: float | None = None) -> InFlightCost:
    """The cost of one stream in flight (see the module docstring; tokens in, USD out).

    ``abort_share``: its provider's observed share of the rest billed on an abort
    (:meth:`AbortBilling.share_for`); None: the prior, :data:`PRIOR_SHARE`."""
    base = prompt_usd_per_token * max(0.0, prompt_tokens)
    r = max(0.0, float(received))
    gen = base + completion_usd_per_token * r
    exp = base + completion_usd_per_token * model.expected_total(r)
    share = PRIOR_SHARE if abort_share is None else abort_share
    return InFlightCost(1, gen, exp, gen + share * (exp - gen), int(abort_share is not None))


def _class_models(rows: list[tuple[str, Any, float, float]], lengths: Callable[[str], list[float]],
                  max_tokens: Callable[[str], int], model: Callable[[str, list[float]], Any] | None) -> dict[str, Any]:
    """The length model of each class of ``rows`` (``(class, progress, prompt tokens, received)``), its
    streams' received tokens as the censored lengths."""
    got: dict[str, list[float]] = {}
    for cls, _prog, _p, r in rows:
        got.setdefault(cls, []).append(r)
    return {cls: (model(cls, r) if model is not None else LengthModel(lengths(cls), r, max_tokens(cls)))
            for cls, r in got.items()}


def streams_cost(streams: Iterable[tuple[str, Any, float]], lengths: Callable[[str], list[float]],
                 max_tokens: Callable[[str], int], prompt_usd_per_token: float, completion_usd_per_token: float,
                 share_for: Callable[[str], float | None] = lambda _p: None,
                 model: Callable[[str, list[float]], Any] | None = None) -> list[tuple[Any, InFlightCost]]:
    """Per stream of one dataset, its progress object and :class:`InFlightCost`.

    Args:
        streams: ``(class, progress, prompt tokens)`` per stream in flight; ``progress`` has
            ``tokens_received`` and ``provider`` (``""`` while unknown).
        lengths: completion lengths (tokens) observed for a class.
        max_tokens: a class's ``max_tokens``.
        prompt_usd_per_token / completion_usd_per_token: prices (USD per token).
        share_for: a provider's observed abort share (:meth:`AbortBilling.share_for`).
        model: ``model(class, tokens streamed by its streams) -> distribution`` (anything with
            ``expected_total``), e.g. :meth:`engine.money.spend.SpendControl.length_model`, which has
            the cut streams too; None: :class:`LengthModel` over ``lengths(class)``.
    """
    rows = [(cls, prog, p, prog.tokens_received) for cls, prog, p in streams]
    models = _class_models(rows, lengths, max_tokens, model)
    return [(prog, stream_cost(p, r, models[cls], prompt_usd_per_token, completion_usd_per_token,
                               share_for(getattr(prog, "provider", "") or "")))
            for cls, prog, p, r in rows]


def streams_total(streams: Iterable[tuple[str, Any, float]], lengths: Callable[[str], list[float]],
                  max_tokens: Callable[[str], int], prompt_usd_per_token: float, completion_usd_per_token: float,
                  share_for: Callable[[str], float | None] = lambda _p: None,
                  model: Callable[[str, list[float]], Any] | None = None) -> InFlightCost:
    """The sum of :func:`streams_cost` over ``streams`` (same arguments; USD), equal to it to the last
    bit (the same operations in the same order), at about half its CPU: no object per stream, each
    tokens count read once, each provider's share looked up once."""
    rows = [(cls, prog, p, prog.tokens_received) for cls, prog, p in streams]
    models = _class_models(rows, lengths, max_tokens, model)
    shares: dict[str, float | None] = {}
    pp, cp = prompt_usd_per_token, completion_usd_per_token
    gen_t = exp_t = abort_t = 0.0
    observed = 0
    for cls, prog, p, r in rows:
        prov = getattr(prog, "provider", "") or ""
        if prov in shares:
            share = shares[prov]
        else:
            share = shares[prov] = share_for(prov)
        base = pp * max(0.0, p)
        rr = max(0.0, float(r))
        gen = base + cp * rr
        exp = base + cp * models[cls].expected_total(rr)
        gen_t += gen
        exp_t += exp
        abort_t += gen + (PRIOR_SHARE if share is None else share) * (exp - gen)
        observed += share is not None
    return InFlightCost(len(rows), gen_t, exp_t, abort_t, observed)


@dataclass
class _Billed:
    n: int = 0
    generated: float = 0.0
    expected: float = 0.0
    billed: float = 0.0

    def share(self) -> float | None:
        rest = self.expected - self.generated
        if rest <= 1e-12:
            return None
        return min(MAX_SHARE, max(0.0, (self.billed - self.generated) / rest))


class AbortBilling:
    """What providers bill for streams this engine aborted, learned from ``/generation`` true-ups.

    :meth:`note` each aborted stream with its generation id, provider and its
    :class:`InFlightCost` at abort time; :meth:`billed` the cost ``/generation`` reports later.
    Pure bookkeeping (no I/O).

    Args:
        min_observations: billed aborts of a provider before its share is used (>= 1).
    """

    MAX_PENDING = 20_000

    def __init__(self, min_observations: int = MIN_ABORT_OBSERVATIONS) -> None:
        self.min_observations = max(1, int(min_observations))
        self._pending: dict[str, tuple[str, float, float]] = {}
        self._by_provider: dict[str, _Billed] = {}
        self._earlier: dict[str, list[int]] = {}  # provider -> [streams, billed beyond generated]
        #: bumped by every recorded bill (:meth:`add`, :meth:`add_earlier`): a figure priced with
        #: :meth:`share_for` at one version is the figure at every later read of that version.
        self.version = 0

    def note(self, generation_id: str, provider: str, cost: InFlightCost) -> None:
        """Remember an aborted stream (its figures at abort time) until its bill is known."""
        if not generation_id or cost.expected_usd <= 0.0:  # no id to true up, or no price known
            return
        if len(self._pending) >= self.MAX_PENDING:  # true-ups never came: forget the oldest
            self._pending.pop(next(iter(self._pending)))
        self._pending[generation_id] = (provider or "", cost.generated_usd, cost.expected_usd)

    def billed(self, generation_id: str, cost_usd: float) -> bool:
        """Record the billed cost (USD) of a noted stream; False (nothing recorded) for other ids."""
        got = self._pending.pop(generation_id, None)
        if got is None:
            return False
        self.add(got[0], got[1], got[2], cost_usd)
        return True

    def add(self, provider: str, generated_usd: float, expected_usd: float, billed_usd: float) -> None:
        """Record one billed aborted stream directly (USD figures at abort time, and its bill)."""
        self.version += 1
        b = self._by_provider.setdefault(provider or "", _Billed())
        b.n += 1
        b.generated += generated_usd
        b.expected += expected_usd
        b.billed += billed_usd

    def add_earlier(self, provider: str, generated_usd: float, billed_usd: float) -> None:
        """Record the bill of a stream an earlier process aborted, whose expected cost at abort time is
        not known: it counts as billed beyond what was generated when ``billed_usd`` exceeds
        :data:`KEPT_BILLING` x ``generated_usd`` (USD)."""
        self.version += 1
        k = self._earlier.setdefault(provider or "", [0, 0])
        k[0] += 1
        k[1] += int(billed_usd > KEPT_BILLING * generated_usd)

    def share_for(self, provider: str) -> float | None:
        """The observed share of the rest billed for ``provider`` (the pooled share of every
        provider when ``provider`` is ``""``): from this process's aborts when it has
        ``min_observations`` of them, else the fraction of earlier processes' aborted streams that
        were billed beyond what was generated; None: too few observations (use the prior)."""
        if provider:
            b = self._by_provider.get(provider)
            k = self._earlier.get(provider)
        else:
            b = _Billed()
            k = [0, 0]
            for x in self._by_provider.values():
                b.n += x.n
                b.generated += x.generated
                b.expected += x.expected
                b.billed += x.billed
            for n, kept in self._earlier.values():
                k[0] += n
                k[1] += kept
        if b is not None and b.n >= self.min_observations:
            return b.share()
        if k is not None and k[0] >= self.min_observations:
            return k[1] / k[0]
        return None

    def observations(self) -> dict[str, tuple[int, float | None]]:
        """Provider -> (billed aborted streams, share of the rest billed or None) as :meth:`share_for`
        uses them, for display."""
        out = {}
        for p in sorted(set(self._by_provider) | set(self._earlier)):
            b = self._by_provider.get(p)
            if b is not None and b.n >= self.min_observations:
                out[p] = (b.n, b.share())
            else:
                n = self._earlier.get(p, [0, 0])[0] + (b.n if b is not None else 0)
                out[p] = (n, self.share_for(p) if p else None)
        return out


def abort_basis(cost: InFlightCost, billing: AbortBilling) -> str:
    """How :attr:`InFlightCost.abort_usd` was estimated, e.g. ``"from the billing of 40 aborted
    streams (SimA 0%, SimC 100% of the rest)"`` or ``"assumes dropped streams are billed in full:
    no aborted stream billed yet"``."""
    obs = {p: (n, s) for p, (n, s) in billing.observations().items() if n >= billing.min_observations and s is not None}
    if not cost.abort_observed or not obs:
        return "assumes dropped streams are billed in full: no aborted stream billed yet"
    n = sum(n for n, _s in obs.values())
    parts = ", ".join(f"{p or '?'} {s:.0%}" for p, (_n, s) in obs.items())
    prior = cost.streams - cost.abort_observed
    tail = f"; {prior:,} stream(s) assumed billed in full" if prior else ""
    return f"from the billing of {n:,} aborted stream(s): {parts} of the rest billed{tail}"


def abort_line(n: int, dataset: str | None, cost: InFlightCost, basis: str = "") -> str:
    """The line logged when ``n`` streams (of ``dataset``, or of the run when None) are aborted, e.g.
    ``"aborted 92 in-flight stream(s): est. $0.0940 already generated is billed and lost, about
    $0.2300 if billed in full (providers that keep generating after a disconnect bill the whole
    completion); est. bill of this abort $0.1200 (BASIS); their prompts return to pending"``
    (``basis``: :func:`abort_basis`; the estimate is left out without it)."""
    of = f" of {dataset}" if dataset else ""
    est = f"; est. bill of this abort ${cost.abort_usd:.4f} ({basis})" if basis else ""
    return (f"aborted {n:,} in-flight stream(s){of}: est. ${cost.generated_usd:.4f} already generated is billed "
            f"and lost, about ${cost.expected_usd:.4f} if billed in full (providers that keep generating after a "
            f"disconnect bill the whole completion){est}; their prompts return to pending")
