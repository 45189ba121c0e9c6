"""Per-record scores of a completion under the target (phase two, from the extraction forward's logits).

INTERFACE (fixed): callers build :class:`RecordScore` with :func:`score_record` and aggregate them with
:mod:`engine.fidelity.verdict`. Torch is imported only by :func:`score_record`, so the dataclass and the
verdict load in the base install (``datagen status``) without the ``extract`` extra.

Per scored token ``y`` with ``p`` = :func:`engine.fidelity.dist.sampling_distribution` at the record's
temperature and top_p (docs/fidelity.md):

- ``p(y) == 0``: the token lies outside the target's nucleus; it counts in ``outside`` and in no other
  in-nucleus sum.
- otherwise: surprisal ``-log p(y)``, entropy ``H(p)``, ``Var_p(-log p)``, top-1 (``y == argmax p``,
  lowest id among ties), ``max p`` and ``max p (1 - max p)``, and the randomized PIT
  ``u = F(y-) + U p(y)``: ``F(y-)`` is the mass of the tokens ordered strictly before ``y`` (probability
  descending, ties by id ascending, the order the nucleus is cut in) and ``U ~ Uniform(0, 1)``. When the
  provider samples from ``p``, ``u`` is Uniform(0, 1) and independent of the past.
- every scored token: ``log softmax(logits / T)[y]`` (no nucleus; ``T = 0`` uses ``T = 1``).

Greedy records (``temperature == 0``): ``p`` is all mass on the argmax, so an in-nucleus token is the
argmax, with surprisal, entropy and variance 0 and top-1 1 (expected 1, variance 0); their PIT would be
``U`` alone (no information), so greedy tokens add no PIT counts. A greedy record is judged by ``outside``
(tokens that are not the target's argmax) only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

#: PIT histogram bins (equal width on [0, 1]).
PIT_BINS = 10

#: Elements (rows x vocabulary) scored at once: bounds the float64 temporaries (~64 MB each).
CHUNK_ELEMENTS = 1 << 23


@dataclass(frozen=True, slots=True)
class RecordScore:
    """Sufficient statistics of one record's scored completion tokens (see docs/fidelity.md).

    Attributes:
        tokens: completion tokens scored (in the target's nucleus or not; special tokens skipped).
        outside: scored tokens the target gives probability 0 at the record's temperature/top_p
            (outside its nucleus).
        surprisal: sum over in-nucleus tokens of ``-log p(y)`` (nats), p = the sampling distribution.
        entropy: sum over the same tokens of the distribution's entropy ``H`` (nats): the surprisal's
            expectation when the provider samples from the target.
        variance: sum over the same tokens of ``Var_p(-log p)`` (nats^2).
        top1: in-nucleus tokens equal to the target's argmax.
        top1_expected: sum of ``max p`` over the same tokens (expected top1 under the target).
        top1_variance: sum of ``max p * (1 - max p)``.
        loglik: sum over ALL scored tokens of ``log p_T(y)`` at the temperature without the nucleus
            (finite; nats): the record's log-likelihood, comparable across providers.
        pit: ``[PIT_BINS]`` counts of randomized PIT values of in-nucleus tokens (tokens ordered by
            probability descending, ties by id).
    """

    tokens: int
    outside: int
    surprisal: float
    entropy: float
    variance: float
    top1: int
    top1_expected: float
    top1_variance: float
    loglik: float
    pit: tuple[int, ...] = field(default=(0,) * PIT_BINS)


def records_from_tokens(record: np.ndarray, records: int, inside: np.ndarray, surprisal: np.ndarray,
                        entropy: np.ndarray, variance: np.ndarray, top1: np.ndarray, pmax: np.ndarray,
                        loglik: np.ndarray, pit_u: np.ndarray) -> list[RecordScore]:
    """Sum per-token statistics into one :class:`RecordScore` per record (numpy; no Python loop over tokens).

    Every array is ``[N]`` over the N scored tokens, in order. Values of out-of-nucleus tokens
    (``inside`` False) are ignored except ``loglik``.

    Args:
        record: ``[N]`` int, the record index (0 .. records-1) of each token.
        records: how many records (records with no tokens get an all-zero score).
        inside: ``[N]`` bool, ``p(y) > 0``.
        surprisal / entropy / variance: ``[N]`` nats, nats, nats^2 (see the module docstring).
        top1: ``[N]`` bool, ``y == argmax p``.
        pmax: ``[N]`` ``max p``.
        loglik: ``[N]`` nats, ``log softmax(logits / T)[y]``.
        pit_u: ``[N]`` randomized PIT in [0, 1]; NaN adds no PIT count (greedy tokens).

    Raises:
        ValueError: arrays of different lengths.
    """
    n = len(record)
    arrays = (inside, surprisal, entropy, variance, top1, pmax, loglik, pit_u)
    if any(len(a) != n for a in arrays):
        raise ValueError(f"per-token arrays differ in length: {[len(a) for a in (record, *arrays)]}")
    rid = np.asarray(record, dtype=np.int64)
    ins = np.asarray(inside, dtype=bool)

    def total(x: np.ndarray, mask: np.ndarray | None = ins) -> np.ndarray:
        w = np.asarray(x, dtype=np.float64)
        if mask is not None:
            w = np.where(mask, w, 0.0)
        return np.bincount(rid, weights=w, minlength=records)

    count = np.bincount(rid, minlength=records)
    outside = count - np.bincount(rid, weights=ins.astype(np.float64), minlength=records).astype(np.int64)
    u = np.asarray(pit_u, dtype=np.float64)
    binned = ins & np.isfinite(u)
    bins = np.minimum((np.where(binned, u, 0.0) * PIT_BINS).astype(np.int64), PIT_BINS - 1)
    pit = np.bincount(rid[binned] * PIT_BINS + bins[binned], minlength=records * PIT_BINS).reshape(records, PIT_BINS)
    pm = np.asarray(pmax, dtype=np.float64)
    cols = (total(surprisal), total(entropy), total(variance), total(np.asarray(top1) & ins, None), total(pm),
            total(pm * (1.0 - pm)), total(loglik, None))
    return [RecordScore(tokens=int(count[r]), outside=int(outside[r]), surprisal=float(cols[0][r]),
                        entropy=float(cols[1][r]), variance=float(cols[2][r]), top1=int(round(cols[3][r])),
                        top1_expected=float(cols[4][r]), top1_variance=float(cols[5][r]), loglik=float(cols[6][r]),
                        pit=tuple(int(c) for c in pit[r])) for r in range(records)]


def _token_stats(logits: torch.Tensor, y: torch.Tensor, u: torch.Tensor, temperature: float,
                 top_p: float, exclude: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Per-token statistics of ``[C, V]`` logits rows and ``[C]`` targets (float64 on the logits' device).

    ``exclude``: token ids whose mass is removed and the rest renormalised (the distribution given that
    the token is not one of them; a row whose whole nucleus is excluded has every token outside).

    Returns ``(inside, surprisal, entropy, variance, top1, pmax, loglik, pit_u)``, each ``[C]``.
    """
    import torch

    from .dist import sampling_distribution

    p32 = sampling_distribution(logits, temperature, top_p)
    if exclude is not None and exclude.numel():
        p32 = p32.index_fill(1, exclude.to(p32.device), 0.0)
        mass = p32.sum(1, keepdim=True)
        p32 = torch.where(mass > 0, p32 / mass.clamp_min(1e-30), torch.zeros_like(p32))
    p = p32.double()
    col = y[:, None]
    py = p.gather(1, col).squeeze(1)
    inside = py > 0
    logp = torch.where(p > 0, p.log(), torch.zeros_like(p))
    entropy = -(p * logp).sum(1)
    variance = (p * (logp + entropy[:, None]) ** 2).sum(1)
    surprisal = torch.where(inside, -py.clamp_min(1e-300).log(), torch.zeros_like(py))
    top1 = p32.argmax(1) == y  # argmax: the first (lowest id) maximum
    pmax = p.max(1).values
    ids = torch.arange(p.shape[1], device=p.device)
    pyc = py[:, None]
    before = ((p > pyc) | ((p == pyc) & (ids[None, :] < col))).double()
    pit_u = (p * before).sum(1) + u * py
    if temperature == 0.0:
        pit_u = torch.full_like(pit_u, float("nan"))
    t_ll = temperature if temperature > 0 else 1.0
    loglik = torch.log_softmax(logits.double() / t_ll, dim=-1).gather(1, col).squeeze(1)
    return inside, surprisal, entropy, variance, top1, pmax, loglik, pit_u


def score_record(logits: torch.Tensor, targets: torch.Tensor, temperature: float | None, top_p: float | None, *,
                 seed: int, skip: torch.Tensor | None = None, chunk_rows: int | None = None,
                 exclude_ids: torch.Tensor | None = None) -> RecordScore:
    """Score one record's completion (module docstring: the statistics; docs/fidelity.md: their use).

    Runs on the logits' device, ``chunk_rows`` rows at a time (default: ``CHUNK_ELEMENTS // V``, at least 1),
    so ``[4096, 163840]`` float32 logits need ~0.5 GB of temporaries, not copies of the whole; the result
    does not depend on the chunking.

    Args:
        logits: ``[T, V]`` the target's logits at the positions that PREDICT the completion tokens
            (position ``i`` predicts ``targets[i]``), any float dtype.
        targets: ``[T]`` int64 completion token ids the provider returned.
        temperature / top_p: what the record was bought with (``None``: 1.0).
        seed: seeds the PIT's randomization (use a stable per-record value) so scores are reproducible:
            position ``i``'s ``U`` is the i-th of ``T`` float64 draws of ``torch.rand`` from a CPU
            ``torch.Generator`` seeded with ``seed`` (mod 2**64), whatever is skipped.
        skip: ``[T]`` bool, True for tokens not to score (special / structural tokens).
        chunk_rows: rows scored at once (tests; memory).
        exclude_ids: ``[K]`` int64 token ids (the special tokens ``skip`` marks): at every scored position the
            distribution is the target's GIVEN that the token is not one of them (their mass removed, the rest
            renormalised). Skipping a position because of the token found there conditions on that token;
            scoring the others under the unconditional distribution would bias every test (an honest
            provider's tokens read too probable by about the excluded mass: -0.035 nats/token at 2.5% per
            position in the rehearsal). Under H0 the conditional PIT is uniform again.

    Raises:
        ValueError: shapes disagree, a target id outside ``[0, V)``, or a bad temperature / top_p.
    """
    import torch

    if logits.dim() != 2 or targets.dim() != 1 or targets.shape[0] != logits.shape[0]:
        raise ValueError(f"need logits [T, V] and targets [T], got {tuple(logits.shape)} and {tuple(targets.shape)}")
    n_pos, vocab = logits.shape
    if skip is not None and tuple(skip.shape) != (n_pos,):
        raise ValueError(f"skip must be [{n_pos}], got {tuple(skip.shape)}")
    t = 1.0 if temperature is None else float(temperature)
    tp = 1.0 if top_p is None else float(top_p)
    if t < 0 or not 0.0 < tp <= 1.0:
        raise ValueError(f"need temperature >= 0 and top_p in (0, 1], got {t} and {tp}")
    tgt = targets.to(torch.int64).cpu()
    if n_pos and (int(tgt.min()) < 0 or int(tgt.max()) >= vocab):
        raise ValueError(f"target ids must lie in [0, {vocab})")
    gen = torch.Generator().manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
    uniforms = torch.rand(n_pos, generator=gen, dtype=torch.float64)
    keep = torch.ones(n_pos, dtype=torch.bool) if skip is None else ~skip.to(torch.bool).cpu()
    rows = torch.nonzero(keep).squeeze(1)
    step = max(1, chunk_rows if chunk_rows is not None else CHUNK_ELEMENTS // max(vocab, 1))
    parts: list[list[np.ndarray]] = [[] for _ in range(8)]
    for start in range(0, len(rows), step):
        sel = rows[start:start + step]
        dev_sel = sel.to(logits.device)
        stats = _token_stats(logits.index_select(0, dev_sel), tgt[sel].to(logits.device),
                             uniforms[sel].to(logits.device), t, tp, exclude_ids)
        for acc, s in zip(parts, stats, strict=True):
            acc.append(s.cpu().numpy())
    cols = [np.concatenate(acc) if acc else np.zeros(0) for acc in parts]
    return records_from_tokens(np.zeros(len(rows), dtype=np.int64), 1, cols[0].astype(bool), cols[1], cols[2],
                               cols[3], cols[4].astype(bool), cols[5], cols[6], cols[7])[0]
