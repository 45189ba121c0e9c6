"""Signals and resources: SIGTERM/SIGHUP drain, a second signal aborts, failing disks pause, fd limits.

- SIGTERM and SIGHUP drain: no new dispatch, in-flight requests finish and are stored, exit 130; the
  drain is time-limited (``run.drain_timeout_s``), then the rest is aborted (back to pending).
- A second signal aborts at once, still flushing: every completion that arrived is stored and
  every aborted attempt is recorded.
- Disk full / read-only store (injected commit failures, and a real full tmpfs where ``mount`` is
  permitted): the run pauses with the reason, loses nothing, stays uncorrupted and resumes by
  itself when commits work again.
- File descriptors: ``check_fd_limit`` raises the soft open-files limit to concurrency + 256 or
  warns when the hard limit is lower; a run at 2,000 concurrency works.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import signal
import sqlite3
import subprocess
import threading
import time

import pytest
from e2e import PY, SimProcess, integrity, live_status, read_log, run_cmd, run_env, socket_count, write_prompts
from mounts import can_mount
from waiting import wait_for

from engine.config import parse_config
from engine.run.headless import run_headless

#: ``make chaos`` sets DATAGEN_LONG=1: the heavy 2,000-streams-in-flight run is part of the long suite only.
LONG = os.environ.get("DATAGEN_LONG") == "1"


def _config(tmp_path, base_url, data, *, drain_s=30, conc=8, stall_s=30):
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"""
[run]
name = "signals"
dir = "{tmp_path / 'run'}"
progress_interval_s = 1
commit_interval_s = 0.2
drain_timeout_s = {drain_s}
[provider]
kind = "openai"
base_url = "{base_url}"
api_key_env = "E2E_KEY"
[provider.timeouts]
stall_s = {stall_s}
[classes.short]
max_tokens = 8192
concurrency = {conc}
[[datasets]]
name = "sig"
path = "{data}"
format = "text"
""")
    return cfg


def read_text_log(run_dir) -> str:
    """The run's ``datagen.log``."""
    return (run_dir / "datagen.log").read_text()


def _in_flight(run_dir):
    doc = live_status(run_dir)
    return doc["totals"]["in_flight"] if doc and doc["run"]["alive"] else 0


def _store(run_dir):
    db = sqlite3.connect(run_dir / "store.sqlite")
    gids = {g for (g,) in db.execute("SELECT generation_id FROM results")}
    attempts = dict(db.execute("SELECT outcome, COUNT(*) FROM attempts GROUP BY outcome").fetchall())
    states = dict(db.execute("SELECT state, COUNT(*) FROM prompts GROUP BY state").fetchall())
    db.close()
    return gids, attempts, states


def _settle(log, run_dir, timeout=10.0) -> None:
    """Wait until the simulator has logged as many requests as the store has attempts: it notices a
    dropped stream when it reads the connection's end, a moment after the client is gone."""
    db = sqlite3.connect(run_dir / "store.sqlite")
    (n,) = db.execute("SELECT COUNT(*) FROM attempts").fetchone()
    db.close()
    try:
        wait_for(lambda: log.exists() and len(read_log(log)) >= n, timeout, interval=0.05)
    except TimeoutError:
        pass


def _aborted_match_dropped(run_dir, dropped) -> None:
    """Every stream the simulator saw dropped is an aborted attempt in the store: by generation id, or
    one of the aborted attempts cut before the response headers (no id known to the client)."""
    db = sqlite3.connect(run_dir / "store.sqlite")
    rows = db.execute("SELECT generation_id FROM attempts WHERE outcome='aborted'").fetchall()
    db.close()
    with_id = {g for (g,) in rows if g}
    dropped_ids = {e["generation_id"] for e in dropped}
    assert with_id <= dropped_ids
    assert len(dropped_ids - with_id) <= sum(1 for (g,) in rows if not g)


