"""Per-provider fidelity verdict: do a provider's completions come from the target's distribution?

Pure (numpy, math, stdlib). The tests and why they hold (docs/fidelity.md, "thresholds and why"):

H0: the provider samples each completion token from ``p``, the target's sampling distribution at the
record's temperature and top_p, given the tokens before it. Then, token by token (a martingale in the
completion's order, whatever the prompts and whatever the provider did earlier):

- every in-nucleus token's randomized PIT ``u`` is Uniform(0, 1) and independent of the past, so the PIT
  values of a provider are i.i.d. uniform: the PIT histogram is exactly multinomial-uniform;
- the surprisal excess ``-log p(y) - H(p)`` has mean 0 and conditional variance ``Var_p(-log p)``, so its
  sum over N tokens, divided by the root of the summed variances, is ~N(0, 1) (martingale CLT);
- likewise ``[y = argmax p] - max p`` with variance ``max p (1 - max p)``;
- no token lies outside the nucleus (p(y) = 0).

Voting tests (each at ``alpha = false_alarm / looks / 6``, Bonferroni; always 6, even where the sixth
cannot vote):

1. ``surprisal``: z = (surprisal - entropy) / sqrt(variance), two-sided. The score test for a change of
   temperature (d/dbeta log p^beta / Z at beta = 1 is minus the surprisal excess), so it is the most
   powerful local test against a provider that misapplies temperature, and it sees the flattening a
   quantized model's noisy logits bring on average.
2. ``top1``: z = (top1 - top1_expected) / sqrt(top1_variance), two-sided.
3. ``pit``: chi-square of the pooled PIT histogram against uniform, PIT_BINS - 1 dof.
4. ``records``: overdispersion across records: each record's PIT normal score
   ``z_r = sum_b n_b c_b / sqrt(n_r mean(c^2))`` (``c_b = E[Z | Z in normal decile b]``) is exactly mean 0,
   variance 1 under H0 with bounded increments, and ``sum_r z_r^2`` is referred to chi-square(records).
   It catches a provider that mixes backends (some records drifted, the rest honest). The per-record
   SURPRISAL z is not used here: its tails are heavy for short or low-entropy records (one honest rare
   token gives z_r^2 in the hundreds), which would break the chi-square reference at alpha ~ 1e-5.
5. ``nucleus``: outside count against Binomial(tokens, outside_tolerance), one-sided. An honest provider is
   outside the target's nucleus only where its numerics break a near-tie at the nucleus edge (or, greedy,
   at the argmax); the tolerance allows for that.
6. ``nucleus-others``: the provider's outside count ``k1`` of ``n1`` tokens against the other providers'
   pooled ``k2`` of ``n2``, one-sided: ``p = min(1, 2 P(Binomial(n1, q) >= k1))`` with
   ``q = max((k2 + 0.5) / (n2 + 1) + floor, U)``, ``floor = outside_tolerance / 2`` and ``U`` the exact
   (Clopper-Pearson) upper bound of the others' rate at confidence ``1 - alpha / 2``. It catches a provider
   outside more often than its peers but under the absolute tolerance (one that mixes a fake-quantized
   backend into 30% of its records: 0.19% outside against honest peers' ~0). Guarantees, each exact at the
   per-test alpha: a provider outside at a rate <= ``floor`` is flagged with probability <= alpha / 2 whatever
   the others (``q >= floor``), so an honest provider whose numerics differ slightly from the peers' is never
   flagged however large the sample; a provider outside at a rate <= the others' is flagged with probability
   <= alpha (the factor 2 pays for ``U`` missing the others' rate, probability <= alpha / 2). Between the two
   (above the others' rate by less than the floor) the floor is a tolerance, not a hypothesis: the test
   treats the others' estimate as known, which the floor (4.5 standard errors of a 0.1% rate at 20,000
   tokens) covers once the others have tens of thousands of tokens. Votes only when the others have
   ``min_tokens`` tokens; their records may include a drifting provider's, which only raises ``q``.

Evidence, not voting: ``others``: Welch t test of the per-record log-likelihood per token against the
pooled other providers. It does not vote because its reference is not the target: the others may drift
themselves, and a router may send a provider a different mix of prompts (longer contexts, another
dataset, another temperature), which moves log-likelihood per token with no drift at all.

Looks (alpha spending): the verdict is re-evaluated as records arrive, up to ``looks`` times per provider
(when: :mod:`engine.fidelity.looks`). With each look at ``false_alarm / looks``, the chance that an honest
provider is ever judged ``drifting`` over the whole run is <= ``false_alarm`` (Bonferroni over looks and
tests; conservative: the looks are positively correlated and the tests overlap).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .score import PIT_BINS, RecordScore
from .tails import binom_sf, chi2_sf, norm_two_sided, t_two_sided

#: Voting tests sharing a look's alpha (surprisal, top1, pit, records, nucleus, nucleus-others).
VOTING_TESTS = 6


def _decile_scores(bins: int) -> tuple[float, ...]:
    """``E[Z | Z in the b-th of `bins` equal-probability normal intervals]`` (sums to 0)."""
    edges = [-math.inf] + [_norm_ppf(b / bins) for b in range(1, bins)] + [math.inf]
    dens = [0.0 if math.isinf(e) else math.exp(-e * e / 2) / math.sqrt(2 * math.pi) for e in edges]
    return tuple((dens[b] - dens[b + 1]) * bins for b in range(bins))


def _norm_ppf(q: float) -> float:
    """Standard normal quantile by bisection on erfc (only used for the PIT bin edges)."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(-mid / math.sqrt(2)) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


