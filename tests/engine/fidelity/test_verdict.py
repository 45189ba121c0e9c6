"""The fidelity verdict: its tail functions, its rules, and its false-alarm rate over 300 seeded honest
providers per setting (the issue's ">= 200 seeded trials"), observed against nominal.

Run with ``-s`` to see the measured rates (docs/fidelity.md, "Thresholds and why", quotes them).
"""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from fidelity_world import World

from engine.fidelity.score import PIT_BINS, RecordScore, score_record
from engine.fidelity.tails import betainc, binom_sf, chi2_sf, norm_two_sided, t_two_sided
from engine.fidelity.verdict import FidelitySettings, binom_upper, judge, judge_providers

SETTINGS = [(1.0, 0.95), (0.6, 1.0)]  # Kimi's recommended sampling, and a cooler one without a nucleus
TRIALS = 300
RECORDS = 40  # ~7,000 tokens per trial (records of 50-300 tokens)


# ---------------------------------------------------------------------------------------------- tails


def test_tails_against_references():
    for x, k in [(3.841458820694124, 1), (16.918977604620448, 9), (0.5, 3), (450.0, 400), (2000.0, 1500),
                 (30.0, 9), (1e-3, 2)]:
        ref = float(torch.special.gammaincc(torch.tensor(k / 2, dtype=torch.float64),
                                            torch.tensor(x / 2, dtype=torch.float64)))
        assert chi2_sf(x, k) == pytest.approx(ref, rel=1e-9, abs=1e-300)
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(0.0, 5) == 1.0
    assert norm_two_sided(1.959963984540054) == pytest.approx(0.05, rel=1e-12)
    assert norm_two_sided(math.nan) == 1.0
    assert t_two_sided(2.0, 10) == pytest.approx(0.07338803477074313, rel=1e-9)  # 2 x 0.036694
    assert t_two_sided(2.0, 1e6) == pytest.approx(norm_two_sided(2.0), rel=1e-4)
    assert betainc(2.0, 3.0, 0.4) == pytest.approx(1 - 0.6**4 - 4 * 0.4 * 0.6**3, rel=1e-9)
    for n, q in [(30, Fraction(1, 10)), (200, Fraction(2, 1000)), (7, Fraction(1, 2))]:
        pmf = [math.comb(n, j) * q**j * (1 - q) ** (n - j) for j in range(n + 1)]  # exact rationals
        for k in range(n + 1):
            exact = float(sum(pmf[k:]))
            assert binom_sf(k, n, float(q)) == pytest.approx(exact, rel=1e-11, abs=1e-300)
    assert binom_sf(0, 10, 0.3) == 1.0 and binom_sf(11, 10, 0.3) == 0.0
    poisson = float(torch.special.gammainc(torch.tensor(150.0, dtype=torch.float64),
                                           torch.tensor(100.0, dtype=torch.float64)))  # Poisson(100) >= 150
    assert binom_sf(150, 1_000_000, 0.0001) == pytest.approx(poisson, rel=0.01)
    assert binom_sf(80, 1_000_000, 0.0001) == pytest.approx(float(torch.special.gammainc(
        torch.tensor(80.0, dtype=torch.float64), torch.tensor(100.0, dtype=torch.float64))), rel=0.01)


# ------------------------------------------------------------------------------------------- the rules


@pytest.fixture(scope="module")
def worlds():
    return {s: World(temperature=s[0], top_p=s[1], seed=1) for s in SETTINGS}


