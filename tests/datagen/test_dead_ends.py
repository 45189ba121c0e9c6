"""Dead ends a new user met, each through the real command line (``python -m datagen ...``):

- an unreachable endpoint (a closed port) failed every prompt for good (``connect``) and the run
  "completed" with exit 0: it now pauses the run (``cannot reach URL``), fails nothing, exits 3 with
  ``--exit-on-pause``, stays paused headless without it, and completes after ``ctl resume`` once the
  server is up; a down replica among several ``base_urls`` is still only taken out of rotation;
- a dataset whose every row is rejected (a wrong ``format``) "completed" with exit 0 and a rerun
  printed nothing: it now stops the run before any request, exit 1, on every run;
- ``datagen sim --port P`` on a busy port printed a traceback: now one line, exit 1;
- a restarted run sent requests for a second before the calibration gate paused the dataset again:
  the gate is now decided from the stored results before the first dispatch;
- a chained extraction quit while paused said only ``exit code 0``: it now says how many samples
  are left (``extraction incomplete: N samples left (rerun to resume)``).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from casesrv import CaseServer, case_config, cli, ok_reply, prompts, run_case, states, status, status_when_there
from waiting import wait_for

TINY_VOCAB = 4200  # the shared `tiny` fixture's vocabulary

PY = sys.executable


def closed_port() -> int:
    """A loopback port nothing listens on (bound, read, closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---- an unreachable endpoint ------------------------------------------------------------------
def test_connect_is_run_wide_only_when_no_endpoint_is_left():
    from engine.run.runwide import condition_of

    msg = "cannot connect (ConnectError: All connection attempts failed)"
    cond = condition_of("connect", 0, msg, where="http://127.0.0.1:9/v1")
    assert cond is not None and cond.kind == "connect"
    assert cond.reason == f"cannot reach http://127.0.0.1:9/v1 (connect): {msg}"
    assert condition_of("connect", 0, msg, endpoint_fault=True) is None  # one replica: out of rotation only
    assert condition_of("connect", 0, "cannot connect (PoolTimeout: )") is None  # our own pool, not the server
    assert condition_of("disconnect", 0, "connection lost while streaming") is None


def test_unreachable_endpoint_pauses_the_run_exits_3_and_fails_nothing(tmp_path):
    port = closed_port()
    url = f"http://127.0.0.1:{port}/v1"
    cfg = case_config(tmp_path, url, prompts(12))
    r = run_case(cfg, "--exit-on-pause", timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 3, out
    assert f"cannot reach {url} (connect): cannot connect" in out
    assert "run completed" not in out
    assert states(tmp_path / "run") == {"pending": 12}  # not one failed for good
    d = status(tmp_path / "run")["datasets"][0]
    assert (d["failed"], d["pending"], d["state"]) == (0, 12, "pending")


def test_unreachable_endpoint_with_a_cap_and_no_pricing_names_the_server_not_the_price(tmp_path):
    """A dollar cap with prices to be read from /models: before, a dead server read as `no price is known
    for model ... (not in the provider's /models)`."""
    url = f"http://127.0.0.1:{closed_port()}/v1"
    cfg = case_config(tmp_path, url, prompts(12), dataset_extra="max_cost_usd = 1.0")
    cfg.write_text(cfg.read_text().replace("[pricing]\nprompt_usd_per_m = 0.6\ncompletion_usd_per_m = 2.5\n", ""))
    assert "[pricing]" not in cfg.read_text()
    r = run_case(cfg, "--exit-on-pause", timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert f"cannot reach {url} (connect): its /models did not answer" in out
    assert "not in the provider's /models" not in out


def test_unreachable_endpoint_headless_stays_paused_and_completes_after_resume(tmp_path):
    """Without ``--exit-on-pause`` the headless run waits, paused, like the other run-wide pauses
    (only a rejected key ends it); once the server is up, ``ctl resume`` sends the pending prompts."""
    port = closed_port()
    url = f"http://127.0.0.1:{port}/v1"
    cfg = case_config(tmp_path, url, prompts(10))
    run_dir = tmp_path / "run"
    env = dict(os.environ, CASE_KEY="case-key-123")
    proc = subprocess.Popen([PY, "-m", "datagen", "run", str(cfg), "--headless"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    try:
        doc = wait_for(lambda: (d := status_when_there(run_dir)) and d["run"]["state"] == "paused" and d, 60,
                       "the run to pause")
        assert f"cannot reach {url}" in doc["run"]["state_reason"]
        assert doc["datasets"][0]["failed"] == 0
        time.sleep(1.5)
        assert proc.poll() is None  # still there, paused
        with CaseServer(ok_reply, port=port) as srv:
            r = cli("ctl", str(run_dir), "resume")
            assert r.returncode == 0 and "run resumed" in r.stdout, r.stdout + r.stderr
            out, _ = proc.communicate(timeout=60)
            assert len(srv.requests) == 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert "GUARD: run paused by a guard: cannot reach" in out
    assert states(run_dir) == {"done": 10}


def base_urls_config(tmp_path: Path, urls: list[str], n: int) -> Path:
    cfg = case_config(tmp_path, urls[0], prompts(n))
    text = cfg.read_text().replace(f'base_url = "{urls[0]}"', "base_urls = " + json.dumps(urls))
    cfg.write_text(text)
    return cfg


def test_no_endpoint_of_several_reachable_is_run_wide(tmp_path):
    urls = [f"http://127.0.0.1:{closed_port()}/v1" for _ in range(2)]
    cfg = base_urls_config(tmp_path, urls, 8)
    r = run_case(cfg, "--exit-on-pause", timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 3, out
    assert "cannot reach any of the 2 endpoints (connect): no healthy endpoint" in out
    assert states(tmp_path / "run") == {"pending": 8}


def test_one_down_replica_among_several_is_only_out_of_rotation(tmp_path):
    with CaseServer(ok_reply) as srv:
        cfg = base_urls_config(tmp_path, [f"http://127.0.0.1:{closed_port()}/v1", srv.base_url], 12)
        r = run_case(cfg, "--exit-on-pause", timeout=60)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert "cannot reach" not in out
        assert states(tmp_path / "run") == {"done": 12}
        assert len(srv.requests) == 12


# ---- every row rejected -----------------------------------------------------------------------
def test_every_row_rejected_stops_before_any_request_on_every_run(tmp_path):
    with CaseServer(ok_reply) as srv:
        cfg = case_config(tmp_path, srv.base_url, prompts(5), dataset_format="sharegpt")
        want = f"dataset d: all 5 rows rejected (first: {tmp_path / 'prompts.jsonl'}:1: sharegpt: "
        for _ in range(2):  # the rerun says it again (before: nothing at all, exit 0)
            r = run_case(cfg, timeout=60)
            assert r.returncode == 1, r.stdout + r.stderr
            assert want in r.stderr, r.stderr
            assert "run completed" not in r.stdout + r.stderr
        assert srv.requests == []
        doc = status(tmp_path / "run")
        assert doc["run"]["state"] == "stopped" and "all 5 rows rejected" in doc["run"]["state_reason"]
        d = doc["datasets"][0]
        assert (d["prompts"], d["rejected"]) == (0, 5), d  # before: rej 0 on the status line


def test_a_store_ingested_with_every_row_rejected_before_the_fix_stops_too(tmp_path, monkeypatch):
    """A run directory whose dataset was stored with 0 prompts and every row rejected (what the
    engine did before) is read again at the next start, and that start stops."""
    from engine.config import load_config
    from engine.run import ingest
    from engine.storage.store import Store, make_run_dir

    cfg_path = case_config(tmp_path, "http://127.0.0.1:9/v1", prompts(4), dataset_format="sharegpt")
    cfg = load_config(cfg_path)

    async def old_ingest() -> None:
        make_run_dir(cfg.run.dir)
        store = await Store.open(cfg.run.dir)
        try:
            monkeypatch.setattr(ingest, "all_rejected", lambda *a: None, raising=False)
            (rep,) = await ingest.ingest_all(cfg, store)
            assert (rep.prompts, rep.rejected) == (0, 4)
        finally:
            await store.close()

    asyncio.run(old_ingest())
    r = run_case(cfg_path, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "dataset d: all 4 rows rejected (first: " in r.stderr


# ---- datagen sim on a busy port ---------------------------------------------------------------
def test_sim_on_a_busy_port_is_one_line_and_exit_1():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        r = subprocess.run([PY, "-m", "datagen", "sim", "--port", str(port)], capture_output=True, text=True,
                           timeout=30)
    finally:
        s.close()
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port} on 127.0.0.1 is in use" in lines[0], r.stderr


# ---- the calibration gate after a restart -----------------------------------------------------
def gate_config(tmp_path: Path) -> Path:
    cfg = case_config(tmp_path, "unused", prompts(400), kind="simulated", concurrency=8, max_tokens=512,
                      dataset_extra="max_cost_usd = 0.1")
    text = cfg.read_text().replace('base_url = "unused"\n', "")
    text = text.replace("[pricing]\nprompt_usd_per_m = 0.6\ncompletion_usd_per_m = 2.5\n", "")
    text += "\n[provider.sim]\nlatency_ms = 20\ntokens_per_s = 2000\nmean_completion_tokens = 300\n"
    cfg.write_text(text)
    return cfg


def attempts(run_dir: Path) -> int:
    with sqlite3.connect(run_dir / "store.sqlite") as c:
        return c.execute("SELECT COUNT(*) FROM attempts").fetchone()[0]


def test_a_restarted_run_decides_the_calibration_gate_before_any_request(tmp_path):
    cfg = gate_config(tmp_path)
    run_dir = tmp_path / "run"
    r = run_case(cfg, "--exit-on-pause", timeout=90)
    assert r.returncode == 3 and "calibration gate: projected cost" in r.stdout, r.stdout + r.stderr
    done, sent = states(run_dir)["done"], attempts(run_dir)
    assert 50 <= done < 400
    r = cli("ctl", str(run_dir), "resume", "d")  # no engine: saved for the next start
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_case(cfg, "--exit-on-pause", timeout=90)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "calibration gate: projected cost" in r.stdout and f"after {done} completions" in r.stdout
    assert states(run_dir)["done"] == done and attempts(run_dir) == sent  # not one request left (before: dozens)


@pytest.mark.slow  # issue 27: long e2e test (>9 s on 2 cores), run by `make slow`
def test_a_gate_pause_is_judged_again_with_the_new_config_at_a_restart(tmp_path):
    """Paused by the gate at a $0.10 cap: rerun as is, it stays paused, no request sent; rerun with the cap
    removed from the config, the gate no longer holds it (before: `calibration gate: ... max_cost_usd $0.10`
    was kept in the store and on the screen, quoting a cap the config no longer had)."""
    cfg = gate_config(tmp_path)
    run_dir = tmp_path / "run"
    r = run_case(cfg, "--exit-on-pause", timeout=90)
    assert r.returncode == 3 and "calibration gate: projected cost" in r.stdout, r.stdout + r.stderr
    sent = attempts(run_dir)
    r = run_case(cfg, "--exit-on-pause", timeout=90)
    assert r.returncode == 3 and attempts(run_dir) == sent, r.stdout + r.stderr
    doc = json.loads(cli("status", str(run_dir), "--json").stdout)
    assert doc["datasets"][0]["state"] == "paused"
    assert doc["datasets"][0]["state_reason"].startswith("calibration gate: projected cost")
    cfg.write_text(cfg.read_text().replace("max_cost_usd = 0.1\n", ""))
    r = run_case(cfg, "--exit-on-pause", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(cli("status", str(run_dir), "--json").stdout)
    d = doc["datasets"][0]
    assert (d["state"], d["done"], d["state_reason"]) == ("done", 400, ""), d


# ---- a chained extraction quit while paused ---------------------------------------------------
class QuitRun:
    """A chained extraction run paused at 1,110 of 5,114 samples that a quit drains (what the chain
    keeps in ``runs``)."""

    def __init__(self) -> None:
        from tui.extract.host import RecordingCommands

        self.commands = RecordingCommands()
        self.quit = asyncio.Event()

    def prepare(self) -> None:
        pass

    async def run(self) -> int:
        await self.quit.wait()
        return 0  # a quit's drain: exit 0, as `datagen extract`

    def snapshot(self):
        from engine.extract.snapshot import DatasetExtractView, ExtractSnapshot

        return ExtractSnapshot(state="stopped", samples_done=1110, samples_total=5114,
                               datasets=(DatasetExtractView("b1", 1110, 5114, 0, 0),))

    def interrupt(self, name: str) -> None:
        self.quit.set()


def test_a_chained_quit_while_extraction_is_paused_says_what_is_left(tmp_path):
    from extract_jobs import chain_config

    from engine.run.chain import ExtractChain

    cfg = chain_config(tmp_path, tmp_path, "run")
    run = QuitRun()
    chain = ExtractChain(cfg, say=lambda line: None, poll_s=0.01, make_run=lambda ds: run)
    chain._check = lambda done: {n: ("ready", "") for n in done}  # type: ignore[method-assign]

    async def main() -> int:
        task = asyncio.create_task(chain.run(lambda: None, lambda: 0))
        while chain.current is None:
            await asyncio.sleep(0.01)
        chain.commands.pause()
        chain.commands.quit()  # the extraction view's q
        run.quit.set()
        return await task

    assert asyncio.run(main()) == 0
    assert chain.incomplete_line() == "extraction incomplete: 4,004 samples left (rerun to resume)"
    assert chain.end_lines() == ['extraction (after_run = "run"): exit code 0, 1 extraction run(s)',
                                 "extraction incomplete: 4,004 samples left (rerun to resume)"]


def test_a_chained_quit_before_the_next_extraction_names_the_datasets_left(tmp_path):
    from extract_jobs import chain_config

    from engine.run.chain import ExtractChain

    chain = ExtractChain(chain_config(tmp_path, tmp_path, "dataset"), say=lambda line: None)
    chain.request_quit("drain")
    chain.exit_code = 0
    assert chain.incomplete_line() == "extraction incomplete: b1, b7 not extracted yet (rerun to resume)"


def test_headless_chained_quit_of_a_paused_extraction_prints_the_samples_left(tmp_path, tiny, monkeypatch):
    """A real chained run (simulator, tokenizer, extraction workers on the tiny model): extraction
    paused before its first batch, then quit: exit 0 (a quit's drain) and the line says 9 are left."""
    from extract_jobs import chain_config

    from engine.extract.run import ExtractRun
    from engine.run.chain import run_headless_chained

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = chain_config(tmp_path, tiny, "run")
    out = io.StringIO()
    chains = []

    def make_run(datasets):
        chains[0].paused = True  # the extraction view's p: the run starts paused
        return ExtractRun(cfg, datasets=list(datasets) if datasets is not None else None, say=chains[0].say,
                          progress_s=None, worker_output="file")

    async def main() -> int:
        task = asyncio.create_task(run_headless_chained(cfg, out, install_signals=False, on_chain=chains.append,
                                                        make_run=make_run))
        deadline = time.monotonic() + 120
        while not (chains and chains[0].current is not None and chains[0].current.info is not None):
            assert time.monotonic() < deadline and not task.done(), out.getvalue()[-3000:]
            await asyncio.sleep(0.05)
        chains[0].commands.quit()  # the extraction view's q
        return await task

    code = asyncio.run(main())
    text = out.getvalue()
    assert code == 0, text[-3000:]
    assert "extract: extraction incomplete: 9 samples left (rerun to resume)" in text, text[-3000:]
