"""Fidelity probes end to end against the simulator as a real HTTP server on 127.0.0.1: every request pinned to
one provider (the sim's log says who served it), the cost line printed before the first request, the batch
kept in the run's store, a provider that drops its tool calls read `below`, and `datagen probe`'s exit status."""

from __future__ import annotations

import collections
import dataclasses
import json
from pathlib import Path
from typing import Any

from helpers import make_config

from engine.client.chat import ChatClient
from engine.client.retry import RetryPolicy
from engine.client.types import ChatRequest, Completion
from engine.fidelity.probeset import listing_prices, probe_targets, project_cost
from engine.run import probes as run_probes_mod
from engine.run.probes import load_probe_set, run_probes
from engine.sim import SimConfig, SimServer
from engine.storage.handle import connect_ro
from engine.storage.probes import batch_results, latest_batch

PROVIDERS = ("SimA", "SimB", "SimC", "SimD")


def log_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(s) for s in path.read_text().splitlines()] if path.exists() else []


class Out:
    """A TextOut that notes, when the cost line is written, how many chat requests the sim had seen."""

    def __init__(self, server: SimServer, log: Path) -> None:
        self.server, self.log, self.text = server, log, ""
        self.at_cost_line: tuple[int, int] | None = None

    def write(self, s: str) -> int:
        if s.startswith("probes: ") and self.at_cost_line is None:
            self.at_cost_line = (self.server.ledger.requests, len(log_lines(self.log)))
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass


def probe_cfg(tmp_path: Path, base_url: str, **probes: Any):
    return make_config(tmp_path, provider={"kind": "openai", "base_url": base_url, "model": "moonshotai/kimi-k2.5"},
                       fidelity={"probes": {"reference": "sima", "max_tokens": 256, **probes}})


async def test_probes_are_pinned_priced_first_and_kept(tmp_path: Path):
    log = tmp_path / "sim.log"
    server = SimServer(SimConfig(seed=5, providers=PROVIDERS, log_path=str(log), mean_completion_tokens=40))
    await server.start()
    try:
        cfg = probe_cfg(tmp_path, server.base_url)
        out = Out(server, log)
        async with ChatClient(server.base_url, "sk-test", trust_env=False) as client:
            report = await run_probes(cfg, client, cfg.run.dir, out)
            listing = await client.get_json("/models/moonshotai/kimi-k2.5/endpoints")
    finally:
        await server.stop()

    # the cost line came first, before any chat request reached the sim
    assert out.at_cost_line == (0, 0)
    first = out.text.splitlines()[0]
    assert first.startswith("probes: 24 x 4 providers = 96 requests, est. $")
    assert first.endswith("at max_tokens); reference SimA, pinned with provider.only + allow_fallbacks false")
    probes = load_probe_set(None)
    targets = probe_targets("sima", endpoints=listing["data"]["endpoints"])
    want = project_cost(probes, targets, 1, 256, listing_prices(listing))
    assert report.projection == want and want.unpriced == () and 0 < want.est_usd < want.max_usd
    assert f"est. ${want.est_usd:.2f} (max ${want.max_usd:.2f}" in first

    # every request was served by the provider it was pinned to: 24 each, none routed elsewhere
    lines = log_lines(log)
    assert len(lines) == 96 and all(x["outcome"] == "completed" for x in lines)
    assert collections.Counter(x["provider"] for x in lines) == {p: 24 for p in PROVIDERS}
    assert [t.slug for t in report.targets] == ["sima", "simb", "simc", "simd"]
    assert all(o.served == o.provider and o.pinned_ok for o in report.outcomes)

    # the simulator's providers are honest (the same seeded generation): F1 1, schema 100%, greedy identical
    v = report.verdicts
    assert list(v) == list(PROVIDERS) and v["SimA"].verdict == "reference"
    calls = v["SimA"].tool_calls
    assert calls > 0 and v["SimA"].schema_accuracy == 1.0
    for p in PROVIDERS[1:]:
        assert (v[p].verdict, v[p].f1, v[p].schema_accuracy, v[p].tool_calls) == ("ok", 1.0, 1.0, calls)
        assert v[p].pairs + v[p].truncated == 24 and v[p].errors == 0 and v[p].misrouted == 0
        assert (v[p].greedy_pairs, v[p].greedy_identical) == (5, 5)
    assert report.ok
    assert report.spent_usd == sum(x["cost_usd"] for x in lines) > 0
    assert out.text.splitlines()[3].split()[:2] == ["SimB", "ok"] and "probes: $" in out.text.splitlines()[-1]

    # kept in the run's store (created by the probes: no run before)
    with connect_ro(cfg.run.dir) as h:
        b = latest_batch(h)
        assert b is not None and b["reference"] == "SimA" and b["requests"] == 96
        assert b["spent_usd"] == report.spent_usd and b["verdicts"]["SimB"]["verdict"] == "ok"
        rows = batch_results(h, b["id"])
    assert len(rows) == 96 and {r["slug"] for r in rows} == {"sima", "simb", "simc", "simd"}
    assert sum(r["called"] for r in rows) == 4 * calls and all(r["error"] is None for r in rows)