def test_world_scores_match_score_record(worlds):
    """The synthetic world's numpy scores are score_record's (so the rates below are the product's)."""
    w = worlds[(1.0, 0.95)]
    rng = np.random.default_rng(3)
    ctx = rng.integers(0, len(w.p), 120)
    y = w.sample(w.honest, ctx, rng)
    y[:5] = 499 - w.argmax[ctx[:5]]  # some tokens outside the nucleus
    direct = score_record(w.logits[torch.from_numpy(ctx)], torch.from_numpy(y), 1.0, 0.95, seed=0)
    flat = ctx * w.vocab + y
    assert direct.tokens == 120 and direct.outside == int((w.p.ravel()[flat] == 0).sum()) >= 1
    ins = w.p.ravel()[flat] > 0
    assert direct.surprisal == pytest.approx(-w.logp.ravel()[flat][ins].sum(), rel=1e-6)
    assert direct.entropy == pytest.approx(w.entropy[ctx][ins].sum(), rel=1e-6)
    assert direct.variance == pytest.approx(w.variance[ctx][ins].sum(), rel=1e-6)
    assert direct.top1 == int((w.argmax[ctx] == y).sum())
    assert direct.loglik == pytest.approx(w.loglik.ravel()[flat].sum(), rel=1e-9)


def honest(w: World, n: int, seed: int) -> list[RecordScore]:
    return w.records(n, np.random.default_rng(seed))


def test_insufficient_then_ok(worlds):
    w = worlds[(1.0, 0.95)]
    recs = honest(w, 25, 0)
    v = judge(recs[:19], [], FidelitySettings())
    assert v.verdict == "insufficient" and v.records == 19
    assert v.reason.startswith("19 records / ") and "needs 20 records and 2000 tokens" in v.reason
    tiny = [RecordScore(50, 0, 50.0, 50.0, 40.0, 20, 20.0, 10.0, -60.0, (5,) * PIT_BINS)] * 30
    assert judge(tiny, [], FidelitySettings()).verdict == "insufficient"  # 1,500 tokens < 2,000
    v = judge(recs, [], FidelitySettings())
    assert v.verdict == "ok", v.reason
    assert v.reason.startswith("no test rejects at p < 8e-06 over 25 records")
    # no others: no Welch, no nucleus-others (both need the others' records)
    assert [t.name for t in v.tests] == ["surprisal", "top1", "pit", "records", "nucleus"]
    assert v.figures["alpha"] == pytest.approx(0.001 / 20 / 6)
    assert math.isnan(v.figures["others_outside_share"])
    assert v.figures["outside_share"] == 0.0 and abs(v.figures["mean_surprisal_excess"]) < 0.05
    assert v.tokens == sum(r.tokens for r in recs)
    j = v.to_json()
    assert j["verdict"] == "ok" and j["figures"]["others_loglik_per_token"] is None
    assert {t["name"] for t in j["tests"]} >= {"surprisal", "pit"}


def test_hot_provider_drifting_with_reason(worlds):
    w = worlds[(1.0, 0.95)]
    rng = np.random.default_rng(5)
    hot = w.records(60, rng, drifted=np.ones(60, bool), sampler=w.drift("temp", hotter=1.4))
    v = judge(hot, honest(w, 60, 6), FidelitySettings())
    assert v.verdict == "drifting"
    assert v.reason.startswith("surprisal +0.") and "nats/token over the target's expectation (z=" in v.reason
    assert "< 8e-06)" in v.reason and "; also " in v.reason
    assert v.figures["mean_surprisal_excess"] > 0.1 and v.figures["top1_rate"] < v.figures["top1_expected"]
    others = next(t for t in v.tests if t.name == "others")
    assert not others.rejected and others.statistic < 0  # lower log-likelihood; evidence only, never votes
    assert "does not vote" in others.detail


