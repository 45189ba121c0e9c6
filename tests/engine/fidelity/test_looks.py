"""When a provider is judged again, what a verdict does, and the fidelity object (engine.fidelity.looks)."""

from __future__ import annotations

import pytest

from engine.fidelity.looks import GROWTH, combined, drift_action, look_due


def test_first_look_once_min_records_are_scored():
    kw = dict(looks=20, min_records=20, verdict=None)
    assert not look_due(19, 0, 0, **kw)
    assert look_due(20, 0, 0, **kw)


def test_next_looks_are_geometric_and_counted():
    kw = dict(looks=20, min_records=20, verdict="ok")
    assert not look_due(29, 20, 1, **kw)
    assert look_due(30, 20, 1, **kw)  # 20 x 1.5
    # 20 looks from 20 records reach ~44,000 records: a long run is watched to its end
    n, looks = 20, 1
    while looks < 20:
        n = int(-(-n * GROWTH // 1))
        looks += 1
    assert 40_000 < n < 50_000
    assert not look_due(10 ** 9, 1, 20, **kw)  # the allowance is spent: no more looks


def test_final_look_judges_any_new_record_but_not_twice():
    kw = dict(looks=20, min_records=20, verdict="ok", final=True)
    assert look_due(21, 20, 1, **kw)
    assert not look_due(20, 20, 1, **kw)


def test_drifting_is_the_last_look():
    assert not look_due(10 ** 6, 20, 1, looks=20, min_records=20, verdict="drifting", final=True)


@pytest.mark.parametrize("verdict,acted,cleared,on_drift,want", [
    ("drifting", None, False, "exclude", "exclude"),
    ("drifting", None, False, "flag", "flag"),
    ("drifting", None, False, "report", "report"),
    ("drifting", "exclude", False, "exclude", None),  # once
    ("drifting", None, True, "exclude", None),  # the user cleared it
    ("ok", None, False, "exclude", None),
    ("insufficient", None, False, "exclude", None),
])
def test_drift_action(verdict, acted, cleared, on_drift, want):
    assert drift_action(verdict, acted, cleared, on_drift) == want


def _row(source, verdict, records, reason="", acted=None, cleared_at=None, figures=None):
    return {"provider": "P", "source": source, "verdict": verdict, "records": records, "tokens": records * 100,
            "reason": reason, "doc": {"figures": figures or {}}, "looks": 1, "acted": acted, "evidence": "/x.json",
            "cleared_at": cleared_at}


def test_phase_two_decides_over_cheap_signals():
    f = combined({"target": _row("target", "drifting", 80, "surprisal high", acted="exclude"),
                  "cheap": _row("cheap", "ok", 300)})
    assert (f["verdict"], f["source"], f["records"], f["acted"], f["cleared"]) == ("drifting", "target", 80, "exclude", False)
    assert f["cheap"]["verdict"] == "ok" and f["target"]["tokens"] == 8000


def test_cheap_signals_decide_while_phase_two_is_insufficient():
    f = combined({"target": _row("target", "insufficient", 5), "cheap": _row("cheap", "drifting", 300, "shorter")})
    assert (f["verdict"], f["source"], f["reason"]) == ("drifting", "cheap", "shorter")


def test_nobody_decided_reads_insufficient():
    f = combined({"target": _row("target", "insufficient", 5, "5 of 20 records")})
    assert (f["verdict"], f["source"], f["records"], f["reason"]) == ("insufficient", None, 5, "5 of 20 records")
    empty = combined({}, records_fallback=7)
    assert (empty["verdict"], empty["records"], empty["reason"]) == ("insufficient", 7, "not judged yet")


def test_cleared_verdict_says_so():
    f = combined({"target": _row("target", "drifting", 80, acted="exclude", cleared_at=1.0)})
    assert f["cleared"] is True and f["verdict"] == "drifting"