class DropsToolCalls:
    """The run's client, except that SimD's answers lose their tool calls (a provider whose parser breaks)."""

    def __init__(self, client: ChatClient) -> None:
        self.client = client

    async def complete(self, req: ChatRequest, progress: Any = None) -> Completion:
        c = await self.client.complete(req)
        if [s.lower() for s in req.body["provider"]["only"]] == ["simd"] and c.tool_calls:
            return dataclasses.replace(c, tool_calls=(), finish_reason="stop")
        return c

    async def get_json(self, path: str, params: Any = None) -> Any:
        return await self.client.get_json(path, params)


async def test_a_provider_below_the_thresholds_and_one_that_cannot_be_reached(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(run_probes_mod, "RETRY", RetryPolicy(max_attempts=1))
    log = tmp_path / "sim.log"
    server = SimServer(SimConfig(seed=5, providers=PROVIDERS, log_path=str(log), mean_completion_tokens=40))
    await server.start()
    try:
        cfg = probe_cfg(tmp_path, server.base_url, providers=["SimA", "SimD", "Nowhere"], min_pairs=4)
        out = Out(server, log)
        async with ChatClient(server.base_url, "sk-test", trust_env=False) as client:
            report = await run_probes(cfg, DropsToolCalls(client), None, out)
    finally:
        await server.stop()
    assert out.at_cost_line == (0, 0) and out.text.startswith("probes: 24 x 3 providers = 72 requests")
    v = report.verdicts
    assert v["SimD"].verdict == "below" and v["SimD"].f1 == 0.0 and v["SimD"].fn > 0 and v["SimD"].tp == 0
    assert v["Nowhere"].verdict == "failed" and v["Nowhere"].errors == 24  # the sim answers 503: no such provider
    assert not report.ok and report.batch is None
    served = collections.Counter(x["provider"] for x in log_lines(log))
    assert served == {"SimA": 24, "SimD": 24, "": 24}  # the unroutable requests were refused, not sent elsewhere


def test_datagen_probe_command_on_the_built_in_simulator(tmp_path: Path, capsys):
    from datagen.cli import main

    (tmp_path / "a.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    (tmp_path / "config.toml").write_text(
        '[run]\nname = "p"\ndir = "run"\n[provider]\nkind = "simulated"\n'
        '[provider.sim]\nproviders = ["SimA", "SimB"]\nmean_completion_tokens = 40\nlog = "sim.log"\n'
        '[[datasets]]\nname = "a"\npath = "a.jsonl"\n'
        '[fidelity.probes]\nreference = "SimB"\nmax_tokens = 256\n')
    assert main(["probe", str(tmp_path / "config.toml")]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].startswith("probes: 24 x 2 providers = 48 requests, est. $") and "reference SimB" in lines[0]
    assert lines[1].split()[:2] == ["provider", "verdict"] and lines[2].split()[:2] == ["SimB", "reference"]
    assert lines[3].split()[:2] == ["SimA", "ok"]
    assert len(log_lines(tmp_path / "sim.log")) == 48
    with connect_ro(tmp_path / "run") as h:
        b = latest_batch(h)
    assert b is not None and b["verdicts"]["SimA"]["f1"] == 1.0
