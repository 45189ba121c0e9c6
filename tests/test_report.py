"""``datagen report``: a real run on the simulator (HTTP on 127.0.0.1, usage counted with the
Kimi-layout fixture tokenizer, faults injected), its figures checked against the engine's own
figures (``datagen status --json``, the budgets' estimators, ``datagen validate``), and the HTML
opened in a real browser (headless Chromium: no console error, a non-blank screenshot with the
charts drawn, the status table's numbers equal to ``datagen status --json``)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from datagen.cli import main
from e2e import PY, status_json
from engine.config import load_config
from engine.extract.shards import OutDir
from engine.extract.status import StatusWriter
from engine.metrics.stats import nearest_rank
from engine.money.spend import SpendControl
from engine.report.runreport import gather
from engine.report.series import bin_width, binned_sum, histogram
from engine.storage.store import Store
from fixtures_tokens import kimi_dir
from helpers import SAMPLES, make_config, seeded_store

CHROMIUM = shutil.which("chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--window-size=1200,2000"]


def write_config(tmp: Path) -> Path:
    tok = kimi_dir()
    cfg = tmp / "config.toml"
    cfg.write_text(f"""
[run]
name = "report-test"
dir = "{tmp / 'run'}"
commit_interval_s = 0.1
progress_interval_s = 30
[provider]
kind = "simulated"
[provider.sim]
seed = 11
latency_ms = 5
tokens_per_s = 0
mean_completion_tokens = 60
tokenizer = "{tok}"
faults = "429:0.06,502:0.05"
[spend]
reserve_percentile = 0.8
[classes.short]
max_tokens = 600
concurrency = 16
[tokenizer]
path = "{tok}"
kind = "tiktoken"
executor = "thread"
[[datasets]]
name = "b1_glaive"
path = "{SAMPLES / 'b1_glaive.jsonl'}"
format = "glaive"
[[datasets]]
name = "b7_sharegpt"
path = "{SAMPLES / 'b7_sharegpt.json'}"
format = "sharegpt"
max_prompts = 60
""")
    return cfg


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(config, run dir) of one finished ``datagen run`` (65 prompts, a few seconds; its own process,
    so the run's engine is gone afterwards, as after any real run)."""
    tmp = tmp_path_factory.mktemp("report")
    cfg = write_config(tmp)
    r = datagen("run", str(cfg), "--headless")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return cfg, tmp / "run"


def datagen(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "datagen", *args], capture_output=True, text=True, timeout=120, env=env)


# ------------------------------------------------------------------------------------------ pure parts

def test_series_bins_histogram() -> None:
    assert bin_width(0) == 1 and bin_width(59) == 1 and bin_width(61) == 2 and bin_width(3600) == 60
    assert bin_width(10 * 86400, 5) == 2 * 86400  # past the table: whole days
    # the last event lands in the last bin, events outside the span are clamped: sums are kept
    assert binned_sum([(100.0, 1), (101.5, 2), (103.0, 4), (99.0, 8)], 100.0, 1.0, 3) == [9.0, 2.0, 4.0]
    h = histogram([0, 1, 2, 9, 10], bins=5)
    assert h["counts"] == [2, 1, 0, 0, 2] and h["edges"] == [0, 2, 4, 6, 8, 10]
    assert histogram([]) == {"edges": [], "counts": []}


# ------------------------------------------------------------------------------------------ figures

