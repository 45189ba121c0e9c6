"""Tail probabilities of the reference distributions the fidelity verdict uses (pure math, no scipy).

Normal, chi-square, binomial and Student t upper tails, accurate to ~1e-12 relative over the ranges the
verdict needs (p-values down to 1e-300; degrees of freedom and counts into the millions).
"""

from __future__ import annotations

import math

_EPS = 1e-15
_TINY = 1e-300
_MAX_ITER = 100_000


def norm_sf(z: float) -> float:
    """``P(Z >= z)`` for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def norm_two_sided(z: float) -> float:
    """``P(|Z| >= |z|)`` for a standard normal Z (1.0 for a NaN z)."""
    if math.isnan(z):
        return 1.0
    return min(1.0, math.erfc(abs(z) / math.sqrt(2.0)))


def _gamma_p_series(a: float, x: float) -> float:
    """Regularized lower incomplete gamma P(a, x) by its series (converges fast for x < a + 1)."""
    term = total = 1.0 / a
    ap = a
    for _ in range(_MAX_ITER):
        ap += 1.0
        term *= x / ap
        total += term
        if abs(term) < abs(total) * _EPS:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _gamma_q_fraction(a: float, x: float) -> float:
    """Regularized upper incomplete gamma Q(a, x) by Lentz's continued fraction (for x >= a + 1)."""
    b = x + 1.0 - a
    c = 1.0 / _TINY
    d = 1.0 / b
    h = d
    for i in range(1, _MAX_ITER):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = _TINY if abs(d) < _TINY else d
        c = b + an / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


def chi2_sf(x: float, dof: float) -> float:
    """``P(X >= x)`` for X ~ chi-square with ``dof`` > 0 degrees of freedom.

    Raises:
        ValueError: ``dof <= 0``.
    """
    if dof <= 0:
        raise ValueError(f"dof must be > 0, got {dof}")
    if not x > 0:
        return 1.0
    a, half = dof / 2.0, x / 2.0
    if half < a + 1.0:
        return max(0.0, 1.0 - _gamma_p_series(a, half))
    return _gamma_q_fraction(a, half)


def binom_sf(k: int, n: int, q: float) -> float:
    """``P(X >= k)`` for X ~ Binomial(n, q), by summing the pmf in log space from the nearer end.

    Raises:
        ValueError: ``n < 0`` or ``q`` outside [0, 1].
    """
    if n < 0 or not 0.0 <= q <= 1.0:
        raise ValueError(f"need n >= 0 and 0 <= q <= 1, got n={n}, q={q}")
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if q == 0.0:
        return 0.0
    if q == 1.0:
        return 1.0
    lq, l1q, lgn = math.log(q), math.log1p(-q), math.lgamma(n + 1)

    def log_pmf(j: int) -> float:
        return lgn - math.lgamma(j + 1) - math.lgamma(n - j + 1) + j * lq + (n - j) * l1q

    mean = n * q
    if k > mean:  # upper tail: terms fall from k on
        first = log_pmf(k)
        total, j = 0.0, k
        while j <= n:
            t = math.exp(log_pmf(j) - first)
            total += t
            if t < 1e-17 * total:
                break
            j += 1
        return min(1.0, math.exp(first) * total)
    # k <= mean: 1 - P(X <= k - 1), the lower terms fall from k - 1 down
    last = log_pmf(k - 1)
    total, j = 0.0, k - 1
    while j >= 0:
        t = math.exp(log_pmf(j) - last)
        total += t
        if t < 1e-17 * total:
            break
        j -= 1
    return max(0.0, 1.0 - math.exp(last) * total)


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta (Lentz; x < (a + 1) / (a + b + 2))."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (_TINY if abs(d) < _TINY else d)
    h = d
    for m in range(1, _MAX_ITER):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (_TINY if abs(d) < _TINY else d)
        c = 1.0 + aa / c
        c = _TINY if abs(c) < _TINY else c
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (_TINY if abs(d) < _TINY else d)
        c = 1.0 + aa / c
        c = _TINY if abs(c) < _TINY else c
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta ``I_x(a, b)`` for a, b > 0 and x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_two_sided(t: float, dof: float) -> float:
    """``P(|T| >= |t|)`` for T ~ Student t with ``dof`` > 0 degrees of freedom (1.0 for NaN t)."""
    if math.isnan(t) or not dof > 0:
        return 1.0
    return betainc(dof / 2.0, 0.5, dof / (dof + t * t))
