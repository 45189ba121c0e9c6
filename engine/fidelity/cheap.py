"""Cheap fidelity signals: each provider against the pooled rest, from what every record already carries (pure).

No target model and no extra spend: per record the completion and reasoning lengths (tokens), the finish
reason, the wire flags, the tool calls against the declared tools, the billed ``prompt_tokens`` against our
own count, and whether the record reconstructs (:class:`CheapRecord`). :func:`judge_cheap` compares each
provider with the records of the others not judged drifting, one test per signal (:data:`TESTS`), and answers
a :class:`engine.fidelity.verdict.Verdict` per provider:

- ``completion_length``: stratified Wilcoxon rank sum (van Elteren) on the records not cut by max_tokens,
  two-sided (lengths shifted);
- ``reasoning_share``: the same on reasoning / completion tokens where > 0, and the exact test of the records
  without reasoning; two-sided, Bonferroni x2 (more or less thinking);
- ``finish_mix``: exact stratified test per finish (stop, length, tool_calls, other), two-sided, Bonferroni x4;
- ``wire_flags``: exact stratified test (a sum of hypergeometrics), one-sided (more failing wire flags);
- ``tool_call_validity``: the same over the records with tool calls (more invalid calls);
- ``prompt_billed_share``: the same on ``prompt_diff != 0`` (billed prompt differs from our count more often);
- ``prompt_billed_offset``: exact tests of ``prompt_diff > 0`` and ``< 0``, two-sided, Bonferroni x2 (billed
  prompt shifted one way);
- ``reconstruction``: exact stratified test, one-sided (more reconstruction mismatches).

Rank tests run only where values are (nearly) continuous: a spike of ties (records cut at max_tokens, records
without reasoning, prompt differences of 0) gives a rank sum a tail heavier than the normal one for a small
provider (measured: a 5% spike made p < 1e-5 fifty times likelier than 1e-5 at 20 records), so the spikes are
tested exactly (hypergeometric) and the rank tests see the rest.

Why these tests: providers do not serve the same prompts (each prompt is bought once), and a provider that was
up only for part of a run serves another mix of datasets than the rest. Under random routing within a stratum
(``CheapRecord.stratum``: dataset and request class) a provider's records and the rest's are exchangeable draws
from the same prompt mix, so rank and conditional (hypergeometric) tests are exact whatever the per-prompt
heterogeneity is, and stratifying removes a difference of dataset mix. Nothing assumes a model of lengths.

False alarms: every p-value is compared with ``false_alarm / (len(TESTS) * looks)`` (Bonferroni over the tests
and the planned looks of one run), so an honest provider is judged ``drifting`` with probability at most
``false_alarm`` per run (tests/engine/fidelity/test_cheap.py measures it). Cheap signals cannot see a drift
that leaves these summaries alone (a 1.4x temperature or a fake quantization at 0.03 nats/token that keeps
lengths within noise): docs/fidelity.md, "cheap signals".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .verdict import Test, Verdict

#: The tests, in report order (the Bonferroni divisor counts all of them, run or not).
TESTS: tuple[str, ...] = ("completion_length", "reasoning_share", "finish_mix", "wire_flags", "tool_call_validity",
                          "prompt_billed_share", "prompt_billed_offset", "reconstruction")
#: The finish categories of ``finish_mix`` (any other finish reason counts as ``other``).
FINISHES: tuple[str, ...] = ("stop", "length", "tool_calls", "other")
NO_OTHERS = "no other provider to compare with"


@dataclass(frozen=True, slots=True)
class CheapRecord:
    """One record's cheap signals.

    Attributes:
        provider: who served it.
        completion_tokens / reasoning_tokens: lengths (tokens; reasoning included in completion).
        finish_reason: as stored (``stop``, ``length``, ``tool_calls``, anything else is ``other``).
        wire_flagged: a failing wire flag was raised (:data:`engine.client.conformance.FAILING`).
        tool_calls_declared: the request declared tools.
        tool_call_valid: None without tool calls; else whether every call names a declared tool with
            arguments valid against its parameters schema (:func:`engine.fidelity.toolschema.tool_calls_valid`).
        prompt_diff: billed prompt tokens minus our own count (tokens); None when unknown.
        reconstruct_ok: None when not validated; else whether the record reconstructed without mismatch.
        stratum: what routing may correlate with (dataset and request class); tests compare within it.
    """

    provider: str
    completion_tokens: int
    reasoning_tokens: int
    finish_reason: str
    wire_flagged: bool
    tool_calls_declared: bool
    tool_call_valid: bool | None
    prompt_diff: int | None
    reconstruct_ok: bool | None
    stratum: str = ""


# ---- the statistics --------------------------------------------------------------------------------------
def _midranks(x: np.ndarray) -> tuple[np.ndarray, float]:
    """Midranks of ``x`` (1-based) and the tie term ``sum(t^3 - t)``."""
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return (ends - (counts - 1) / 2.0)[inv], float(np.sum(counts.astype(float) ** 3 - counts))


def van_elteren(groups: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float]:
    """Stratified Wilcoxon rank-sum test (van Elteren weights ``1/(N_h+1)``) of ``a`` against ``b`` over strata
    ``[(a_h, b_h)]`` (any real values; ties get midranks). Returns ``(z, two-sided p)``; ``(0, 1)`` when no
    stratum has both groups or every value ties. Normal approximation."""
    t = var = 0.0
    for a, b in groups:
        n, m = len(a), len(b)
        if n == 0 or m == 0:
            continue
        big = n + m
        ranks, ties = _midranks(np.concatenate([a, b]).astype(float))
        w = 1.0 / (big + 1)
        t += w * (float(ranks[:n].sum()) - n * (big + 1) / 2.0)
        var += w * w * n * m / 12.0 * ((big + 1) - ties / (big * (big - 1)))
    if var <= 0:
        return 0.0, 1.0
    z = t / math.sqrt(var)
    return z, math.erfc(abs(z) / math.sqrt(2))


def _log_factorials(n: int) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=float)))])


def exact_rate(strata: Sequence[tuple[int, int, int, int]]) -> tuple[int, float, float, float]:
    """Exact conditional test of a common rate (odds ratio 1) over strata ``[(n_a, k_a, n_b, k_b)]`` (records
    and events of group a, of group b): the events of ``a`` given each stratum's margins are a sum of
    independent hypergeometrics (convolved). Returns ``(observed events of a, expected, P(X >= observed),
    P(X <= observed))``."""
    dist = np.ones(1)
    offset = observed = 0
    expected = 0.0
    lf = _log_factorials(max((a + b for a, _, b, _ in strata), default=0))
    for n_a, k_a, n_b, k_b in strata:
        observed += k_a
        big, events = n_a + n_b, k_a + k_b
        if n_a == 0 or n_b == 0 or events == 0 or events == big:
            offset += k_a
            expected += k_a
            continue
        expected += n_a * events / big
        lo, hi = max(0, events - n_b), min(n_a, events)
        x = np.arange(lo, hi + 1)
        logp = lf[events] - lf[x] - lf[events - x] + lf[big - events] - lf[n_a - x] - lf[big - events - n_a + x]
        pmf = np.exp(logp - logp.max())
        dist = np.convolve(dist, pmf / pmf.sum())
        offset += lo
    i = observed - offset
    return observed, expected, float(min(1.0, dist[i:].sum())), float(min(1.0, dist[: i + 1].sum()))


# ---- one provider against the rest -----------------------------------------------------------------------
def _fmt_p(p: float) -> str:
    if p >= 0.001:
        return f"{p:.2g}"
    m, e = f"{max(p, 1e-300):.0e}".split("e")
    return f"{m}e{int(e)}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if x < 0.1 else f"{100 * x:.0f}%"


class _Ranked:
    """A signal's values ranked within each stratum once (midranks; nan values left out), so that each provider's
    van Elteren statistic is a weighted sum of its ranks."""

    def __init__(self, values: np.ndarray, stratum: np.ndarray, n_strata: int) -> None:
        self.values, self.stratum = values, stratum
        self.ok = ~np.isnan(values)
        self.ranks = np.zeros(len(values))
        self.size = np.bincount(stratum[self.ok], minlength=n_strata).astype(float)
        self.ties = np.zeros(n_strata)
        for s in range(n_strata):
            idx = np.flatnonzero(self.ok & (stratum == s))
            if len(idx):
                self.ranks[idx], self.ties[s] = _midranks(values[idx])

    def test(self, mine: np.ndarray) -> tuple[float, float]:
        """``(z, two-sided p)`` of ``mine`` against the rest (:func:`van_elteren`)."""
        sel = mine & self.ok
        n = np.bincount(self.stratum[sel], minlength=len(self.size)).astype(float)
        w_sum = np.bincount(self.stratum[sel], weights=self.ranks[sel], minlength=len(self.size))
        big = self.size
        m = big - n
        use = (n > 0) & (m > 0)
        if not use.any():
            return 0.0, 1.0
        n, m, big, w_sum, ties = n[use], m[use], big[use], w_sum[use], self.ties[use]
        w = 1.0 / (big + 1)
        t = float(np.sum(w * (w_sum - n * (big + 1) / 2.0)))
        var = float(np.sum(w * w * n * m / 12.0 * ((big + 1) - ties / (big * (big - 1)))))
        if var <= 0:
            return 0.0, 1.0
        z = t / math.sqrt(var)
        return z, math.erfc(abs(z) / math.sqrt(2))


class _Columns:
    """Every record's signals as arrays (``nan`` where a signal is None), ranked or counted by stratum once."""

    def __init__(self, by_provider: Mapping[str, Sequence[CheapRecord]]) -> None:
        recs = [r for rs in by_provider.values() for r in rs]
        names = list(by_provider)
        self.provider = np.repeat(np.arange(len(names)), [len(by_provider[p]) for p in names])
        index = {s: i for i, s in enumerate(sorted({r.stratum for r in recs}))}
        finish = {f: i for i, f in enumerate(FINISHES)}
        nan = math.nan
        table = np.array([
            (index[r.stratum], r.completion_tokens, r.reasoning_tokens, finish.get(r.finish_reason, 3), r.wire_flagged,
             nan if r.tool_call_valid is None else not r.tool_call_valid,
             nan if r.prompt_diff is None else r.prompt_diff, nan if r.reconstruct_ok is None else not r.reconstruct_ok)
            for r in recs], dtype=float).reshape(-1, 8)
        self.stratum = table[:, 0].astype(np.int64)
        self.n_strata = len(index)
        self.completion, self.reasoning = table[:, 1], table[:, 2]
        share = np.full(len(recs), np.nan)
        pos = self.completion > 0
        share[pos] = self.reasoning[pos] / self.completion[pos]
        self.finish = table[:, 3].astype(np.int64)
        self.flagged, self.tool_bad, self.prompt_diff, self.recon_bad = table[:, 4], table[:, 5], table[:, 6], table[:, 7]
        self.share = share
        # rank tests only where values are (nearly) continuous: a spike of ties (cut at max_tokens, no reasoning)
        # makes the rank sum's tail heavier than the normal one at small samples; the spikes are tested exactly.
        uncut = np.where((self.finish == 1) | (self.completion <= 0), np.nan, self.completion)
        self.ranked = {k: _Ranked(v, self.stratum, self.n_strata)
                       for k, v in (("completion", uncut), ("share", np.where(share > 0, share, np.nan)))}

    def rate(self, events: np.ndarray, mine: np.ndarray) -> tuple[float, float, float, float, int, int]:
        """``(rate mine, rate rest, P(upper), P(lower), n mine, n rest)`` over records where ``events`` is not nan
        (:func:`exact_rate` by stratum)."""
        ok = ~np.isnan(events)
        k = self.n_strata
        n_all = np.bincount(self.stratum[ok], minlength=k)
        e_all = np.bincount(self.stratum[ok], weights=events[ok], minlength=k).round().astype(np.int64)
        sel = ok & mine
        n_a = np.bincount(self.stratum[sel], minlength=k)
        e_a = np.bincount(self.stratum[sel], weights=events[sel], minlength=k).round().astype(np.int64)
        rows = [(int(a), int(ka), int(t - a), int(kt - ka)) for a, ka, t, kt in zip(n_a, e_a, n_all, e_all, strict=True)]
        _, _, up, low = exact_rate(rows)
        na, nb = int(n_a.sum()), int((n_all - n_a).sum())
        return int(e_a.sum()) / max(na, 1), int((e_all - e_a).sum()) / max(nb, 1), up, low, na, nb


