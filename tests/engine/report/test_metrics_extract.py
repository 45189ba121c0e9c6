"""``datagen extract`` with ``[run] metrics_port``: the extraction figures scraped while the tiny
model runs on CPU, equal to the status files (``datagen status``'s extraction document) once paused,
and the port closed when Ctrl-C ends the command; and chained extraction (``[extract] after_run``),
whose one endpoint shows generation and then extraction."""

from __future__ import annotations

import asyncio
import io
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from extract_jobs import chain_config
from test_metrics import get, parse, refused, value
from waiting import wait_for

from engine.extract.control import send
from engine.extract.status import collect
from engine.extract.tiny import synth_records
from engine.run.chain import run_headless_chained
from engine.tokens.records import write_parquet

TINY_VOCAB = 4200  # the shared `tiny` fixture's vocabulary

REPO = Path(__file__).resolve().parents[3]


def test_extract_metrics_follow_the_job_and_the_port_closes(tmp_path: Path, tiny: Path) -> None:
    recs = synth_records(40, 8, 120, seed=3)
    write_parquet(tmp_path / "data" / "a.parquet", recs)
    (tmp_path / "config.toml").write_text(
        f'[run]\ndir = "run"\nmetrics_port = 0\n[[datasets]]\nname = "a"\npath = "a.jsonl"\n'
        f'[extract]\nmodel = "{tiny}"\naux_layers = [0, 1, 2]\nmax_tokens_per_batch = 256\ndisk_margin_gb = 0\n')
    out = tmp_path / "run" / "extract"
    p = subprocess.Popen([sys.executable, "-m", "datagen", "extract", str(tmp_path / "config.toml"), "--data",
                          str(tmp_path / "data"), "--progress-s", "0.5"], cwd=REPO,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True).start()  # type: ignore[arg-type]
    try:
        def url_line() -> str | None:
            assert p.poll() is None, "".join(lines)
            return next((m.group(1) for line in list(lines) if (m := re.match(r"metrics: (http://\S+/metrics)", line))),
                        None)

        url = wait_for(url_line, 30, what="the metrics line")

        def scrape() -> dict:
            return parse(httpx.get(url, timeout=5).text)

        m = wait_for(lambda: (s := scrape()) and any(k[0] == "datagen_extract_info" for k in s) and s, 30, what="a job")
        for ds in ("a", "b"):  # the plan, before any sample (synth_records alternates two datasets)
            mine = [r for r in recs if r.dataset == ds]
            assert value(m, "datagen_extract_samples_planned", dataset=ds) == len(mine) > 0
            assert value(m, "datagen_extract_tokens_planned", dataset=ds) == sum(len(r.input_ids) for r in mine)
        assert send(out, "extract-pause").ok
        m = wait_for(lambda: (s := scrape()) and get(s, "datagen_extract_info", state="paused", model=str(tiny)) == 1
                     and get(s, "datagen_extract_worker_info", worker="0", state="paused") == 1 and s,
                     60, what="paused workers")
        doc = collect(out)  # what `datagen status` shows of the extraction
        assert doc["state"] == "paused"
        assert sum(value(m, "datagen_extract_samples_done", dataset=ds) for ds in "ab") == doc["samples_done"]
        assert sum(value(m, "datagen_extract_tokens_done", dataset=ds) for ds in "ab") == doc["tokens_done"]
        assert value(m, "datagen_extract_written_bytes") == doc["bytes_written"]
        p.send_signal(signal.SIGINT)  # Ctrl-C: the paused workers quit at once, the launcher with them
        assert p.wait(60) == 130, "".join(lines)
    finally:
        if p.poll() is None:
            p.kill()
    assert refused(url)


@pytest.mark.slow  # generation, then a model load and extraction: ~30 s on 2 shared cores
def test_chained_run_serves_generation_then_extraction_on_one_port(tmp_path: Path, tiny: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # 300 ms before each first token (4 slow prompts one at a time): generation runs >= 1.2 s, so the scraper
    # (every 0.2 s, once the metrics line is out) sees it running; instant answers left it to chance under load
    cfg = chain_config(tmp_path, tiny, "run", latency_ms=300)
    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"metrics_port": 0})})
    out = io.StringIO()
    seen: list[dict] = []
    done = threading.Event()

    def scraper() -> None:  # another thread, as Prometheus would be: the server runs on the run's loop
        url = None
        while not done.is_set():
            url = url or next((m.group(1) for m in re.finditer(r"metrics: (http://\S+/metrics)", out.getvalue())), None)
            if url:
                try:
                    seen.append(parse(httpx.get(url, timeout=5).text))
                except httpx.TransportError:
                    pass
            done.wait(0.2)
        seen.append({"url": url})

    t = threading.Thread(target=scraper)
    t.start()
    try:
        code = asyncio.run(run_headless_chained(cfg, out, install_signals=False))
    finally:
        done.set()
        t.join(10)
    assert code == 0, out.getvalue()[-3000:]
    url = seen.pop()["url"]
    assert url and refused(url)
    gen = [m for m in seen if any(k[0] == "datagen_run_info" for k in m)]
    assert gen and all(any(k[0] == "datagen_extract_info" for k in m) for m in gen)  # one endpoint, both sources
    waiting = [m for m in gen if get(m, "datagen_run_info", run="x", state="running")]
    assert waiting and get(waiting[0], "datagen_extract_info", state="not_started", model="") == 1
    extracting = [m for m in seen if any(k[0] == "datagen_extract_samples_planned" for k in m)]
    assert extracting, "no scrape during the extraction"
    last = extracting[-1]
    assert value(last, "datagen_run_info", run="x", state="completed") == 1  # generation's final snapshot stays
    assert value(last, "datagen_extract_samples_planned", dataset="b1") == 5
    assert value(last, "datagen_completions_total", dataset="b1") == 5
