"""Planning: length-sorted, token-capped batches, a length-balanced split over workers, resume skip,
and the disk projection.

The plan depends only on the input (ids and lengths) and ``max_tokens_per_batch``, never on what is
already done, so every worker of a job (and every restart with the same settings) computes the
same batches and the same owner for each batch: a sample belongs to exactly one worker. Done
samples are then filtered out of each worker's batches; a batch left empty is dropped, so an
all-done batch never reaches the model (docs/eagle3-data.md pitfall 7).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Collection, Sequence

import numpy as np

#: Estimated safetensors header bytes per sample (4 keys of JSON: name, dtype, shape, offsets).
HEADER_BYTES_PER_SAMPLE = 4 * 110


@dataclass(frozen=True, slots=True)
class Batch:
    """One forward batch.

    Attributes:
        rows: table row indices, ascending length.
        max_len: longest sample (tokens) = padded width.
        tokens: real tokens (sum of lengths).
    """

    rows: tuple[int, ...]
    max_len: int
    tokens: int

    @property
    def padded(self) -> int:
        """Tokens the model sees, padding included (``len(rows) * max_len``)."""
        return len(self.rows) * self.max_len


def make_batches(lengths: np.ndarray, ids: Sequence[str], max_tokens: int) -> list[Batch]:
    """Sort samples by (length, id) and cut them greedily into batches of at most ``max_tokens``
    PADDED tokens (a sample longer than the cap gets a batch of its own).

    Args:
        lengths: ``[N]`` tokens per sample; ids: ``[N]`` sample ids (tie-break, for determinism).
        max_tokens: cap of ``batch size x longest sample``.
    """
    order = sorted(range(len(ids)), key=lambda i: (int(lengths[i]), ids[i]))
    batches: list[Batch] = []
    rows: list[int] = []
    tokens = 0
    for i in order:
        t = int(lengths[i])
        if rows and (len(rows) + 1) * t > max_tokens:  # ascending: t is the new max length
            batches.append(Batch(tuple(rows), int(lengths[rows[-1]]), tokens))
            rows, tokens = [], 0
        rows.append(i)
        tokens += t
    if rows:
        batches.append(Batch(tuple(rows), int(lengths[rows[-1]]), tokens))
    return batches


def split(batches: Sequence[Batch], world: int) -> list[list[Batch]]:
    """Split batches over ``world`` workers, balancing padded tokens (longest-first greedy).

    Deterministic (ties go to the lower rank). Each worker's list is ordered longest batch first,
    so a batch that does not fit in memory fails at the start, not after hours.
    """
    order = sorted(range(len(batches)), key=lambda b: (-batches[b].padded, -batches[b].max_len, b))
    heap = [(0, r) for r in range(world)]
    out: list[list[Batch]] = [[] for _ in range(world)]
    for b in order:
        load, r = heapq.heappop(heap)
        out[r].append(batches[b])
        heapq.heappush(heap, (load + batches[b].padded, r))
    return out


def pending(batches: Sequence[Batch], ids: Sequence[str], lengths: np.ndarray, done: Collection[str]) -> list[Batch]:
    """The batches with done samples removed; batches left empty are dropped (never run)."""
    out = []
    for b in batches:
        rows = tuple(i for i in b.rows if ids[i] not in done)
        if not rows:
            continue
        if len(rows) == len(b.rows):
            out.append(b)
        else:
            out.append(Batch(rows, max(int(lengths[i]) for i in rows), sum(int(lengths[i]) for i in rows)))
    return out


@dataclass(frozen=True, slots=True)
class Projection:
    """Projected output bytes.

    Attributes:
        hidden_bytes: sum of lengths x (n_aux + 1) x H x dtype bytes (the hidden states; 1 byte for fp8).
        overhead_bytes: token ids and masks per token (+ fp8 scales) + headers per sample (:data:`LAYOUT_OVERHEAD`).
        samples / tokens: what is projected.
    """

    hidden_bytes: int
    overhead_bytes: int
    samples: int
    tokens: int

    @property
    def total(self) -> int:
        return self.hidden_bytes + self.overhead_bytes


#: Bytes besides the hidden states, per layout: (per token, per sample). Shards: input_ids int64 +
#: loss_mask int8, a safetensors header per sample; speculators: token_ids int64 in ``hs_i`` plus
#: input_ids and loss_mask int64 in its dataset; specforge: input_ids and loss_mask int64 and
#: torch.save's zip framing per file (engine/extract/layouts/).
LAYOUT_OVERHEAD = {"shards": (8 + 1, HEADER_BYTES_PER_SAMPLE), "speculators": (8 + 8 + 8, 2 * 110 + 16),
                   "specforge": (8 + 8, 1_600), "modelopt": (8 + 8, 1_700)}
#: ``save_dtype = "fp8"`` (1 byte per element): the float32 scale each token carries
#: (``hidden_states_scales``), and the extra safetensors header entry per sample.
FP8_SCALE_BYTES = 4
FP8_HEADER_BYTES = 110


def _overhead(layout: str) -> tuple[int, int]:
    try:
        return LAYOUT_OVERHEAD[layout]
    except KeyError:
        raise ValueError(f"unknown layout {layout!r}; expected one of {sorted(LAYOUT_OVERHEAD)}") from None


def _overhead_for(layout: str, dtype_bytes: int) -> tuple[int, int]:
    per_tok, per_sample = _overhead(layout)
    if dtype_bytes == 1:  # fp8 (engine.extract.job.FP8_BYTES): + the per-token scale
        per_tok, per_sample = per_tok + FP8_SCALE_BYTES, per_sample + (FP8_HEADER_BYTES if layout == "speculators" else 0)
    return per_tok, per_sample


def project(lengths: np.ndarray | Sequence[int], hidden_size: int, n_aux: int, dtype_bytes: int,
            layout: str = "shards") -> Projection:
    """Bytes the output files of these samples will take in ``layout`` (see :class:`Projection`).

    ``dtype_bytes`` is the stored element size (:attr:`engine.extract.job.ExtractJob.dtype_bytes`):
    1 means ``save_dtype = "fp8"``, whose per-token float32 scale is counted with the overhead. A
    gzipped ``specforge`` output (``compress = true``) is projected uncompressed: an upper bound.
    """
    tokens = int(np.sum(np.asarray(lengths, dtype=np.int64)))
    n = len(lengths)
    per_tok, per_sample = _overhead_for(layout, dtype_bytes)
    return Projection(tokens * (n_aux + 1) * hidden_size * dtype_bytes, tokens * per_tok + n * per_sample, n, tokens)


def per_token_bytes(hidden_size: int, n_aux: int, dtype_bytes: int, layout: str = "shards") -> int:
    """Output bytes per token in ``layout`` (hidden states + token ids + mask, + the fp8 scale), without
    per-sample framing."""
    return (n_aux + 1) * hidden_size * dtype_bytes + _overhead_for(layout, dtype_bytes)[0]
