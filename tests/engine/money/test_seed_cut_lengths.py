"""A restart after aborts and kills seeds the length estimator with the cut streams too (trial of issue 34).

At the real shape (2,000 streams of 4 tokens/s, lengths ~ exponential with mean 2,000, max_tokens 8,000),
a run killed 250 s after its dispatch has stored only the completions that finished by then: the short
ones (mean ~460). The other streams were cut; their attempts hold what they had streamed (1,000
tokens each). Before, a restart seeded its estimator from the stored results alone and reserved a
few hundred tokens a stream: a 2M-token budget ended at 5.37M (2.7x). Now the cut streams enter as
right-censored lengths, in dispatch order with the results, and the first reservation of the restart
reads the censored curve.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from helpers import completion, make_config, seeded_store

from engine.money.spend import SpendControl
from engine.storage.writer import StoreWriter

N = 2000
RATE = 4.0  # tokens/s per stream
KILL_S = 250.0
MEAN = 2000.0


async def _killed_run(tmp_path):
    cfg = make_config(tmp_path, datasets=[{"name": "a", "path": "a.jsonl", "token_budget": 2_000_000}],
                      classes={"short": {"max_tokens": 8000, "concurrency": N}})
    store = await seeded_store(cfg, {"a": N})
    rng = random.Random(7)
    writer = StoreWriter(store)
    t0 = 1_000_000.0
    finished = []
    for i in range(1, N + 1):
        length = min(8000, max(1, int(rng.expovariate(1 / MEAN))))
        start = t0 + i * 0.01
        if length / RATE <= KILL_S:  # finished before the kill: stored
            end = start + length / RATE
            c = completion(completion_tokens=length)
            c = dataclasses.replace(c, latency_s=length / RATE)
            writer.add_attempt(i, "a", 1, start, end, "ok", cost_usd=0.001)
            writer.add_result(i, "a", f"a-{i - 1:06d}", c, 1, now=end)
            finished.append(length)
        else:  # cut by the kill: what it had streamed
            writer.add_attempt(i, "a", 1, start, t0 + KILL_S, "aborted", generation_id=f"g{i}",
                               tokens_received=int(KILL_S * RATE), cost_usd=0.002, estimated=True)
    await writer.flush()
    return cfg, store, finished


async def test_a_restart_after_a_kill_reserves_from_the_cut_streams_too(tmp_path):
    cfg, store, finished = await _killed_run(tmp_path)
    try:
        recent = await store.recent_lengths("a")
        old = await store.recent_completion_tokens("a")
    finally:
        await store.close()
    seq = recent["short"]
    assert len(seq) == N and sum(c for _t, c in seq) == N - len(finished)  # every stream, each cut one censored
    assert sum(finished) / len(finished) < 600  # the survivors: the short ones

    spend = SpendControl(cfg)
    spend.seed("a", 0, 0, 0.0, recent)
    est = spend.budgets["a"].estimators["short"]
    assert 0.75 * MEAN <= est.lengths().mean() <= 1.25 * MEAN, est.lengths().mean()
    assert est.expected() >= 0.9 * 2 * MEAN  # the reserved p90+ of an exponential with mean 2,000 (~4,600)

    before = SpendControl(cfg)  # what a restart seeded before: the stored results alone
    before.seed("a", 0, 0, 0.0, old)
    b = before.budgets["a"].estimators["short"]
    assert b.expected() < 1100 and b.lengths().mean() < 600


async def test_the_last_processs_cut_streams_count_as_censored_lengths_when_recorded_after_the_seed(tmp_path):
    """The runner seeds the estimators (``Scheduler.load``) before ``recover_cut_streams`` records the
    streams the last kill cut: those come through ``count_lost`` with their class (a trial at 40 tokens/s:
    the restart after a second kill dispatched 1,226 streams on a budget with ~1.1M tokens left)."""
    cfg, store, finished = await _killed_run(tmp_path)
    try:
        recent = await store.recent_lengths("a")
    finally:
        await store.close()
    results_only = {"short": [(t, c) for t, c in recent["short"] if not c]}
    spend = SpendControl(cfg)
    spend.seed("a", 0, 0, 0.0, results_only)
    est = spend.budgets["a"].estimators["short"]
    assert est.expected() < 1100  # the short survivors alone
    for _ in range(N - len(finished)):
        spend.count_lost("a", int(KILL_S * RATE), 0.002, "short")
    assert 0.75 * MEAN <= est.lengths().mean() <= 1.25 * MEAN, est.lengths().mean()
    assert est.expected() >= 0.9 * 2 * MEAN
    assert spend.lost_usd["a"] == pytest.approx(0.002 * (N - len(finished)))


async def test_a_restart_counts_the_tokens_earlier_kills_cut_in_the_token_budget(tmp_path):
    """``Scheduler.load`` seeds each token budget with the stored completions AND the tokens that cut or
    failed attempts streamed (as the process that cut them counted them). Before, a trial's budget read
    1.62M of 2M after two kills while 2.57M had been streamed, and the run went on dispatching."""
    from engine.client.retry import RetryPolicy
    from engine.run.scheduler import Scheduler

    cfg, store, finished = await _killed_run(tmp_path)
    try:
        async def complete(req, progress=None):  # never called: nothing is dispatched
            raise AssertionError("dispatched")

        sched = Scheduler(cfg, store, StoreWriter(store, 0.05), complete, policy=RetryPolicy(max_attempts=1))
        await sched.load()
        cut = (N - len(finished)) * int(KILL_S * RATE)
        assert sched.spend.budgets["a"].tokens.used == sum(finished) + cut
        assert sched.datasets["a"].completion_tokens == sum(finished)  # the results' own figure is unchanged
    finally:
        await store.close()
