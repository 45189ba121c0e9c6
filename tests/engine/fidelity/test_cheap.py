"""Cheap fidelity signals (engine.fidelity.cheap): the exact tests against brute force, the tool-call schema check,
the verdict's wording, and by simulation (tests/engine/fidelity/cheapsim.py, seeded) the false-alarm rate on
honest providers that serve different prompts from a heterogeneous mix, and the power per drift kind."""

from __future__ import annotations

import math
from itertools import product

import numpy as np
import pytest
from cheapsim import Drift, world

from engine.fidelity.cheap import TESTS, CheapRecord, exact_rate, judge_cheap, van_elteren
from engine.fidelity.toolschema import tool_calls_valid


def _hyper(n_a: int, k_a: int, n_b: int, k_b: int) -> dict[int, float]:
    big, events = n_a + n_b, k_a + k_b
    return {x: math.comb(events, x) * math.comb(big - events, n_a - x) / math.comb(big, n_a)
            for x in range(max(0, events - n_b), min(n_a, events) + 1)}


def test_exact_rate_is_the_sum_of_hypergeometrics():
    strata = [(5, 3, 7, 1), (4, 0, 6, 2), (3, 3, 0, 0), (6, 2, 9, 4)]  # the third has no rest: fixed at 3
    pmfs = [_hyper(*s) for s in strata if s[0] and s[2]]
    total: dict[int, float] = {}
    for xs in product(*(list(p.items()) for p in pmfs)):
        x = sum(v for v, _ in xs) + 3
        total[x] = total.get(x, 0.0) + math.prod(q for _, q in xs)
    obs, expected, up, low = exact_rate(strata)
    assert obs == 8 and expected == pytest.approx(5 * 4 / 12 + 4 * 2 / 10 + 3 + 6 * 6 / 15)
    assert up == pytest.approx(sum(q for x, q in total.items() if x >= 8))
    assert low == pytest.approx(sum(q for x, q in total.items() if x <= 8))
    # Fisher's exact test, one stratum: 4 of 5 against 1 of 10
    assert exact_rate([(5, 4, 10, 1)])[2] == pytest.approx(sum(_hyper(5, 4, 10, 1)[x] for x in (4, 5)))


def test_van_elteren_on_one_stratum_is_the_rank_sum_test():
    a, b = np.array([1.0, 2, 2, 5, 9]), np.array([3.0, 4, 6, 7, 8, 10])
    z, p = van_elteren([(a, b)])
    # rank sum of a with midranks: 1 + 2.5 + 2.5 + 6 + 10 = 22 (2 tied at 2... no: b has no 2) -> ranks 1, 2.5, 2.5, 6, 10
    w, n, m = 1 + 2.5 + 2.5 + 6 + 10, 5, 6
    var = n * m / 12 * ((n + m + 1) - 6 / ((n + m) * (n + m - 1)))
    assert z == pytest.approx((w - n * (n + m + 1) / 2) / math.sqrt(var))
    assert p == pytest.approx(math.erfc(abs(z) / math.sqrt(2)))
    assert van_elteren([(a, np.array([]))]) == (0.0, 1.0)
    assert van_elteren([(np.ones(4), np.ones(3))]) == (0.0, 1.0)  # all tied


TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "required": ["q"], "additionalProperties": False,
    "properties": {"q": {"type": "string"}, "k": {"type": "integer"}, "mode": {"enum": ["web", "news"]},
                   "tags": {"type": "array", "items": {"type": "string"}}}}}}]


def _call(name: str, args: object) -> dict:
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": args}}


@pytest.mark.parametrize("args, valid", [
    ('{"q": "x"}', True), ('{"q": "x", "k": 3, "mode": "news", "tags": ["a"]}', True), ({"q": "x"}, True),
    ('{"k": 3}', False),  # required q missing
    ('{"q": "x", "extra": 1}', False),  # additionalProperties false
    ('{"q": 3}', False), ('{"q": "x", "k": 1.5}', False), ('{"q": "x", "mode": "images"}', False),
    ('{"q": "x", "tags": [1]}', False), ('{"q": "x"', False), ('["q"]', False),
])
def test_tool_calls_against_the_declared_schema(args, valid):
    assert tool_calls_valid([_call("search", args)], TOOLS) is valid