def _shift(c: _Columns, mine: np.ndarray) -> float:
    """Stratified log-median ratio of completion lengths (weights n m / N), mine over the rest, as a relative change."""
    num = den = 0.0
    pos = c.completion > 0
    for s in range(c.n_strata):
        a = c.completion[pos & mine & (c.stratum == s)]
        b = c.completion[pos & ~mine & (c.stratum == s)]
        if len(a) and len(b):
            w = len(a) * len(b) / (len(a) + len(b))
            num += w * (math.log(float(np.median(a))) - math.log(float(np.median(b))))
            den += w
    return math.expm1(num / den) if den else 0.0


def _tests(c: _Columns, mine: np.ndarray, level: float, figures: dict[str, float]) -> list[Test]:
    out: list[Test] = []

    def add(name: str, stat: float, p: float, detail: str) -> None:
        out.append(Test(name, float(stat), p, p < level, f"{detail}, p={_fmt_p(p)}"))

    z, p = c.ranked["completion"].test(mine)
    med = [float(np.median(c.completion[m])) for m in (mine, ~mine)]
    shift = _shift(c, mine)
    figures["completion_tokens_median"], figures["completion_tokens_median_rest"] = med
    figures["completion_shift"] = shift
    add("completion_length", z, p, f"completions {abs(shift):.0%} {'shorter' if shift < 0 else 'longer'} than the "
        f"other providers' (median {med[0]:,.0f} vs {med[1]:,.0f} tokens)")

    z, p = c.ranked["share"].test(mine)
    with np.errstate(invalid="ignore"):
        a, b, up, low, _, _ = c.rate(np.where(np.isnan(c.share), np.nan, c.share == 0), mine)
    p0 = min(1.0, 2 * min(up, low))
    sums = [float(c.reasoning[m].sum() / max(1.0, c.completion[m].sum())) for m in (mine, ~mine)]
    figures["reasoning_share"], figures["reasoning_share_rest"] = sums
    figures["no_reasoning"], figures["no_reasoning_rest"] = a, b
    if p0 < p:
        add("reasoning_share", a - b, min(1.0, 2 * p0), f"no reasoning on {_pct(a)} of records vs {_pct(b)} at the "
            "other providers")
    else:
        add("reasoning_share", z, min(1.0, 2 * p), f"reasoning {_pct(sums[0])} of completion tokens vs "
            f"{_pct(sums[1])} at the other providers")

    best: tuple[float, str, float] = (math.inf, "", 0.0)
    for i, f in enumerate(FINISHES):
        a, b, up, low, _, _ = c.rate((c.finish == i).astype(float), mine)
        figures[f"finish_{f}"], figures[f"finish_{f}_rest"] = a, b
        p2 = min(1.0, 2 * min(up, low)) * len(FINISHES)
        if p2 < best[0]:
            best = (p2, f"finish {f!r} on {_pct(a)} of records vs {_pct(b)} at the other providers", a - b)
    add("finish_mix", best[2], min(1.0, best[0]), best[1] or "no finish reasons")

    def one_sided(name: str, events: np.ndarray, what: str, of: str, among: str = "records") -> None:
        a, b, up, _, n_a, n_b = c.rate(events, mine)
        figures[name], figures[f"{name}_rest"] = a, b
        if n_a == 0 or n_b == 0:
            out.append(Test(name, math.nan, 1.0, False, f"no {among} to compare"))
            return
        add(name, a - b, up, f"{what} on {_pct(a)} of {of} vs {_pct(b)} at the other providers")

    one_sided("wire_flags", c.flagged, "failing wire flags", "records")
    one_sided("tool_call_validity", c.tool_bad, "invalid tool calls", "records with tool calls",
              "records with tool calls")
    with np.errstate(invalid="ignore"):
        one_sided("prompt_billed_share", np.where(np.isnan(c.prompt_diff), np.nan, c.prompt_diff != 0),
                  "billed prompt tokens differing from our count", "records", "billed prompt tokens")
    known = ~np.isnan(c.prompt_diff)
    means = [float(c.prompt_diff[m & known].mean()) if (m & known).any() else math.nan for m in (mine, ~mine)]
    figures["prompt_diff_mean"], figures["prompt_diff_mean_rest"] = means
    if math.isnan(means[0]) or math.isnan(means[1]):
        out.append(Test("prompt_billed_offset", math.nan, 1.0, False, "no billed prompt tokens to compare"))
    else:  # above or below our count more often than the rest (exact, two-sided each, Bonferroni x2)
        ps = []
        for sign in (1, -1):
            with np.errstate(invalid="ignore"):
                a, b, up, low, _, _ = c.rate(np.where(known, sign * c.prompt_diff > 0, np.nan), mine)
            ps.append(min(1.0, 2 * min(up, low)))
        add("prompt_billed_offset", means[0] - means[1], min(1.0, 2 * min(ps)), f"billed prompt tokens "
            f"{means[0]:+.1f} over our count on average vs {means[1]:+.1f} at the other providers")
    one_sided("reconstruction", c.recon_bad, "reconstruction mismatches", "records", "validated records")
    return out


