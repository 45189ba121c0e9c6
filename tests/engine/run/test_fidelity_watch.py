"""Judging a run's providers from stored phase-two scores (engine.run.fidelity): verdicts saved, a drift acted on
once with its evidence file, looks spent geometrically, the live watch excludes and says so once."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import numpy as np
from helpers import make_config, seeded_store

from engine.config.fidelity import FidelitySection
from engine.run.fidelity import FidelityWatch, judge_run
from engine.storage import verdicts
from engine.storage.fidelity import ScoreRow, open_scores, save_scores
from engine.storage.handle import connect_ro

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fidelity"))
from fidelity_world import World

CFG = FidelitySection(cheap_signals=False)


def _store_scores(run_dir, world, rng, who: dict[str, tuple[int, str | None]], start: int = 0) -> None:
    rows = []
    for prov, (n, drift) in who.items():
        sampler = world.drift(drift) if drift else None
        drifted = np.ones(n, dtype=bool) if drift else None
        for i, sc in enumerate(world.records(n, rng, drifted, sampler)):
            rows.append(ScoreRow(f"d:{prov}-{start + i}", "d", prov, 1.0, 0.95, sc))
    h = open_scores(run_dir)
    try:
        save_scores(h, rows)
    finally:
        h.close()


async def _run_dir(tmp_path):
    cfg = make_config(tmp_path)
    await (await seeded_store(cfg, {"a": 1})).close()
    return cfg.run.dir


async def test_a_drifting_provider_is_judged_and_acted_on_once(tmp_path):
    run_dir = await _run_dir(tmp_path)
    world, rng = World(seed=3), np.random.default_rng(5)
    _store_scores(run_dir, world, rng, {"SimA": (60, None), "SimB": (60, None), "SimT": (60, "temp")})
    drifts = judge_run(run_dir, CFG, now=100.0)
    assert [(d.provider, d.source, d.action, d.records) for d in drifts] == [("SimT", "target", "exclude", 60)]
    assert "provider SimT is drifting (phase two, 60 records)" in drifts[0].line()
    evidence = json.loads((run_dir / "fidelity" / "SimT-target.json").read_text())
    assert evidence["provider"] == "SimT" and len(evidence["records"]) == 60
    assert evidence["records"][0]["sample_id"] == "d:SimT-0" and evidence["verdict"]["verdict"] == "drifting"
    with connect_ro(run_dir) as h:
        fid = verdicts.by_provider(h)
        assert {p: f["verdict"] for p, f in fid.items()} == {"SimA": "ok", "SimB": "ok", "SimT": "drifting"}
        assert fid["SimT"]["evidence"].endswith("SimT-target.json") and fid["SimT"]["acted"] == "exclude"
    # more records: SimT's verdict is final, the honest ones are not judged again before 1.5x their records
    _store_scores(run_dir, world, rng, {"SimA": (20, None), "SimT": (40, "temp")}, start=1000)
    assert judge_run(run_dir, CFG, now=200.0) == []
    with connect_ro(run_dir) as h:
        rows = {r["provider"]: r for r in verdicts.load(h)}
    assert (rows["SimA"]["looks"], rows["SimA"]["records"]) == (1, 60)  # 80 < 90: not due
    assert (rows["SimT"]["looks"], rows["SimT"]["records"]) == (1, 60)
    assert judge_run(run_dir, CFG, now=300.0, final=True) == []  # the run's last look: 80 > 60 is judged
    with connect_ro(run_dir) as h:
        rows = {r["provider"]: r for r in verdicts.load(h)}
    assert (rows["SimA"]["looks"], rows["SimA"]["records"], rows["SimA"]["verdict"]) == (2, 80, "ok")


async def test_too_few_records_read_insufficient_and_spend_no_look(tmp_path):
    run_dir = await _run_dir(tmp_path)
    world, rng = World(seed=4), np.random.default_rng(6)
    _store_scores(run_dir, world, rng, {"SimA": (5, None), "SimT": (5, "temp")})
    assert judge_run(run_dir, CFG, now=1.0) == []
    with connect_ro(run_dir) as h:
        rows = {r["provider"]: r for r in verdicts.load(h)}
    assert {p: (r["verdict"], r["looks"], r["records"]) for p, r in rows.items()} == {
        "SimA": ("insufficient", 0, 5), "SimT": ("insufficient", 0, 5)}


async def test_the_live_watch_excludes_once_and_publishes(tmp_path):
    run_dir = await _run_dir(tmp_path)
    world, rng = World(seed=3), np.random.default_rng(7)
    _store_scores(run_dir, world, rng, {"SimA": (60, None), "SimQ": (60, "temp")})
    excluded, events, published = [], [], []

    async def exclude(name: str) -> str:
        excluded.append(name)
        return f"provider {name} excluded"

    watch = FidelityWatch(run_dir, CFG, exclude, lambda *e: events.append(e), publish=published.append)
    assert [d.provider for d in await watch.look()] == ["SimQ"]
    assert [d.provider for d in await watch.look()] == []
    assert excluded == ["SimQ"] and len(events) == 1
    level, kind, dataset, line = events[0]
    assert (level, kind, dataset) == ("warning", "fidelity", None) and "excluded from buying" in line
    assert published[-1]["SimQ"]["verdict"] == "drifting" and published[-1]["SimA"]["verdict"] == "ok"


async def test_a_look_that_fails_is_logged_and_buying_goes_on(tmp_path, caplog):
    watch = FidelityWatch(tmp_path / "nowhere", CFG, lambda n: asyncio.sleep(0, "x"), lambda *e: None)
    assert await watch.look() == []
    assert "could not be judged" in caplog.text


async def test_after_datagen_extract_the_drift_is_saved_for_the_next_run(tmp_path):
    from engine.run.fidelity import judge_offline
    from engine.storage import read

    run_dir = await _run_dir(tmp_path)
    world, rng = World(seed=3), np.random.default_rng(8)
    _store_scores(run_dir, world, rng, {"SimA": (60, None), "SimT": (60, "temp")})
    lines: list[str] = []
    assert [d.provider for d in judge_offline(run_dir, CFG, lines.append)] == ["SimT"]
    assert lines[0] == "fidelity: SimA ok (phase two, 60 records)"
    assert lines[1].startswith("fidelity: SimT drifting (phase two, 60 records): surprisal")
    assert "excluded from buying" in lines[2]
    with connect_ro(run_dir) as h:
        assert read.excluded_providers(h) == ["SimT"]  # the next `datagen run` routes around it
    assert judge_offline(run_dir, CFG, lines.append) == []  # once


async def test_a_look_reads_the_records_only_when_one_is_due(tmp_path, monkeypatch):
    import engine.storage.fidelity as sf

    run_dir = await _run_dir(tmp_path)
    world, rng = World(seed=3), np.random.default_rng(9)
    _store_scores(run_dir, world, rng, {"SimA": (5000, None), "SimB": (300, None)})  # past REFRESH_BELOW
    reads = []
    real = sf.load_scores
    monkeypatch.setattr(sf, "load_scores", lambda h, *a: reads.append(1) or real(h, *a))
    assert judge_run(run_dir, CFG, now=1.0) == [] and len(reads) == 1  # first looks
    assert judge_run(run_dir, CFG, now=2.0) == [] and len(reads) == 1  # nothing grew: nothing read
    _store_scores(run_dir, world, rng, {"SimB": (160, None)}, start=10_000)  # 460 >= 1.5 x 300: SimB is due
    assert judge_run(run_dir, CFG, now=3.0) == [] and len(reads) == 2


async def test_status_shows_the_phase_two_figures_per_dataset(tmp_path):
    from engine.report.status import collect_status

    run_dir = await _run_dir(tmp_path)
    world, rng = World(seed=3), np.random.default_rng(12)
    _store_scores(run_dir, world, rng, {"SimA": (60, None), "SimT": (60, "temp")})
    doc = collect_status(run_dir)
    by = doc["fidelity_by_dataset"]["d"]
    assert by["SimA"]["records"] == by["SimT"]["records"] == 60
    assert abs(by["SimA"]["surprisal_z"]) < 4 and by["SimT"]["surprisal_z"] > 10
    assert by["SimT"]["surprisal_excess"] > 0.3 and by["SimA"]["outside_share"] == 0.0


def test_a_provider_judged_before_a_restart_stays_on_the_dashboard():
    from engine.metrics.stats import ProviderSnapshot
    from engine.run.observe import with_judged

    live = ProviderSnapshot(name="SimA", requests=3, errors={}, error_rate=0.0, latency_p50_s=1.0, latency_p95_s=1.0,
                            ttft_p50_s=None, ttft_p95_s=None, tok_per_s_per_stream=None, mean_completion_tokens=10.0,
                            cost_usd=0.01, excluded=False)
    fid = {"SimA": {"verdict": "ok"}, "SimQ": {"verdict": "drifting"}}
    got = with_judged((live,), fid, {"SimQ"})
    assert [(p.name, p.requests, p.excluded, p.fidelity) for p in got] == [
        ("SimA", 3, False, {"verdict": "ok"}), ("SimQ", 0, True, {"verdict": "drifting"})]