_SCORES = _decile_scores(PIT_BINS)
_SCORE_VAR = sum(c * c for c in _SCORES) / PIT_BINS


@dataclass(frozen=True)
class Test:
    """One test of a verdict: ``statistic`` (z, chi-square, count or t, per ``name``), its p-value, whether it
    rejected at the verdict's per-test alpha, and a one-line ``detail`` a user reads."""

    name: str
    statistic: float
    p_value: float
    rejected: bool
    detail: str


@dataclass(frozen=True)
class Verdict:
    """A provider's fidelity verdict.

    Attributes:
        verdict: ``"ok"``, ``"drifting"`` or ``"insufficient"``.
        records / tokens: records and scored tokens it rests on.
        tests: every test run (voting and evidence), module docstring.
        reason: one line, e.g. ``surprisal +0.041 nats/token over the target's expectation (z=5.3,
            p=6e-08 < 1e-05)``.
        figures: what the dashboard shows (module docstring of :func:`judge`), NaN where undefined.
    """

    verdict: str
    records: int
    tokens: int
    tests: tuple[Test, ...]
    reason: str
    figures: dict[str, float]

    def to_json(self) -> dict:
        """Plain JSON values (non-finite floats as None)."""
        def num(x: float) -> float | None:
            return float(x) if math.isfinite(x) else None

        return {"verdict": self.verdict, "records": self.records, "tokens": self.tokens, "reason": self.reason,
                "figures": {k: num(v) for k, v in self.figures.items()},
                "tests": [{"name": t.name, "statistic": num(t.statistic), "p_value": num(t.p_value),
                           "rejected": t.rejected, "detail": t.detail} for t in self.tests]}


@dataclass(frozen=True)
class FidelitySettings:
    """``[fidelity]`` settings.

    Attributes:
        false_alarm: chance an honest provider is ever judged drifting in a run (all looks, all tests).
        min_records / min_tokens: below either the verdict is ``insufficient``.
        outside_tolerance: share of tokens an honest provider may place outside the target's nucleus
            (numerical near-ties at its edge); half of it is the margin over the other providers' share that
            ``nucleus-others`` allows (:meth:`outside_floor`).
        looks: how many times a provider's verdict is evaluated in a run (:mod:`engine.fidelity.looks`).
    """

    false_alarm: float = 0.001
    min_records: int = 20
    min_tokens: int = 2000
    outside_tolerance: float = 0.002
    looks: int = 20

    def alpha(self) -> float:
        """Per-test alpha at one look: ``false_alarm / looks / VOTING_TESTS``."""
        return self.false_alarm / max(1, self.looks) / VOTING_TESTS

    def outside_floor(self) -> float:
        """Share of tokens a provider may be outside the nucleus beyond the other providers' share:
        ``outside_tolerance / 2``."""
        return self.outside_tolerance / 2


def _fmt_p(p: float) -> str:
    if p < 1e-300:
        return "<1e-300"
    return f"={p:.1g}" if p < 0.01 else f"={p:.2f}"


def _record_z(r: RecordScore) -> float | None:
    n = sum(r.pit)
    if n == 0:
        return None
    return sum(c * k for c, k in zip(_SCORES, r.pit, strict=True)) / math.sqrt(n * _SCORE_VAR)


