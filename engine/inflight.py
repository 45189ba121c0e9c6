"""What the streams in flight cost: one estimator for every in-flight dollar figure.

Used by the dashboard header while draining, the ``draining N ...`` log line, the abort line,
``ctl abort`` / ``ctl skip --abort`` confirmations, ``status`` (``cost_in_flight_usd``) and the
credits floor. Pure functions (no I/O, no clocks).

Per stream, with ``r`` the completion tokens received so far and ``P`` its prompt tokens:

- ``generated_usd`` = ``price_prompt * P + price_completion * r``: what a provider bills for an
  abort now if it stops generating when the client disconnects (a lower bound of the bill).
- ``expected_usd`` = ``price_prompt * P + price_completion * E[min(L, max_tokens) | L > r]``: what
  the stream costs when it completes, which is also what an abort costs on providers that keep
  generating after a disconnect (they bill the whole completion). The remaining length is modelled
  as exponential (memoryless) with mean ``theta`` = (sum of the completed lengths + sum of the
  tokens streamed so far by the requests in flight) / completed requests of the same dataset and
  class: the maximum-likelihood mean with in-flight streams as right-censored observations, so the
  first (short) completions do not make the long streams still in flight look cheap. Then
  ``E = r + theta * (1 - exp(-(max_tokens - r) / theta))``. Exponential lengths are what the
  simulator generates; for lighter-tailed real lengths the figure errs high (an upper estimate).
  While nothing has completed the answer is ``max_tokens`` (an upper bound).

Spend of aborted or failed attempts plays no part (it was the source of estimates that grew after
every restart).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class InFlightCost:
    """Dollars of a set of streams in flight.

    Attributes:
        streams: how many streams.
        generated_usd: billed if aborted now by providers that stop generating (USD, lower bound).
        expected_usd: billed when they complete, or if aborted by providers that keep generating
            after a disconnect (USD).
    """

    streams: int = 0
    generated_usd: float = 0.0
    expected_usd: float = 0.0

    def __add__(self, other: "InFlightCost") -> "InFlightCost":
        return InFlightCost(self.streams + other.streams, self.generated_usd + other.generated_usd,
                            self.expected_usd + other.expected_usd)


class LengthModel:
    """Expected final completion length of a stream given the tokens it has streamed.

    Args:
        observed: completion lengths (tokens) of finished requests of one dataset+class.
        censored: tokens streamed so far by that dataset+class's requests in flight.
        max_tokens: the class's ``max_tokens`` (tokens, >= 1): the answer while nothing completed,
            and the cap of every answer.
    """

    def __init__(self, observed: Iterable[float], censored: Iterable[float], max_tokens: int) -> None:
        obs = list(observed)
        self.max_tokens = int(max_tokens)
        #: the mean completion length (tokens), censoring accounted for; None before any completion.
        self.theta: float | None = (sum(obs) + sum(max(0.0, c) for c in censored)) / len(obs) if obs else None

    def expected_total(self, received: float) -> float:
        """``E[min(L, max_tokens) | L > received]`` (tokens), at least ``received``."""
        r = max(0.0, float(received))
        m = float(self.max_tokens)
        if r >= m:
            return r
        if self.theta is None:
            return m
        if self.theta <= 0:
            return r
        return r + self.theta * -math.expm1(-(m - r) / self.theta)


def stream_cost(prompt_tokens: float, received: float, model: LengthModel, prompt_usd_per_token: float,
                completion_usd_per_token: float) -> InFlightCost:
    """The cost of one stream in flight (see the module docstring; tokens in, USD out)."""
    base = prompt_usd_per_token * max(0.0, prompt_tokens)
    r = max(0.0, float(received))
    return InFlightCost(1, base + completion_usd_per_token * r,
                        base + completion_usd_per_token * model.expected_total(r))


def abort_line(n: int, dataset: str | None, cost: InFlightCost) -> str:
    """The line logged when ``n`` streams (of ``dataset``, or of the run when None) are aborted, e.g.
    ``"aborted 92 in-flight stream(s): est. $0.0940 already generated is billed and lost, about
    $0.2300 if billed in full (providers that keep generating after a disconnect bill the whole
    completion); their prompts return to pending"``."""
    of = f" of {dataset}" if dataset else ""
    return (f"aborted {n:,} in-flight stream(s){of}: est. ${cost.generated_usd:.4f} already generated is billed "
            f"and lost, about ${cost.expected_usd:.4f} if billed in full (providers that keep generating after a "
            f"disconnect bill the whole completion); their prompts return to pending")
