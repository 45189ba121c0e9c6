"""The abort estimate learns each provider's billing of dropped streams (issue 11, section 6).

Field report: the quit dialog said "$1.57" for 2,000 in-flight streams whose abort then cost ~$4.5
(providers that keep generating bill dropped streams in full). The estimate now comes from the
``/generation`` true-ups of streams this engine aborted, per provider: a provider that stops
billing at the disconnect (the simulator's "cancellable" providers) is estimated at what was
generated, one that keeps generating at the whole expected completion. Real parts: the project's
simulator (in-process HTTP server on loopback) with one cancellable and one non-cancellable
provider, the real store, the real true-ups.
"""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3

import pytest

from engine.config import parse_config
from engine.money.inflight import AbortBilling, InFlightCost, abort_basis
from engine.report.status import collect_status
from engine.run.headless import run_headless

# Real-time billing by the simulator (true-ups within the exit wait): run alone, not beside a parallel worker.
pytestmark = pytest.mark.serial


# ---- pure ------------------------------------------------------------------------------------
def test_abort_billing_share_per_provider_pooled_and_prior():
    b = AbortBilling(min_observations=2)
    b.note("g1", "SimA", InFlightCost(1, 0.10, 0.50))
    b.note("g2", "SimA", InFlightCost(1, 0.20, 0.60))
    assert b.share_for("SimA") is None  # noted, not billed yet
    assert b.billed("g1", 0.10) and b.billed("g2", 0.22)
    assert not b.billed("g1", 0.10) and not b.billed("unknown", 1.0)  # each bill counts once
    # (0.32 - 0.30) / (1.10 - 0.30) = 0.025
    assert b.share_for("SimA") == pytest.approx(0.025)
    b.add("SimC", 0.10, 0.50, 0.55)
    assert b.share_for("SimC") is None  # one observation < 2
    b.add("SimC", 0.10, 0.50, 0.45)
    assert b.share_for("SimC") == pytest.approx((1.00 - 0.20) / (1.00 - 0.20))
    # provider not known yet: pooled over every provider: (1.32 - 0.50) / (2.10 - 0.50)
    assert b.share_for("") == pytest.approx(0.82 / 1.60)
    assert b.share_for("SimB") is None
    b.add("SimX", 0.1, 0.2, 5.0)
    b.add("SimX", 0.1, 0.2, 5.0)
    assert b.share_for("SimX") == 3.0  # capped
    assert b.observations()["SimA"] == (2, pytest.approx(0.025))


def test_abort_billing_from_earlier_processes_counts_streams_billed_beyond_what_they_generated():
    b = AbortBilling(min_observations=3)
    for generated, billed in ((0.010, 0.010), (0.010, 0.0124), (0.010, 0.030), (0.002, 0.020)):
        b.add_earlier("SimC", generated, billed)  # kept billing: > 1.25 x generated (2 of 4)
    assert b.share_for("SimC") == pytest.approx(0.5)
    assert b.share_for("") == pytest.approx(0.5)  # pooled
    for _ in range(3):
        b.add("SimC", 0.01, 0.03, 0.03)  # this process's own aborts take over once there are enough
    assert b.share_for("SimC") == pytest.approx(1.0)
    b.add_earlier("SimA", 0.01, 0.01)
    assert b.share_for("SimA") is None  # 1 < 3


def test_abort_basis_says_estimate_and_its_source():
    b = AbortBilling(min_observations=1)
    assert abort_basis(InFlightCost(3, 0.1, 0.5, 0.5, 0), b) == \
        "assumes dropped streams are billed in full: no aborted stream billed yet"
    b.add("SimA", 0.1, 0.5, 0.1)
    b.add("SimC", 0.1, 0.5, 0.5)
    assert abort_basis(InFlightCost(3, 0.1, 0.5, 0.3, 2), b) == (
        "from the billing of 2 aborted stream(s): SimA 0%, SimC 100% of the rest billed; "
        "1 stream(s) assumed billed in full")