def test_tool_calls_name_and_absence():
    assert tool_calls_valid([], TOOLS) is None
    assert tool_calls_valid([_call("fetch", "{}")], TOOLS) is False
    assert tool_calls_valid([_call("search", '{"q": "a"}'), _call("search", "{}")], TOOLS) is False
    assert tool_calls_valid([_call("f", "")], [{"name": "f"}]) is True  # bare schema, no parameters, no arguments


def _rec(provider: str, n: int, stratum: str = "d", **kw) -> CheapRecord:
    base = dict(provider=provider, completion_tokens=n, reasoning_tokens=n // 2, finish_reason="stop",
                wire_flagged=False, tool_calls_declared=False, tool_call_valid=None, prompt_diff=0,
                reconstruct_ok=True, stratum=stratum)
    base.update(kw)
    return CheapRecord(**base)  # type: ignore[arg-type]


def test_verdicts_and_their_reasons():
    rng = np.random.default_rng(0)
    lengths = np.exp(rng.normal(7, 0.5, 900)).astype(int) + 1
    by = {"A": [_rec("A", int(x)) for x in lengths[:300]], "B": [_rec("B", int(x)) for x in lengths[300:600]],
          "S": [_rec("S", int(x * 0.7)) for x in lengths[600:]], "few": [_rec("few", 100)] * 5}
    v = judge_cheap(by, false_alarm=0.01, min_records=30, looks=4)
    assert (v["A"].verdict, v["B"].verdict, v["S"].verdict, v["few"].verdict) == ("ok", "ok", "drifting", "insufficient")
    assert v["few"].reason == "5 records, fewer than 30" and v["few"].records == 5
    s = v["S"]
    assert s.reason.startswith("completions 3") and "shorter than the other providers' (median " in s.reason
    assert [t.name for t in s.tests] == list(TESTS) and s.tests[0].rejected and s.tests[0].statistic < -8
    assert s.figures["level"] == pytest.approx(0.01 / (8 * 4))
    assert v["A"].reason.startswith("no cheap signal differs from the other providers' (300 records, 8 tests at p<")
    assert v["A"].to_json()["tests"][4]["statistic"] is None  # no tool calls anywhere: not run (nan -> null)
    # a provider that bills 3 more prompt tokens than our count on every record
    by["S"] = [_rec("S", int(x), prompt_diff=3) for x in lengths[600:]]
    s = judge_cheap(by, false_alarm=0.01, min_records=30, looks=1)["S"]
    assert s.verdict == "drifting" and s.reason.startswith(
        "billed prompt tokens differing from our count on 100% of records vs 0.0% at the other providers, p=")
    assert s.reason.endswith("(and 1 more)")
    assert judge_cheap({"A": by["A"]}, false_alarm=0.01, min_records=30, looks=1)["A"].reason == \
        "no other provider to compare with"
    with pytest.raises(ValueError):
        judge_cheap(by, false_alarm=0.0, min_records=30, looks=1)


