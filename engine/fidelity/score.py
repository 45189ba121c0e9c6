"""Per-record scores of a completion under the target (phase two, from the extraction forward's logits).

INTERFACE (fixed; the body is being written): callers build :class:`RecordScore` with
:func:`score_record` and aggregate them with :mod:`engine.fidelity.verdict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

#: PIT histogram bins (equal width on [0, 1]).
PIT_BINS = 10


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


def score_record(logits: torch.Tensor, targets: torch.Tensor, temperature: float | None, top_p: float | None, *,
                 seed: int, skip: torch.Tensor | None = None) -> RecordScore:
    """Score one record's completion.

    Args:
        logits: ``[T, V]`` the target's logits at the positions that PREDICT the completion tokens
            (position ``i`` predicts ``targets[i]``), any float dtype.
        targets: ``[T]`` int64 completion token ids the provider returned.
        temperature / top_p: what the record was bought with (``None``: 1.0).
        seed: seeds the PIT's randomization (use a stable per-record value) so scores are reproducible.
        skip: ``[T]`` bool, True for tokens not to score (special / structural tokens).

    Raises:
        ValueError: shapes disagree.
    """
    raise NotImplementedError