def test_nucleus_and_greedy():
    # a greedy provider: every in-nucleus token is the argmax; judged by tokens outside (not the argmax)
    def greedy(n_tokens: int, off: int) -> RecordScore:
        k = n_tokens - off
        return RecordScore(n_tokens, off, 0.0, 0.0, 0.0, k, float(k), 0.0, -0.5 * n_tokens)

    s = FidelitySettings()
    ok = judge([greedy(200, 0)] * 30, [], s)
    assert ok.verdict == "ok" and ok.figures["pit_chi2"] != ok.figures["pit_chi2"]  # no PIT: NaN
    # 18 of 6,000 outside (0.3%): Binomial(6000, 0.2%) has mean 12, P(>= 18) = 0.063: within the tolerance
    near = judge([greedy(200, 1)] * 18 + [greedy(200, 0)] * 12, [], s)
    assert near.verdict == "ok" and near.tests[-1].p_value == pytest.approx(0.0628, abs=0.0005)
    assert near.tests[-1].name == "nucleus"
    bad = judge([greedy(200, 2)] * 30, [], s)  # 60 of 6,000 = 1% against a 0.2% tolerance
    assert bad.verdict == "drifting" and bad.reason.startswith("60 of 6000 tokens (1.00%) outside the target's")


def greedy_records(n: int, tokens: int, outside_total: int) -> list[RecordScore]:
    """``n`` greedy records of ``tokens`` each, ``outside_total`` tokens outside spread over the first ones."""
    out = []
    for i in range(n):
        off = outside_total // n + (i < outside_total % n)
        k = tokens - off
        out.append(RecordScore(tokens, off, 0.0, 0.0, 0.0, k, float(k), 0.0, -0.5 * tokens))
    return out


def test_nucleus_against_the_others():
    """0.19% outside (under the 0.2% tolerance) vs peers at 0%: drifting by nucleus-others, whose reference is
    the peers' share + the 0.1% floor; peers at 0.15% or too few peer tokens: ok."""
    s = FidelitySettings()
    mine = greedy_records(350, 200, 133)  # 133 of 70,000 = 0.19%
    alone = judge(mine, [], s)
    assert alone.verdict == "ok" and alone.figures["outside_share"] == pytest.approx(0.0019)
    clean = greedy_records(700, 200, 0)
    v = judge(mine, clean, s)
    assert v.verdict == "drifting"
    t = next(t for t in v.tests if t.name == "nucleus-others")
    q = 0.5 / 140_001 + 0.001
    assert q > binom_upper(0, 140_000, s.alpha() / 2) == pytest.approx(-math.log(s.alpha() / 2) / 140_000, rel=1e-4)
    assert t.p_value == pytest.approx(2 * binom_sf(133, 70_000, q), rel=1e-9) and t.p_value < 1e-9
    # Poisson(70.3) >= 133, independently: the regularized lower gamma P(133, 70.3)
    ref = float(torch.special.gammainc(torch.tensor(133.0, dtype=torch.float64),
                                       torch.tensor(70_000 * q, dtype=torch.float64)))
    assert t.p_value == pytest.approx(2 * ref, rel=0.05)
    assert v.reason.startswith("0.19% of tokens (133 of 70000) outside the target's nucleus vs 0.00% (0 of 140000) "
                               "for the other providers (tested against 0.100%, theirs + 0.10% floor, p=")
    assert v.reason.endswith(" < 8e-06)") and v.figures["others_outside_share"] == 0.0
    assert next(t for t in v.tests if t.name == "nucleus").p_value > 0.5  # the absolute test does not see it
    noisy_peers = greedy_records(700, 200, 210)  # 0.15%: reference 0.25%
    assert judge(mine, noisy_peers, s).verdict == "ok"
    few = greedy_records(9, 200, 0)  # 1,800 peer tokens < min_tokens: the test does not run
    assert "nucleus-others" not in [t.name for t in judge(mine, few, s).tests]
    # 2,000 peer tokens with none outside: the exact upper bound of their rate, 1 - (alpha/2)^(1/2000) = 0.618%,
    # is the reference
    v = judge(mine, greedy_records(10, 200, 0), s)
    t = next(t for t in v.tests if t.name == "nucleus-others")
    assert 1 - (s.alpha() / 2) ** (1 / 2000) == pytest.approx(binom_upper(0, 2000, s.alpha() / 2), rel=1e-9)
    assert v.verdict == "ok" and "(tested against 0.618%, the upper bound of theirs)" in t.detail


