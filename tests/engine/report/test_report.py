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
from e2e import PY, status_json
from fixtures_tokens import kimi_dir
from helpers import SAMPLES, make_config, seeded_store

from datagen.cli import main
from engine.config import load_config
from engine.extract.shards import OutDir
from engine.extract.status import StatusWriter
from engine.metrics.stats import nearest_rank
from engine.money.spend import SpendControl
from engine.report.runreport import gather
from engine.report.series import bin_width, binned_sum, histogram
from engine.storage.store import Store

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

def _bars_under_legends(fig: Any) -> list[str]:
    """Bars (``Rectangle`` patches of positive size) whose drawn box meets their axis' legend box."""
    from matplotlib.patches import Rectangle

    fig.canvas.draw()
    hits = []
    for a in fig.axes:
        leg = a.get_legend()
        if leg is None:
            continue
        box = leg.get_window_extent()
        for p in a.patches:
            if isinstance(p, Rectangle) and p.get_width() > 0 and p.get_height() > 0:
                bb = p.get_window_extent()
                if bb.x1 > box.x0 and bb.x0 < box.x1 and bb.y1 > box.y0 and bb.y0 < box.y1:
                    hits.append(f"{a.get_title()[:30]}: bar at x={p.get_x():.0f} h={p.get_height():.0f}")
    return hits


def test_chart_legends_never_cover_bars() -> None:
    """Few completions (the demo's b1_glaive, b8_swe_agent: tall lone bars at the right end) and an
    error burst at the end: every legend sits clear of the bars."""
    from engine.report import plots

    def item(name: str, vals: list[int], classes: list[str]) -> dict:
        res = {"tokens": 10240, "q": None, "calibrated": False, "basis": "max_tokens until 50 completions (5 so far)"}
        return {"dataset": name, "n": len(vals), "mean": sum(vals) / len(vals), "hist": histogram([float(v) for v in vals], 30),
                "classes": [{"class": c, "n": len(vals), "max_tokens": 10240, "percentile": 0.9,
                             "percentile_tokens": max(vals), "reservation": res} for c in classes]}

    items = [item("b1_glaive", [210, 250, 320, 520, 672], ["short"]), item("one", [371], ["short"]),
             item("b8_swe_agent", [50, 240, 400, 660, 1139], ["long", "short"]),
             item("wide", [10 * i for i in range(1, 120)], ["short"])]
    assert _bars_under_legends(plots.lengths_figure(items)) == []
    n = 20
    tl = {"t0": 0.0, "t1": float(n), "bin_s": 1.0, "bins": n,
          "errors": {"server": [0.0] * (n - 3) + [9.0, 9.0, 9.0], "rate_limit": [1.0] * n,
                     "disconnect": [0.0] * (n - 1) + [4.0]}}
    assert _bars_under_legends(plots.errors_figure(tl)) == []
    provs = {f"Provider{i}": {"ok": 90 + i, "records": 100, "invalid": 10 - i, "checks": {}} for i in range(3)}
    val = {"summary": {"providers": provs},
           "invalid_by_first_check": {p: {"completion_ids_mismatch": d["invalid"]} for p, d in provs.items()}}
    assert _bars_under_legends(plots.validation_figure(val)) == []


def test_report_endpoints_table_equals_status(tmp_path: Path) -> None:
    """A run over two replicas (``[provider] base_urls``, one of them down from the start): the report
    has one row per endpoint, every cell equal to ``datagen status --json``'s ``endpoints``."""
    import socket

    from e2e import write_prompts

    from engine.sim import SimConfig, SimThread

    sim = SimThread(SimConfig(seed=5, mean_completion_tokens=30, faults={"502": 0.2}, providers=("S",)))
    url = sim.start()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    s.close()
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"""
[run]
name = "fleet-report"
dir = "{tmp_path / 'run'}"
commit_interval_s = 0.1
[provider]
kind = "openai"
api_key_env = "REPORT_KEY"
base_urls = [{{ url = "{url}", concurrency = 3 }}, "{dead}"]
endpoint_probe_s = 30
[classes.short]
max_tokens = 400
concurrency = 4
[[datasets]]
name = "a"
path = "{write_prompts(tmp_path / 'p.jsonl', 20)}"
format = "text"
""")
    try:
        r = datagen("run", str(cfg), "--headless", env={**os.environ, "REPORT_KEY": "sim-key"})
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    finally:
        sim.stop()
    run_dir = tmp_path / "run"
    r = datagen("report", str(run_dir), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    status = status_json(run_dir)
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
    figures = [p for p in paths if p[0] == "providers" and "fidelity" not in p]
    assert len(figures) == 7 * len(status["providers"])  # PROVIDER_COLS, wire flags included
    judged = [p for p in status["providers"] if p["fidelity"]["source"] is not None or p["fidelity"]["reason"] != "not judged yet"]
    # the provider fidelity table: verdict and records per provider judged, equal to status --json's
    assert len([p for p in paths if p[0] == "providers" and "fidelity" in p]) == 2 * len(judged)
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
