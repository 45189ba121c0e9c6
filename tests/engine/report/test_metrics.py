"""``[run] metrics_port``: the Prometheus endpoint (engine/report/metrics.py, metricsserver.py).

The families are checked on real snapshots parsed back with prometheus_client's own parser; the
server on a real loopback socket with httpx (404/405, OpenMetrics, a failing source, close with a
keep-alive connection open, a port in use); and ``datagen run --headless`` as a subprocess on a slow
simulator, scraped while it runs and compared with ``datagen status --json`` (equal once paused and
settled), then resumed to its end (the port closes), and interrupted with SIGINT (exit 130, the port
closes).
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from helpers import SAMPLES
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_for

from engine.config import ConfigError, parse_config
from engine.extract.snapshot import DatasetExtractView, ExtractSnapshot, GpuRow, WorkerView
from engine.metrics.stats import ProviderSnapshot
from engine.report.metrics import SnapshotCollector
from engine.report.metricsserver import MetricsError, MetricsServer, open_metrics
from engine.report.snapshot import ClassSnapshot, DatasetSnapshot, RunSnapshot
from engine.report.status import collect_status
from engine.run.ctl import send

PY = sys.executable


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    """``{(sample name, frozenset of label items): value}`` of a text-format scrape."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(m: dict, name: str, **labels: str) -> float:
    """The sample ``name{labels}`` of a parsed scrape (KeyError: not in it)."""
    return m[(name, frozenset(labels.items()))]


def get(m: dict, name: str, **labels: str) -> float | None:
    """The sample ``name{labels}``, None when the scrape has none."""
    return m.get((name, frozenset(labels.items())))


def snapshot(**over) -> RunSnapshot:
    a = DatasetSnapshot(name="a", state="running", state_reason="", prompts=10, rejected=1, done=4, failed=1,
                        skipped=0, pending=3, in_flight=2, prompt_tokens=400, completion_tokens=900,
                        reasoning_tokens=300, cost_usd=0.125, token_budget=5000, errors={"rate_limit": 3, "server": 1},
                        req_per_s=0.5, tok_per_s=40.0, eta_s=12.0, reserved_tokens=2000, projected_cost_usd=0.3)
    b = DatasetSnapshot(name="b", state="paused", state_reason="paused by user", prompts=2, rejected=0, done=0,
                        failed=0, skipped=0, pending=2, in_flight=0, prompt_tokens=0, completion_tokens=0,
                        reasoning_tokens=0, cost_usd=0.0, token_budget=None)
    prov = ProviderSnapshot(name="SimA", requests=7, errors={"rate_limit": 2}, error_rate=2 / 7, latency_p50_s=1.5,
                            latency_p95_s=3.0, ttft_p50_s=0.2, ttft_p95_s=None, tok_per_s_per_stream=55.0,
                            mean_completion_tokens=225.0, cost_usd=0.1, excluded=False)
    kw = dict(name="r", state="running", state_reason="", elapsed_s=33.0, datasets=(a, b),
              classes=(ClassSnapshot("short", 24, 2, 1000, 24, 96),), in_flight=2, req_per_s=0.5, cost_usd=0.125,
              errors={"rate_limit": 3, "server": 1}, credits_usd=None, cost_in_flight_usd=0.02, loop_lag_ms=7.0,
              providers=(prov,), spend_rate_usd_per_h=1.5)
    kw.update(over)
    return RunSnapshot(**kw)  # type: ignore[arg-type]


def render(collector: SnapshotCollector) -> dict:
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return parse(generate_latest(reg).decode())


