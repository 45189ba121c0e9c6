"""score_record against a naive per-token computation; skip, outside, greedy, seeds, chunking, errors."""

import math

import numpy as np
import pytest
import torch

from engine.fidelity.dist import sampling_distribution
from engine.fidelity.score import PIT_BINS, RecordScore, records_from_tokens, score_record


def naive(logits, targets, temperature, top_p, seed, skip=None) -> RecordScore:
    """One token at a time in plain Python over the definition (docs/fidelity.md)."""
    n, vocab = logits.shape
    u_all = torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).tolist()
    t_ll = temperature if temperature > 0 else 1.0
    tot = dict(tokens=0, outside=0, surprisal=0.0, entropy=0.0, variance=0.0, top1=0, top1_expected=0.0,
               top1_variance=0.0, loglik=0.0)
    pit = [0] * PIT_BINS
    for i in range(n):
        if skip is not None and skip[i]:
            continue
        p = sampling_distribution(logits[i], temperature, top_p).double().tolist()
        y = int(targets[i])
        z = [float(v) / t_ll for v in logits[i]]
        m = max(z)
        tot["loglik"] += z[y] - m - math.log(sum(math.exp(v - m) for v in z))
        tot["tokens"] += 1
        if p[y] == 0:
            tot["outside"] += 1
            continue
        h = -sum(q * math.log(q) for q in p if q > 0)
        tot["surprisal"] += -math.log(p[y])
        tot["entropy"] += h
        tot["variance"] += sum(q * (-math.log(q) - h) ** 2 for q in p if q > 0)
        pmax = max(p)
        tot["top1"] += int(y == p.index(pmax))
        tot["top1_expected"] += pmax
        tot["top1_variance"] += pmax * (1 - pmax)
        order = sorted(range(vocab), key=lambda v: (-p[v], v))
        before = sum(p[v] for v in order[:order.index(y)])
        if temperature > 0:
            pit[min(int((before + u_all[i] * p[y]) * PIT_BINS), PIT_BINS - 1)] += 1
    return RecordScore(pit=tuple(pit), **tot)


def close(a: RecordScore, b: RecordScore) -> None:
    assert (a.tokens, a.outside, a.top1, a.pit) == (b.tokens, b.outside, b.top1, b.pit)
    for f in ("surprisal", "entropy", "variance", "top1_expected", "top1_variance", "loglik"):
        assert getattr(a, f) == pytest.approx(getattr(b, f), rel=1e-9, abs=1e-9), f


def case(n=40, vocab=13, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=g) * 2.5
    logits[:, 3] = logits[:, 7]  # exact ties: ordered by id
    logits[::5, 1] = logits[::5].max(dim=1).values  # ties at the top: argmax is the lowest id
    targets = torch.randint(0, vocab, (n,), generator=g)
    return logits, targets


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 0.95), (0.7, 0.8), (0.6, 1.0), (1.3, 0.5)])
def test_matches_naive(temperature, top_p):
    logits, targets = case()
    got = score_record(logits, targets, temperature, top_p, seed=11)
    close(got, naive(logits, targets, temperature, top_p, 11))
    assert got.tokens == 40 and sum(got.pit) == got.tokens - got.outside
    if top_p < 1:
        assert got.outside > 0  # uniform random targets land outside a nucleus
    assert got.surprisal > got.entropy  # random targets are less likely than the target's own samples


def test_skip_and_outside_counts():
    logits, targets = case(n=30)
    skip = torch.zeros(30, dtype=torch.bool)
    skip[::3] = True
    got = score_record(logits, targets, 1.0, 0.5, seed=5, skip=skip)
    close(got, naive(logits, targets, 1.0, 0.5, 5, skip=skip.tolist()))
    assert got.tokens == 20
    p = sampling_distribution(logits, 1.0, 0.5)
    zero = p.gather(1, targets[:, None]).squeeze(1) == 0
    assert got.outside == int((zero & ~skip).sum()) > 0
    # a token's PIT draw depends on its position, not on what else is skipped
    only = torch.ones(30, dtype=torch.bool)
    only[4] = False
    one = score_record(logits, targets, 1.0, 0.5, seed=5, skip=only)
    close(one, naive(logits, targets, 1.0, 0.5, 5, skip=only.tolist()))
    assert one.tokens == 1


def test_greedy():
    logits, targets = case(n=25)
    targets[:10] = logits[:10].argmax(dim=1)
    got = score_record(logits, targets, 0.0, None, seed=1)
    close(got, naive(logits, targets, 0.0, 1.0, 1))
    arg = logits.argmax(dim=1)
    assert got.outside == int((targets != arg).sum()) and got.outside >= 1
    assert got.top1 == got.tokens - got.outside and got.top1_expected == got.top1
    assert (got.surprisal, got.entropy, got.variance, got.top1_variance) == (0.0, 0.0, 0.0, 0.0)
    assert got.pit == (0,) * PIT_BINS  # greedy tokens add no PIT counts
    expect = torch.log_softmax(logits.double(), dim=1).gather(1, targets[:, None]).sum().item()
    assert got.loglik == pytest.approx(expect, rel=1e-12)  # T = 0: the log-likelihood at T = 1


