"""Which copy of a prompt stored in several datasets is bought (:func:`engine.datasets.overlap.plan`), on rows:
the copy that got furthest (done, then tried, then pending, then dup), the one stored first among equals; copies
tried are never changed; a copy removed from its file or in a dataset not configured is never the one to buy;
another ``max_tokens`` is another request; ``buy_each`` makes every ``dup`` pending again; the lines say so."""

from __future__ import annotations

from engine.datasets.overlap import Copy, overlap_lines, plan


def test_plan_picks_the_copy_that_got_furthest():
    def c(i, ds, state="pending", att=0, req=100, ec=None, of=None):
        return Copy(i, ds, "k", req, state, att, ec, of)

    every = {"a", "b", "c"}
    # done beats tried beats pending beats dup, whatever the order they were stored in
    p = plan([c(1, "a"), c(2, "b", "failed", 6), c(3, "c", "done", 1), c(4, "b", "done", 1, req=7)], "buy_once", every)
    assert p.to_dup == [(1, 3)] and p.to_pending == [] and dict(p.both) == {}  # the failed copy is left as it is
    assert dict(p.pairs) == {("a", "c"): 1}
    p = plan([c(1, "a", "done", 1), c(2, "b", "done", 1), c(3, "c", "failed", 2)], "buy_once", every)
    assert (p.to_dup, dict(p.both), dict(p.pairs)) == ([], {("b", "a"): 1}, {})
    p = plan([c(1, "a", "dup", of=2), c(2, "b", "pending", 2)], "buy_once", every)
    assert (p.to_dup, p.to_pending) == ([], [])
    # a dup whose copy to buy is gone is pending again; one whose owner moved names the new one
    assert plan([c(1, "a", "dup", of=9)], "buy_once", every).to_pending == [1]
    p = plan([c(1, "a", "dup", of=9), c(2, "b", "dup", of=9)], "buy_once", every)
    assert (p.to_pending, p.to_dup) == ([1], [(2, 1)])
    # a copy removed from its file, or in a dataset not configured, is never the one to buy
    p = plan([c(1, "a", "failed", 1, ec="removed"), c(2, "x"), c(3, "b")], "buy_once", every)
    assert p.to_dup == [(2, 3)] and dict(p.both) == {}  # (a tried copy is never changed)
    assert plan([c(1, "x"), c(2, "y")], "buy_once", every).to_dup == []
    # other requests are other prompts
    assert plan([c(1, "a"), c(2, "b", req=200)], "buy_once", every).to_dup == []
    p = plan([c(1, "a", "dup", of=2), c(2, "b")], "buy_each", every)
    assert p.to_pending == [1] and dict(p.pairs) == {("b", "a"): 1}
    assert overlap_lines(p, "buy_each") == {"b": [
        "ingest: 1 prompt(s) of 'b' also in 'a' (bought in each: [run] cross_dataset_duplicates = \"buy_each\"; "
        "\"buy_once\" buys them once)"]}