def test_quit_and_abort_dialog_texts_label_the_abort_estimate():
    from tui.modals import abort_body, quit_body
    from tui.testing import fixed_snapshot

    snap = fixed_snapshot()
    import dataclasses

    snap = dataclasses.replace(snap, in_flight=2000, cost_in_flight_usd=4.61, abort_cost_usd=4.52,
                               abort_cost_basis="from the billing of 40 aborted stream(s): SimC 98% of the rest billed")
    q = quit_body(snap)
    assert q.splitlines()[:2] == [
        "2,000 requests in flight (est. $4.61 when they finish).",
        "Abort now: est. $4.52 billed (from the billing of 40 aborted stream(s): SimC 98% of the rest billed)."]
    assert abort_body(snap).splitlines()[1] == q.splitlines()[1]


# ---- the real thing ------------------------------------------------------------------------
def _cfg(tmp_path, providers, cancellable):
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"Question {i}: explain topic {i * 7919 % 1000}."}) + "\n"
                         for i in range(600)))
    return parse_config({
        "run": {"name": "abortest", "dir": str(tmp_path / "run"), "commit_interval_s": 0.1, "progress_interval_s": 1},
        "provider": {"kind": "simulated", "timeouts": {"stall_s": 30},
                     "sim": {"seed": 5, "mean_completion_tokens": 1500, "tokens_per_s": 500, "latency_ms": 20,
                             "providers": providers, "cancellable": cancellable, "faults": ""}},
        "classes": {"short": {"max_tokens": 6000, "concurrency": 60}},
        "spend": {"anomaly_error_rate": 0},
        "datasets": [{"name": "a", "path": str(p), "format": "text"}],
    }, tmp_path / "config.toml")


@pytest.mark.parametrize("providers,cancellable", [(["SimA", "SimC"], ["SimA"]), (["SimC"], [])],
                         ids=["mixed", "keeps-generating"])
async def test_abort_estimate_follows_each_providers_observed_billing(tmp_path, providers, cancellable):
    """Before: the only figure was the in-flight cost if billed in full (expected_usd), whatever the
    provider; with a cancellable provider among them it over-states the bill by far (measured below)."""
    holder: dict = {}

    def ready(job):
        async def go():
            s = job.scheduler
            while not s.datasets or s.snapshot().dataset("a").done < 40:
                await asyncio.sleep(0.05)
            n = s.ending.abort()  # teach: these streams' bills land through /generation
            for _ in range(400):
                if sum(k for k, _s in s.spend.aborts.observations().values()) >= 0.8 * n:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # new streams under way
            holder["obs"] = s.spend.aborts.observations()
            holder["status"] = collect_status(tmp_path / "run")  # `datagen status --json`'s document, live
            snap = s.snapshot()
            holder["cost"] = s.ending.in_flight_cost()
            holder["basis"] = snap.abort_cost_basis
            holder["snap_abort"] = snap.abort_cost_usd
            db = sqlite3.connect(tmp_path / "run" / "store.sqlite")
            holder["first_max_id"] = db.execute("SELECT COALESCE(MAX(id), 0) FROM attempts").fetchone()[0]
            db.close()
            holder["billed0"] = job.sim.ledger.billed_usd  # no await since the estimate: nothing moved
            holder["job"] = job
            s.ending.stop("test abort", abort=True)

        holder["t"] = asyncio.get_running_loop().create_task(go())

    code = await run_headless(_cfg(tmp_path, providers, cancellable), io.StringIO(), install_signals=False, on_ready=ready)
    assert code in (0, 130)
    db = sqlite3.connect(tmp_path / "run" / "store.sqlite")
    rows = db.execute("SELECT provider, cost_usd FROM attempts WHERE outcome = 'aborted' AND id > ?",
                      (holder["first_max_id"],)).fetchall()
    billed = holder["job"].sim.ledger.billed_usd - holder["billed0"]  # what the provider billed for the abort
    c: InFlightCost = holder["cost"]
    obs = holder["obs"]
    print(f"\nobserved shares {obs}; {c.streams} streams: generated ${c.generated_usd:.4f}, if billed in full "
          f"${c.expected_usd:.4f}, est. abort ${c.abort_usd:.4f}; billed ${billed:.4f} ({len(rows)} aborted)\n"
          f"basis: {holder['basis']}")
    if "SimA" in providers:
        # stops billing at the disconnect: what it bills beyond what we read is what it had generated
        # and sent but the client had not read yet (socket buffers, the workers' 100 ms progress batches):
        # measured 0.21 here at 500 tokens/s per stream, once tokens are counted at the run's own
        # characters per token (at characters / 4, 1.4x the count, it read 0)
        assert obs["SimA"][1] is not None and obs["SimA"][1] <= 0.35
    assert obs["SimC"][1] is not None and obs["SimC"][1] >= 0.6  # keeps billing: the rest, in full
    assert holder["basis"].startswith("from the billing of ")
    st = holder["status"]
    assert st["abort_cost_basis"].startswith("from the billing of ")
    assert st["abort_cost_usd"] == pytest.approx(c.abort_usd, rel=0.5)  # the live row, up to a second old
    assert c.abort_observed >= 0.8 * c.streams
    assert len(rows) >= 20 and sum(cost is not None for _p, cost in rows) >= 0.8 * len(rows)  # bills landed
    assert abs(c.abort_usd - billed) <= 0.25 * billed, (c.abort_usd, billed)  # stated tolerance: 25%
    assert c.generated_usd < billed  # what was generated under-states the bill
    if "SimA" in providers:
        # the old figure (billed in full) over-states this mix: 1.17x measured (1.3x+ while tokens were
        # counted as characters / 4, which over-counted what every stream had streamed)
        assert c.expected_usd > 1.1 * billed


