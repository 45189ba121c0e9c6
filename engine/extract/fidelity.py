"""Phase-two fidelity scores from the extraction forward: the target's logits on each record's completion.

The extraction forward already computes the target's final hidden state (after the final norm: what
the LM head reads) at every position. :class:`Scorer` applies the LM head to the states at the
positions that PREDICT the completion tokens (``loss_mask`` is 1 exactly on the completion ids, not
shifted: position ``i - 1`` predicts token ``i``) and hands the logits to
:func:`engine.fidelity.score.score_record`, with the temperature and top_p the record was bought
with: no second forward.

Memory: the LM head runs on at most :data:`CHUNK_TOKENS` positions at a time (Kimi-K2.5's 163,840-token
vocabulary: 168 MB of bfloat16 logits per call; :func:`~engine.fidelity.score.score_record` bounds its
own temporaries), so ``[B, T, V]`` or one long record's ``[T, V]`` is never held. A record longer than
one chunk is scored chunk by chunk and the chunks' sums added (:func:`add_scores`); chunk ``k`` seeds its
PIT randomization with ``record_seed(id) + k`` (a record within one chunk: ``record_seed(id)``). The
chunks are a fixed number of completion tokens, so a record's scores depend on the record and the
model only (not on the vocabulary, the batch or the engine).

Tokens not scored (``skip``): the tokenizer's special tokens (``</think>``, ``<|im_end|>``, tool-call
markers: structural tokens the export may rebuild rather than the provider sample) and ids outside
the LM head's vocabulary.
"""

from __future__ import annotations

import logging
import zlib
from typing import Any, Callable, Iterable

import numpy as np
import torch

from engine.extract.scorefiles import score_row
from engine.fidelity.score import PIT_BINS, RecordScore, score_record

log = logging.getLogger(__name__)

#: Completion tokens per LM-head call (and per PIT seed).
CHUNK_TOKENS = 512
#: Largest absolute difference allowed between the LM head on the captured final state and the model's
#: own logits (the worker's check on the last position of each batch), relative to the logits' scale.
HEAD_CHECK_RTOL = 1e-2


def record_seed(sid: str) -> int:
    """The PIT seed of record ``sid``: CRC-32 of its UTF-8 id (stable across runs and processes)."""
    return zlib.crc32(sid.encode("utf-8"))


def add_scores(a: RecordScore, b: RecordScore) -> RecordScore:
    """Field-wise sum of two scores of disjoint token sets (every field of :class:`RecordScore` is a sum)."""
    return RecordScore(
        tokens=a.tokens + b.tokens, outside=a.outside + b.outside, surprisal=a.surprisal + b.surprisal,
        entropy=a.entropy + b.entropy, variance=a.variance + b.variance, top1=a.top1 + b.top1,
        top1_expected=a.top1_expected + b.top1_expected, top1_variance=a.top1_variance + b.top1_variance,
        loglik=a.loglik + b.loglik, pit=tuple(x + y for x, y in zip(a.pit, b.pit, strict=True)))


EMPTY = RecordScore(0, 0, 0.0, 0.0, 0.0, 0, 0.0, 0.0, 0.0, (0,) * PIT_BINS)


