"""Provider verdicts in the store: looks, drifting kept, clearing (offline ctl), status --json's fidelity."""

from __future__ import annotations

import json

from helpers import make_config, seeded_store

from engine.report.status import collect_status
from engine.run.commands import RunCommand
from engine.run.ctl import send
from engine.storage import offline, verdicts
from engine.storage.handle import connect_ro, connect_rw


async def _run_dir(tmp_path):
    cfg = make_config(tmp_path)
    store = await seeded_store(cfg, {"a": 3})
    await store.close()
    return cfg.run.dir


async def test_looks_counted_drifting_since_kept(tmp_path):
    run_dir = await _run_dir(tmp_path)
    with connect_rw(run_dir) as h:
        assert verdicts.save(h, "P", "target", "insufficient", 5, 400, "5 of 20", {}, 1.0, look=False) is None
        prev = verdicts.save(h, "P", "target", "ok", 20, 2000, "fine", {"figures": {"z": 0.3}}, 2.0)
        assert prev["verdict"] == "insufficient" and prev["looks"] == 0
        verdicts.save(h, "P", "target", "drifting", 30, 3000, "surprisal", {}, 3.0)
        verdicts.set_acted(h, "P", "target", "exclude", "/run/fidelity/P-target.json")
        verdicts.save(h, "P", "target", "drifting", 45, 4500, "surprisal", {}, 4.0)
        (row,) = verdicts.load(h)
        assert (row["looks"], row["drifting_since"], row["acted"], row["records"]) == (3, 3.0, "exclude", 45)
        assert verdicts.drifting_providers(h) == {"P": "target: surprisal"}
        verdicts.save(h, "Q", "cheap", "drifting", 50, 0, "shorter", {}, 4.0)  # reported only: not flagged
        verdicts.set_acted(h, "Q", "cheap", "report", None)
        assert verdicts.drifting_providers(h) == {"P": "target: surprisal"}
        assert verdicts.drifting_names(h) == ["P", "Q"]


async def test_read_only_handle_without_the_table(tmp_path):
    run_dir = await _run_dir(tmp_path)
    with connect_ro(run_dir) as h:
        assert verdicts.load(h) == [] and verdicts.by_provider(h) == {} and verdicts.drifting_names(h) == []


async def test_clear_verdict_offline_includes_the_provider_again(tmp_path):
    run_dir = await _run_dir(tmp_path)
    with connect_rw(run_dir) as h:
        verdicts.save(h, "SimQ", "target", "drifting", 40, 4000, "surprisal +0.04 nats/token", {}, 1.0)
        verdicts.set_acted(h, "SimQ", "target", "exclude", None)
        offline.set_excluded_providers(h, ["SimQ", "Other"])
    refused = send(run_dir, RunCommand.clear_verdict("SimA"))
    assert not refused.ok and "SimQ" in refused.message and "no drifting verdict" in refused.message
    res = send(run_dir, RunCommand.clear_verdict("simq"))  # the one case-insensitive match
    assert res.ok, res.message
    assert "cleared and included again" in res.message
    with connect_ro(run_dir) as h:
        assert verdicts.drifting_providers(h) == {}
        (row,) = verdicts.load(h)
        assert row["cleared_at"] is not None
    doc = collect_status(run_dir)
    assert doc["excluded_providers"] == ["Other"]
    again = send(run_dir, RunCommand.clear_verdict("SimQ"))
    assert not again.ok and "no provider is drifting" in again.message


async def test_status_json_has_each_providers_fidelity(tmp_path):
    run_dir = await _run_dir(tmp_path)
    with connect_rw(run_dir) as h:
        verdicts.save(h, "SimQ", "target", "drifting", 40, 4000, "surprisal high", {"figures": {"z": 6.1}}, 1.0)
        verdicts.set_acted(h, "SimQ", "target", "exclude", "/r/fidelity/SimQ-target.json")
        verdicts.save(h, "SimQ", "cheap", "ok", 60, 0, "", {}, 1.0)
    doc = collect_status(run_dir)
    json.dumps(doc)  # what --json prints
    (p,) = [p for p in doc["providers"] if p["name"] == "SimQ"]
    f = p["fidelity"]
    assert (f["verdict"], f["records"], f["source"], f["acted"]) == ("drifting", 40, "target", "exclude")
    assert f["target"]["figures"] == {"z": 6.1} and f["cheap"]["verdict"] == "ok"
