"""Detection power of the fidelity verdict per drift kind and records count, at the default settings
(false_alarm 0.001 over 20 looks, 6 voting tests). Run with ``-s`` for the table docs/fidelity.md quotes.

Drift kinds (fidelity_world): ``quant``: the target's logits + N(0, 0.3^2) noise fixed per context
(per-token KL(target || provider) ~0.035 nats at T=1, printed); ``temp``: 1.4x the requested temperature;
``mix-temp`` / ``mix-quant``: each record drifted (as ``temp`` / ``quant``) with probability 0.3, the rest
honest. Each trial is one provider's stream of 800 records (50-300 tokens), judged at 20, 50, ..., 800
records, as the looks of a run judge it, against the pooled records of two honest providers that have been
bought alongside it (twice its records: a run split evenly over three providers).
"""

import numpy as np
import pytest
from fidelity_world import World

from engine.fidelity.verdict import FidelitySettings, judge

SIGMA = 0.3
LOOKS = (20, 50, 100, 200, 300, 400, 600, 800)
TRIALS = 30
KINDS = ("quant", "temp", "mix-temp", "mix-quant")


def power_table(temperature: float, top_p: float) -> tuple[dict[str, list[float]], World]:
    w = World(temperature=temperature, top_p=top_p, seed=2)
    s = FidelitySettings()
    n = LOOKS[-1]
    peers = w.records(2 * n, np.random.default_rng(7))  # two honest providers, interleaved
    out: dict[str, list[float]] = {}
    for ki, kind in enumerate(KINDS):
        sampler = w.drift(kind.removeprefix("mix-"), sigma=SIGMA)
        hits = np.zeros(len(LOOKS))
        rng = np.random.default_rng(100 * ki + int(10 * temperature))
        drifted = np.ones((TRIALS, n), bool) if not kind.startswith("mix") else rng.random((TRIALS, n)) < 0.3
        recs = w.records(TRIALS * n, rng, drifted=drifted.ravel(), sampler=sampler)
        for t in range(TRIALS):
            mine = recs[t * n:(t + 1) * n]
            for li, look in enumerate(LOOKS):
                hits[li] += judge(mine[:look], peers[:2 * look], s).verdict == "drifting"
        out[kind] = list(hits / TRIALS)
    return out, w


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 0.95), (0.6, 1.0)])
def test_power_per_drift_kind(temperature, top_p):
    table, w = power_table(temperature, top_p)
    kl_model, kl_at_t = w.kl_quant(SIGMA)
    outside = w.outside_rate(w.probs("quant", SIGMA))
    print(f"\nT={temperature} top_p={top_p}: quant KL(target||provider) {kl_model:.4f} nats/token at T=1, "
          f"{kl_at_t:.4f} at T={temperature}, {outside:.3%} of its tokens outside the target's nucleus (30% mix: "
          f"{0.3 * outside:.3%}); power over {TRIALS} trials, default settings (alpha 8.3e-6 per test)")
    print("  records  " + "  ".join(f"{n:>5d}" for n in LOOKS))
    for kind, row in table.items():
        print(f"  {kind:9s}" + "  ".join(f"{p:5.2f}" for p in row))
    assert 0.02 <= kl_model <= 0.05
    assert table["temp"][0] >= 0.9  # 1.4x temperature: caught at the first look (20 records)
    assert table["mix-temp"][0] >= 0.9  # 30% of records at 1.4x: also at 20 records
    # fake-quantized: with a nucleus its tokens fall outside the target's nucleus (0.6% vs 0.2% tolerated)
    # by 50 records; without one only the calibration tests see it (KL 0.07 at T=0.6: 200 records)
    assert table["quant"][LOOKS.index(50 if top_p < 1 else 200)] >= 0.9
    if top_p < 1:
        # 30% fake-quantized: 0.18% outside, under the 0.2% tolerance, over the honest peers' 0% + 0.1% floor:
        # nucleus-others catches it by 600 records (~100,000 tokens); the absolute test alone never did
        assert 0.0015 < 0.3 * outside < 0.002
        assert table["mix-quant"][LOOKS.index(600)] >= 0.9 and table["mix-quant"][LOOKS.index(100)] <= 0.5
    else:  # no nucleus: no token is ever outside; only the calibration tests see the 30% mix, slowly
        assert outside == 0.0