def completion_positions(loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pred [n], tgt [n])`` int64 indices: position ``pred[j]`` predicts the completion token at
    ``tgt[j] = pred[j] + 1`` (``loss_mask [T]`` is 1 exactly on completion ids; a completion token at
    position 0 has no predicting position and is left out)."""
    tgt = torch.nonzero(loss_mask.reshape(-1) != 0).reshape(-1).to(torch.int64)
    tgt = tgt[tgt >= 1]
    return tgt - 1, tgt


class Scorer:
    """Scores records from final hidden states with an LM head.

    Args:
        head: ``[n, H]`` final states (after the final norm) -> ``[n, V]`` logits, on the states' device.
        vocab: V, the LM head's output size.
        skip_ids: token ids never scored (special tokens).
        chunk: completion tokens per head call (module doc).
    """

    def __init__(self, head: Callable[[torch.Tensor], torch.Tensor], vocab: int, skip_ids: Iterable[int] = (),
                 chunk: int = CHUNK_TOKENS) -> None:
        self.head = head
        self.vocab = int(vocab)
        self.skip_ids = torch.tensor(sorted({int(i) for i in skip_ids}), dtype=torch.int64)
        #: the skipped ids inside the head's vocabulary: the scored tokens' distribution excludes them
        self._exclude = self.skip_ids[(self.skip_ids >= 0) & (self.skip_ids < vocab)]
        self.chunk = max(1, int(chunk))

    def score(self, final: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor, sid: str,
              temperature: float | None, top_p: float | None) -> RecordScore:
        """One record's score.

        Args:
            final: ``[T, H]`` the record's final hidden states (after the final norm), any device.
            input_ids: ``[T]`` token ids; loss_mask: ``[T]`` 1 on completion ids.
            sid: the record id (seeds the PIT, :func:`record_seed`).
            temperature / top_p: what the record was bought with (None: 1.0).

        Returns:
            the summed :class:`RecordScore` (:data:`EMPTY` when the record has no completion token).

        Raises:
            ValueError: ``final``, ``input_ids`` and ``loss_mask`` disagree in length.
        """
        t = final.shape[0]
        if input_ids.shape[0] != t or loss_mask.shape[0] != t:
            raise ValueError(f"final states {tuple(final.shape)}, input_ids {tuple(input_ids.shape)} and loss_mask "
                             f"{tuple(loss_mask.shape)} disagree in length")
        pred, tgt = completion_positions(loss_mask.cpu())
        if not len(pred):
            return EMPTY
        targets = input_ids.cpu().to(torch.int64)[tgt]
        skip = torch.isin(targets, self.skip_ids) | (targets >= self.vocab) | (targets < 0)
        targets = targets.clamp(0, self.vocab - 1)
        dev = final.device
        base = record_seed(sid)
        total: RecordScore | None = None
        for k, a in enumerate(range(0, len(pred), self.chunk)):
            b = a + self.chunk
            logits = self.head(final[pred[a:b].to(dev)])
            s = score_record(logits, targets[a:b].to(logits.device), temperature, top_p, seed=base + k,
                             skip=skip[a:b].to(logits.device), exclude_ids=self._exclude)
            total = s if total is None else add_scores(total, s)
        assert total is not None
        return total


def check_head(head: Callable[[torch.Tensor], torch.Tensor], final_last: torch.Tensor, logits_last: torch.Tensor) -> float:
    """How far the LM head on the captured final state is from the model's own logits, relative to
    the logits' scale: ``max |head(final) - logits| / max(1, max |logits|)``.

    Args:
        final_last: ``[B, H]`` the final states at the positions the model computed logits for.
        logits_last: ``[B, V]`` the model's logits there.
    """
    with torch.inference_mode():
        ours = head(final_last).float()
    ref = logits_last.float().to(ours.device)
    if ours.shape != ref.shape:
        return float("inf")
    return float((ours - ref).abs().max() / ref.abs().max().clamp(min=1.0))



def guarded(owner: Any, run: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]] | None:
    """``run()`` in inference mode; out of device memory, ``owner.scorer`` is set to None (scoring off for
    the rest of the job, logged) and None returned: the extraction goes on without scores."""
    try:
        with torch.inference_mode():
            return run()
    except torch.OutOfMemoryError as e:
        owner.scorer = None
        log.warning("fidelity: out of device memory while scoring (%s); scoring off for the rest of this worker",
                    str(e).splitlines()[0] if str(e) else "no detail")
        return None


def score_batch(scorer: Scorer, final: torch.Tensor, table: Any, rows: Iterable[int], temperature: float | None,
                top_p: float | None) -> list[dict[str, Any]]:
    """The score lines (:func:`engine.extract.scorefiles.score_row`) of one batch's samples.

    Args:
        final: ``[B, Tmax, H]`` final states after the final norm, row ``k`` = ``rows[k]`` (right padded).
        table: the :class:`engine.extract.source.TokenTable` the rows index.
        temperature / top_p: the job's, for records that do not say theirs (None: 1.0).
    """
    out = []
    for k, row in enumerate(rows):
        ids, mask = table.tokens(row)
        provider, t, p = table.sampling(row)
        t = temperature if t is None else t
        p = top_p if p is None else p
        sid = table.ids[row]
        s = scorer.score(final[k, :len(ids)], torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(mask.astype(np.int8)),
                         sid, t, p)
        out.append(score_row(sid, table.datasets[row], provider, t, p, s))
    return out


class TransformersScoring:
    """Fidelity scoring on the transformers engine: the LM head (``model.get_output_embeddings()``) on
    :attr:`engine.extract.model.HiddenStates.final`, checked once against the model's own logits.

    Args:
        job: the extraction job (``skip_token_ids``, ``temperature``, ``top_p``, ``model``).
        hs: the worker's forward object (a :class:`~engine.extract.model.HiddenStates`, or a layout's
            wrapper of one in ``.inner``).
    """

    def __init__(self, job: Any, hs: Any) -> None:
        self.job = job
        self.inner = getattr(hs, "inner", hs)
        self.scorer: Scorer | None = None
        self.checked = False
        head = self.inner.head() if hasattr(self.inner, "head") else None
        weight = getattr(head, "weight", None)
        if head is None or weight is None or weight.dim() != 2:
            log.warning("fidelity: %s has no LM head to score with; scoring off", type(self.inner.model).__name__)
            return
        skip = job.skip_token_ids
        if skip is None:
            from engine.extract.specials import special_token_ids

            skip = set(special_token_ids(job.model, getattr(self.inner.model, "config", None))) | set(job.unscored_token_ids)

        def apply(h: torch.Tensor) -> torch.Tensor:
            return head(h.to(weight.device))

        self.scorer = Scorer(apply, int(weight.shape[0]), skip)

    @property
    def on(self) -> bool:
        """Whether the batches are scored."""
        return self.scorer is not None

    def __call__(self, table: Any, rows: Iterable[int]) -> list[dict[str, Any]] | None:
        """Score the batch the last forward ran (``rows`` of ``table``); None when scoring is off (no LM
        head, or the LM head on the final state does not reproduce the model's logits: logged once)."""
        if self.scorer is None or self.inner.final is None:
            return None
        if not self.checked and self.inner.logits_last is not None:
            self.checked = True
            with torch.inference_mode():
                err = check_head(self.scorer.head, self.inner.final[:, -1], self.inner.logits_last)
            if not err <= HEAD_CHECK_RTOL:
                log.warning("fidelity: the LM head on the final state is %.3g (relative) from the model's own logits: "
                            "this model computes its logits otherwise (soft-capping, scaling); scoring off", err)
                self.scorer = None
                return None
        scorer, final = self.scorer, self.inner.final
        return guarded(self, lambda: score_batch(scorer, final, table, rows, self.job.temperature, self.job.top_p))