def test_figures_equal_the_engines_own(run: tuple[Path, Path]) -> None:
    cfg_path, run_dir = run
    figs = gather(run_dir)
    st = figs["status"]
    assert st["run"]["state"] == "completed" and st["totals"]["done"] == 65, st["totals"]
    assert figs["settings"]["source"] == "stored with the run"  # written by `datagen run` at its start
    assert figs["settings"]["spend"]["reserve_percentile"] == 0.8
    assert figs["settings"]["classes"] == {"short": {"max_tokens": 600, "concurrency": 16}}
    base = load_config(cfg_path)
    again = gather(run_dir, base.model_copy(update={"spend": base.spend.model_copy(update={"reserve_percentile": 0.95})}))
    assert again["settings"]["source"] == "--config" and again["lengths"][1]["classes"][0]["percentile"] == 0.95

    tl = figs["timeline"]
    assert sum(tl["completions"]) == st["totals"]["done"]
    assert sum(tl["completion_tokens"]) == st["totals"]["completion_tokens"]
    assert tl["spend_usd_cum"][-1] == pytest.approx(st["totals"]["cost_usd"], abs=1e-9)
    errors = {c: int(sum(v)) for c, v in tl["errors"].items()}
    assert errors == st["totals"]["errors"] and errors.get("rate_limit") and errors.get("server"), errors
    assert len(tl["completions"]) == tl["bins"] and tl["t0"] + tl["bins"] * tl["bin_s"] >= tl["t1"]

    # lengths: the configured percentile of the stored lengths, and the reservation the engine's own
    # budgets hold after seeding from the store exactly as the scheduler does at a restart
    cfg = load_config(cfg_path)
    spend = SpendControl(cfg)

    async def seed() -> None:
        store = await Store.open(run_dir)
        try:
            for d in cfg.datasets:
                spend.seed(d.name, 0, 0, 0.0, await store.recent_completion_tokens(d.name))
        finally:
            await store.close()

    asyncio.run(seed())
    import sqlite3

    conn = sqlite3.connect(run_dir / "store.sqlite")
    by_ds = {d: sorted(k for (k,) in conn.execute("SELECT completion_tokens FROM results WHERE dataset=?", (d,)))
             for d in ("b1_glaive", "b7_sharegpt")}
    conn.close()
    items = {it["dataset"]: it for it in figs["lengths"]}
    assert list(items) == ["b1_glaive", "b7_sharegpt"]
    for name, it in items.items():
        (c,) = it["classes"]
        assert it["n"] == len(by_ds[name]) == next(d["done"] for d in st["datasets"] if d["name"] == name)
        assert sum(it["hist"]["counts"]) == it["n"]
        assert c["percentile_tokens"] == nearest_rank(by_ds[name], 0.8)
        assert c["reservation"]["tokens"] == spend.budgets[name].estimators["short"].expected()
    assert items["b1_glaive"]["classes"][0]["reservation"]["tokens"] == 600  # 5 completions: not calibrated
    b7 = items["b7_sharegpt"]["classes"][0]["reservation"]
    assert b7["calibrated"] and 0.8 < b7["q"] < 0.9 and b7["tokens"] < 600, b7  # p80 raised to its upper bound

    # validation: every record validated, billing exact (the simulator counts with the same tokenizer)
    v = figs["validation"]
    assert v["summary"]["records"] == 65 and v["summary"]["ok"] == 65
    assert v["billing_diffs"] == {"0": v["summary"]["billing"]["rows"]} and v["summary"]["billing"]["rows"] > 0
    assert sum(p["records"] for p in v["summary"]["providers"].values()) == 65
    assert figs["extraction"] is None  # none linked to this run


def test_extraction_progress_from_manifest_and_status(tmp_path: Path) -> None:
    """A linked extraction's progress: committed by the real OutDir (manifest + files), reported by
    the real status writer; the timeline follows the files' commit times."""
    cfg = make_config(tmp_path)

    async def seeded() -> None:
        store = await seeded_store(cfg, {"a": 3, "b": 2})
        await store.close()

    asyncio.run(seeded())
    run_dir = Path(cfg.run.dir)
    out = OutDir(tmp_path / "elsewhere")
    t0 = 1_700_000_000.0
    for i, entries in enumerate([[{"id": "a:1", "length": 10, "dataset": "a"}, {"id": "b:1", "length": 7, "dataset": "b"}],
                                 [{"id": "a:2", "length": 5, "dataset": "a"}]]):
        tmp = out.tmp_path()
        tmp.write_bytes(b"x" * 16)
        name = out.commit(tmp, entries)
        os.utime(out.path / name, (t0 + 60 * i, t0 + 60 * i))
    w = StatusWriter(out.path, 0, 1)
    w.set_totals(4, 30, 0, 0, {"a": {"samples_total": 2, "samples_done": 0, "tokens_total": 15, "tokens_done": 0, "skipped": False}})
    w.add_done(3, 22, 48)
    w.set_state("done")
    (run_dir / "extract.json").write_text(json.dumps({"out_dir": str(out.path)}))  # as `datagen extract` links it

    figs = gather(run_dir)
    ex = figs["extraction"]
    assert ex["out_dir"] == str(out.path) and ex["status"] == figs["status"]["extract"]
    assert ex["status"]["state"] == "done" and ex["status"]["samples_done"] == 3 and ex["status"]["manifest_samples"] == 3
    assert ex["timeline"] == {"t": [t0, t0, t0 + 60], "samples_cum": [1.0, 2.0, 3.0], "tokens_cum": [7.0, 17.0, 22.0]}
    assert ex["datasets"] == {"a": {"samples": 2, "tokens": 15}, "b": {"samples": 1, "tokens": 7}}
    assert figs["timeline"] is None and figs["lengths"] == [] and figs["validation"] is None  # nothing sent yet
    assert figs["settings"]["source"].startswith("defaults") and figs["settings"]["spend"]["reserve_percentile"] == 0.9

    from engine.report.page import render
    from engine.report.plots import all_charts

    charts = all_charts(figs)
    assert charts["extraction"].startswith(b"\x89PNG") and charts["throughput"] is None and charts["lengths"] is None
    html = render(figs, charts)
    assert "No attempt stored yet." in html and "No validation" in html and "Extraction progress" not in html
    assert html.count("data:image/png;base64,") == 1