def test_run_families_carry_the_snapshot_figures() -> None:
    m = render(SnapshotCollector(run=lambda: snapshot()))
    assert value(m, "datagen_spend_usd_total", dataset="a") == 0.125
    assert value(m, "datagen_spend_usd_total", dataset="b") == 0.0
    assert value(m, "datagen_prompt_tokens_total", dataset="a") == 400
    assert value(m, "datagen_completion_tokens_total", dataset="a") == 900
    assert value(m, "datagen_reasoning_tokens_total", dataset="a") == 300
    assert value(m, "datagen_errors_total", dataset="a", **{"class": "rate_limit"}) == 3
    assert value(m, "datagen_errors_total", dataset="a", **{"class": "server"}) == 1
    assert {s: value(m, "datagen_prompts", dataset="a", state=s)
            for s in ("done", "failed", "skipped", "pending", "in_flight")} == {
        "done": 4, "failed": 1, "skipped": 0, "pending": 3, "in_flight": 2}
    assert value(m, "datagen_in_flight", dataset="a") == 2
    assert value(m, "datagen_reserved_tokens", dataset="a") == 2000
    assert value(m, "datagen_reserved_usd") == 0.02
    assert value(m, "datagen_requests_per_second", dataset="a") == 0.5
    assert value(m, "datagen_loop_lag_seconds") == pytest.approx(0.007)
    assert value(m, "datagen_token_budget", dataset="a") == 5000
    assert ("datagen_token_budget", frozenset({("dataset", "b")})) not in m  # no budget: no sample
    assert not any(k[0] == "datagen_credits_usd" for k in m)  # unknown credits are left out, not 0
    assert value(m, "datagen_dataset_info", dataset="b", state="paused") == 1
    assert value(m, "datagen_run_info", run="r", state="running") == 1
    assert value(m, "datagen_class_concurrency", **{"class": "short"}) == 24
    assert value(m, "datagen_provider_requests_total", provider="SimA") == 7
    assert value(m, "datagen_provider_errors_total", provider="SimA", **{"class": "rate_limit"}) == 2
    assert value(m, "datagen_provider_spend_usd_total", provider="SimA") == 0.1
    assert value(m, "datagen_provider_latency_seconds", provider="SimA", quantile="0.95") == 3.0
    assert ("datagen_provider_ttft_seconds", frozenset({("provider", "SimA"), ("quantile", "0.95")})) not in m
    assert value(m, "datagen_spend_rate_usd_per_hour") == 1.5
    m2 = render(SnapshotCollector(run=lambda: snapshot(credits_usd=4.5, credits_age_s=2.0)))
    assert value(m2, "datagen_credits_usd") == 4.5 and value(m2, "datagen_credits_age_seconds") == 2.0


async def test_endpoint_families_carry_the_fleets_figures_and_never_a_password() -> None:
    """A real fleet (a simulator, and a dead port behind a ``user:password@`` url): the scrape's
    per-endpoint series equal the fleet's snapshot (the one ``status --json`` ``endpoints`` is made
    of), with the url masked."""
    import dataclasses

    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from engine.client.chat import ChatClient
    from engine.client.endpoints import HealthPolicy
    from engine.client.fleet import EndpointFleet
    from engine.client.types import ChatRequest
    from engine.sim import SimConfig, SimThread

    sim = SimThread(SimConfig(seed=3, mean_completion_tokens=20, providers=("S",)))
    url = sim.start()
    dead_sock = socket.socket()
    dead_sock.bind(("127.0.0.1", 0))
    port = dead_sock.getsockname()[1]
    dead_sock.close()  # nothing listens there
    dead = f"http://127.0.0.1:{port}/v1"
    fleet = EndpointFleet([(url, 4), (f"http://bob:s3cret-pw@127.0.0.1:{port}/v1", None)],
                          lambda u: ChatClient(u, None if "@" in u else "sim-key", connect_timeout_s=2),
                          policy=HealthPolicy(probe_s=30.0), probe_timeout_s=2)
    try:
        await fleet.start()
        req = ChatRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=32, body={"model": "m"})
        for _ in range(3):
            await fleet.complete(req)
        eps = fleet.snapshot()
    finally:
        await fleet.aclose()
        sim.stop()
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(run=lambda: snapshot(endpoints=eps)))
    text = generate_latest(reg).decode()
    assert "s3cret" not in text and "bob" not in text
    m = parse(text)
    live, down = eps
    assert down.url == f"http://***@127.0.0.1:{port}/v1" and live.requests == 3
    dead = down.url
    assert value(m, "datagen_endpoint_info", endpoint=live.url, state="healthy") == 1
    assert value(m, "datagen_endpoint_info", endpoint=dead, state="down") == 1
    assert (value(m, "datagen_endpoint_up", endpoint=live.url), value(m, "datagen_endpoint_up", endpoint=dead)) == (1, 0)
    assert value(m, "datagen_endpoint_in_flight", endpoint=live.url) == 0
    assert value(m, "datagen_endpoint_concurrency", endpoint=live.url) == 4
    assert get(m, "datagen_endpoint_concurrency", endpoint=dead) is None  # no cap: no sample
    assert value(m, "datagen_endpoint_requests_total", endpoint=live.url) == 3
    assert value(m, "datagen_endpoint_completion_tokens_total", endpoint=live.url) == live.completion_tokens > 0
    assert value(m, "datagen_endpoint_completion_tokens_per_second", endpoint=live.url) == live.tok_per_s > 0
    assert value(m, "datagen_endpoint_latency_seconds", endpoint=live.url, quantile="0.5") == live.latency_p50_s
    assert get(m, "datagen_endpoint_latency_seconds", endpoint=dead, quantile="0.5") is None  # no success yet
    assert value(m, "datagen_endpoint_state_seconds", endpoint=dead) == down.state_for_s
    errs = dataclasses.replace(down, errors={"connect": 2, "disconnect": 1}, requests=3)
    m2 = render(SnapshotCollector(run=lambda: snapshot(endpoints=(errs,))))
    assert value(m2, "datagen_endpoint_errors_total", endpoint=dead, **{"class": "connect"}) == 2
    assert value(m2, "datagen_endpoint_errors_total", endpoint=dead, **{"class": "disconnect"}) == 1
    assert not any(k[0].startswith("datagen_endpoint_") for k in render(SnapshotCollector(run=lambda: snapshot())))


