"""The streams in flight as the snapshot's drain outlook (:mod:`engine.money.drain`), while the run is
paused or draining: how long until they end, and what the abort at the end of a drain's countdown
would bill.

Each stream's expected remaining tokens and its abort share come from the in-flight estimator
(:meth:`engine.run.ending.RunEnding.stream_costs`, :mod:`engine.money.inflight`): its expected cost
when complete minus what it generated, over the completion price, is the tokens it is still expected
to stream; its estimated abort bill places the provider's share between the two. Its rate is its
provider's median streaming rate (``tok_per_s_per_stream`` of the run's providers; a stream whose
provider is not known yet takes the mean of the known ones). Computed at most once a second per run
(:data:`EVERY_S`): about 40 passes over the streams.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from engine.money.drain import DrainOutlook, DrainStream, drain_outlook

if TYPE_CHECKING:
    from engine.metrics.stats import ProviderSnapshot

#: What is read of the run: :class:`engine.run.observe.RunView` (``clock``, ``spend``, ``runstate``, ``cfg``,
#: ``ending``); not imported, observe imports this module.
RunView = Any

#: Seconds an outlook is reused (the deadline it was computed for counts down meanwhile).
EVERY_S = 1.0

_CACHE: "weakref.WeakKeyDictionary[Any, tuple[float, DrainOutlook]]" = weakref.WeakKeyDictionary()


def outlook(sched: RunView, providers: "tuple[ProviderSnapshot, ...]", deadline_s: float | None) -> DrainOutlook | None:
    """The drain outlook of ``sched``'s streams in flight for an abort ``deadline_s`` seconds away
    (None: no deadline); None when nothing is in flight or no completion price is known."""
    now = sched.clock()
    hit = _CACHE.get(sched)
    if hit is not None and now - hit[0] < EVERY_S and (hit[1].deadline_s is None) == (deadline_s is None):
        return hit[1]
    return _fresh(sched, providers, deadline_s, now)


def _fresh(sched: RunView, providers: "tuple[ProviderSnapshot, ...]", deadline_s: float | None,
           now: float) -> DrainOutlook | None:
    prices = sched.spend.prices()
    if prices is None or prices.completion_usd_per_token <= 0 or not any(
            rt.streams for rt in sched.runstate.datasets.values()):
        _CACHE.pop(sched, None)
        return None
    pc = prices.completion_usd_per_token
    rates = {p.name: p.tok_per_s_per_stream for p in providers if p.tok_per_s_per_stream}
    pooled = sum(rates.values()) / len(rates) if rates else None
    cap_of: dict[int, int] = {}
    for rt in sched.runstate.datasets.values():
        for cls, prog, _p in rt.streams.values():
            cap_of[id(prog)] = sched.cfg.classes[cls].max_tokens
    streams = []
    for prog, c in sched.ending.stream_costs():
        rest_usd = max(0.0, c.expected_usd - c.generated_usd)
        share = (c.abort_usd - c.generated_usd) / rest_usd if rest_usd > 1e-12 else 1.0
        received = float(prog.tokens_received)
        streams.append(DrainStream(
            remaining_tokens=rest_usd / pc,
            cap_tokens=max(0.0, cap_of.get(id(prog), 0) - received),
            tok_per_s=rates.get(getattr(prog, "provider", "") or "", pooled),
            generated_usd=c.generated_usd, completion_usd_per_token=pc, abort_share=max(0.0, share)))
    o = drain_outlook(streams, deadline_s)
    _CACHE[sched] = (now, o)
    return o
