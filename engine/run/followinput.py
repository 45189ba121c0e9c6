"""The frozen input of one follow increment (``[extract] after_run = "follow"``, :mod:`engine.run.chainfollow`).

While generation goes on, a run directory's validated records keep growing. An extraction whose
input is the run directory would see a different set of records in its ``prepare`` and in each
worker (each loads its input at its own start, and several workers split the batches of what they
loaded): records could fall between two workers' shares, or land in both. So each increment's
records are read once from the store and written to a ``tokens`` Parquet file (the format ``datagen
export --format tokens`` writes and ``datagen extract --data`` reads, attribution and sampling
columns included); the increment's extraction reads that file, the same for every worker and
every restart. Only records not in the output manifest yet are written. The file is removed once
the increment ended (:func:`remove_increment`; a leftover from a killed process is removed at the
next start).
"""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from engine.extract.shards import OutDir
from engine.tokens.records import TokenRecord, write_parquet

#: Where increments are frozen, under the extraction output directory's ``status`` folder.
INPUT_DIR = Path("status") / "follow-input"


@dataclass(frozen=True)
class FrozenIncrement:
    """One increment's input.

    Attributes:
        path: the folder holding its ``records.parquet`` (the job's ``--data``); None when no record
            was new (nothing written).
        read: ``{dataset: records}`` validated records the store held for each dataset (new or not).
        new: ``{dataset: records}`` written, i.e. not in the manifest yet.
    """

    path: Path | None
    read: Counter[str]
    new: Counter[str]


def input_root(out_dir: str | Path) -> Path:
    """The folder of frozen increments under ``out_dir``."""
    return Path(out_dir) / INPUT_DIR


def freeze_increment(run_dir: str | Path, out_dir: str | Path, datasets: tuple[str, ...], seq: int) -> FrozenIncrement:
    """Read ``datasets``' validated records from ``run_dir``'s store and write those not listed in
    ``out_dir``'s manifest to ``out_dir/status/follow-input/<seq>/records.parquet`` (blocking).

    Raises:
        engine.tokens.vstore.NoStoreError: no store in ``run_dir``; OSError: the file cannot be written.
    """
    from engine.tokens.exports import iter_token_records

    done = OutDir(out_dir).done_ids() if Path(out_dir).is_dir() else set()
    read: Counter[str] = Counter()
    new: Counter[str] = Counter()

    def fresh() -> Iterator[TokenRecord]:
        for r in iter_token_records(Path(run_dir), datasets=datasets):
            read[r.dataset] += 1
            if r.id not in done:
                new[r.dataset] += 1
                yield r

    folder = input_root(out_dir) / f"{seq:05d}"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        write_parquet(folder / "records.parquet", fresh())  # streamed: an increment after a restart may be large
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if not sum(new.values()):
        shutil.rmtree(folder, ignore_errors=True)
        return FrozenIncrement(None, read, new)
    return FrozenIncrement(folder, read, new)


def remove_increment(frozen: FrozenIncrement | None) -> None:
    """Remove an increment's input folder (nothing when there is none)."""
    if frozen is not None and frozen.path is not None:
        shutil.rmtree(frozen.path, ignore_errors=True)


def remove_leftovers(out_dir: str | Path) -> None:
    """Remove every frozen increment under ``out_dir`` (those a killed process left)."""
    shutil.rmtree(input_root(out_dir), ignore_errors=True)


__all__ = ["FrozenIncrement", "INPUT_DIR", "freeze_increment", "input_root", "remove_increment", "remove_leftovers"]
