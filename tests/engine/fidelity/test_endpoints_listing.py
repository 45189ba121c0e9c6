"""OpenRouter's endpoints listing reduced for attribution (engine.fidelity.endpoints) and kept (engine.storage.endpoints)."""

from __future__ import annotations

import pytest
from helpers import make_config, seeded_store

from engine.fidelity.endpoints import endpoints_path, parse_endpoints, quantization_by_provider
from engine.storage.endpoints import latest_snapshot, save_snapshot, snapshots
from engine.storage.handle import connect_rw

LISTING = {"data": {"id": "moonshotai/kimi-k2.5", "name": "Kimi K2.5", "endpoints": [
    {"name": "Together | moonshotai/kimi-k2.5", "provider_name": "Together", "tag": "together/fp8", "quantization": "fp8",
     "context_length": 262144, "status": 0, "pricing": {"prompt": "0.0000006"}},
    {"name": "Moonshot AI | moonshotai/kimi-k2.5", "provider_name": "Moonshot AI", "tag": "moonshotai/int4",
     "quantization": "int4", "context_length": 262144, "status": 0},
    {"name": "Together turbo", "provider_name": "Together", "tag": "together/fp4", "quantization": "fp4"},
    "junk",
]}}


def test_path_of_a_model():
    assert endpoints_path("moonshotai/kimi-k2.5") == "/models/moonshotai/kimi-k2.5/endpoints"
    assert endpoints_path("moonshotai/kimi-k2.5:thinking") == "/models/moonshotai/kimi-k2.5/endpoints"
    for bad in ("kimi", "a/b/c", "/x"):
        with pytest.raises(ValueError, match="author/slug"):
            endpoints_path(bad)


def test_parse_keeps_provider_precision_and_tag():
    eps = parse_endpoints(LISTING)
    assert [(e["provider_name"], e["tag"], e["quantization"]) for e in eps] == [
        ("Moonshot AI", "moonshotai/int4", "int4"), ("Together", "together/fp4", "fp4"), ("Together", "together/fp8", "fp8")]
    assert eps[1]["context_length"] is None and "pricing" not in eps[0]
    assert quantization_by_provider(eps) == {"Moonshot AI": "int4", "Together": "fp4/fp8"}
    assert parse_endpoints({"error": {"code": 404}}) == [] and parse_endpoints([1]) == []


async def test_snapshots_kept_only_when_they_change(tmp_path):
    cfg = make_config(tmp_path)
    await (await seeded_store(cfg, {"a": 1})).close()
    eps = parse_endpoints(LISTING)
    with connect_rw(cfg.run.dir) as h:
        assert latest_snapshot(h) == []
        assert save_snapshot(h, eps, 1.0) is True
        assert save_snapshot(h, eps, 2.0) is False
        changed = [dict(e, quantization="fp4") if e["provider_name"] == "Moonshot AI" else e for e in eps]
        assert save_snapshot(h, changed, 3.0) is True
        assert [t for t, _ in snapshots(h)] == [1.0, 3.0]
        assert quantization_by_provider(latest_snapshot(h))["Moonshot AI"] == "fp4"
