"""Detection power of the fidelity verdict per drift kind and records count, at the default settings
(false_alarm 0.001 over 20 looks). Run with ``-s`` for the table docs/fidelity.md quotes.

Drift kinds (fidelity_world): ``quant``: the target's logits + N(0, 0.3^2) noise fixed per context
(per-token KL(target || provider) ~0.035 nats at T=1, printed); ``temp``: 1.4x the requested temperature;
``mix-temp`` / ``mix-quant``: each record drifted (as ``temp`` / ``quant``) with probability 0.3, the rest
honest. Each trial is one provider's stream of 400 records (50-300 tokens), judged at 20, 50, 100, 200
and 400 records, as the looks of a run judge it.
"""

import numpy as np
import pytest
from fidelity_world import World

from engine.fidelity.verdict import FidelitySettings, judge

SIGMA = 0.3
LOOKS = (20, 50, 100, 200, 400)
TRIALS = 30
KINDS = ("quant", "temp", "mix-temp", "mix-quant")


def power_table(temperature: float, top_p: float) -> tuple[dict[str, list[float]], World]:
    w = World(temperature=temperature, top_p=top_p, seed=2)
    s = FidelitySettings()
    out: dict[str, list[float]] = {}
    for ki, kind in enumerate(KINDS):
        sampler = w.drift(kind.removeprefix("mix-"), sigma=SIGMA)
        hits = np.zeros(len(LOOKS))
        rng = np.random.default_rng(100 * ki + int(10 * temperature))
        n = LOOKS[-1]
        drifted = np.ones((TRIALS, n), bool) if not kind.startswith("mix") else rng.random((TRIALS, n)) < 0.3
        recs = w.records(TRIALS * n, rng, drifted=drifted.ravel(), sampler=sampler)
        for t in range(TRIALS):
            mine = recs[t * n:(t + 1) * n]
            for li, look in enumerate(LOOKS):
                hits[li] += judge(mine[:look], [], s).verdict == "drifting"
        out[kind] = list(hits / TRIALS)
    return out, w


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 0.95), (0.6, 1.0)])
def test_power_per_drift_kind(temperature, top_p):
    table, w = power_table(temperature, top_p)
    kl_model, kl_at_t = w.kl_quant(SIGMA)
    print(f"\nT={temperature} top_p={top_p}: quant KL(target||provider) {kl_model:.4f} nats/token at T=1, "
          f"{kl_at_t:.4f} at T={temperature}; power over {TRIALS} trials, default settings (alpha 1e-5 per test)")
    print("  records  " + "  ".join(f"{n:>5d}" for n in LOOKS))
    for kind, row in table.items():
        print(f"  {kind:9s}" + "  ".join(f"{p:5.2f}" for p in row))
    assert 0.02 <= kl_model <= 0.05
    assert table["temp"][0] >= 0.9  # 1.4x temperature: caught at the first look (20 records)
    assert table["mix-temp"][0] >= 0.9  # 30% of records at 1.4x: also at 20 records
    # fake-quantized: with a nucleus its tokens fall outside the target's nucleus (0.6% vs 0.2% tolerated)
    # by 50 records; without one only the calibration tests see it (KL 0.07 at T=0.6: 200 records)
    assert table["quant"][LOOKS.index(50 if top_p < 1 else 200)] >= 0.9
