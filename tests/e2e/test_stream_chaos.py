"""Full load with the stream workers: kill -9 of the run's process group, of one stream worker, and a pause.

Counted against ``datagen sim --log`` (every finished request, with its generation id, prompt key and
whether it was fully sent):

- billed but not stored: completions the simulator fully sent whose generation id is not in the store
  after the rerun (the journal is ingested at start);
- bought twice: prompts with more than one fully sent completion (each was paid twice);
- a pause: no request reaches the simulator while the run is paused once those in flight ended,
  retries included;
- journaled but not committed (issue 34): the completions in the journal files whose prompt has no
  stored result right after the kill; the rerun must store every one of them from the journal
  (``recovered: N completion(s)``), never buy them again;
- a stream worker stopped (``SIGSTOP``) longer than ``stall_s`` (issue 34): shown frozen, and on
  ``SIGCONT`` what the provider finished meanwhile is stored, not cut as a stall and bought again.

``make test`` runs them at 300 streams; ``make chaos`` (``DATAGEN_LONG=1``) at the product's own
scale, 2,000 streams. Counts are asserted, never times.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import sqlite3
import subprocess
import time

import pytest
from e2e import PY, SimProcess, read_log, run_cmd, run_env, status_json, write_prompts
from waiting import wait_for

from engine.stream import journal

# issue 27: minutes of full load with kill -9 of the group and of a stream worker: `make slow` runs it.
pytestmark = [pytest.mark.slow, pytest.mark.serial]  # full load: alone, after the parallel part of `make slow`

LONG = os.environ.get("DATAGEN_LONG") == "1"
#: Streams in flight: the product's scale in `make chaos`, a tenth of it in `make test`.
CONC = 2000 if LONG else 300
PROMPTS = 8000 if LONG else 900
#: Upper bounds of the issue (billed but not stored, bought twice), per kill.
MAX_LOST = 50
#: Tokens/s of each stream in the full-load kill (20: 2,000 streams x 20 = 40k tokens/s in `make chaos`;
#: DATAGEN_KILL_TOKENS_PER_S=5 gives issue 37's ~10k tokens/s; the requests' total limit grows so the
#: longest completions, ~1,800 tokens of 200 mean, still finish).
KILL_TOKENS_PER_S = max(1, int(os.environ.get("DATAGEN_KILL_TOKENS_PER_S", "20")))


def _config(tmp_path, base_url, data, *, faults: bool = False, workers: int = 1, stall_s: float = 30, total_s: int = 300,
            anomaly: str = "anomaly_error_rate = 0"):
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"""
[run]
name = "load"
dir = "{tmp_path / 'run'}"
progress_interval_s = 1
max_attempts = 10
stream_workers = {workers}
[provider]
kind = "openai"
base_url = "{base_url}"
api_key_env = "E2E_KEY"
[provider.timeouts]
connect_s = 10
stall_s = {stall_s}
total_s = {total_s}
[spend]
{anomaly}
[classes.short]
max_tokens = 4096
concurrency = {CONC}
[[datasets]]
name = "load"
path = "{data}"
format = "text"
""")
    return cfg


def _sim(tmp_path, *extra, tokens_per_s: int = 100):
    log = tmp_path / "sim.jsonl"
    return SimProcess("--seed", "7", "--mean-completion-tokens", "200", "--tokens-per-s", str(tokens_per_s),
                      "--latency-ms", "20", *extra, log=log), log


def _start(cfg, out):
    return subprocess.Popen(run_cmd(cfg), env=run_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _counts(run_dir, log, kill_t: float | None = None):
    """(billed but not stored, bought twice, stored) from the simulator's log and the store; with
    ``kill_t``, also prints when the not-stored ones finished relative to the kill (s)."""
    entries = read_log(log)
    sent = [e for e in entries if e["outcome"] == "completed" and e["fully_sent"]]
    db = sqlite3.connect(run_dir / "store.sqlite")
    try:
        stored = {g for (g,) in db.execute("SELECT generation_id FROM results")}
    finally:
        db.close()
    not_stored = [e for e in sent if e["generation_id"] not in stored]
    if kill_t is not None and not_stored:
        ago = sorted(kill_t - e["t"] for e in not_stored)
        print(f"\nnot stored: finished {ago[0]:.3f}..{ago[-1]:.3f} s before the kill (median {ago[len(ago) // 2]:.3f})")
    per_key = collections.Counter(e["prompt_key"] for e in sent)
    twice = sum(n - 1 for n in per_key.values() if n > 1)
    return len(not_stored), twice, len(stored)


def _journaled_not_committed(run_dir) -> dict[str, str]:
    """Right after a kill: generation id -> prompt key of every completion in the journal files
    (read from disk) whose prompt has no stored result."""
    db = sqlite3.connect(run_dir / "store.sqlite")
    try:
        stored = {(d, k) for d, k in db.execute("SELECT dataset, key FROM results")}
    finally:
        db.close()
    recs = [r for seg in journal.segments(run_dir / "journal") for r in journal.read_records(seg)]
    return {r["c"]["generation_id"]: r["k"] for r in recs if (r["d"], r["k"]) not in stored}


def _recovered(out: str) -> int:
    """N of the rerun's ``recovered: N completion(s) ... stored from the stream workers' journals``."""
    m = re.search(r"recovered: (\d+) completion\(s\)", out)
    return int(m.group(1)) if m else 0


def _in_flight(run_dir) -> int:
    try:
        return status_json(run_dir)["totals"]["in_flight"]
    except Exception:
        return 0


@pytest.mark.timeout((900 + 3 * 4096 // KILL_TOKENS_PER_S) if LONG else 400)
def test_kill9_of_the_process_group_at_full_load_loses_almost_nothing(tmp_path):
    data = write_prompts(tmp_path / "prompts.jsonl", PROMPTS, tag="kill ")
    # streams paced like a real provider (20 tokens/s each, as B2): 2,000 x 20 = 40k tokens/s
    sim, log = _sim(tmp_path, tokens_per_s=KILL_TOKENS_PER_S)
    run_dir = tmp_path / "run"
    try:
        cfg = _config(tmp_path, sim.base_url, data, total_s=max(300, 4096 // KILL_TOKENS_PER_S + 60))
        with open(tmp_path / "run1.out", "w") as out:
            p = _start(cfg, out)
            try:
                wait_for(lambda: _in_flight(run_dir) >= CONC * 0.9, 240, interval=0.2, what="streams in flight")
                wait_for(lambda: sum(1 for _ in open(log)) >= CONC * 0.5, 240, interval=0.2, what="completions")
            finally:
                kill_t = time.time()
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        time.sleep(1)
        sent_before = sum(1 for e in read_log(log) if e["outcome"] == "completed" and e["fully_sent"])
        journaled = _journaled_not_committed(run_dir)
        with open(tmp_path / "run2.out", "w") as out:
            p2 = _start(cfg, out)
            try:
                limit = (600 if LONG else 300) * 20 // KILL_TOKENS_PER_S  # slower streams: a longer rerun
                assert p2.wait(limit) == 0, (tmp_path / "run2.out").read_text()[-3000:]
            finally:
                if p2.poll() is None:
                    os.killpg(p2.pid, signal.SIGKILL)
    finally:
        sim.stop()
    not_stored, twice, stored = _counts(run_dir, log, kill_t)
    out2 = (tmp_path / "run2.out").read_text()
    print(f"\nkill -9 of the process group at {CONC} streams after {sent_before} completions: billed but not "
          f"stored {not_stored}, bought twice {twice}, stored {stored}/{PROMPTS}; {len(journaled)} journaled but "
          f"not committed at the kill; rerun said: "
          f"{next((ln for ln in out2.splitlines() if ln.startswith('recovered')), '(nothing recovered)')}")
    assert stored == PROMPTS
    assert _recovered(out2) == len(journaled)  # every journaled, uncommitted completion stored from the journal
    db = sqlite3.connect(run_dir / "store.sqlite")
    stored_gids = {g for (g,) in db.execute("SELECT generation_id FROM results")}
    db.close()
    assert set(journaled) <= stored_gids
    assert not_stored <= MAX_LOST and twice <= MAX_LOST
    assert "recovered: " in out2 and "stream(s) cut by its end counted as lost spend" in out2
    doc = status_json(run_dir)
    assert doc["stream_workers"]["configured"] == 1
    db = sqlite3.connect(run_dir / "store.sqlite")
    (cut,) = db.execute("SELECT COUNT(*) FROM attempts WHERE outcome='aborted' AND message LIKE 'stream cut%'").fetchone()
    db.close()
    assert cut >= CONC * 0.5  # the streams the kill cut are counted as lost spend


@pytest.mark.timeout(900 if LONG else 400)
def test_a_run_held_stopped_then_killed_stores_what_its_workers_journaled_meanwhile(tmp_path):
    """Issue 34: the run's process held (SIGSTOP) 3 s at full load, then the whole group killed. The
    workers went on streaming and journaling; nothing reached the store. Before, the journal segments
    had been deleted at start (while the workers had them open): the rerun found nothing and bought
    all of them (95 in the issue) again. Now each is stored from the journal, and bought once."""
    data = write_prompts(tmp_path / "prompts.jsonl", PROMPTS, tag="held ")
    sim, log = _sim(tmp_path, tokens_per_s=20)
    run_dir = tmp_path / "run"
    try:
        cfg = _config(tmp_path, sim.base_url, data)
        with open(tmp_path / "run1.out", "w") as out:
            p = _start(cfg, out)
            try:
                wait_for(lambda: _in_flight(run_dir) >= CONC * 0.9, 240, interval=0.2, what="streams in flight")
                wait_for(lambda: sum(1 for _ in open(log)) >= CONC * 0.3, 240, interval=0.2, what="completions")
                os.kill(p.pid, signal.SIGSTOP)  # the run's own process; its stream workers go on
                time.sleep(3)
            finally:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        time.sleep(1)
        journaled = _journaled_not_committed(run_dir)
        with open(tmp_path / "run2.out", "w") as out:
            p2 = _start(cfg, out)
            try:
                assert p2.wait(600 if LONG else 300) == 0, (tmp_path / "run2.out").read_text()[-3000:]
            finally:
                if p2.poll() is None:
                    os.killpg(p2.pid, signal.SIGKILL)
    finally:
        sim.stop()
    not_stored, twice, stored = _counts(run_dir, log)
    out2 = (tmp_path / "run2.out").read_text()
    sent = collections.Counter(e["prompt_key"] for e in read_log(log) if e["outcome"] == "completed" and e["fully_sent"])
    journaled_twice = sum(1 for k in journaled.values() if sent[k] > 1)
    print(f"\nrun held stopped 3 s at {CONC} streams, then kill -9: {len(journaled)} completion(s) journaled but not "
          f"committed, {_recovered(out2)} recovered from the journal, {journaled_twice} of them bought again; "
          f"overall billed but not stored {not_stored}, bought twice {twice}, stored {stored}/{PROMPTS}")
    assert len(journaled) >= 10  # the stop held results back from the store (before: 0, the files were gone)
    assert _recovered(out2) == len(journaled)
    db = sqlite3.connect(run_dir / "store.sqlite")
    stored_gids = {g for (g,) in db.execute("SELECT generation_id FROM results")}
    db.close()
    assert set(journaled) <= stored_gids
    assert journaled_twice == 0
    assert stored == PROMPTS and not_stored <= MAX_LOST and twice <= MAX_LOST


@pytest.mark.timeout(400)
def test_a_stream_worker_stopped_past_the_stall_timeout_stalls_nothing(tmp_path):
    """Issue 34: one of 2 stream workers stopped 8 s with ``stall_s = 2``. Before: ``status`` showed it
    alive, and on SIGCONT every stream it held was cut as ``stall: no bytes for 2s`` (what the
    provider had finished meanwhile was bought again), enough to trip the error-rate guard. Now it
    is shown frozen while stopped, and its streams go on when it runs again."""
    data = write_prompts(tmp_path / "prompts.jsonl", PROMPTS, tag="frozen ")
    sim, log = _sim(tmp_path, tokens_per_s=20)
    run_dir = tmp_path / "run"
    try:
        cfg = _config(tmp_path, sim.base_url, data, workers=2, stall_s=2, anomaly="anomaly_error_rate = 0.2")
        with open(tmp_path / "run.out", "w") as out:
            p = _start(cfg, out)
            try:
                wait_for(lambda: _in_flight(run_dir) >= CONC * 0.9, 240, interval=0.2, what="streams in flight")
                victim = status_json(run_dir)["stream_workers"]["workers"][0]
                held = victim["in_flight"]
                os.kill(victim["pid"], signal.SIGSTOP)
                try:
                    t0 = time.monotonic()
                    doc = wait_for(lambda: (d := status_json(run_dir))["stream_workers"]["frozen"] == 1 and d, 20,
                                   interval=0.2, what="the stopped worker shown frozen")
                    text = subprocess.run([PY, "-m", "datagen", "status", str(run_dir)], capture_output=True,
                                          text=True, timeout=60).stdout
                    time.sleep(max(0.0, 8 - (time.monotonic() - t0)))
                finally:
                    os.kill(victim["pid"], signal.SIGCONT)
                w0 = doc["stream_workers"]["workers"][0]
                assert (w0["alive"], w0["frozen"], w0["pid"]) == (True, True, victim["pid"]) and w0["silent_s"] >= 5
                assert f"stream worker 0 (pid {victim['pid']}): not answering for" in text
                assert p.wait(300) == 0, (tmp_path / "run.out").read_text()[-3000:]
            finally:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
    finally:
        sim.stop()
    not_stored, twice, stored = _counts(run_dir, log)
    db = sqlite3.connect(run_dir / "store.sqlite")
    stalls = db.execute("SELECT COUNT(*) FROM attempts WHERE error_class = 'stall'").fetchone()[0]
    events = db.execute("SELECT level, message FROM events WHERE kind = 'stream_worker' ORDER BY id").fetchall()
    paused = db.execute("SELECT COUNT(*) FROM events WHERE message LIKE '%paus%'").fetchone()[0]
    db.close()
    print(f"\none of 2 stream workers stopped 8 s (stall_s 2) holding {held} streams: {stalls} stall(s), billed but "
          f"not stored {not_stored}, bought twice {twice}, stored {stored}/{PROMPTS}")
    assert (stalls, not_stored, twice, stored) == (0, 0, 0, PROMPTS)  # before: ~held stalls, bought again
    assert paused == 0  # no guard paused the run
    assert [lv for lv, _ in events] == ["warning", "info"]
    assert "has not answered for" in events[0][1] and "answers again after" in events[1][1]
    assert status_json(run_dir)["stream_workers"]["restarts"] == 0


@pytest.mark.timeout(900 if LONG else 400)
def test_kill9_of_one_stream_worker_returns_its_streams_and_the_run_completes(tmp_path):
    data = write_prompts(tmp_path / "prompts.jsonl", PROMPTS, tag="worker ")
    # the full load, as the process-group kill: 20 tokens/s per stream
    sim, log = _sim(tmp_path, tokens_per_s=20)
    run_dir = tmp_path / "run"
    try:
        cfg = _config(tmp_path, sim.base_url, data, workers=2)
        with open(tmp_path / "run.out", "w") as out:
            p = _start(cfg, out)
            try:
                wait_for(lambda: _in_flight(run_dir) >= CONC * 0.9, 240, interval=0.2, what="streams in flight")
                time.sleep(2)
                doc = status_json(run_dir)
                victim = doc["stream_workers"]["workers"][0]
                assert victim["alive"] and victim["in_flight"] > 0
                os.kill(victim["pid"], signal.SIGKILL)
                wait_for(lambda: status_json(run_dir)["stream_workers"]["restarts"] == 1, 60, interval=0.2, what="a restart")
                assert p.wait(600 if LONG else 300) == 0, (tmp_path / "run.out").read_text()[-3000:]
            finally:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
    finally:
        sim.stop()
    not_stored, twice, stored = _counts(run_dir, log)
    doc = status_json(run_dir)
    sw = doc["stream_workers"]
    print(f"\nkill -9 of one of 2 stream workers at {CONC} streams: {sw['lost_requests']} returned to pending, "
          f"{sw['recovered']} recovered from its journal; billed but not stored {not_stored}, bought twice {twice}")
    assert stored == PROMPTS
    assert not_stored <= MAX_LOST and twice <= MAX_LOST
    assert sw["restarts"] == 1 and sw["lost_requests"] > 0
    db = sqlite3.connect(run_dir / "store.sqlite")
    events = [m for (m,) in db.execute("SELECT message FROM events WHERE kind='stream_worker'")]
    (aborted,) = db.execute("SELECT COUNT(*) FROM attempts WHERE outcome='aborted'").fetchone()
    (failed,) = db.execute("SELECT COUNT(*) FROM prompts WHERE state='failed'").fetchone()
    db.close()
    assert len(events) == 1 and "killed by signal 9" in events[0] and "took its place" in events[0]
    assert aborted == sw["lost_requests"]  # each counted once, with its streamed spend
    assert failed == 0  # a worker's death fails no prompt


@pytest.mark.timeout(400)
def test_pause_all_sends_nothing_once_in_flight_ended_retries_included(tmp_path):
    """Half the requests fail with a retryable 429 or 502: retries are due all the time. Once the
    run is paused and the requests in flight ended, nothing reaches the simulator."""
    data = write_prompts(tmp_path / "prompts.jsonl", PROMPTS, tag="pause ")
    sim, log = _sim(tmp_path, "--faults", "429:0.3,502:0.2")
    run_dir = tmp_path / "run"
    try:
        cfg = _config(tmp_path, sim.base_url, data)
        with open(tmp_path / "run.out", "w") as out:
            p = _start(cfg, out)
            try:
                wait_for(lambda: _in_flight(run_dir) >= CONC * 0.5, 240, interval=0.2, what="streams in flight")
                time.sleep(2)
                r = subprocess.run([*run_cmd(cfg)[:3], "ctl", str(run_dir), "pause"], env=run_env(),
                                   capture_output=True, text=True, timeout=60)
                assert r.returncode == 0, r.stdout + r.stderr
                wait_for(lambda: _in_flight(run_dir) == 0, 240, interval=0.2, what="in flight ended")
                time.sleep(1.5)  # the simulator logs a request when it finished
                before = len(read_log(log))
                time.sleep(8)  # retries are due within seconds (backoff from 1 s)
                after = len(read_log(log))
                doc = status_json(run_dir)
                assert doc["run"]["state"] == "paused"
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(120)
            finally:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
    finally:
        sim.stop()
    entries = read_log(log)
    retried = collections.Counter(e["prompt_key"] for e in entries)
    print(f"\npause at {CONC} streams with 50% faults: {after - before} requests reached the simulator while paused "
          f"({before} before); {sum(1 for n in retried.values() if n > 1)} prompts had been retried")
    assert sum(1 for n in retried.values() if n > 1) > 50  # retries were really happening
    assert after - before == 0


def test_status_json_names_the_stream_workers(tmp_path):
    data = write_prompts(tmp_path / "prompts.jsonl", 20, tag="small ")
    sim, _log = _sim(tmp_path)
    try:
        cfg = _config(tmp_path, sim.base_url, data, workers=2)
        r = subprocess.run(run_cmd(cfg), env=run_env(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        sim.stop()
    doc = status_json(tmp_path / "run")
    sw = doc["stream_workers"]
    assert (sw["configured"], sw["alive"], sw["restarts"], sw["lost_requests"]) == (2, 0, 0, 0)
    assert [w["slot"] for w in sw["workers"]] == [0, 1] and all(w["pid"] > 0 for w in sw["workers"])
    assert list((tmp_path / "run" / "journal").iterdir()) == []  # every journaled result committed: pruned
    json.dumps(doc)
