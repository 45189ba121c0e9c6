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
from engine.fidelity.verdict import FidelitySettings, judge, judge_providers

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
    assert v.reason.startswith("no test rejects at p < 1e-05 over 25 records")
    assert [t.name for t in v.tests] == ["surprisal", "top1", "pit", "records", "nucleus"]  # no others: no Welch
    assert v.figures["alpha"] == pytest.approx(1e-5)
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
    assert "< 1e-05)" in v.reason and "; also " in v.reason
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
    bad = judge([greedy(200, 2)] * 30, [], s)  # 60 of 6,000 = 1% against a 0.2% tolerance
    assert bad.verdict == "drifting" and bad.reason.startswith("60 of 6000 tokens (1.00%) outside the target's")


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
    """300 seeded honest providers per setting, 40 records each: at the defaults (per look 5e-5) none is
    judged drifting; at false_alarm=0.05, looks=1 (per test 0.01) the observed rate is below 0.05, and every
    voting test's p-values are uniform (rates of p < 0.01, 0.05, 0.5 within binomial bounds of nominal)."""
    default, loose = FidelitySettings(), FidelitySettings(false_alarm=0.05, looks=1)
    pvals: dict[str, list[float]] = {}
    alarms_default = alarms_loose = 0
    n = 0
    for (temperature, _top_p), w in worlds.items():
        recs = w.records(TRIALS * RECORDS, np.random.default_rng(int(temperature * 10)))
        for i in range(TRIALS):
            mine = recs[i * RECORDS:(i + 1) * RECORDS]
            other = recs[((i + 1) % TRIALS) * RECORDS:((i + 1) % TRIALS + 1) * RECORDS]
            alarms_default += judge(mine, other, default).verdict == "drifting"
            v = judge(mine, other, loose)
            alarms_loose += v.verdict == "drifting"
            for t in v.tests:
                pvals.setdefault(t.name, []).append(t.p_value)
            n += 1
    print(f"\nhonest providers: {n} trials of {RECORDS} records; drifting at the defaults (0.001 over 20 looks): "
          f"{alarms_default}/{n}; at false_alarm=0.05, looks=1: {alarms_loose}/{n} = {alarms_loose / n:.3f}")
    for name, ps in pvals.items():
        arr = np.array(ps)
        print(f"  {name:9s} share p<0.01 {np.mean(arr < 0.01):.3f}  p<0.05 {np.mean(arr < 0.05):.3f}  "
              f"p<0.5 {np.mean(arr < 0.5):.3f}")
    assert alarms_default <= 1
    assert alarms_loose <= _bounds(n, 0.05)[1]
    for name in ("surprisal", "top1", "pit", "records", "others"):
        arr = np.array(pvals[name])
        for level in (0.01, 0.05, 0.5):
            lo, hi = _bounds(n, level)
            assert lo <= (arr < level).sum() <= hi, (name, level, (arr < level).sum())
    assert max(pvals["nucleus"]) == 1.0 and min(pvals["nucleus"]) == 1.0  # honest: never outside