def test_seed_reproducible_and_chunking_identical():
    logits, targets = case(n=64, vocab=50, seed=3)
    a = score_record(logits, targets, 1.0, 0.95, seed=7)
    assert score_record(logits, targets, 1.0, 0.95, seed=7) == a
    for rows in (1, 3, 17, 64, 1000):
        assert score_record(logits, targets, 1.0, 0.95, seed=7, chunk_rows=rows) == a
    pits = {score_record(logits, targets, 1.0, 0.95, seed=s).pit for s in range(8)}
    assert len(pits) > 1  # the seed drives the randomization
    # the PIT is the only randomized field
    b = score_record(logits, targets, 1.0, 0.95, seed=8)
    assert (b.surprisal, b.entropy, b.top1, b.loglik) == (a.surprisal, a.entropy, a.top1, a.loglik)


def test_honest_samples_are_calibrated():
    """Tokens sampled from the sampling distribution: PIT flat, surprisal mean = entropy within its sd."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4000, 200, generator=g) * 3
    p = sampling_distribution(logits, 0.8, 0.9)
    targets = torch.multinomial(p, 1, generator=g).squeeze(1)
    s = score_record(logits, targets, 0.8, 0.9, seed=2)
    assert s.outside == 0 and s.tokens == 4000
    z = (s.surprisal - s.entropy) / math.sqrt(s.variance)
    assert abs(z) < 4
    assert abs(s.top1 - s.top1_expected) < 4 * math.sqrt(s.top1_variance)
    assert min(s.pit) > 400 - 4 * 19 and max(s.pit) < 400 + 4 * 19  # Binomial(4000, 0.1): sd 19


def test_bf16_and_empty():
    logits, targets = case(n=8)
    got = score_record(logits.bfloat16(), targets, 1.0, 0.9, seed=0)
    assert got.tokens == 8
    empty = score_record(logits, targets, 1.0, 0.9, seed=0, skip=torch.ones(8, dtype=torch.bool))
    assert empty == RecordScore(0, 0, 0.0, 0.0, 0.0, 0, 0.0, 0.0, 0.0)


def test_errors():
    logits, targets = case(n=8)
    with pytest.raises(ValueError, match="targets"):
        score_record(logits, targets[:5], 1.0, 0.9, seed=0)
    with pytest.raises(ValueError, match="skip"):
        score_record(logits, targets, 1.0, 0.9, seed=0, skip=torch.zeros(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="target ids"):
        score_record(logits, targets + 100, 1.0, 0.9, seed=0)
    with pytest.raises(ValueError, match="top_p"):
        score_record(logits, targets, 1.0, 1.5, seed=0)
    with pytest.raises(ValueError, match="length"):
        records_from_tokens(np.zeros(3, int), 1, *(np.zeros(2),) * 8)


def test_records_from_tokens_groups_by_record():
    rec = np.array([0, 0, 2, 2, 2])
    inside = np.array([True, False, True, True, True])
    out = records_from_tokens(rec, 3, inside, np.array([1.0, 9, 2, 3, 4]), np.ones(5), np.full(5, 0.5),
                              np.array([True, True, False, True, True]), np.full(5, 0.4), np.full(5, -1.0),
                              np.array([0.05, 0.5, 0.99, np.nan, 1.0]))
    assert out[1] == RecordScore(0, 0, 0.0, 0.0, 0.0, 0, 0.0, 0.0, 0.0)
    assert (out[0].tokens, out[0].outside, out[0].surprisal, out[0].top1, out[0].loglik) == (2, 1, 1.0, 1, -2.0)
    assert out[0].pit == (1,) + (0,) * 9  # the outside token's PIT is not counted
    assert (out[2].tokens, out[2].surprisal, out[2].entropy, out[2].top1) == (3, 9.0, 3.0, 2)
    assert out[2].pit == (0,) * 9 + (2,)  # 0.99 and 1.0 in the last bin, NaN not counted
    assert out[2].top1_variance == pytest.approx(3 * 0.24)


def test_skipping_special_tokens_is_scored_given_not_special():
    """Positions are skipped because of the token found there (a special one): the scored tokens are draws
    from the target GIVEN that they are not special. Scored under the unconditional distribution an honest
    provider reads too probable (the rehearsal found -0.035 nats/token); with ``exclude_ids`` it is calibrated."""
    import torch

    from engine.fidelity.dist import sampling_distribution

    g = torch.Generator().manual_seed(11)
    n, vocab = 6000, 60
    logits = torch.randn(n, vocab, generator=g) * 2.0
    logits[:, :6] += 1.0  # six "special" ids with ~15% of the mass between them
    p = sampling_distribution(logits, 1.0, 0.95)
    y = torch.multinomial(p, 1, generator=g).squeeze(1)
    special = torch.arange(6)
    skip = torch.isin(y, special)
    assert 0.05 < skip.float().mean() < 0.4

    def z(s):
        return (s.surprisal - s.entropy) / math.sqrt(s.variance)

    biased = score_record(logits, y, 1.0, 0.95, seed=1, skip=skip)
    fixed = score_record(logits, y, 1.0, 0.95, seed=1, skip=skip, exclude_ids=special)
    assert abs(z(biased)) > 5  # the honest provider would be judged drifting (its sign: where the special mass lies)
    assert abs(z(fixed)) < 4 and fixed.outside == 0
    assert fixed.tokens == biased.tokens == int((~skip).sum())