# ------------------------------------------------------------------------------------------ the command

async def test_report_endpoints_table_equals_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run over two replicas (``[provider] base_urls``, one of them down from the start): the report
    has one row per endpoint, every cell equal to ``datagen status --json``'s ``endpoints``."""
    import socket

    from e2e import write_prompts
    from engine.run.headless import run_headless
    from engine.sim import SimConfig, SimThread
    from helpers import make_config

    sim = SimThread(SimConfig(seed=5, mean_completion_tokens=30, faults={"502": 0.2}, providers=("S",)))
    url = sim.start()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    s.close()
    monkeypatch.setenv("REPORT_KEY", "sim-key")
    cfg = make_config(tmp_path, provider={"kind": "openai", "api_key_env": "REPORT_KEY",
                                          "base_urls": [{"url": url, "concurrency": 3}, dead], "endpoint_probe_s": 30},
                      datasets=[{"name": "a", "path": str(write_prompts(tmp_path / "p.jsonl", 20)), "format": "text"}])
    try:
        assert await run_headless(cfg, io.StringIO(), install_signals=False, metrics=False) == 0
    finally:
        sim.stop()
    r = datagen("report", str(cfg.run.dir), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    status = status_json(cfg.run.dir)
    cells = Cells()
    cells.feed((tmp_path / "out" / "report.html").read_text(encoding="utf-8"))
    paths = check_cells_equal_status(cells, status)
    eps = [p for p in paths if p[0] == "endpoints"]
    assert {p[1] for p in eps} == {url, dead} and len(eps) == 12 * 2
    assert lookup(status, ["endpoints", dead, "state"]) == "down"
    assert lookup(status, ["endpoints", url, "requests"]) >= 20 and lookup(status, ["endpoints", url, "errors"])


def test_report_errors_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["report", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"error: {tmp_path / 'nope'}: no such run directory"], err
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "no run store here" in err, err
    (tmp_path / "file").write_text("x")
    assert main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "file")]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "file"), "--out", str(tmp_path / "o")]) == 2  # a plain file as RUN_DIR
    err = capsys.readouterr().err
    assert err.splitlines() == [f"error: {tmp_path / 'file'}: not a directory (expected a run directory)"], err
    assert not (tmp_path / "o").exists()


