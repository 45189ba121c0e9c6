"""Provider fidelity in ``datagen report`` and the Prometheus metrics (issue 35).

The report reads the verdicts from a real store (``provider_verdicts`` written by
:mod:`engine.storage.verdicts`, as the run's fidelity watch writes them) and its table carries the same
objects ``datagen status --json`` gives each provider; the metrics come from snapshots whose providers
carry the fidelity object, parsed back with prometheus_client's own parser.
"""

from __future__ import annotations

import asyncio
import json
from html.parser import HTMLParser
from pathlib import Path

from helpers import make_config, seeded_store
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from engine.fidelity.looks import combined
from engine.metrics.stats import ProviderSnapshot
from engine.report.fidelityreport import fidelity_html, rows
from engine.report.metrics import SnapshotCollector, provider_families
from engine.report.runreport import gather
from engine.report.snapshot import RunSnapshot
from engine.storage import verdicts
from engine.storage.handle import connect_rw

DRIFT_REASON = "surprisal +0.041 nats/token over the target's expectation (z=5.3, p=6e-08 < 1e-05)"


class Cells(HTMLParser):
    """The rows of the table ``id=tid``: each cell's text and attributes."""

    def __init__(self, tid: str) -> None:
        super().__init__()
        self.tid, self.inside = tid, False
        self.rows: list[list[dict]] = []
        self.cell: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self.inside = a.get("id") == self.tid
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag in ("td", "th"):
            self.cell = {"text": "", **a}

    def handle_endtag(self, tag):
        if tag == "table":
            self.inside = False
        elif self.inside and tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append(self.cell)
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell["text"] += data


def table(html: str, tid: str) -> list[list[dict]]:
    p = Cells(tid)
    p.feed(html)
    return p.rows


def judged_run(tmp_path: Path) -> Path:
    """A run store with three providers judged: Drifty drifting (phase two, excluded, evidence), Honest ok
    (phase two and cheap), Cleared drifting by cheap signals, flagged then cleared by the user."""
    cfg = make_config(tmp_path)

    async def seeded() -> None:
        store = await seeded_store(cfg, {"a": 2})
        await store.close()

    asyncio.run(seeded())
    run_dir = Path(cfg.run.dir)
    with connect_rw(run_dir) as h:
        verdicts.save(h, "Drifty", "target", "drifting", 120, 40_000, DRIFT_REASON,
                      {"figures": {"mean_surprisal_excess": 0.041}}, 100.0)
        verdicts.set_acted(h, "Drifty", "target", "exclude", str(run_dir / "fidelity" / "Drifty-target.json"))
        verdicts.save(h, "Honest", "target", "ok", 412, 180_345, "no test rejects at p < 1e-05", {}, 100.0)
        verdicts.save(h, "Honest", "cheap", "ok", 300, 0, "no cheap signal differs", {}, 100.0)
        verdicts.save(h, "Cleared", "cheap", "drifting", 90, 0, "completions 41% shorter", {}, 100.0)
        verdicts.set_acted(h, "Cleared", "cheap", "flag", str(run_dir / "fidelity" / "Cleared-cheap.json"))
        assert verdicts.clear(h, "Cleared", 200.0) == 1
        verdicts.save(h, "Young", "target", "insufficient", 12, 300, "12 records / 300 tokens scored; a verdict "
                      "needs 20 records and 2000 tokens", {}, 100.0, look=False)
    return run_dir