def test_extract_families_and_no_source_yet() -> None:
    ext = ExtractSnapshot(
        state="running", model="/m", elapsed_s=10.0, samples_done=5, samples_total=9, tokens_done=500,
        tokens_total=900, tokens_per_s=50.0, eta_s=8.0, bytes_written=1000, bytes_projected=1800,
        disk_free_bytes=None,
        workers=(WorkerView(rank=0, state="running", samples_done=5, tokens_per_s=50.0, restarts=1),),
        datasets=(DatasetExtractView("a", 5, 9, 500, 900), DatasetExtractView("b", 0, 0, 0, 0, skipped=True)),
        gpus=(GpuRow(index=0, name="H200", util_pct=87.0, mem_used_bytes=10, mem_total_bytes=100, temp_c=None),))
    m = render(SnapshotCollector(run=lambda: None, extract=lambda: ext))
    assert not any(k[0].startswith("datagen_run_") for k in m)  # generation not prepared: nothing of it
    assert value(m, "datagen_extract_info", state="running", model="/m") == 1
    assert value(m, "datagen_extract_samples_done", dataset="a") == 5
    assert value(m, "datagen_extract_samples_planned", dataset="a") == 9
    assert value(m, "datagen_extract_tokens_done", dataset="a") == 500
    assert value(m, "datagen_extract_dataset_skipped", dataset="b") == 1
    assert value(m, "datagen_extract_worker_restarts", worker="0") == 1
    assert value(m, "datagen_extract_worker_info", worker="0", state="running") == 1
    assert value(m, "datagen_gpu_utilization_ratio", gpu="0") == pytest.approx(0.87)
    assert value(m, "datagen_gpu_memory_total_bytes", gpu="0") == 100
    assert not any(k[0] in ("datagen_gpu_temperature_celsius", "datagen_extract_disk_free_bytes") for k in m)


def _port_in_use() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


async def test_server_serves_refuses_and_closes_every_connection() -> None:
    calls = []

    def source():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return snapshot()

    server = MetricsServer("127.0.0.1", 0, SnapshotCollector(run=source))
    await server.start()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=5) as http:
        r = await http.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert value(parse(r.text), "datagen_spend_usd_total", dataset="a") == 0.125
        assert "process_resident_memory_bytes" in r.text  # the process collector rides along
        r = await http.get("/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"})
        assert r.headers["content-type"].startswith("application/openmetrics-text") and r.text.endswith("# EOF\n")
        r = await http.get("/metrics")  # the source fails once: 500, and the endpoint keeps serving
        assert r.status_code == 500 and "boom" in r.text
        assert (await http.get("/metrics")).status_code == 200
        assert (await http.get("/other")).status_code == 404
        assert (await http.post("/metrics")).status_code == 405
        # a keep-alive connection is open now (httpx pools it): close() must end it too
        await asyncio.wait_for(server.close(), 5)
        with pytest.raises(httpx.TransportError):
            await http.get("/metrics")
    with pytest.raises(OSError):  # nothing listens any more
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
    await server.close()  # idempotent


def test_port_in_use_is_a_config_error_and_unset_port_serves_nothing(tmp_path: Path) -> None:
    held, port = _port_in_use()
    try:
        cfg = parse_config({"run": {"metrics_port": port}, "datasets": [{"name": "a", "path": "a.jsonl"}]},
                           tmp_path / "config.toml", check_files=False)
        with pytest.raises(MetricsError, match=rf"run.metrics_port: cannot listen on 127.0.0.1:{port}"):
            open_metrics(cfg.run)
    finally:
        held.close()
    cfg = parse_config({"datasets": [{"name": "a", "path": "a.jsonl"}]}, tmp_path / "config.toml", check_files=False)
    assert cfg.run.metrics_port is None and open_metrics(cfg.run) is None
    with pytest.raises(ConfigError, match="run.metrics_port"):
        parse_config({"run": {"metrics_port": 70000}, "datasets": [{"name": "a", "path": "a.jsonl"}]},
                     tmp_path / "config.toml", check_files=False)