def binom_upper(k: int, n: int, gamma: float) -> float:
    """Exact (Clopper-Pearson) upper confidence bound of a binomial rate: the ``r`` with
    ``P(Binomial(n, r) <= k) = gamma`` (1.0 when ``k >= n``), by bisection to ~1e-15.

    Raises:
        ValueError: ``n <= 0``, ``k < 0`` or ``gamma`` outside (0, 1).
    """
    if n <= 0 or k < 0 or not 0.0 < gamma < 1.0:
        raise ValueError(f"need n > 0, k >= 0, 0 < gamma < 1, got k={k}, n={n}, gamma={gamma}")
    if k >= n:
        return 1.0
    lo, hi = k / n, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if 1.0 - binom_sf(k + 1, n, mid) > gamma:  # P(X <= k) still above gamma: the bound is higher
            lo = mid
        else:
            hi = mid
    return hi


def _nucleus_others(k1: int, n1: int, others: Sequence[RecordScore], s: FidelitySettings,
                    alpha: float) -> tuple[float, float, str, float] | None:
    """Test 6 (module docstring): ``(k1, p, detail, others' share)``, None when the others have fewer than
    ``min_tokens`` tokens."""
    k2, n2 = sum(r.outside for r in others), sum(r.tokens for r in others)
    if n2 < max(1, s.min_tokens):
        return None
    floor = s.outside_floor()
    plug, upper = (k2 + 0.5) / (n2 + 1) + floor, binom_upper(k2, n2, alpha / 2)
    q = min(1.0, max(plug, upper))
    p = min(1.0, 2 * binom_sf(k1, n1, q))
    why = f"theirs + {floor:.2%} floor" if plug >= upper else "the upper bound of theirs"
    detail = (f"{k1 / n1 if n1 else 0:.2%} of tokens ({k1} of {n1}) outside the target's nucleus vs "
              f"{k2 / n2:.2%} ({k2} of {n2}) for the other providers (tested against {q:.3%}, {why})")
    return float(k1), p, detail, k2 / n2


def _loglik_rates(scores: Sequence[RecordScore]) -> list[float]:
    return [r.loglik / r.tokens for r in scores if r.tokens > 0]


def _welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Welch's t, its dof and the two-sided p-value (NaNs when a variance is 0)."""
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1) / len(a)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1) / len(b)
    if va + vb <= 0:
        return math.nan, math.nan, 1.0
    t = (ma - mb) / math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))
    return t, dof, t_two_sided(t, dof)


