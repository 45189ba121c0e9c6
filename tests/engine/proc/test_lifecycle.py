"""Every process a run starts survives the terminal's life; the parent alone decides (issue 16, 1-2).

- The reconstruction pool starts while ``sys.stderr`` has no file descriptor (what the dashboard
  leaves): before, ``ValueError: bad value(s) in fds_to_keep`` from the resource tracker.
- Worker processes (tokenizer pool, resource tracker) ignore SIGINT/SIGTERM/SIGHUP/SIGQUIT sent to
  the process group; the parent gets them; nothing is left behind (processes, /dev/shm semaphores).
- A dead pool is replaced; a completion is stored even when its reconstruction cannot run, and is
  rebuilt later (``only_missing``, as exports and ``datagen validate`` do).
- ``datagen run --headless`` x {process, thread, no tokenizer}: Ctrl-C to the process group drains
  within the limit, stores and validates every completion, exits 130, leaves no child or semaphore;
  a second signal aborts at once and logs how many streams and dollars were lost.
- The drain limit defaults to the requests' own bound (``provider.timeouts.total_s``).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from e2e import live_status, run_cmd, run_env
from fixtures_tokens import kimi_dir
from helpers import completion, make_config, seeded_store
from lifecycle import alive, cmdline, descendants, lifecycle_config, sem_names, sig_ignored, store_counts
from waiting import wait_for

REPO = Path(__file__).resolve().parents[3]
TERMINAL = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def _mask(sigs) -> int:
    return sum(1 << (s - 1) for s in sigs)


POOL_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, time
    sys.path.insert(0, {tests!r})
    from engine.config import TokenizerSection
    from engine.tokens.service import _make_pool

    class NoFd:  # what a dashboard leaves in sys.stderr: writes work, no file descriptor
        def write(self, s): return len(s)
        def flush(self): pass
        def fileno(self): return -1
    sys.stderr = NoFd()
    got = []
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(s, lambda n, f: got.append(n))
    pool = _make_pool(TokenizerSection(path={kimi!r}, workers=2), None, 2, "process")
    futs = [pool.submit(time.sleep, 1.0) for _ in range(2)]  # both workers start
    [f.result() for f in futs]
    print(json.dumps({{"ready": True}}), flush=True)
    sys.stdin.readline()  # the test signals the whole process group meanwhile
    pids = sorted({{pool.submit(os.getpid).result(timeout=30) for _ in range(6)}})
    pool.shutdown(wait=True)
    print(json.dumps({{"pids": pids, "got": sorted(got)}}), flush=True)
""")