def test_matplotlib_is_loaded_by_report_only_and_its_absence_names_the_extra(run: tuple[Path, Path], tmp_path: Path) -> None:
    _, run_dir = run
    code = ("import sys; from datagen.cli import main; rc = main(sys.argv[1:]); "
            "print('MPL', 'matplotlib' in sys.modules); sys.exit(rc)")
    r = subprocess.run([PY, "-c", code, "status", str(run_dir), "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("MPL False"), r.stdout[-200:] + r.stderr
    missing = "import sys; sys.modules['matplotlib'] = None; from datagen.cli import main; sys.exit(main(sys.argv[1:]))"
    r = subprocess.run([PY, "-c", missing, "report", str(run_dir), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: ") and "pip install 'eagle-datagen[report]'" in r.stderr
    assert not (tmp_path / "o" / "report.html").exists()


class Cells(HTMLParser):
    """Every element with ``data-path``: (path, value, text); and every ``img``'s ``src``."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[list[Any]] = []
        self.imgs: list[str] = []
        self._open: list[Any] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a.get("src") or "")
        if "data-path" in a:
            self._open = [json.loads(a["data-path"] or ""), json.loads(a["data-value"] or ""), ""]
            self.cells.append(self._open)

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._open[2] += data

    def handle_endtag(self, tag: str) -> None:
        self._open = None


def lookup(doc: Any, path: list[str]) -> Any:
    """The value at ``path`` in a status document (a list entry by its ``name``, an endpoint by its ``url``)."""
    for k in path:
        doc = next(x for x in doc if x.get("name", x.get("url")) == k) if isinstance(doc, list) else doc[k]
    return doc


def check_cells_equal_status(cells: "Cells", status: dict) -> set[tuple]:
    """Every ``data-path`` cell of the page carries ``datagen status --json``'s value (integers shown
    as that value); returns the paths seen."""
    for path, value, text in cells.cells:
        assert value == lookup(status, path), (path, value)
        if isinstance(value, int) and not isinstance(value, bool):
            assert text == f"{value:,}", (path, text)
    return {tuple(p) for p, _, _ in cells.cells}


def chromium(url: str, shot: Path, profile: Path) -> str:
    """Open ``url`` in headless Chromium, save a screenshot; return its stderr log."""
    r = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}", url],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stderr


def console_errors(log: str) -> list[str]:
    """The page's console messages and uncaught errors in Chromium's log."""
    return [line for line in log.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
def test_console_errors_are_seen(tmp_path: Path) -> None:
    """The browser check can fail: a page with a script error shows in the log it scans."""
    page = tmp_path / "bad.html"
    page.write_text("<html><body><p>x</p><script>notAFunction();</script></body></html>")
    errs = console_errors(chromium(page.as_uri(), tmp_path / "bad.png", tmp_path / "profile"))
    assert any("Uncaught ReferenceError: notAFunction is not defined" in e for e in errs), errs


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
def test_report_in_a_real_browser(run: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from PIL import Image, ImageStat

    _, run_dir = run
    t = time.monotonic()
    r = datagen("report", str(run_dir), "--out", str(tmp_path / "out"))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    page = tmp_path / "out" / "report.html"
    assert r.stdout.startswith(f"{page}: ")
    html = page.read_text(encoding="utf-8")
    status = status_json(run_dir)

    # self-contained: no script, no URL, every image embedded (and each a real PNG)
    text_only = re.sub(r"base64,[A-Za-z0-9+/=]+", "base64,", html)  # base64 may hold "//"
    assert "<script" not in html and not re.search(r"(?:https?:|file:)?//[a-z0-9]", text_only, re.I)
    cells = Cells()
    cells.feed(html)
    assert len(cells.imgs) == 5, len(cells.imgs)  # throughput, lengths, errors, validation, billing
    for src in cells.imgs:
        assert src.startswith("data:image/png;base64,")
        im = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
        assert im.format == "PNG" and im.size[0] == 1100, im.size

    # the status table's numbers are `datagen status --json`'s
    assert len(cells.cells) > 60
    paths = check_cells_equal_status(cells, status)
    assert {("totals", "done"), ("totals", "cost_usd"), ("datasets", "b7_sharegpt", "done"), ("run", "elapsed_s")} <= paths
    assert sum(1 for p in paths if p[0] == "providers") == 6 * len(status["providers"])
    assert "endpoints" not in status and not any(p[0] == "endpoints" for p in paths)  # one server: no table

    # a real browser renders it: no console error, a screenshot with the charts' colours in it
    log = chromium(page.as_uri(), tmp_path / "shot.png", tmp_path / "profile")
    assert console_errors(log) == []
    shot = Image.open(tmp_path / "shot.png").convert("RGB")
    assert shot.size == (1200, 2000)
    assert max(ImageStat.Stat(shot).var) > 1000  # not blank
    colours = shot.getcolors(maxcolors=1 << 20) or []
    blue = sum(n for n, (r_, g, b) in colours if abs(r_ - 31) < 12 and abs(g - 119) < 12 and abs(b - 180) < 12)
    assert blue > 5000, blue  # the throughput bars and length histograms (tab:blue) were drawn
    with capsys.disabled():
        print(f"\nreport {page.stat().st_size:,} bytes; report + status + browser {time.monotonic() - t:.1f}s")
