"""The stream workers' journals on the real file system while a run runs (issue 34).

Before: the run started its stream workers (each opens its first journal segment at once) and only
then ingested the journals of earlier processes, deleting every segment in ``RUN_DIR/journal``, its
own workers' open ones included: ``/proc/WORKER/fd`` showed ``w0-PID-0000.jsonl (deleted)``, and a
``kill -9`` then found nothing to recover (every completion journaled but not yet committed was
bought again). Here a real ``datagen run`` streams slowly from the simulator while the test reads
``/proc/PID/fd`` of each worker and the files it names.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
from pathlib import Path

from e2e import SimProcess, live_status, read_log, run_cmd, run_env, write_prompts
from waiting import wait_for

from engine.stream import journal

PROMPTS = 60
CONC = 20


def _config(tmp_path: Path, base_url: str, data: Path) -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"""
[run]
name = "journal"
dir = "{tmp_path / 'run'}"
progress_interval_s = 1
stream_workers = 2
[provider]
kind = "openai"
base_url = "{base_url}"
api_key_env = "E2E_KEY"
[classes.short]
max_tokens = 4096
concurrency = {CONC}
[[datasets]]
name = "j"
path = "{data}"
format = "text"
""")
    return cfg


def _workers(run_dir: Path) -> list[tuple[int, int]]:
    """``(slot, pid)`` of the live stream workers, as the running engine reports them."""
    doc = live_status(run_dir)
    if not doc or not doc.get("stream_workers"):
        return []
    return [(w["slot"], w["pid"]) for w in doc["stream_workers"]["workers"] if w["alive"] and w["pid"]]


def _journal_fds(pid: int) -> list[str]:
    """Targets of the worker's open descriptors under a ``journal`` directory, as the kernel names them."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if "/journal/" in target:
            out.append(target)
    return out


def _check_open_segments(run_dir: Path, workers: list[tuple[int, int]]) -> list[Path]:
    """Each worker holds exactly one journal segment open, named after it, and that name exists."""
    paths = []
    for slot, pid in workers:
        fds = _journal_fds(pid)
        assert len(fds) == 1, f"worker {slot} (pid {pid}) has journal descriptors {fds}"
        assert not fds[0].endswith(" (deleted)"), f"worker {slot}'s open journal segment was deleted: {fds[0]}"
        p = Path(fds[0])
        assert p.parent == run_dir / "journal" and p.name.startswith(f"w{slot}-{pid}-") and p.exists()
        paths.append(p)
    return paths


def test_each_workers_open_journal_segment_exists_and_holds_what_was_committed(tmp_path):
    data = write_prompts(tmp_path / "prompts.jsonl", PROMPTS, tag="journal ")
    log = tmp_path / "sim.jsonl"
    # streams of about 4 s (80 tokens at 20 tokens/s): the first completions come seconds after start
    sim = SimProcess("--seed", "5", "--mean-completion-tokens", "80", "--tokens-per-s", "20", "--latency-ms", "20",
                     log=log)
    run_dir = tmp_path / "run"
    try:
        cfg = _config(tmp_path, sim.base_url, data)
        with open(tmp_path / "run.out", "w") as out:
            p = subprocess.Popen(run_cmd(cfg), env=run_env(), stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
            try:
                workers = wait_for(lambda: len(_workers(run_dir)) == 2 and _workers(run_dir), 60, interval=0.1,
                                   what="two stream workers up")
                wait_for(lambda: (live_status(run_dir) or {}).get("totals", {}).get("in_flight", 0) > 0, 60,
                         interval=0.1, what="streams in flight")
                # before any completion: the segments the workers opened at start are still there
                _check_open_segments(run_dir, workers)
                wait_for(lambda: sum(1 for _ in open(log)) >= 25 if log.exists() else False, 120, interval=0.1,
                         what="25 completions")
                segs = _check_open_segments(run_dir, workers)
                # every committed result was journaled first, in the segment its worker still has open
                db = sqlite3.connect(f"file:{run_dir / 'store.sqlite'}?mode=ro", uri=True)
                try:
                    committed = {g for (g,) in db.execute("SELECT generation_id FROM results")}
                finally:
                    db.close()
                journaled = {r["c"]["generation_id"] for s in segs for r in journal.read_records(s)}
                assert len(committed) >= 10 and committed <= journaled, (len(committed), len(journaled))
                ledgers = {q.name for q in (run_dir / "journal").glob("inflight-*.json")}
                assert {f"inflight-w{slot}-{pid}.json" for slot, pid in workers} <= ledgers
                assert p.wait(180) == 0, (tmp_path / "run.out").read_text()[-3000:]
            finally:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
    finally:
        sim.stop()
    sent = [e for e in read_log(log) if e["outcome"] == "completed" and e["fully_sent"]]
    assert len(sent) == PROMPTS  # nothing bought twice
    assert "journal segment" not in (run_dir / "stream-workers.log").read_text()  # no segment lost its name
    assert list((run_dir / "journal").iterdir()) == []  # all committed: pruned at the end