async def test_abort_estimate_after_a_restart_uses_the_earlier_processes_bills(tmp_path):
    """The bills of aborted streams are in the store (attempts ``aborted`` with their true-up cost): a
    restarted engine's first abort estimate already follows them instead of assuming billed in full."""
    cfg = _cfg(tmp_path, ["SimA", "SimC"], ["SimA"])
    first: dict = {}

    def teach(job):
        async def go():
            s = job.scheduler
            while not s.datasets or s.snapshot().dataset("a").done < 40:
                await asyncio.sleep(0.05)
            first["n"] = s.ending.in_flight_cost().streams
            s.ending.stop("teach", abort=True)  # the run waits for the true-ups before it exits

        first["t"] = asyncio.get_running_loop().create_task(go())

    await run_headless(cfg, io.StringIO(), install_signals=False, on_ready=teach)
    db = sqlite3.connect(tmp_path / "run" / "store.sqlite")
    (billed_rows,) = db.execute("SELECT COUNT(*) FROM attempts WHERE outcome = 'aborted' AND cost_usd IS NOT NULL "
                                "AND generation_id IS NOT NULL").fetchone()
    db.close()
    assert billed_rows >= 0.8 * first["n"] >= 20
    second: dict = {}

    def measure(job):
        async def go():
            s = job.scheduler
            while not s.datasets or s.snapshot().dataset("a").in_flight < 40:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.5)
            second["cost"] = s.ending.in_flight_cost()
            second["basis"] = s.snapshot().abort_cost_basis
            second["obs"] = s.spend.aborts.observations()
            second["billed0"] = job.sim.ledger.billed_usd
            second["job"] = job
            s.ending.stop("measure", abort=True)

        second["t"] = asyncio.get_running_loop().create_task(go())

    await run_headless(cfg, io.StringIO(), install_signals=False, on_ready=measure)
    c: InFlightCost = second["cost"]
    billed = second["job"].sim.ledger.billed_usd - second["billed0"]
    print(f"\nrestarted: {billed_rows} earlier bills, shares {second['obs']}; est. abort ${c.abort_usd:.4f} "
          f"(in full ${c.expected_usd:.4f}) billed ${billed:.4f}\nbasis: {second['basis']}")
    assert second["basis"].startswith("from the billing of ")
    # SimA stops billing at the disconnect; beyond what was read it bills what sat in socket buffers and the
    # workers' 100 ms progress batches: 0.0 alone, 0.15 once under load; the bound of the first test holds
    assert second["obs"]["SimA"][1] <= 0.35
    # After a restart the shares come from the stored bills alone (no "in full" figure was stored), a
    # coarser basis: measured -5..+29% over the bill in 7 runs here, +41% once in CI (which provider the
    # ~40 streams in flight happened to be on). What it must do: follow the bills, at least halving the
    # error of the old "billed in full" figure (+80..+130% on this mix).
    assert abs(c.abort_usd - billed) <= 0.5 * billed, (c.abort_usd, billed)
    assert abs(c.abort_usd - billed) <= 0.5 * abs(c.expected_usd - billed), (c.abort_usd, c.expected_usd, billed)
    assert c.expected_usd > 1.3 * billed
