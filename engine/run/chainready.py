"""When a finished dataset's token records can be extracted while generation goes on
(``[extract] after_run = "dataset"``, :mod:`engine.run.chain`; ``follow`` applies its failure rule to
the verdicts so far, :mod:`engine.run.chainfollow`): every result committed, every one
with its validation verdict, and not too many invalid ones. :func:`readiness` decides (pure);
:func:`dataset_counts` reads the figures from the run's store (read-only).
"""

from __future__ import annotations

from pathlib import Path

from engine.storage.validations import readiness_counts

#: Dataset states after which generation adds no result to it (``engine.report.snapshot.DatasetSnapshot``).
FINISHED_STATES = ("done", "budget_met", "skipped")

_MIN_GUARD = 50  # validated records a dataset needs before its failure rate counts (the anomaly guard's)


def readiness(done: int, committed: int, unvalidated: int, validated: int, invalid: int,
              max_failure_rate: float, failure_window: int) -> tuple[str, str]:
    """Whether a finished dataset can be extracted now (pure).

    Args:
        done: its completed prompts (the generation snapshot); committed: its results in the store.
        unvalidated: committed results without a validation verdict; validated / invalid: verdicts.
        max_failure_rate / failure_window: ``[tokenizer]``'s (0 disables the failure check).

    Returns:
        ``("ready", "")``, ``("wait", why)`` (results not committed or validated yet) or
        ``("refuse", why)`` (too many invalid records: not extracted).
    """
    if committed < done:
        return "wait", f"{done - committed} result(s) not committed yet"
    if unvalidated:
        return "wait", f"{unvalidated} result(s) not validated yet"
    if max_failure_rate > 0 and validated >= min(_MIN_GUARD, failure_window) and invalid / validated > max_failure_rate:
        return "refuse", (f"validation failed for {invalid} of {validated} records "
                          f"({invalid / validated:.0%} > max_failure_rate {max_failure_rate:.0%})")
    return "ready", ""


def dataset_counts(run_dir: Path, names: list[str]) -> dict[str, tuple[int, int, int, int]]:
    """``{dataset: (committed results, unvalidated, validated, invalid)}`` from the run's store,
    read-only (the generation's writer and validator keep writing; WAL readers never block them).

    Raises:
        engine.storage.schema.StoreError: no store, or one without a ``validations`` table yet.
    """
    return readiness_counts(Path(run_dir), names)


__all__ = ["FINISHED_STATES", "dataset_counts", "readiness"]
