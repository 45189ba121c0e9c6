"""When a provider is judged again, what a verdict does, and the one fidelity figure a provider shows.

Pure: no I/O, no clocks. A run judges a provider many times as its records arrive ("looks"). Each
look tests at ``false_alarm / looks`` (Bonferroni over the looks, :mod:`engine.fidelity.verdict`), so
the chance that an honest provider is ever judged ``drifting`` in a run stays <= ``false_alarm`` as
long as no more than ``looks`` looks are taken. Looks are spent geometrically: the first once a
provider has ``min_records`` scored records, each next one once its records grew by :data:`GROWTH`
(20 records x 1.5^19 ~ 44,000 records for 20 looks), so a long run keeps being watched. A look that
finds ``drifting`` is the last one for that provider and source: the sequential test stopped there
(docs/fidelity.md, "Thresholds and why").
"""

from __future__ import annotations

import math
from typing import Any, Mapping

#: Growth of a provider's records between two looks.
GROWTH = 1.5

VERDICTS = ("ok", "drifting", "insufficient")


def look_due(records: int, last_records: int, looks_used: int, *, looks: int, min_records: int,
             verdict: str | None, final: bool = False) -> bool:
    """Whether to judge a provider (one source) now.

    Args:
        records: its scored records now; last_records: at its last look (0: never judged).
        looks_used: looks spent so far; looks: the run's allowance (``[fidelity] looks``).
        min_records: below this nothing is tested (the verdict is ``insufficient``, no look spent).
        verdict: its current verdict (None: none yet); a ``drifting`` one is final.
        final: the last chance of a run or an extraction: judge if any record arrived since the last look.
    """
    if verdict == "drifting" or looks_used >= looks or records < min_records:
        return False
    if last_records <= 0:
        return True
    if final:
        return records > last_records
    return records >= math.ceil(last_records * GROWTH)


def drift_action(verdict: str, acted: str | None, cleared: bool, on_drift: str) -> str | None:
    """What a new look's ``verdict`` does now: ``on_drift`` (``exclude`` | ``flag`` | ``report``) the first
    time a provider reads ``drifting``; None when it is not drifting, was already acted on, or the user
    cleared its verdict (a cleared provider is never acted on again)."""
    if verdict != "drifting" or acted is not None or cleared:
        return None
    return on_drift


def combined(rows: Mapping[str, Mapping[str, Any]], records_fallback: int = 0) -> dict[str, Any]:
    """The fidelity object of one provider from its verdict rows by source (``target``, ``cheap``; rows as
    :func:`engine.storage.verdicts.load` gives them).

    The phase-two verdict (``target``: scored under the target model) decides when it is ``ok`` or
    ``drifting``; otherwise the cheap signals' when they decide; otherwise ``insufficient``.
    ``records`` is the deciding source's record count (``records_fallback`` when no source judged yet).

    Returns:
        ``{"verdict", "records", "tokens", "source", "reason", "acted", "cleared", "evidence", "target",
        "cheap"}``; ``target`` / ``cheap``: ``{"verdict", "records", "reason", "looks", "figures"}`` or None.
    """
    def part(src: str) -> dict[str, Any] | None:
        r = rows.get(src)
        if r is None:
            return None
        doc = r.get("doc") or {}
        return {"verdict": r["verdict"], "records": int(r["records"]), "tokens": int(r.get("tokens") or 0),
                "reason": r.get("reason") or "", "looks": int(r.get("looks") or 0),
                "figures": dict(doc.get("figures") or {})}

    target, cheap = part("target"), part("cheap")
    decider, source = None, None
    for name, p in (("target", target), ("cheap", cheap)):
        if p is not None and p["verdict"] in ("ok", "drifting"):
            decider, source = p, name
            break
    row = rows.get(source) if source else None
    if decider is None:
        best = target or cheap
        return {"verdict": "insufficient", "records": best["records"] if best else records_fallback,
                "tokens": best["tokens"] if best else 0, "source": None,
                "reason": best["reason"] if best else "not judged yet", "acted": None, "cleared": False,
                "evidence": None, "target": target, "cheap": cheap}
    assert row is not None
    return {"verdict": decider["verdict"], "records": decider["records"], "tokens": decider["tokens"],
            "source": source, "reason": decider["reason"], "acted": row.get("acted"),
            "cleared": row.get("cleared_at") is not None, "evidence": row.get("evidence"),
            "target": target, "cheap": cheap}