def test_spikes_of_ties_are_tested_exactly_not_by_ranks():
    """Records cut at max_tokens tie at the top of the lengths: the rank test leaves them to the exact finish
    test, so a small provider with many cuts reads as more ``length`` finishes, not as longer completions."""
    rng = np.random.default_rng(1)
    def recs(p: str, n: int, cut: float) -> list[CheapRecord]:
        out = []
        for x in np.exp(rng.normal(6, 0.5, n)):
            c = rng.random() < cut
            out.append(_rec(p, 4096 if c else int(x) + 1, finish_reason="length" if c else "stop"))
        return out
    v = judge_cheap({"A": recs("A", 1000, 0.05), "B": recs("B", 1000, 0.05), "S": recs("S", 40, 0.5)},
                    false_alarm=0.01, min_records=20, looks=1)["S"]
    tests = {t.name: t for t in v.tests}
    assert v.verdict == "drifting" and v.reason.startswith("finish 'length' on ")
    assert tests["completion_length"].p_value > 0.001 and not tests["completion_length"].rejected
    whole = np.array([r.completion_tokens for r in recs("S", 40, 0.5)], dtype=float)
    rest = np.array([r.completion_tokens for r in recs("A", 2000, 0.05)], dtype=float)
    assert van_elteren([(whole, rest)])[1] < 0.01 / 8  # ranks over the cut ones too would read "longer"


# ---- simulation: false alarms and power -----------------------------------------------------------------
H = Drift()
HONEST = {"h0": (300, H), "h1": (500, H), "h2": (800, H), "h3": (400, H)}
SKEWED = {"h0": (0.1, 0.3, 0.6)}  # h0 was up mostly while the agentic dataset ran


def _restratified(w: dict[str, list[CheapRecord]]) -> dict[str, list[CheapRecord]]:
    return {p: [CheapRecord(*(getattr(r, f) for f in r.__slots__[:-1]), stratum="") for r in rs] for p, rs in w.items()}


def test_false_alarms_on_honest_providers_stay_under_the_stated_rate():
    """200 seeded runs of 4 honest providers (2,000 records, heterogeneous prompts; h0 on another dataset mix):
    the share of provider-runs judged drifting is at most the configured false_alarm (measured: 0.375% at 0.01,
    9.5% at 0.2: the Bonferroni bound is conservative). Without the strata, h0's other mix alone is judged
    drifting."""
    trials = 200
    alarms = {0.01: 0, 0.2: 0}
    naive = 0
    for seed in range(trials):
        w = world(np.random.default_rng(seed), HONEST, SKEWED)
        for fa in alarms:
            v = judge_cheap(w, false_alarm=fa, min_records=30, looks=1)
            assert [x.records for x in v.values()] == [n for n, _ in HONEST.values()]
            alarms[fa] += sum(x.verdict == "drifting" for x in v.values())
        if seed < 30:
            naive += judge_cheap(_restratified(w), false_alarm=0.2, min_records=30, looks=1)["h0"].verdict == "drifting"
    rates = {fa: k / (trials * len(HONEST)) for fa, k in alarms.items()}
    print(f"false alarms per provider-run: {rates}; h0 without strata: {naive / 30:.2f}")
    assert rates[0.01] <= 0.015 and rates[0.2] <= 0.2
    assert naive / 30 > 0.8


# drift kind, its records (3 honest providers of 600 serve the rest), the least power accepted at false_alarm 0.01
# (measured over 100 seeded runs: 0.85, 0.92, 1.00, 0.84; docs/fidelity.md has the table by records and level)
POWER = {
    "20% shorter completions": (Drift(log_shift=math.log(0.8)), 500, 0.8),
    "5 points more length finishes": (Drift(extra_length=0.05), 400, 0.8),
    "prompt billed +1 token": (Drift(bill=1), 60, 0.95),
    "3x the wire-flag rate": (Drift(flag_mult=3.0), 1500, 0.8),
}


@pytest.mark.parametrize("kind", list(POWER))
def test_power_per_drift_kind(kind):
    drift, n, least = POWER[kind]
    trials, hits, which = 100, 0, set()
    for seed in range(trials):
        w = world(np.random.default_rng(1000 + seed), {"h1": (600, H), "h2": (600, H), "h3": (600, H), "d": (n, drift)})
        v = judge_cheap(w, false_alarm=0.01, min_records=30, looks=1)["d"]
        hits += v.verdict == "drifting"
        which |= {t.name for t in v.tests if t.rejected}
    print(f"{kind}: power {hits / trials:.2f} with {n} records ({sorted(which)})")
    assert hits / trials >= least