def test_report_has_the_provider_fidelity_table(tmp_path: Path) -> None:
    run_dir = judged_run(tmp_path)
    figs = gather(run_dir)
    fid = figs["fidelity"]
    assert sorted(fid) == ["Cleared", "Drifty", "Honest", "Young"]
    assert fid["Drifty"]["verdict"] == "drifting" and fid["Drifty"]["acted"] == "exclude"
    status_fid = {p["name"]: p["fidelity"] for p in figs["status"]["providers"]}
    assert {n: status_fid[n] for n in fid} == fid  # the report's objects are status --json's

    from engine.report.page import render
    from engine.report.plots import all_charts

    html = render(figs, all_charts(figs))
    assert '<h2 id="provider-fidelity">Provider fidelity</h2>' in html
    head, *body = table(html, "fidelity")
    assert [c["text"] for c in head] == ["provider", "verdict", "source", "records", "tokens", "reason", "action",
                                         "evidence file"]
    got = [[c["text"] for c in r] for r in body]
    assert got == [
        ["Drifty", "drifting", "phase two", "120", "40,000", DRIFT_REASON, "excluded",
         str(run_dir / "fidelity" / "Drifty-target.json")],
        ["Cleared", "drifting (cleared)", "cheap signals", "90", "0", "completions 41% shorter", "cleared (was flagged)",
         str(run_dir / "fidelity" / "Cleared-cheap.json")],
        ["Honest", "ok", "phase two", "412", "180,345", "no test rejects at p < 1e-05", "-", "-"],
        ["Young", "insufficient", "-", "12", "300", "12 records / 300 tokens scored; a verdict needs 20 records and "
         "2000 tokens", "-", "-"],
    ]
    verdict_cell = body[0][1]
    assert json.loads(verdict_cell["data-path"]) == ["providers", "Drifty", "fidelity", "verdict"]
    assert json.loads(verdict_cell["data-value"]) == "drifting" and "color:#b00" in verdict_cell["style"]
    assert json.loads(body[2][3]["data-value"]) == status_fid["Honest"]["records"] == 412


def test_report_says_when_no_provider_was_judged(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)

    async def seeded() -> None:
        store = await seeded_store(cfg, {"a": 1})
        await store.close()

    asyncio.run(seeded())
    figs = gather(Path(cfg.run.dir))
    assert figs["fidelity"] == {}  # no provider_verdicts table in this store: nothing judged
    html = fidelity_html(figs["fidelity"])
    assert "No provider judged yet" in html and "<table" not in html
    assert rows({}) == []


def run_snapshot(*providers: ProviderSnapshot) -> RunSnapshot:
    return RunSnapshot(name="r", state="running", state_reason="", elapsed_s=1.0, datasets=(), classes=(),
                       in_flight=0, req_per_s=0.0, cost_usd=0.0, errors={}, credits_usd=None, providers=providers)


def provider(name: str, fidelity: dict | None) -> ProviderSnapshot:
    return ProviderSnapshot(name=name, requests=10, errors={}, error_rate=0.0, latency_p50_s=1.0, latency_p95_s=2.0,
                            ttft_p50_s=0.1, ttft_p95_s=0.2, tok_per_s_per_stream=50.0, mean_completion_tokens=100.0,
                            cost_usd=0.01, excluded=False, fidelity=fidelity)


def scrape(snap: RunSnapshot) -> dict[tuple[str, frozenset], float]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(run=lambda: snap))
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def test_metrics_carry_each_providers_fidelity() -> None:
    def row(verdict: str, records: int, cleared: bool = False) -> dict:
        return {"verdict": verdict, "records": records, "tokens": 0, "reason": "", "looks": 1, "doc": {},
                "acted": "exclude" if verdict == "drifting" else None, "cleared_at": 5.0 if cleared else None,
                "evidence": None}

    snap = run_snapshot(
        provider("Drifty", combined({"target": row("drifting", 120), "cheap": row("ok", 300)})),
        provider("Honest", combined({"target": row("ok", 412)})),
        provider("Cleared", combined({"cheap": row("drifting", 90, cleared=True)})),
        provider("Young", combined({"target": row("insufficient", 12)})),
        provider("Unjudged", None),
    )
    m = scrape(snap)
    drifting = {dict(k[1])["provider"]: v for k, v in m.items() if k[0] == "datagen_provider_fidelity_drifting"}
    assert drifting == {"Drifty": 1.0, "Honest": 0.0, "Cleared": 0.0, "Young": 0.0}  # Unjudged: absent
    records = {(dict(k[1])["provider"], dict(k[1])["source"]): v for k, v in m.items()
               if k[0] == "datagen_provider_fidelity_records"}
    assert records == {("Drifty", "target"): 120, ("Drifty", "cheap"): 300, ("Honest", "target"): 412,
                       ("Cleared", "cheap"): 90, ("Young", "target"): 12}
    # nobody judged: both families are empty (left out of the scrape)
    fams = {f.name: f for f in provider_families(run_snapshot(provider("P", None)))}
    assert fams["datagen_provider_fidelity_drifting"].samples == [] == fams["datagen_provider_fidelity_records"].samples