def _start(tmp_path, cfg, min_in_flight):
    out = open(tmp_path / "run.out", "w")
    p = subprocess.Popen(run_cmd(cfg), env=run_env(), stdout=out, stderr=subprocess.STDOUT)
    out.close()
    wait_for(lambda: _in_flight(tmp_path / "run") >= min_in_flight or p.poll() is not None, 60)
    assert p.poll() is None, (tmp_path / "run.out").read_text()
    return p


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_first_signal_drains_in_flight_and_exits_130(tmp_path, sig):
    log = tmp_path / "sim.jsonl"
    data = write_prompts(tmp_path / "p.jsonl", 200)
    sim = SimProcess("--seed", "3", "--mean-completion-tokens", "300", "--tokens-per-s", "200", log=log)
    try:
        p = _start(tmp_path, _config(tmp_path, sim.base_url, data), 8)
        t_sig = time.time()
        p.send_signal(sig)
        rc = p.wait(60)
        took = time.time() - t_sig
    finally:
        if p.poll() is None:
            p.kill()
        sim.stop()
    out = (tmp_path / "run.out").read_text()
    assert rc == 130, out  # interrupted (docs/commands.md: exit codes)
    assert re.search(rf"{sig.name}: draining [78] in-flight request\(s\) \(est\. \$[0-9.]+, up to 30s\); again to abort", out)
    assert re.search(r"draining: \d+ in flight \(est\. \$[0-9.]+\); aborting them in \d+s", out)
    entries = read_log(log)
    after = [e for e in entries if e["t"] > t_sig]
    gids, attempts, states = _store(tmp_path / "run")
    # The requests in flight (8, or 7 when one had just finished) finished and were stored; nothing new
    # was sent; nothing was cut.
    assert 7 <= len(after) <= 8 and all(e["outcome"] == "completed" and e["generation_id"] in gids for e in after)
    assert not any(e["outcome"] == "client_dropped" for e in entries) and "aborted" not in attempts
    sent = {e["generation_id"] for e in entries if e["outcome"] == "completed" and e["fully_sent"]}
    assert sent == gids
    assert states["done"] == len(gids) and states["pending"] == 200 - len(gids)
    assert took < 30
    doc = live_status(tmp_path / "run")
    assert doc["run"]["state"] == "stopped" and doc["totals"]["in_flight"] == 0


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
def test_sighup_drains_even_when_stdout_is_gone(tmp_path):
    """The terminal goes away mid-run (stdout becomes a closed pipe), then SIGHUP arrives: the run
    must still drain, store what is in flight and exit."""
    sig = signal.SIGHUP
    log = tmp_path / "sim.jsonl"
    data = write_prompts(tmp_path / "p.jsonl", 200)
    sim = SimProcess("--seed", "3", "--mean-completion-tokens", "300", "--tokens-per-s", "200", log=log)
    cfg = _config(tmp_path, sim.base_url, data)
    try:
        p = subprocess.Popen(run_cmd(cfg), env=run_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        gone = threading.Event()

        def reader():  # reads the output until the "terminal" goes away, then closes its end
            while not gone.is_set() and p.stdout.readline():
                pass
            p.stdout.close()

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        wait_for(lambda: _in_flight(tmp_path / "run") >= 8 or p.poll() is not None, 60)
        assert p.poll() is None
        gone.set()
        t.join(5)
        time.sleep(2.5)  # progress lines (every 1 s) now hit the closed pipe
        assert p.poll() is None  # the run itself goes on
        p.send_signal(sig)
        try:
            rc = p.wait(10)
        except subprocess.TimeoutExpired:
            rc = None
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        sim.stop()
    assert rc is not None, f"{sig.name} did not stop the run within 10 s (stdout gone)"
    gids, attempts, states = _store(tmp_path / "run")
    assert "aborted" not in attempts and states.get("done", 0) == len(gids) > 0
    assert rc == 130


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
def test_drain_is_time_limited_then_aborts(tmp_path):
    log = tmp_path / "sim.jsonl"
    data = write_prompts(tmp_path / "p.jsonl", 100)
    # ~4,000-token completions at 200 tokens/s: far longer than the 1 s drain.
    sim = SimProcess("--seed", "4", "--mean-completion-tokens", "4000", "--tokens-per-s", "200",
                     "--cancellable", "SimA,SimB,SimC", log=log)
    try:
        p = _start(tmp_path, _config(tmp_path, sim.base_url, data, drain_s=1), 8)
        time.sleep(0.5)
        t_sig = time.time()
        p.send_signal(signal.SIGTERM)
        rc = p.wait(30)
        took = time.time() - t_sig
        _settle(log, tmp_path / "run")
    finally:
        if p.poll() is None:
            p.kill()
        sim.stop()
    out = (tmp_path / "run.out").read_text()
    assert rc == 130, out
    assert re.search(r"SIGTERM: draining \d+ in-flight request\(s\) \(est\. \$[0-9.]+, up to 1s\); again to abort", out)
    # One line says what the abort cost: how many streams, estimated dollars.
    assert re.search(r"aborted \d+ in-flight stream\(s\): est\. \$[0-9.]+ already generated is billed and lost",
                     read_text_log(tmp_path / "run"))
    assert took < 6
    gids, attempts, states = _store(tmp_path / "run")
    entries = read_log(log)
    dropped = [e for e in entries if e["outcome"] == "client_dropped"]
    # The streams still running after 1 s were cut, recorded as aborted, and their prompts are pending again.
    assert len(dropped) >= 1 and attempts.get("aborted", 0) >= len(dropped)
    _aborted_match_dropped(tmp_path / "run", dropped)
    assert states.get("done", 0) == len(gids) and states["pending"] == 100 - len(gids)
    assert {e["generation_id"] for e in entries if e["outcome"] == "completed"} == gids


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
def test_second_signal_aborts_at_once_and_still_flushes(tmp_path):
    log = tmp_path / "sim.jsonl"
    data = write_prompts(tmp_path / "p.jsonl", 300)
    # Exponential lengths (mean 1,500 tokens at 500 tokens/s): some finish between the two signals.
    sim = SimProcess("--seed", "5", "--mean-completion-tokens", "1500", "--tokens-per-s", "500",
                     "--cancellable", "SimA,SimB,SimC", log=log)
    try:
        p = _start(tmp_path, _config(tmp_path, sim.base_url, data, drain_s=60, conc=24), 24)
        time.sleep(1.0)
        p.send_signal(signal.SIGHUP)
        time.sleep(1.5)
        t_abort = time.time()
        p.send_signal(signal.SIGTERM)
        rc = p.wait(30)
        took = time.time() - t_abort
        _settle(log, tmp_path / "run")
    finally:
        if p.poll() is None:
            p.kill()
        sim.stop()
    out = (tmp_path / "run.out").read_text()
    assert rc == 130, out
    assert re.search(r"SIGHUP: draining \d+ in-flight request\(s\) \(est\. \$[0-9.]+, up to 60s\); again to abort", out)
    assert "SIGTERM: aborting in-flight requests" in out
    assert took < 5
    gids, attempts, states = _store(tmp_path / "run")
    entries = read_log(log)
    completed = {e["generation_id"] for e in entries if e["outcome"] == "completed" and e["fully_sent"]}
    dropped = [e for e in entries if e["outcome"] == "client_dropped"]
    # Every completion that arrived, during the drain included, is stored; every cut stream is recorded.
    assert completed == gids
    assert any(e["t"] < t_abort and e["outcome"] == "completed" for e in entries)
    assert len(dropped) >= 1 and attempts.get("aborted", 0) >= len(dropped)
    _aborted_match_dropped(tmp_path / "run", dropped)
    assert states.get("done", 0) + states["pending"] == 300
    assert integrity(tmp_path / "run" / "store.sqlite") == "ok"


# ------------------------------------------------------------------------------- failing disks

def _sim_cfg(tmp_path, n, run_dir=None, **sim):
    data = write_prompts(tmp_path / "p.jsonl", n)
    return parse_config({
        "run": {"name": "disk", "dir": str(run_dir or tmp_path / "run"), "commit_interval_s": 0.2,
                "progress_interval_s": 0.5},
        "provider": {"kind": "simulated", "sim": {"seed": 6, "log": str(tmp_path / "sim.jsonl"), **sim}},
        "classes": {"short": {"max_tokens": 8192, "concurrency": 16}},
        "datasets": [{"name": "disk", "path": str(data), "format": "text"}],
    }, tmp_path / "config.toml")


@pytest.mark.parametrize("error", ["database or disk is full", "attempt to write a readonly database"])
async def test_store_failure_pauses_and_resumes_without_loss(tmp_path, error):
    n = 150
    cfg = _sim_cfg(tmp_path, n, mean_completion_tokens=100, tokens_per_s=400)
    seen: dict = {"paused": [], "in_flight_while_failing": [], "db_done": []}
    failing = asyncio.Event()

    def ready(job):
        conn = job.store.conn
        real = conn.execute

        async def execute(sql, *a, **k):
            if failing.is_set() and sql == "COMMIT":
                raise sqlite3.OperationalError(error)
            return await real(sql, *a, **k)

        conn.execute = execute

        async def chaos():
            sched = job.scheduler
            while sched.snapshot().datasets[0].done < 30:
                await asyncio.sleep(0.02)
            failing.set()
            t_end = time.monotonic() + 3.0
            while time.monotonic() < t_end:
                seen["paused"].append((sched.run_paused, sched.pause_kind, sched.state_reason))
                seen["in_flight_while_failing"].append(sched.snapshot().in_flight)
                await asyncio.sleep(0.1)
            db = sqlite3.connect(cfg.run.dir / "store.sqlite")
            seen["db_done"] = db.execute("SELECT COUNT(*) FROM results").fetchone()[0]
            seen["mem_done"] = sched.snapshot().datasets[0].done
            db.close()
            failing.clear()

        seen["task"] = asyncio.get_running_loop().create_task(chaos())

    out = io.StringIO()
    code = await asyncio.wait_for(run_headless(cfg, out, install_signals=False, on_ready=ready), 120)
    text = out.getvalue()
    assert code == 0, text
    reason = (f"store commits fail (OperationalError: {error}); nothing is lost: results wait in memory and are "
              f"committed when the disk works again")
    # Paused with the reason within a commit interval or two; dispatch stopped, in-flight drained to 0.
    assert (True, "store", reason) in seen["paused"][:10]
    assert seen["paused"][-1] == (True, "store", reason)
    assert seen["in_flight_while_failing"][-1] == 0
    assert seen["mem_done"] > seen["db_done"]  # results that arrived while failing waited in memory
    assert f"[run disk] paused ({reason})" in text
    db = sqlite3.connect(cfg.run.dir / "store.sqlite")
    states = dict(db.execute("SELECT state, COUNT(*) FROM prompts GROUP BY state").fetchall())
    (n_results,) = db.execute("SELECT COUNT(*) FROM results").fetchone()
    events = [m for (m,) in db.execute("SELECT message FROM events ORDER BY id")]
    db.close()
    assert states == {"done": n} and n_results == n
    assert f"run paused: {reason}" in events and "run resumed" in events
    assert integrity(cfg.run.dir / "store.sqlite") == "ok"
    entries = read_log(tmp_path / "sim.jsonl")
    completed = [e["prompt_key"] for e in entries if e["outcome"] == "completed"]
    assert len(completed) == len(set(completed)) == n  # nothing paid twice: no result was lost


@pytest.mark.skipif(not can_mount(), reason="needs root and permission to mount a tmpfs")
@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
async def test_real_full_filesystem_pauses_and_resumes(tmp_path):
    """The run directory on a 1.5 MB tmpfs: it fills up, the run pauses; the tmpfs is grown, the run
    resumes and completes; nothing lost, nothing corrupt."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", str(mnt)], check=True)
    try:
        n = 400
        # ~2,000 tokens of ~6 characters each per answer (reasoning + content): ~12 kB a result, 5 MB in all.
        cfg = _sim_cfg(tmp_path, n, run_dir=mnt / "run", mean_completion_tokens=2000, tokens_per_s=0)
        seen: dict = {}

        def ready(job):
            async def grow():
                sched = job.scheduler
                while not (sched.run_paused and sched.pause_kind == "store"):
                    await asyncio.sleep(0.05)
                seen["reason"] = sched.state_reason
                await asyncio.sleep(1.0)
                seen["in_flight"] = sched.snapshot().in_flight
                subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], check=True)

            seen["task"] = asyncio.get_running_loop().create_task(grow())

        out = io.StringIO()
        code = await asyncio.wait_for(run_headless(cfg, out, install_signals=False, on_ready=ready), 180)
        assert code == 0, out.getvalue()[-3000:]
        assert seen["reason"].startswith("store commits fail (OperationalError: database or disk is full)")
        assert seen["in_flight"] == 0
        db_path = mnt / "run" / "store.sqlite"
        assert integrity(db_path) == "ok"
        db = sqlite3.connect(db_path)
        assert dict(db.execute("SELECT state, COUNT(*) FROM prompts GROUP BY state").fetchall()) == {"done": n}
        db.close()
        completed = [e["prompt_key"] for e in read_log(tmp_path / "sim.jsonl") if e["outcome"] == "completed"]
        assert len(completed) == len(set(completed)) == n
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


# ----------------------------------------------------------------------------- file descriptors

FD_PROBE = r"""
import io, resource, sys
soft, hard = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
from engine.run.runner import check_fd_limit
out = io.StringIO()
got = check_fd_limit(int(sys.argv[3]), out)
print(got, resource.getrlimit(resource.RLIMIT_NOFILE)[0], repr(out.getvalue()))
"""


@pytest.mark.parametrize("soft,hard,conc,expect_soft,warns", [
    (256, 4096, 2000, 2256, False),    # raised to concurrency + 256
    (512, 1024, 2000, 1024, True),     # raised as far as the hard limit allows, then a warning
    (8192, 8192, 2000, 8192, False),   # already enough: left alone
    (1024, 1024, 500, 1024, False),    # 500 + 256 fit
])
def test_fd_limit_raised_or_warned(soft, hard, conc, expect_soft, warns):
    r = subprocess.run([PY, "-c", FD_PROBE, str(soft), str(hard), str(conc)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got, now, msg = r.stdout.strip().split(" ", 2)
    assert int(got) == int(now) == expect_soft
    need = conc + 256
    expected = (f"warning: open-files limit {expect_soft} is below {need} needed for {conc} concurrent requests; "
                f"run `ulimit -n {need}` first or lower classes.*.concurrency\n") if warns else ""
    assert eval(msg) == expected


def _limit(soft, hard):
    def pre():
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return pre


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
def test_run_at_2000_concurrency_warns_under_a_low_hard_limit_and_still_completes(tmp_path):
    """`datagen run` at 2,000 concurrency with `ulimit -Hn 512`: the warning names the `ulimit -n`
    needed; connections beyond the limit fail (EMFILE), are retried, and the run still completes."""
    data = write_prompts(tmp_path / "p.jsonl", 600)
    sim = SimProcess("--seed", "8", "--mean-completion-tokens", "100", "--tokens-per-s", "100")
    try:
        cfg = _config(tmp_path, sim.base_url, data, conc=2000, stall_s=10)
        cfg.write_text(cfg.read_text().replace("[run]\n", "[run]\nmax_attempts = 50\n"))
        r = subprocess.run(run_cmd(cfg), env=run_env(), capture_output=True, text=True, timeout=240,
                           preexec_fn=_limit(512, 512))
    finally:
        sim.stop()
    assert "warning: open-files limit 512 is below 2256 needed for 2000 concurrent requests; run `ulimit -n 2256` " \
           "first or lower classes.*.concurrency" in r.stdout
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = live_status(tmp_path / "run")
    assert doc["totals"]["done"] == 600, doc["totals"]
    print(f"\n2,000 concurrency under ulimit -n 512: done {doc['totals']['done']}, errors {doc['totals']['errors']}")


@pytest.mark.skipif(not LONG, reason="2,000 streams in flight take ~45 s of both cores: make chaos (DATAGEN_LONG=1)")
@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
def test_run_at_2000_concurrency_with_enough_fds(tmp_path):
    """2,000 streams in flight at once: the soft limit is raised at start, no warning, all complete."""
    n = 2000
    data = write_prompts(tmp_path / "p.jsonl", n)
    sim = SimProcess("--seed", "9", "--mean-completion-tokens", "40", "--tokens-per-s", "10")
    peak = 0
    try:
        cfg = _config(tmp_path, sim.base_url, data, conc=2000)
        with open(tmp_path / "run.out", "w") as out:
            p = subprocess.Popen(run_cmd(cfg), env=run_env(), stdout=out, stderr=subprocess.STDOUT,
                                 preexec_fn=_limit(1024, 4096))
        while p.poll() is None:
            peak = max(peak, socket_count(p.pid) or 0)
            time.sleep(0.2)
        rc = p.wait()
    finally:
        if p.poll() is None:
            p.kill()
        sim.stop()
    text = (tmp_path / "run.out").read_text()
    assert rc == 0, text[-3000:]
    assert "warning: open-files limit" not in text
    assert peak > 1024  # more sockets than the soft limit it started with
    doc = live_status(tmp_path / "run")
    assert doc["totals"]["done"] == n and doc["totals"]["failed"] == 0
    print(f"\n2,000 concurrency: peak {peak} sockets, soft limit raised from 1024")


def test_run_completes_when_stdout_is_closed_from_the_start(tmp_path):
    data = write_prompts(tmp_path / "p.jsonl", 30)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"""
[run]
dir = "{tmp_path / 'run'}"
progress_interval_s = 0.2
commit_interval_s = 0.1
[provider.sim]
tokens_per_s = 200
[classes.short]
max_tokens = 200
concurrency = 4
[[datasets]]
name = "a"
path = "{data}"
format = "text"
""")
    p = subprocess.Popen(run_cmd(cfg), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # like `| head -0`: nobody reads the progress
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()[-2000:]
    assert live_status(tmp_path / "run")["totals"]["done"] == 30
