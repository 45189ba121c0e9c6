"""Token records: the training sample as token ids, and the ``tokens`` Parquet format.

A :class:`TokenRecord` is what the drafter trains on and what hidden-state extraction reads:
``input_ids`` = chat-templated prompt ids + the target's completion ids, ``loss_mask`` = 1 exactly
on the completion ids (NOT shifted; docs/eagle3-data.md pitfall 1).

Parquet layout (``datagen export --format tokens``): one file per dataset, ``DIR/<dataset>.parquet``,
columns ``id`` (string, ``"<dataset>:<key>"``), ``dataset`` (string), ``input_ids`` (list<int32>),
``loss_mask`` (list<int8>), ``prompt_len`` (int32), ``completion_len`` (int32), ``provider``
(string), ``finish_reason`` (string), then who served the record and how it was bought
(:mod:`engine.client.attribution`): ``model`` (string: the id the response named), ``endpoint``
(string: the ``[provider] base_urls`` entry, "" with one ``base_url``), ``system_fingerprint``
(string, "" when none was sent), ``flags`` (list<string>: the record's failed checks, then its other
wire flags; empty for a clean record), ``temperature`` and ``top_p`` (float64, null when the request
left them to the provider's default or the result was stored before they were recorded); rows in prompt
order. Loadable with pyarrow and ``datasets.load_dataset("parquet", data_files=...)``; files written
before the attribution columns read back with their defaults (:func:`read_parquet_dir`).

JSONL layout (``datagen export --format tokens-jsonl``, :func:`write_jsonl`): one file per dataset,
``DIR/<dataset>.jsonl``, one compact JSON object per record in the same order,
``{"input_ids": [int, ...], "loss_mask": [0|1, ...], "id": "<dataset>:<key>"}``: the same ids and
mask as the Parquet rows, for trainers that read pre-tokenized JSONL (SpecForge ``data.prompts_path``,
speculators ``prepare-data``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from engine.storage.atomic import atomic_path

SCHEMA = pa.schema([
    ("id", pa.string()),
    ("dataset", pa.string()),
    ("input_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.int8())),
    ("prompt_len", pa.int32()),
    ("completion_len", pa.int32()),
    ("provider", pa.string()),
    ("finish_reason", pa.string()),
    ("model", pa.string()),
    ("endpoint", pa.string()),
    ("system_fingerprint", pa.string()),
    ("flags", pa.list_(pa.string())),
    ("temperature", pa.float64()),
    ("top_p", pa.float64()),
])


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """One training sample as token ids.

    Attributes:
        id: ``"<dataset>:<prompt key>"`` (stable across runs).
        dataset: dataset name.
        input_ids: prompt ids + completion ids, ``[T]``.
        loss_mask: ``[T]`` of 0/1, 1 exactly on the completion ids.
        prompt_len / completion_len: lengths of the two parts (tokens); they sum to T.
        provider: provider that generated the completion; finish_reason: its finish reason.
        model / endpoint / system_fingerprint: who served it (module docstring).
        flags: failed checks, then the other wire flags (names: :mod:`engine.tokens.validate`,
            :mod:`engine.client.conformance`).
        temperature / top_p: the sampling settings it was bought with (None: not sent / not recorded).
    """

    id: str
    dataset: str
    input_ids: list[int]
    loss_mask: list[int]
    prompt_len: int
    completion_len: int
    provider: str = ""
    finish_reason: str = ""
    model: str = ""
    endpoint: str = ""
    system_fingerprint: str = ""
    flags: tuple[str, ...] = ()
    temperature: float | None = None
    top_p: float | None = None

    def __len__(self) -> int:
        return len(self.input_ids)


def write_parquet(path: Path, records: Iterable[TokenRecord], batch_rows: int = 1024) -> int:
    """Write records to ``path`` atomically (temp file + rename); returns the row count."""
    n = 0
    with atomic_path(Path(path)) as tmp, pq.ParquetWriter(tmp, SCHEMA) as w:
        batch: list[TokenRecord] = []
        for r in records:
            batch.append(r)
            if len(batch) >= batch_rows:
                w.write_table(_table(batch))
                n += len(batch)
                batch = []
        if batch or n == 0:
            w.write_table(_table(batch))
            n += len(batch)
    return n


def write_jsonl(path: Path, records: Iterable[TokenRecord]) -> int:
    """Write records to ``path`` as JSONL (module doc) atomically (temp file + rename); returns the count."""
    import json

    from engine.storage.atomic import write_lines

    return write_lines(Path(path), (json.dumps({"input_ids": [int(i) for i in r.input_ids],
                                                "loss_mask": [int(m) for m in r.loss_mask], "id": r.id},
                                               ensure_ascii=False, separators=(",", ":")) for r in records))


def _table(batch: list[TokenRecord]) -> pa.Table:
    return pa.table({
        "id": [r.id for r in batch],
        "dataset": [r.dataset for r in batch],
        "input_ids": [r.input_ids for r in batch],
        "loss_mask": [r.loss_mask for r in batch],
        "prompt_len": [r.prompt_len for r in batch],
        "completion_len": [r.completion_len for r in batch],
        "provider": [r.provider for r in batch],
        "finish_reason": [r.finish_reason for r in batch],
        "model": [r.model for r in batch],
        "endpoint": [r.endpoint for r in batch],
        "system_fingerprint": [r.system_fingerprint for r in batch],
        "flags": [list(r.flags) for r in batch],
        "temperature": [r.temperature for r in batch],
        "top_p": [r.top_p for r in batch],
    }, schema=SCHEMA)


def read_parquet_dir(path: Path) -> Iterator[TokenRecord]:
    """Yield records from a ``tokens`` export: every ``*.parquet`` in ``path`` (sorted), or one file.

    Raises:
        FileNotFoundError: no Parquet file there.
    """
    path = Path(path)
    files = [path] if path.is_file() else sorted(path.glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.parquet token files")
    for f in files:
        pf = pq.ParquetFile(f)
        for batch in pf.iter_batches(batch_size=256):
            cols = batch.to_pydict()
            none = [None] * batch.num_rows  # a column an older export does not have
            model, endpoint, fp, flags, temp, top_p = (cols.get(k, none) for k in (
                "model", "endpoint", "system_fingerprint", "flags", "temperature", "top_p"))
            for i in range(batch.num_rows):
                yield TokenRecord(
                    id=cols["id"][i], dataset=cols["dataset"][i], input_ids=cols["input_ids"][i],
                    loss_mask=cols["loss_mask"][i], prompt_len=cols["prompt_len"][i],
                    completion_len=cols["completion_len"][i], provider=cols["provider"][i] or "",
                    finish_reason=cols["finish_reason"][i] or "", model=model[i] or "", endpoint=endpoint[i] or "",
                    system_fingerprint=fp[i] or "", flags=tuple(flags[i] or ()), temperature=temp[i], top_p=top_p[i],
                )
