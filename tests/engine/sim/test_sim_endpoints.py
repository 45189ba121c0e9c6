"""The simulator's OpenRouter endpoints listing (engine.sim.endpoints), the model-backed options (engine.sim.config)
and the behaviour specs (engine.sim.behaviours). No model is loaded here."""

from __future__ import annotations

import argparse
from pathlib import Path

import httpx
import pytest

from engine.sim import SimConfig, SimServer, add_sim_arguments, sim_config_from_args
from engine.sim.behaviours import parse_behaviour, parse_behaviours, quant_targets, serve
from engine.sim.endpoints import QUANTIZATIONS, parse_quantization

AUTH = {"Authorization": "Bearer sk-or-test"}


async def test_endpoints_listing_shape_quantization_and_routing_by_tag() -> None:
    cfg = SimConfig(providers=("SimA", "SimQ", "SimM"), quantization={"SimQ": "fp4", "SimM": "fp8"}, price_in=0.4,
                    price_out=1.9)
    server = SimServer(cfg)
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.base_url, headers=AUTH, timeout=10) as c:
            r = await c.get("/models/moonshotai/kimi-k2.5/endpoints")
            other = await c.get("/models/openai/gpt-4/endpoints")
            pinned = []
            for tag in ("simq/fp4", "SimQ", "simm/fp8"):
                body = {"model": cfg.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20,
                        "provider": {"only": [tag], "allow_fallbacks": False}}
                pinned.append((await c.post("/chat/completions", json=body)).json()["provider"])
            wrong = await c.post("/chat/completions", json={
                "model": cfg.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20,
                "provider": {"only": ["simq/int4"], "allow_fallbacks": False}})
    finally:
        await server.stop()
    assert r.status_code == 200
    data = r.json()["data"]
    assert data["id"] == "moonshotai/kimi-k2.5" and data["architecture"]["modality"] == "text->text"
    eps = data["endpoints"]
    assert [(e["provider_name"], e["tag"], e["quantization"]) for e in eps] == [
        ("SimA", "sima/int4", "int4"), ("SimQ", "simq/fp4", "fp4"), ("SimM", "simm/fp8", "fp8")]
    e = eps[0]
    assert e["name"] == "SimA | moonshotai/kimi-k2.5" and e["status"] == 0 and e["context_length"] == 262144
    assert e["pricing"]["prompt"] == "0.0000004" and e["pricing"]["completion"] == "0.0000019"
    assert {"temperature", "top_p", "max_tokens"} <= set(e["supported_parameters"])
    assert e["max_completion_tokens"] == 65536
    assert other.status_code == 404 and "No endpoints found" in other.text
    assert pinned == ["SimQ", "SimQ", "SimM"]
    assert wrong.status_code == 503  # a tag with another precision names no endpoint


def test_quantization_spec() -> None:
    assert parse_quantization(" SimQ=fp4, SimM=fp8 ,") == {"SimQ": "fp4", "SimM": "fp8"}
    assert parse_quantization("") == {}
    assert "int4" in QUANTIZATIONS and "nvfp4" not in QUANTIZATIONS
    for bad, why in (("SimQ", "PROVIDER=LABEL"), ("SimQ=fp3", "one of"), ("=fp4", "PROVIDER=LABEL")):
        with pytest.raises(ValueError, match=why):
            parse_quantization(bad)
    with pytest.raises(ValueError, match="not one of the providers"):
        SimConfig(providers=("SimA",), quantization={"SimQ": "fp4"})


def test_behaviour_specs() -> None:
    bs = parse_behaviours("SimA=honest, SimQ=quant:0.03,SimT=temp:1.4,SimM=mix:0.3,SimN=mix:0.2/temp:1.5")
    assert {k: str(v) for k, v in bs.items()} == {
        "SimA": "honest", "SimQ": "quant:0.03", "SimT": "temp:1.4", "SimM": "mix:0.3/quant:0.1",
        "SimN": "mix:0.2/temp:1.5"}
    assert quant_targets(bs) == [0.03, 0.1]
    assert serve(bs["SimT"], 0, 1).temp_factor == 1.4 and serve(bs["SimQ"], 0, 1).quant_kl == 0.03
    assert serve(bs["SimA"], 0, 1).label == "honest"
    assert parse_behaviour("mix:0").value == 0.0 and {serve(parse_behaviour("mix:0"), 0, s).label for s in range(50)} == {"honest"}
    for bad, why in (("quant:0", "> 0"), ("temp:-1", "> 0"), ("mix:1.5", r"\[0, 1\]"), ("mix:0.3/mix:0.1", "quant:KL or temp"),
                     ("quant", "expected"), ("drift:1", "expected"), ("quant:x", "not a number")):
        with pytest.raises(ValueError, match=why):
            parse_behaviour(bad)
    for bad, why in (("SimA", "PROVIDER=BEHAVIOUR"), ("SimA=honest,SimA=temp:2", "twice")):
        with pytest.raises(ValueError, match=why):
            parse_behaviours(bad)


def test_cli_options(tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    add_sim_arguments(p)
    kit = tmp_path / "kit"
    (kit / "tokenizer").mkdir(parents=True)
    cfg = sim_config_from_args(p.parse_args([
        "--target", str(kit / "target"), "--behaviours", "SimA=honest,SimB=honest,SimQ=quant:0.03,SimM=mix:0.3",
        "--quantization", "SimQ=fp4", "--model-threads", "3"]))
    assert cfg.providers == ("SimA", "SimB", "SimQ", "SimM")  # the behaviours name the providers
    assert cfg.tokenizer == str(kit / "tokenizer")  # the kit's tokenizer beside its target
    assert cfg.behaviours["SimM"] == "mix:0.3/quant:0.1" and cfg.quantization == {"SimQ": "fp4"}
    assert cfg.model_threads == 3
    plain = sim_config_from_args(p.parse_args([]))
    assert plain.providers == ("SimA", "SimB", "SimC") and plain.target is None and plain.behaviours == {}
    with pytest.raises(ValueError, match="not one of the providers"):
        sim_config_from_args(p.parse_args(["--target", "t", "--tokenizer", "k", "--providers", "SimA",
                                           "--behaviours", "SimQ=quant:0.03"]))
    with pytest.raises(ValueError, match="needs --tokenizer"):
        sim_config_from_args(p.parse_args(["--target", str(tmp_path / "nowhere" / "target")]))
    with pytest.raises(ValueError, match="set --target"):
        SimConfig(providers=("SimA",), behaviours={"SimA": "temp:2"})