def test_pool_starts_without_a_stderr_fd_and_its_workers_ignore_group_signals(tmp_path):
    script = POOL_SCRIPT.format(tests=str(REPO / "tests"), kimi=str(kimi_dir()))
    p = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = p.stdout.readline()
        assert line.strip() == '{"ready": true}', line + p.stderr.read() if p.poll() is not None else line
        kids = descendants(p.pid)
        workers = {k for k in kids if "spawn_main" in cmdline(k)}
        tracker = {k for k in kids if "resource_tracker" in cmdline(k)}
        assert len(workers) == 2 and len(tracker) == 1, [cmdline(k) for k in kids]
        sems = sem_names({p.pid} | kids)
        assert sems  # the pool's queues hold semaphores
        for w in workers:  # born ignoring terminal signals
            assert sig_ignored(w) & _mask(TERMINAL) == _mask(TERMINAL), hex(sig_ignored(w))
        for s in TERMINAL:  # as a terminal (Ctrl-C, Ctrl-\\, hang-up) or `kill -TERM -PGID` would
            os.killpg(p.pid, s)
            time.sleep(0.2)
        assert all(alive(k) for k in kids)
        out, err = p.communicate("go\n", timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0, err
    doc = json.loads(out.strip().splitlines()[-1])
    assert set(doc["pids"]) <= workers  # the same workers did the work after the signals
    assert doc["got"] == sorted(int(s) for s in TERMINAL)  # the parent got every signal
    wait_for(lambda: not any(alive(k) for k in kids), 10)
    assert not [s for s in sems if (Path("/dev/shm") / s).exists()]


# ------------------------------------------------------------------------- the live service

def _records_setup(tmp_path, n):
    cfg = make_config(tmp_path, datasets=[{"name": "a", "path": "a.jsonl"}],
                      tokenizer={"path": str(kimi_dir()), "executor": "process", "workers": 2})
    asyncio.run(_seed(cfg, n))
    return cfg


async def _seed(cfg, n):
    store = await seeded_store(cfg, {"a": n})
    await store.close()


def _completion():
    return completion("It is sunny.", completion_tokens=0)


def _validations(run_dir: Path) -> int:
    db = sqlite3.connect(run_dir / "store.sqlite")
    try:
        return db.execute("SELECT COUNT(*) FROM validations").fetchone()[0]
    finally:
        db.close()


async def _submit_and_kill(cfg, n, *, replacements: int | None = None):
    import engine.tokens.service as service

    if replacements is not None:
        service._MAX_POOL_REPLACEMENTS = replacements
    svc = service.ReconstructionService(cfg.tokenizer, cfg.run.dir, commit_interval_s=0.05)
    await svc.start()
    msgs = [{"role": "user", "content": "Weather in Rome?"}]
    for i in range(n // 2):
        svc.submit(i + 1, "a", f"k{i}", msgs, [], _completion())
    await asyncio.sleep(0)
    while svc._pending:
        await asyncio.sleep(0.05)
    workers = {k for k in descendants(os.getpid()) if "spawn_main" in cmdline(k)}
    assert workers
    for w in workers:
        os.kill(w, signal.SIGKILL)  # the pool dies (an OOM kill, a crash)
    await asyncio.sleep(0.5)
    for i in range(n // 2, n):  # must not raise; each record is resubmitted to a new pool
        svc.submit(i + 1, "a", f"k{i}", msgs, [], _completion())
    await svc.close()
    return svc


def test_dead_pool_is_replaced_and_every_record_validated(tmp_path, monkeypatch):
    import engine.tokens.service as service

    monkeypatch.setattr(service, "_MAX_POOL_REPLACEMENTS", service._MAX_POOL_REPLACEMENTS)
    cfg = _records_setup(tmp_path, 8)
    svc = asyncio.run(_submit_and_kill(cfg, 8))
    assert svc.replacements == 1 and svc.skipped == 0
    assert _validations(cfg.run.dir) == 8


def test_submit_never_raises_when_the_pool_cannot_be_replaced(tmp_path, monkeypatch):
    import engine.tokens.service as service

    monkeypatch.setattr(service, "_MAX_POOL_REPLACEMENTS", service._MAX_POOL_REPLACEMENTS)
    cfg = _records_setup(tmp_path, 8)
    svc = asyncio.run(_submit_and_kill(cfg, 8, replacements=0))
    assert svc.skipped == 4 and _validations(cfg.run.dir) == 4  # submit never raised; 4 left for later


def test_completion_is_stored_when_reconstruction_cannot_be_queued_and_validated_later(tmp_path, monkeypatch):
    """A reconstruction service whose ``submit`` raises (a dead pool, before the fix) must cost no
    completion: the run completes, every prompt is done, none returns to pending (bought again), and
    ``validate_run(only_missing=True)`` (what exports and ``datagen validate`` do) rebuilds them later."""
    from engine.config import parse_config
    from engine.run.headless import run_headless
    from engine.tokens.service import ReconstructionService, validate_run

    def broken_submit(self, *a, **k):
        raise RuntimeError("BrokenProcessPool: a child process terminated abruptly")

    monkeypatch.setattr(ReconstructionService, "submit", broken_submit)

    cfg = parse_config({
        "run": {"name": "b", "dir": str(tmp_path / "run"), "commit_interval_s": 0.1, "progress_interval_s": 60},
        "provider": {"kind": "simulated", "sim": {"seed": 1, "latency_ms": 5, "tokens_per_s": 5000,
                                                  "mean_completion_tokens": 50, "faults": ""}},
        "classes": {"short": {"max_tokens": 2000, "concurrency": 4}},
        "datasets": [{"name": "g", "path": str(REPO / "engine/samples/b1_glaive.jsonl"), "format": "glaive"}],
        "tokenizer": {"path": str(kimi_dir()), "executor": "thread"},
    }, tmp_path / "config.toml")

    code = asyncio.run(asyncio.wait_for(run_headless(cfg, io.StringIO(), install_signals=False), 60))
    assert code == 0
    c = store_counts(tmp_path / "run")
    assert c["results"] == c.get("prompts_done", 0) > 0 and c.get("prompts_pending", 0) == 0
    assert c["validations"] == 0
    validate_run(tmp_path / "run", cfg.tokenizer, workers=1, only_missing=True)
    assert store_counts(tmp_path / "run")["validations"] == c["results"]


# ------------------------------------------------------------------------- datagen run --headless

def _start_run(tmp_path, cfg, min_in_flight, children=0):
    out = open(tmp_path / "run.out", "w")
    p = subprocess.Popen(run_cmd(cfg), cwd=REPO, env=run_env(), stdout=out, stderr=subprocess.STDOUT,
                         start_new_session=True)
    out.close()

    def ready():
        if p.poll() is not None:
            return True
        doc = live_status(tmp_path / "run")
        return (doc and doc["run"]["alive"] and doc["totals"]["in_flight"] >= min_in_flight
                and len([k for k in descendants(p.pid) if "spawn_main" in cmdline(k)]) >= children)

    try:
        wait_for(ready, 60, interval=0.2)
    except TimeoutError:
        pass
    assert p.poll() is None, (tmp_path / "run.out").read_text()
    return p


def _finish(p, timeout):
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        return None
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


SLOW = pytest.mark.slow


@pytest.mark.parametrize("executor", ["process", pytest.param("thread", marks=SLOW), pytest.param("none", marks=SLOW)])
def test_ctrl_c_to_the_process_group_drains_stores_validates_and_exits_130(tmp_path, executor):
    cfg = lifecycle_config(tmp_path, executor, drain="30", tokens=200, tokens_per_s=100, kimi=kimi_dir())
    p = _start_run(tmp_path, cfg, 8, children=2 if executor == "process" else 0)
    kids = descendants(p.pid)
    sems = sem_names({p.pid} | kids)
    t0 = time.monotonic()
    os.killpg(p.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    rc = _finish(p, 40)
    took = time.monotonic() - t0
    out = (tmp_path / "run.out").read_text()
    assert rc == 130, out[-3000:]
    assert took < 30 + 10
    assert re.search(r"SIGINT: draining \d+ in-flight request\(s\) \(est\. \$[0-9.]+, up to 30s\); again to abort", out)
    c = store_counts(tmp_path / "run")
    # Every completion that streamed back is stored (none returned to pending), nothing was cut...
    assert c["aborted"] == 0 and c["results"] == c["prompts_done"] > 0
    assert c["results"] + c.get("prompts_pending", 0) == 98
    # ...and reconstructed: the pool survived the Ctrl-C.
    assert c["validations"] == (c["results"] if executor != "none" else 0)
    assert "BrokenProcessPool" not in (tmp_path / "run" / "datagen.log").read_text()
    wait_for(lambda: not any(alive(k) for k in kids), 10)
    assert not [s for s in sems if (Path("/dev/shm") / s).exists()]


@pytest.mark.parametrize("executor", ["process", pytest.param("none", marks=SLOW)])
@pytest.mark.slow  # issue 27: long e2e test (>9 s on 2 cores), run by `make slow`
def test_second_signal_aborts_at_once_and_says_what_was_lost(tmp_path, executor):
    # ~30 s streams and an "auto" drain (total_s = 120 s): only the second signal ends the run.
    cfg = lifecycle_config(tmp_path, executor, drain="", tokens=3000, tokens_per_s=100, kimi=kimi_dir())
    p = _start_run(tmp_path, cfg, 8, children=2 if executor == "process" else 0)
    kids = descendants(p.pid)
    os.killpg(p.pid, signal.SIGINT)
    time.sleep(1.5)
    t0 = time.monotonic()
    os.killpg(p.pid, signal.SIGTERM)
    rc = _finish(p, 20)
    took = time.monotonic() - t0
    out = (tmp_path / "run.out").read_text()
    assert rc == 130, out[-3000:]
    assert took < 10
    assert re.search(r"SIGINT: draining [1-8] in-flight request\(s\) \(est\. \$[0-9.]+, up to 2m\); again to abort", out)
    assert "SIGTERM: aborting in-flight requests" in out
    log = (tmp_path / "run" / "datagen.log").read_text()
    m = re.search(r"aborted (\d+) in-flight stream\(s\): est\. \$([0-9.]+) already generated is billed and lost", log)
    # (lengths are random: a stream may end between the two signals)
    assert m and int(m.group(1)) >= 1 and float(m.group(2)) > 0
    c = store_counts(tmp_path / "run")
    assert c["aborted"] == int(m.group(1)) and c.get("prompts_pending", 0) + c["results"] == 98
    wait_for(lambda: not any(alive(k) for k in kids), 10)


def test_drain_limit_defaults_to_the_requests_own_timeout(tmp_path):
    from engine.config import parse_config
    from engine.run.scheduler import Scheduler

    base = {"run": {"dir": str(tmp_path / "r")}, "provider": {"kind": "simulated", "timeouts": {"total_s": 1234}},
            "datasets": [{"name": "g", "path": str(REPO / "engine/samples/b1_glaive.jsonl"), "format": "glaive"}]}
    cfg = parse_config(base, tmp_path / "c.toml")
    assert cfg.run.drain_timeout_s == "auto"
    assert Scheduler(cfg, None, None, None).ending.drain_limit_s() == 1234.0
    cfg = parse_config({**base, "run": {"dir": str(tmp_path / "r"), "drain_timeout_s": 7}}, tmp_path / "c.toml")
    assert Scheduler(cfg, None, None, None).ending.drain_limit_s() == 7.0


def test_headless_drain_shows_countdown_in_flight_and_dollars(tmp_path):
    cfg = lifecycle_config(tmp_path, "none", drain="3", tokens=3000, tokens_per_s=100)
    p = _start_run(tmp_path, cfg, 8)
    os.killpg(p.pid, signal.SIGTERM)
    rc = _finish(p, 20)
    out = (tmp_path / "run.out").read_text()
    assert rc == 130, out[-3000:]
    assert re.search(r"draining: [1-8] in flight \(est\. \$0\.\d{4}\); aborting them in [0-3]s", out), out[-2000:]


# ------------------------------------------------------------------------- datagen extract workers

def _extract(tmp: Path, tiny: Path, n: int) -> tuple[subprocess.Popen, Path]:
    from engine.extract.tiny import synth_records
    from engine.tokens.records import write_parquet

    write_parquet(tmp / "data" / "a.parquet", synth_records(n, 8, 160, seed=11))
    (tmp / "config.toml").write_text(
        f'[run]\ndir = "run"\n[[datasets]]\nname = "a"\npath = "a.jsonl"\n'
        f'[extract]\nmodel = "{tiny}"\naux_layers = [0, 1, 2]\nmax_tokens_per_batch = 256\ndisk_margin_gb = 0\n')
    out = open(tmp / "extract.out", "w")
    p = subprocess.Popen([sys.executable, "-m", "datagen", "extract", str(tmp / "config.toml"), "--data",
                          str(tmp / "data"), "--progress-s", "0.5", "--workers", "2"], cwd=REPO,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=out, stderr=subprocess.STDOUT,
                         start_new_session=True)
    out.close()
    manifest = tmp / "run" / "extract" / "manifest.jsonl"

    def started() -> bool:
        return p.poll() is not None or (manifest.exists() and manifest.read_bytes().count(b"\n") >= 4)

    wait_for(started, 120, interval=0.05)
    assert p.poll() is None, (tmp / "extract.out").read_text()
    return p, manifest


@pytest.mark.parametrize("signals", [(signal.SIGHUP,), pytest.param((signal.SIGINT, signal.SIGINT), marks=SLOW)],
                         ids=["SIGHUP", "SIGINT-twice"])
@pytest.mark.slow  # issue 27: long e2e test (>9 s on 2 cores), run by `make slow`
def test_extract_workers_obey_the_launcher_not_the_terminal(tmp_path, tiny, signals):
    """``datagen extract`` with 2 worker processes: a hang-up or Ctrl-C to the process group reaches
    the launcher only; it stops the workers after their batch (first signal) or kills them (second),
    and exits 130. Before: SIGHUP killed the launcher at once (exit -1), the workers with it."""
    p, manifest = _extract(tmp_path, tiny, 3000)
    kids = descendants(p.pid)
    workers = {k for k in kids if "engine.extract.worker" in cmdline(k)}
    assert len(workers) == 2
    assert all(os.getpgid(w) != os.getpgid(p.pid) for w in workers)  # out of the terminal's reach
    for s in signals:
        os.killpg(p.pid, s)
        time.sleep(0.3)
    rc = _finish(p, 60)
    out = (tmp_path / "extract.out").read_text()
    assert rc == 130, out[-3000:]
    name = signals[0].name
    assert f"{name}: stopping workers after their current batch; again to kill them" in out
    if len(signals) == 2:
        assert "SIGINT: killing workers now" in out
    wait_for(lambda: not any(alive(k) for k in kids), 10)
    assert manifest.read_bytes().count(b"\n") < 3000  # it was stopped, not finished


def test_header_shows_the_drain_countdown_even_at_80_columns():
    import dataclasses

    from tui.panes.header import header_lines
    from tui.testing import fixed_snapshot

    s = dataclasses.replace(fixed_snapshot(), state="stopping", state_reason="Ctrl-C: interrupted (drain)")
    assert not any("draining" in line.plain for line in header_lines(s, "quitting (drain)…", 80))
    s = dataclasses.replace(s, drain_left_s=754.2)
    for width in (80, 160):
        lines = [line.plain for line in header_lines(s, "quitting (drain)…", width)]
        assert lines[2].startswith(f"draining {s.in_flight:,} in flight (${s.cost_in_flight_usd:.4f}) · abort in 12m34s")