def _judge_once(by_provider: Mapping[str, Sequence[CheapRecord]], level: float,
                min_records: int) -> dict[str, Verdict]:
    """Each provider of ``by_provider`` against the pooled rest of it."""
    cols = _Columns(by_provider)
    total = len(cols.provider)
    out: dict[str, Verdict] = {}
    for i, name in enumerate(by_provider):
        mine = cols.provider == i
        n = int(mine.sum())
        tokens = int(cols.completion[mine].sum())
        rest = total - n
        if rest == 0:
            out[name] = Verdict("insufficient", n, tokens, (), NO_OTHERS, {})
            continue
        if n < min_records or rest < min_records:
            who = f"{n:,} records" if n < min_records else f"the other providers have {rest:,} records"
            out[name] = Verdict("insufficient", n, tokens, (), f"{who}, fewer than {min_records:,}", {})
            continue
        figures: dict[str, float] = {"records_rest": float(rest), "level": level}
        tests = tuple(_tests(cols, mine, level, figures))
        bad = sorted((t for t in tests if t.rejected), key=lambda t: t.p_value)
        if bad:
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            out[name] = Verdict("drifting", n, tokens, tests, bad[0].detail + more, figures)
        else:
            out[name] = Verdict("ok", n, tokens, tests, f"no cheap signal differs from the other providers' "
                                f"({n:,} records, {len(tests)} tests at p<{_fmt_p(level)})", figures)
    return out