def _flag_chance(n1: int, r1: float, n2: int, k2: int, s: FidelitySettings) -> float:
    """Exact chance that nucleus-others rejects a provider whose outside count is Binomial(n1, r1) against
    peers with k2 of n2 outside: P(k1 >= the smallest count it rejects)."""
    q = min(1.0, max((k2 + 0.5) / (n2 + 1) + s.outside_floor(), binom_upper(k2, n2, s.alpha() / 2)))
    lo, hi = int(n1 * q), int(n1 * q + 40 * math.sqrt(n1 * q) + 60)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if 2 * binom_sf(mid, n1, q) < s.alpha() else (mid + 1, hi)
    return binom_sf(lo, n1, r1)


def test_nucleus_others_guarantees_and_numerics(worlds):
    """Exact, from the binomial: (1) a provider outside at the floor's rate or less is flagged with chance
    <= alpha / 2 at any sample size; (2) one outside as often as its peers (any rate) with chance <= alpha,
    however few peer tokens; (3) an honest engine with other numerics (logits + N(0, 0.03^2)) at Kimi's
    T=1 / top_p=0.95 is outside 0.068% of its tokens (the fake-quantized 30% mix: 0.18%): against exact
    peers it is never flagged up to 1e8 tokens."""
    s = FidelitySettings()
    for n1 in (2_000, 20_000, 200_000, 2_000_000, 20_000_000):
        assert _flag_chance(n1, s.outside_floor(), n1, 0, s) <= s.alpha() / 2
    for r, n2, n1 in [(0.003, 2_000, 1_000_000), (0.0015, 20_000, 10_000_000), (0.002, 5_000, 200_000)]:
        m = n2 * r
        ks = range(int(m + 12 * math.sqrt(m) + 20))  # the peers' count, to beyond 1e-20 of its mass
        pmf = [binom_sf(k, n2, r) - binom_sf(k + 1, n2, r) for k in ks]
        chance = sum(w * _flag_chance(n1, r, n2, k, s) for k, w in zip(ks, pmf, strict=True))
        assert chance <= s.alpha(), (r, n2, n1, chance)
    w = worlds[(1.0, 0.95)]
    r1, mix = w.outside_rate(w.probs("numerics", 0.03)), 0.3 * w.outside_rate(w.probs("quant", 0.3))
    sizes = (10_000, 100_000, 1_000_000, 10_000_000, 100_000_000)
    chances = [_flag_chance(n, r1, n, 0, s) for n in sizes]
    print(f"\nnumerics 0.03: {r1:.4%} outside (30% fake-quantized mix {mix:.4%}); chance flagged per look at "
          + ", ".join(f"{n:.0e} tokens {c:.1e}" for n, c in zip(sizes, chances, strict=True)))
    assert 0.0005 < r1 < 0.0008 and 0.0015 < mix < 0.002
    assert max(chances) < 1e-8


def test_judge_providers_pools_the_others(worlds):
    w = worlds[(0.6, 1.0)]
    rng = np.random.default_rng(9)
    by = {"a": honest(w, 30, 1), "b": honest(w, 30, 2),
          "hot": w.records(30, rng, drifted=np.ones(30, bool), sampler=w.drift("temp"))}
    out = judge_providers(by, FidelitySettings())
    assert {k: v.verdict for k, v in out.items()} == {"a": "ok", "b": "ok", "hot": "drifting"}
    ll_others = out["a"].figures["others_loglik_per_token"]
    pooled = by["b"] + by["hot"]
    assert ll_others == pytest.approx(sum(r.loglik for r in pooled) / sum(r.tokens for r in pooled))


# ------------------------------------------------------------------------------ false alarms, measured


def _bounds(n: int, rate: float, z: float = 3.5) -> tuple[float, float]:
    sd = math.sqrt(n * rate * (1 - rate))
    return n * rate - z * sd, n * rate + z * sd