# ---------------------------------------------------------------- datagen run --headless, scraped


def _config(tmp_path: Path, port: int = 0, rows: int = 12) -> Path:
    """Two datasets: the first ``rows`` conversations of the ShareGPT sample and the glaive one; about
    0.7 s a completion on 3 slots, with some 429/502 retries."""
    share = tmp_path / "share.json"
    share.write_text(json.dumps(json.loads((SAMPLES / "b7_sharegpt.json").read_text())[:rows]))
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"""
[run]
name = "prom"
dir = "{tmp_path / 'run'}"
progress_interval_s = 1
commit_interval_s = 0.2
metrics_port = {port}
[provider]
kind = "simulated"
[provider.sim]
seed = 5
latency_ms = 20
tokens_per_s = 60
mean_completion_tokens = 40
faults = "429:0.15,502:0.05"
[classes.short]
max_tokens = 1000
concurrency = 3
[[datasets]]
name = "share"
path = "{share}"
format = "sharegpt"
[[datasets]]
name = "glaive"
path = "{SAMPLES / 'b1_glaive.jsonl'}"
format = "glaive"
""")
    return cfg


class Run:
    """``datagen run CONFIG --headless`` in a subprocess; its stdout drained by a thread."""

    def __init__(self, cfg: Path) -> None:
        self.proc = subprocess.Popen([PY, "-m", "datagen", "run", str(cfg), "--headless"], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()  # type: ignore[arg-type]
        self.url = wait_for(self._url, 30, what="the metrics line")

    def _url(self) -> str | None:
        for line in list(self.lines):
            m = re.match(r"metrics: (http://127\.0\.0\.1:\d+/metrics) \(Prometheus\)", line)
            if m:
                return m.group(1)
        if self.proc.poll() is not None:
            raise AssertionError("".join(self.lines))
        return None

    def scrape(self) -> dict:
        r = httpx.get(self.url, timeout=5)
        assert r.status_code == 200
        return parse(r.text)



def status(run_dir: Path) -> dict:
    r = subprocess.run([PY, "-m", "datagen", "status", str(run_dir), "--json"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def ctl(run_dir: Path, verb: str) -> None:
    """``datagen ctl RUN_DIR VERB`` (in this process: the same call the CLI makes)."""
    r = send(run_dir, verb)
    assert r.ok, r.text


def refused(url: str) -> bool:
    try:
        httpx.get(url, timeout=2)
    except httpx.TransportError:
        return True
    return False


def _settled_equal(m: dict, doc: dict) -> None:
    """Every monotone figure of the scrape equals ``datagen status --json``'s."""
    for d in doc["datasets"]:
        n = d["name"]
        assert value(m, "datagen_completions_total", dataset=n) == d["done"]
        assert value(m, "datagen_prompt_tokens_total", dataset=n) == d["prompt_tokens"]
        assert value(m, "datagen_completion_tokens_total", dataset=n) == d["completion_tokens"]
        assert value(m, "datagen_reasoning_tokens_total", dataset=n) == d["reasoning_tokens"]
        assert value(m, "datagen_spend_usd_total", dataset=n) == pytest.approx(d["cost_usd"], abs=1e-9)
        for s in ("done", "failed", "pending", "in_flight"):
            assert value(m, "datagen_prompts", dataset=n, state=s) == d[s], (n, s)
        got = {dict(k[1])["class"]: v for k, v in m.items()
               if k[0] == "datagen_errors_total" and dict(k[1])["dataset"] == n}
        assert got == d["errors"], n
    assert value(m, "datagen_reserved_usd") == 0.0


@pytest.mark.slow  # issue 27: long e2e test (>9 s on 2 cores), run by `make slow`
def test_headless_run_scraped_matches_status_then_port_closes_at_exit(tmp_path: Path) -> None:
    run = Run(_config(tmp_path))
    run_dir = tmp_path / "run"
    try:
        m = wait_for(lambda: (s := run.scrape()) and any(k[0] == "datagen_completions_total" and v > 0
                                                         for k, v in s.items()) and s, 30, what="a first completion")
        doc = collect_status(run_dir)  # during the run: the store trails the engine, never leads it
        later = run.scrape()
        for d in doc["datasets"]:
            n = d["name"]
            assert sum(value(later, "datagen_prompts", dataset=n, state=s)
                       for s in ("done", "failed", "skipped", "pending", "in_flight")) == d["prompts"]
            assert d["done"] <= value(later, "datagen_completions_total", dataset=n)
            assert d["completion_tokens"] <= value(later, "datagen_completion_tokens_total", dataset=n)
            assert d["cost_usd"] <= value(later, "datagen_spend_usd_total", dataset=n) + 1e-9
        for k, v in m.items():  # counters never go back
            if k[0].endswith("_total") and k[0].startswith("datagen_"):
                assert later.get(k, 0) >= v, k
        ctl(run_dir, "pause")
        m = wait_for(lambda: (s := run.scrape()) and get(s, "datagen_run_info", run="prom", state="paused") == 1
                     and all(v == 0 for k, v in s.items() if k[0] == "datagen_in_flight") and s, 60, what="settled pause")
        # the store gets the last results at the next commit (0.2 s): then both say the same
        wait_for(lambda: (d := collect_status(run_dir)) and all(x["in_flight"] == 0 for x in d["datasets"])
                 and sum(x["done"] for x in d["datasets"]) == sum(
                     v for k, v in m.items() if k[0] == "datagen_completions_total"), 10, what="status settled")
        _settled_equal(run.scrape(), status(run_dir))
        assert value(m, "datagen_completions_total", dataset="share") > 0
        ctl(run_dir, "resume")
        assert run.proc.wait(120) == 0, "".join(run.lines)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    assert refused(run.url)  # gone with the process
    final = status(run_dir)
    assert all(d["done"] + d["failed"] == d["prompts"] for d in final["datasets"])


def test_sigint_drains_exits_130_and_closes_the_port(tmp_path: Path) -> None:
    run = Run(_config(tmp_path))
    try:
        wait_for(lambda: any(k[0] == "datagen_in_flight" and v > 0 for k, v in run.scrape().items()), 30, what="in flight")
        run.proc.send_signal(signal.SIGINT)
        assert run.proc.wait(60) == 130, "".join(run.lines)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    assert refused(run.url)


def test_port_in_use_refuses_the_start_and_leaves_nothing(tmp_path: Path) -> None:
    held, port = _port_in_use()
    try:
        r = subprocess.run([PY, "-m", "datagen", "run", str(_config(tmp_path, port)), "--headless"],
                           capture_output=True, text=True, timeout=60)
    finally:
        held.close()
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"error: run.metrics_port: cannot listen on 127.0.0.1:{port}" in r.stderr
    assert not (tmp_path / "run" / "store.sqlite").exists()


async def test_dashboard_serves_its_snapshots_until_it_exits(tmp_path: Path) -> None:
    from tui.app import DashboardApp
    from tui.testing import FIXED_GPUS, sim_config

    app = DashboardApp(sim_config(tmp_path, metrics_port=0), gpu_source=lambda: FIXED_GPUS, install_signals=False)
    assert app.metrics is not None
    url = app.metrics.url
    async with app.run_test(size=(120, 40)) as pilot, httpx.AsyncClient(timeout=5) as http:
        end = time.monotonic() + 20
        while True:  # served by the app's own loop: the pilot's pauses let it answer
            try:
                m = parse((await http.get(url)).text)
            except httpx.TransportError:
                m = {}
            if any(k[0] == "datagen_in_flight" and v > 0 for k, v in m.items()):
                break
            assert time.monotonic() < end, "no request in flight in the scrapes"
            await pilot.pause(0.1)
        assert app.engine is not None and app.engine.snapshot() is not None  # the endpoint reads the app's engine
        assert get(m, "datagen_run_info", run="tui-test", state="running") == 1
        assert value(m, "datagen_prompts", dataset="sharegpt", state="pending") > 0
    assert refused(url)  # the app's unmount stopped the engine and the endpoint


def test_docs_list_every_metric() -> None:
    from engine.report.metrics import extract_families, run_families

    section = (Path(__file__).resolve().parents[3] / "docs" / "metrics.md").read_text()
    ext = ExtractSnapshot(state="running")
    names = {f.name + ("_total" if f.type == "counter" else "") for f in run_families(snapshot()) + extract_families(ext)}
    assert len(names) > 50
    missing = sorted(n for n in names if f"`{n}`" not in section)
    assert not missing, f"docs/metrics.md does not list {missing}"
