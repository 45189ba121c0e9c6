"""B1's headline row: CPU-s per 1,000 completed requests vs the bare sharded loop, goal <= 1.2x."""

from bench import b1_throughput as b1


def _runs(rps: float, cpu: float, **kw) -> list[dict]:
    return [{"req_per_s": rps, "cpu_s_per_1000": cpu, **kw} for _ in range(2)]


def test_headline_is_cpu_per_1000_vs_sharded_loop() -> None:
    results = {k: _runs(100.0, 10.0) for k in b1.contenders()}
    results["ours"] = _runs(90.0, 11.5, errors=0, main_cpu_share=0.2, workers_cpu_share=0.9)
    rows = b1.rows(results, {k: [0.5, 0.5] for k in results}, reps=2, seconds=6.0)
    head = rows[0]
    assert head["unit"] == "CPU-s/1k req" and "headline" in head["what"]
    assert head["ours"]["median"] == 11.5 and head["baseline"]["median"] == 10.0
    assert abs(head["ratio"]["median"] - 1.15) < 1e-9 and head["met"] is True and head["goal"] == "<= 1.2x"
    assert any("scaling" in r["what"] for r in rows)  # the scaling rows stay
    assert sum(r["unit"] == "CPU-s/1k req" for r in rows) == 3  # headline (sharded), one pool, SDK


def test_headline_not_met_over_goal() -> None:
    results = {k: _runs(100.0, 9.8) for k in b1.contenders()}
    results["ours"] = _runs(90.0, 16.7, errors=0)
    head = b1.rows(results, {k: [0.5, 0.5] for k in results}, reps=2, seconds=6.0)[0]
    assert head["met"] is False and abs(head["ratio"]["median"] - 16.7 / 9.8) < 1e-9