def test_false_alarm_rate_on_honest_providers(worlds):
    """300 seeded honest providers per setting, 40 records each, judged against the pooled records of 3 other
    honest providers of the same world: at the defaults (per look 8.3e-6) none is judged drifting; at
    false_alarm=0.05, looks=1 (per test 0.0083) the observed rate is below 0.05, and every voting test's p-values
    are uniform (rates of p < 0.01, 0.05, 0.5 within binomial bounds of nominal). Also 300 honest providers whose
    engine has other numerics (logits + N(0, 0.03^2)) at T=1 / top_p=0.95 against the same exact peers: none
    drifting at the defaults, and under 0.05 at false_alarm=0.05."""
    default, loose = FidelitySettings(), FidelitySettings(false_alarm=0.05, looks=1)
    pvals: dict[str, dict[str, list[float]]] = {"exact": {}, "numerics": {}}
    alarms = {(pop, a): 0 for pop in pvals for a in ("default", "loose")}
    trials = {"exact": 0, "numerics": 0}
    populations = [("exact", setting, None) for setting in SETTINGS] + [("numerics", (1.0, 0.95), 0.03)]
    for pop, (temperature, top_p), sigma in populations:
        w = worlds[(temperature, top_p)]
        rng = np.random.default_rng(int(temperature * 10) + (7 if sigma else 0))
        peers = w.records(TRIALS * RECORDS, np.random.default_rng(int(temperature * 10)))
        recs = peers if sigma is None else w.records(TRIALS * RECORDS, rng, drifted=np.ones(TRIALS * RECORDS, bool),
                                                     sampler=w.drift("numerics", sigma=sigma))
        for i in range(TRIALS):
            mine = recs[i * RECORDS:(i + 1) * RECORDS]
            other = [r for j in range(1, 4) for r in peers[((i + j) % TRIALS) * RECORDS:][:RECORDS]]
            alarms[pop, "default"] += judge(mine, other, default).verdict == "drifting"
            v = judge(mine, other, loose)
            alarms[pop, "loose"] += v.verdict == "drifting"
            for t in v.tests:
                pvals[pop].setdefault(t.name, []).append(t.p_value)
            trials[pop] += 1
    for pop, n in trials.items():
        print(f"\n{pop} honest providers: {n} trials of {RECORDS} records; drifting at the defaults (0.001 over 20 "
              f"looks): {alarms[pop, 'default']}/{n}; at false_alarm=0.05, looks=1: {alarms[pop, 'loose']}/{n} = "
              f"{alarms[pop, 'loose'] / n:.3f}")
        for name, ps in pvals[pop].items():
            arr = np.array(ps)
            print(f"  {name:14s} share p<0.01 {np.mean(arr < 0.01):.3f}  p<0.05 {np.mean(arr < 0.05):.3f}  "
                  f"p<0.5 {np.mean(arr < 0.5):.3f}")
    n = trials["exact"]
    assert alarms["exact", "default"] <= 1 and alarms["numerics", "default"] == 0
    assert alarms["exact", "loose"] <= _bounds(n, 0.05)[1]
    assert alarms["numerics", "loose"] <= _bounds(trials["numerics"], 0.05)[1]
    exact = pvals["exact"]
    for name in ("surprisal", "top1", "pit", "records", "others"):
        arr = np.array(exact[name])
        for level in (0.01, 0.05, 0.5):
            lo, hi = _bounds(n, level)
            assert lo <= (arr < level).sum() <= hi, (name, level, (arr < level).sum())
    for name in ("nucleus", "nucleus-others"):  # an exact honest provider is never outside
        assert len(exact[name]) == n and min(exact[name]) == 1.0
    # other numerics: outside 0.068% of its tokens, under the 0.1% floor over exact peers (never flagged)
    assert min(pvals["numerics"]["nucleus-others"]) > 0.05