def judge(scores: Sequence[RecordScore], others: Sequence[RecordScore], s: FidelitySettings) -> Verdict:
    """Judge one provider from its records' scores (``others``: the other providers' records, pooled).

    Figures: ``mean_surprisal_excess`` (nats/token), ``surprisal_z``, ``top1_rate``, ``top1_expected``,
    ``top1_z``, ``outside_share``, ``others_outside_share`` (NaN when ``nucleus-others`` does not vote),
    ``pit_chi2``, ``pit_low`` / ``pit_high`` (share of PIT values in the first /
    last bin; 0.1 each under H0), ``overdispersion`` (sum z_r^2 / records), ``loglik_per_token`` (nats),
    ``others_loglik_per_token``, ``alpha`` (per test).
    """
    alpha = s.alpha()
    records, tokens = len(scores), sum(r.tokens for r in scores)
    outside = sum(r.outside for r in scores)
    inside = tokens - outside
    excess = sum(r.surprisal for r in scores) - sum(r.entropy for r in scores)
    var = sum(r.variance for r in scores)
    top1 = sum(r.top1 for r in scores)
    top1_exp = sum(r.top1_expected for r in scores)
    top1_var = sum(r.top1_variance for r in scores)
    pit = [sum(r.pit[b] for r in scores) for b in range(PIT_BINS)]
    n_pit = sum(pit)
    nan = math.nan
    tests: list[Test] = []

    def add(name: str, stat: float, p: float, detail: str, votes: bool = True) -> None:
        tests.append(Test(name, stat, p, votes and p < alpha, detail))

    per_tok = excess / inside if inside else nan
    z_s = excess / math.sqrt(var) if var > 0 else nan
    add("surprisal", z_s, norm_two_sided(z_s),
        f"surprisal {per_tok:+.3f} nats/token over the target's expectation (z={z_s:.1f})")
    z_t = (top1 - top1_exp) / math.sqrt(top1_var) if top1_var > 0 else nan
    rate, rate_exp = (top1 / inside, top1_exp / inside) if inside else (nan, nan)
    add("top1", z_t, norm_two_sided(z_t), f"top-1 agreement {rate:.3f} vs {rate_exp:.3f} expected (z={z_t:.1f})")
    chi2 = sum((k - n_pit / PIT_BINS) ** 2 for k in pit) / (n_pit / PIT_BINS) if n_pit else nan
    low, high = (pit[0] / n_pit, pit[-1] / n_pit) if n_pit else (nan, nan)
    add("pit", chi2, chi2_sf(chi2, PIT_BINS - 1) if n_pit else 1.0,
        f"PIT histogram chi2={chi2:.1f} ({PIT_BINS - 1} dof); first/last bin {low:.3f}/{high:.3f} vs 0.100")
    zs = [z for z in map(_record_z, scores) if z is not None]
    disp = sum(z * z for z in zs)
    far = sum(abs(z) > 3 for z in zs)
    add("records", disp, chi2_sf(disp, len(zs)) if zs else 1.0,
        f"per-record PIT scores: sum z^2={disp:.0f} over {len(zs)} records; {far} beyond |z|>3 "
        f"(expected {0.0027 * len(zs):.1f})")
    add("nucleus", float(outside), binom_sf(outside, tokens, s.outside_tolerance),
        f"{outside} of {tokens} tokens ({outside / tokens if tokens else 0:.2%}) outside the target's nucleus "
        f"(tolerance {s.outside_tolerance:.2%})")
    peer = _nucleus_others(outside, tokens, others, s, alpha)
    if peer is not None:
        add("nucleus-others", peer[0], peer[1], peer[2])
    mine, theirs = _loglik_rates(scores), _loglik_rates(others)
    ll = sum(r.loglik for r in scores) / tokens if tokens else nan
    ll_others = nan
    if len(mine) >= max(2, s.min_records) and len(theirs) >= max(2, s.min_records):
        t_ll, dof, p_ll = _welch(mine, theirs)
        ll_others = sum(r.loglik for r in others) / max(1, sum(r.tokens for r in others))
        add("others", t_ll, p_ll, f"log-likelihood {ll:.3f} vs {ll_others:.3f} nats/token for the other providers "
            f"(Welch t={t_ll:.1f}, {dof:.0f} dof; evidence, does not vote)", votes=False)
    figures = {"mean_surprisal_excess": per_tok, "surprisal_z": z_s, "top1_rate": rate, "top1_expected": rate_exp,
               "top1_z": z_t, "outside_share": outside / tokens if tokens else nan,
               "others_outside_share": peer[3] if peer is not None else nan, "pit_chi2": chi2,
               "pit_low": low, "pit_high": high, "overdispersion": disp / len(zs) if zs else nan,
               "loglik_per_token": ll, "others_loglik_per_token": ll_others, "alpha": alpha}
    if records < s.min_records or tokens < s.min_tokens:
        reason = (f"{records} records / {tokens} tokens scored; a verdict needs {s.min_records} records and "
                  f"{s.min_tokens} tokens")
        return Verdict("insufficient", records, tokens, tuple(tests), reason, figures)
    rejected = sorted((t for t in tests if t.rejected), key=lambda t: t.p_value)
    if rejected:
        first = rejected[0]
        also = f"; also {', '.join(t.name for t in rejected[1:])}" if len(rejected) > 1 else ""
        reason = f"{first.detail.rstrip(')')}, p{_fmt_p(first.p_value)} < {alpha:.1g}){also}"
        return Verdict("drifting", records, tokens, tuple(tests), reason, figures)
    reason = (f"no test rejects at p < {alpha:.1g} over {records} records / {tokens} tokens: surprisal "
              f"{per_tok:+.3f} nats/token, top-1 {rate:.3f} vs {rate_exp:.3f}, {outside / tokens:.2%} outside")
    return Verdict("ok", records, tokens, tuple(tests), reason, figures)


def judge_providers(by_provider: Mapping[str, Sequence[RecordScore]], s: FidelitySettings) -> dict[str, Verdict]:
    """:func:`judge` for every provider, each against the pooled records of all the others."""
    out: dict[str, Verdict] = {}
    for name, scores in by_provider.items():
        others = [r for other, rs in by_provider.items() if other != name for r in rs]
        out[name] = judge(scores, others, s)
    return out
