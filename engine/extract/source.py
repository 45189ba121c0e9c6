"""Extraction input: token records held column-wise (numpy), from a ``tokens`` export or a run directory.

Any ``Iterable[TokenRecord]`` becomes a :class:`TokenTable`: ids, datasets, lengths and the token
ids / loss masks of every sample concatenated into two flat arrays (``int32`` / ``int8``), so a
job of 240 M tokens takes ~1.2 GB instead of tens of GB of Python lists, and a batch is sliced out
without per-token Python work.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from engine.extract.job import ExtractError, ExtractJob
from engine.tokens.records import TokenRecord, read_parquet_dir

log = logging.getLogger(__name__)



@dataclass
class TokenTable:
    """Samples column-wise.

    Attributes:
        ids / datasets: per sample (``"<dataset>:<key>"``, dataset name).
        lengths: ``[N]`` int64, tokens to extract per sample (after truncation, if any).
        full_lengths: ``[N]`` int64, tokens in the record.
        offsets: ``[N]`` int64 start of each sample in the flat arrays.
        input_ids: flat ``int32``; loss_mask: flat ``int8``.
        dropped: ``{"duplicate": n, "empty": n, "mismatched": n, "over_length": n, "no_supervised_tokens": n}``
            rows left out (the last: truncated to ``max_seq_len`` inside the prompt, no completion token kept).
        providers: per sample, who served the completion (``""``: unknown); temperatures / top_ps:
            ``[N]`` float64, what the record was bought with (NaN: the record does not say; phase-two
            fidelity scoring then uses the job's ``[generation]`` values). Empty when not collected.
    """

    ids: list[str]
    datasets: list[str]
    lengths: np.ndarray
    full_lengths: np.ndarray
    offsets: np.ndarray
    input_ids: np.ndarray
    loss_mask: np.ndarray
    dropped: dict[str, int]
    providers: list[str] = field(default_factory=list)
    temperatures: np.ndarray = field(default_factory=lambda: np.zeros(0))
    top_ps: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __len__(self) -> int:
        return len(self.ids)

    def tokens(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids [T], loss_mask [T])`` of sample ``i`` (views, T = ``lengths[i]``)."""
        o, t = int(self.offsets[i]), int(self.lengths[i])
        return self.input_ids[o:o + t], self.loss_mask[o:o + t]

    def sampling(self, i: int) -> tuple[str, float | None, float | None]:
        """``(provider, temperature, top_p)`` of sample ``i`` (None: not recorded)."""
        def at(a: np.ndarray) -> float | None:
            return float(a[i]) if i < len(a) and not np.isnan(a[i]) else None

        return (self.providers[i] if i < len(self.providers) else ""), at(self.temperatures), at(self.top_ps)

    @classmethod
    def from_records(cls, records: Iterable[TokenRecord], chunk: int = 4096) -> "TokenTable":
        """Collect records; duplicates (same id: first kept), empty rows and rows whose
        ``loss_mask`` length differs from ``input_ids`` are dropped and counted (logged)."""
        ids: list[str] = []
        datasets: list[str] = []
        lengths: list[int] = []
        providers: list[str] = []
        temps: list[float] = []
        top_ps: list[float] = []
        seen: set[str] = set()
        dropped = {"duplicate": 0, "empty": 0, "mismatched": 0, "over_length": 0, "no_supervised_tokens": 0}
        tok_chunks: list[np.ndarray] = []
        mask_chunks: list[np.ndarray] = []
        tok_buf: list[np.ndarray] = []
        mask_buf: list[np.ndarray] = []
        for r in records:
            if r.id in seen:
                dropped["duplicate"] += 1
                continue
            if len(r.input_ids) == 0:
                dropped["empty"] += 1
                continue
            if len(r.loss_mask) != len(r.input_ids):
                dropped["mismatched"] += 1
                continue
            seen.add(r.id)
            ids.append(r.id)
            datasets.append(r.dataset)
            lengths.append(len(r.input_ids))
            providers.append(r.provider or "")
            temps.append(_float(getattr(r, "temperature", None)))  # columns a tokens export may carry
            top_ps.append(_float(getattr(r, "top_p", None)))
            tok_buf.append(np.asarray(r.input_ids, dtype=np.int32))
            mask_buf.append(np.asarray(r.loss_mask, dtype=np.int8))
            if len(tok_buf) >= chunk:
                tok_chunks.append(np.concatenate(tok_buf))
                mask_chunks.append(np.concatenate(mask_buf))
                tok_buf, mask_buf = [], []
        if tok_buf:
            tok_chunks.append(np.concatenate(tok_buf))
            mask_chunks.append(np.concatenate(mask_buf))
        lens = np.asarray(lengths, dtype=np.int64)
        offsets = np.zeros(len(lens), dtype=np.int64)
        if len(lens):
            offsets[1:] = np.cumsum(lens)[:-1]
        for k, n in dropped.items():
            if n:
                log.warning("extract input: %d %s row(s) left out", n, k)
        return cls(ids, datasets, lens, lens.copy(), offsets,
                   np.concatenate(tok_chunks) if tok_chunks else np.zeros(0, np.int32),
                   np.concatenate(mask_chunks) if mask_chunks else np.zeros(0, np.int8), dropped,
                   providers, np.asarray(temps, dtype=np.float64), np.asarray(top_ps, dtype=np.float64))

    def limit_length(self, max_seq_len: int | None, over_length: str) -> "TokenTable":
        """Apply ``max_seq_len``: ``skip`` drops longer samples (counted in ``dropped["over_length"]``),
        ``truncate`` keeps their first ``max_seq_len`` tokens. Returns a table (self when no limit)."""
        if max_seq_len is None or not len(self) or int(self.lengths.max()) <= max_seq_len:
            return self
        if over_length == "truncate":
            cut = TokenTable(self.ids, self.datasets, np.minimum(self.lengths, max_seq_len), self.full_lengths,
                             self.offsets, self.input_ids, self.loss_mask, dict(self.dropped), self.providers,
                             self.temperatures, self.top_ps)
            # a sample cut inside its prompt keeps no completion token: nothing to train on, yet its forward
            # would cost as much as any other (trl #6668, NeMo #8025): skipped and counted
            starts = np.concatenate(([0], np.cumsum(self.loss_mask.astype(np.int64))))
            supervised = starts[cut.offsets + cut.lengths] - starts[cut.offsets]
            keep = np.flatnonzero(supervised > 0)
            if len(keep) == len(cut):
                return cut
            out = cut.take(keep)
            n = len(cut) - len(keep)
            out.dropped["no_supervised_tokens"] = out.dropped.get("no_supervised_tokens", 0) + n
            log.warning("extract input: %d sample(s) keep no completion token after truncation to max_seq_len %d: "
                        "skipped (e.g. %s)", n, max_seq_len, cut.ids[int(np.flatnonzero(supervised == 0)[0])])
            return out
        keep = np.flatnonzero(self.lengths <= max_seq_len)
        out = self.take(keep)
        out.dropped["over_length"] += len(self) - len(keep)
        log.warning("extract input: %d sample(s) longer than max_seq_len %d skipped", len(self) - len(keep), max_seq_len)
        return out

    def take(self, rows: np.ndarray | list[int]) -> "TokenTable":
        """A table of the given rows (sharing the flat token arrays)."""
        rows = np.asarray(rows, dtype=np.int64)
        return TokenTable([self.ids[i] for i in rows], [self.datasets[i] for i in rows], self.lengths[rows],
                          self.full_lengths[rows], self.offsets[rows], self.input_ids, self.loss_mask,
                          dict(self.dropped), [self.providers[i] for i in rows] if self.providers else [],
                          self.temperatures[rows] if len(self.temperatures) else self.temperatures,
                          self.top_ps[rows] if len(self.top_ps) else self.top_ps)


def _float(v: object) -> float:
    """A record's temperature / top_p as a float (NaN: absent or not a number)."""
    try:
        return float(v) if v is not None else float("nan")  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return float("nan")


def _find_run_dir_reader() -> Callable[..., Iterator[TokenRecord]]:
    """The run-directory reader (:func:`engine.tokens.exports.iter_token_records`), imported lazily."""
    from engine.tokens.exports import iter_token_records

    return iter_token_records


def iter_source(kind: str, path: str | Path, datasets: tuple[str, ...] | None = None) -> Iterator[TokenRecord]:
    """Records of a source: ``parquet`` (``tokens`` export dir or file) or ``run_dir`` (validated
    records straight from the run's store); only those of ``datasets`` when given (a run directory's
    results of those datasets not validated yet are then left out, not validated here).

    Raises:
        ExtractError: the input is missing, or run-directory input is not available in this build.
    """
    path = Path(path)
    if kind == "parquet":
        try:
            files = [path] if path.is_file() else sorted(path.glob("*.parquet"))
            if not files:
                raise FileNotFoundError(f"{path}: no *.parquet token files")
        except OSError as e:
            raise ExtractError(f"--data: {e}") from None
        recs = read_parquet_dir(path)
        return recs if datasets is None else (r for r in recs if r.dataset in datasets)
    if kind == "run_dir":
        return _find_run_dir_reader()(path) if datasets is None else _find_run_dir_reader()(path, datasets=datasets)
    raise ExtractError(f"unknown input kind {kind!r}")


def load_table(job: ExtractJob) -> TokenTable:
    """The job's input as a :class:`TokenTable`, with ``max_seq_len`` applied."""
    return TokenTable.from_records(iter_source(job.source_kind, job.source_path, job.datasets)).limit_length(
        job.max_seq_len, job.over_length)
