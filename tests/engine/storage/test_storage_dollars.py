"""engine.storage owns the database (issue 27): a dataset's dollars have one definition in the store
(engine.storage.dollars), and it agrees with the engine's in-memory one (engine.money.spend.SpendControl)
on a real run's store: every billed attempt counts, failed ones included, a result without a bill as 0.
Status, the spend rate, the report's timeline and a restart's seed all read that one definition."""

from __future__ import annotations

import pytest
from helpers import completion
from scheduling import Fake, build, run_all

from engine.client.types import ErrorClass, RequestError
from engine.report.runreport import timeline
from engine.report.status import StatusError, collect_status, provider_costs
from engine.storage.dollars import Dollars, bills, dataset_dollars, spend_window
from engine.storage.handle import NoStoreError, connect_ro


def _err(cost: float | None, cls: ErrorClass = ErrorClass.SERVER) -> RequestError:
    return RequestError(cls, "upstream 502", status=502, partial_cost_usd=cost)


async def test_the_store_and_the_engine_count_the_same_dollars(tmp_path):
    fake = Fake(script={
        "a prompt 0": [_err(0.02), completion(cost=0.003)],  # a billed failure, then the result
        "a prompt 1": [_err(0.01), _err(None), _err(0.005)],  # failed for good: every bill is lost
        "a prompt 2": [completion(cost=None)],  # a result without a bill counts 0
        "b prompt 0": [_err(0.04, ErrorClass.BAD_REQUEST)],  # failed at once, billed
        "b prompt 1": [completion(cost=0.25, provider="Q")],
    })
    cfg, store, writer, sched = await build(tmp_path, {"a": 5, "b": 3}, fake)
    assert await run_all(sched, writer) == 0
    memory = {d: (sched.spend.dataset_usd[d], sched.spend.lost_usd[d]) for d in ("a", "b")}
    assert memory["a"][1] == pytest.approx(0.035) and memory["b"][1] == pytest.approx(0.04)

    with connect_ro(cfg.run.dir) as h:
        stored = dataset_dollars(h)
        for d, (usd, lost) in memory.items():
            assert stored[d].usd == pytest.approx(usd, abs=1e-12) and stored[d].lost_usd == pytest.approx(lost, abs=1e-12)
        total = sum(v.usd for v in stored.values())
        # the same bills per provider, over time and in a window
        assert sum(provider_costs(h).values()) == pytest.approx(total)
        assert sum(c for _, c in bills(h)) == pytest.approx(total)
        assert spend_window(h, 0.0, 0.0) == pytest.approx((total, total))
        assert timeline(h)["spend_usd_cum"][-1] == pytest.approx(total)
    assert await store.dataset_dollars() == stored  # the engine's async store runs the same query
    assert await store.lost_costs() == {d: v.lost_usd for d, v in stored.items()}
    doc = collect_status(cfg.run.dir)
    for ds in doc["datasets"]:
        assert ds["cost_usd"] == pytest.approx(stored[ds["name"]].usd)
        assert ds["lost_cost_usd"] == pytest.approx(stored[ds["name"]].lost_usd)
    await store.close()

    # a restart seeds its spend from the store: the same dollars as the engine had
    cfg, store, writer, again = await build(tmp_path, {}, Fake())
    for d, (usd, lost) in memory.items():
        assert again.spend.dataset_usd[d] == pytest.approx(usd) and again.spend.lost_usd[d] == pytest.approx(lost)
    await store.close()


def test_dollars_of_a_dataset_never_billed_are_zero():
    assert Dollars() == (0.0, 0.0) and Dollars().usd == 0.0 and Dollars(1.5, 0.25).usd == 1.75


def test_no_store_is_the_status_error(tmp_path):
    """connect_ro moved to engine.storage; a missing store still raises what `datagen status` catches."""
    assert StatusError is NoStoreError
    with pytest.raises(StatusError, match="no run store here"):
        connect_ro(tmp_path)