def judge_cheap(by_provider: Mapping[str, Sequence[CheapRecord]], *, false_alarm: float, min_records: int,
                looks: int) -> dict[str, Verdict]:
    """Judge each provider against the pooled records of the others that are not drifting.

    A drifting provider in the pool shifts the rest, so that an honest provider may differ from that pooled
    rest: providers are judged in passes; each pass judges every provider still trusted against the other
    trusted ones, and the one with the most significant rejection is judged ``drifting`` (by that pass) and
    leaves the pool; the passes end when none is rejected. With honest providers only, this is one pass.

    Args:
        by_provider: ``{provider: its records}``.
        false_alarm: the probability per run that an honest provider is judged ``drifting`` (upper bound, among
            honest providers).
        min_records: fewer records than this (the provider's, or the rest's) is ``insufficient``.
        looks: how many times a run judges (the planned looks; each look is charged ``false_alarm / looks``).

    Returns:
        ``{provider: Verdict}`` (:class:`engine.fidelity.verdict.Verdict`; ``tokens``: its completion tokens,
        ``figures``: each signal's value for the provider and for the rest, ``<name>`` / ``<name>_rest``) in
        ``by_provider``'s order: ``drifting`` when a test rejects at
        ``false_alarm / (len(TESTS) * looks)``, its reason the most significant rejection; ``ok`` otherwise.

    Raises:
        ValueError: ``false_alarm`` not in (0, 1), ``looks`` < 1 or ``min_records`` < 1.
    """
    if not 0 < false_alarm < 1 or looks < 1 or min_records < 1:
        raise ValueError(f"false_alarm {false_alarm} must be in (0, 1), looks {looks} and min_records "
                         f"{min_records} >= 1")
    level = false_alarm / (len(TESTS) * looks)
    trusted = dict(by_provider)
    out: dict[str, Verdict] = {}
    while True:
        now = _judge_once(trusted, level, min_records)
        drifting = [(min(t.p_value for t in v.tests), p) for p, v in now.items() if v.verdict == "drifting"]
        if not drifting:
            out.update(now)
            break
        worst = min(drifting)[1]
        out[worst] = now[worst]
        del trusted[worst]
    return {p: out[p] for p in by_provider}
