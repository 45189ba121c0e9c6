"""The run directory under a live ``datagen run``, and what operators' mistakes print (issue 34).

Real processes: ``datagen sim`` (its ``--log`` is what was billed) and ``datagen run --headless``.

- ``rm -rf`` of the run directory mid-run: the run stops within a few seconds (exit 4), the streams in
  flight are cut, the simulator bills at most the streams in flight plus about one second of dispatch
  after the deletion, one clear last line; before: 277-483 completions bought after the deletion.
- ``mv`` of the run directory: the run stops (exit 4) and drains what is in flight into the store where
  it went; every completion the simulator billed is in that store, once.
- A nearly full disk (a tmpfs with a filler file; root only): the run pauses before any commit fails
  and resumes by itself once space is freed, completing every prompt.
- A full disk (a 1.5 MB tmpfs; root only): a handful of lines, no ``--- Logging error ---``, no traceback;
  the same error is counted, not repeated.
- Another local user (``setpriv`` to ``nobody``; root only): ``status``, ``ctl``, ``validate``,
  ``export``, ``report`` on a 0700 run directory print one line naming the path and the access needed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from e2e import PY, SimProcess, live_status, read_log, run_env, wait_for, write_prompts
from mounts import can_mount

EXIT_DIR_LOST = 4


def _config(tmp_path: Path, base_url: str, data: Path, run_dir: Path, *, conc: int = 16) -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"""
[run]
name = "dirlost"
dir = "{run_dir}"
progress_interval_s = 1
commit_interval_s = 0.2
[provider]
kind = "openai"
base_url = "{base_url}"
api_key_env = "E2E_KEY"
[classes.short]
max_tokens = 8192
concurrency = {conc}
[[datasets]]
name = "d"
path = "{data}"
format = "text"
""")
    return cfg


def _start(tmp_path: Path, cfg: Path) -> subprocess.Popen:
    out, err = open(tmp_path / "run.out", "w"), open(tmp_path / "run.err", "w")
    p = subprocess.Popen([PY, "-m", "datagen", "run", str(cfg), "--headless"], env=run_env(), stdout=out, stderr=err)
    out.close()
    err.close()
    return p


def _done(run_dir: Path) -> int:
    doc = live_status(run_dir)
    return doc["totals"]["done"] if doc else 0


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


@pytest.fixture
def sim(tmp_path):
    # 200 tokens at 200 tokens/s: each stream lasts about a second, so 16 are always in flight
    s = SimProcess("--tokens-per-s", "200", "--mean-completion-tokens", "200", "--seed", "3",
                   log=tmp_path / "sim.jsonl")
    yield s
    s.stop()


def test_rm_rf_of_the_run_directory_stops_the_run_within_seconds(tmp_path, sim):
    run_dir = tmp_path / "run"
    cfg = _config(tmp_path, sim.base_url, write_prompts(tmp_path / "p.jsonl", 3000), run_dir)
    p = _start(tmp_path, cfg)
    try:
        wait_for(lambda: _done(run_dir) >= 40 or p.poll() is not None, 60)
        assert p.poll() is None, (tmp_path / "run.err").read_text()
        t_del = time.time()
        shutil.rmtree(run_dir)
        code = p.wait(15)
        took = time.time() - t_del
    finally:
        if p.poll() is None:
            p.kill()
    out, err = _lines(tmp_path / "run.out"), _lines(tmp_path / "run.err")
    assert code == EXIT_DIR_LOST, (out[-5:], err)
    assert took < 8.0  # detected within ~1 s, the cut streams answer within the 5 s cut grace
    last = out[-1]
    assert last.startswith(f"run stopped: run directory {run_dir} was deleted while running; ")
    cut = re.search(r"; (\d+) in-flight stream\(s\) cut \(est\. \$([0-9.]+) already generated is billed for "
                    r"nothing, about \$([0-9.]+) if billed in full\); the store went with it, nothing more is bought",
                    last)
    assert cut is not None, last
    generated, in_full = float(cut.group(2)), float(cut.group(3))
    assert 0 < generated < in_full  # the headline is what was generated, not the completions' whole price
    assert last.endswith(f"store {run_dir / 'store.sqlite'} (deleted)")
    assert not any("Traceback" in line or "Logging error" in line for line in out + err)
    assert len(err) <= 4, err  # the stop's line and the abort's line
    time.sleep(1.0)  # the simulator logs a dropped stream when it reads the connection's end
    log = read_log(tmp_path / "sim.jsonl")
    after = [e for e in log if e["t"] > t_del]
    (tmp_path / "after_deletion.json").write_text(json.dumps(  # the figures, for the record
        {"requests": len(after), "usd": sum(e["cost_usd"] for e in after), "stopped_after_s": took,
         "cut": int(cut.group(1)), "est_generated_usd": generated, "est_in_full_usd": in_full}))
    # the cut streams are billed what they generated until the simulator saw the cut (no less than the
    # run had received): the headline stays within the simulator's bill (before: $0.0109 against $0.0066)
    assert generated <= sum(e["cost_usd"] for e in after) + 1e-4
    print(f"\nafter the deletion: {len(after)} request(s) billed ${sum(e['cost_usd'] for e in after):.4f} by the "
          f"simulator; the line: {cut.group(1)} cut, est. ${generated:.4f} generated, ${in_full:.4f} in full")
    # bound: the 16 streams in flight at the deletion, plus those dispatched before it was seen
    # (a check every second: about 16 req/s here) -- 2 x concurrency + 16; before the fix 277-483
    assert len(after) <= 48, len(after)
    assert not run_dir.exists()


def test_mv_of_the_run_directory_stops_and_drains_into_the_moved_store(tmp_path, sim):
    run_dir, moved = tmp_path / "run", tmp_path / "moved"
    cfg = _config(tmp_path, sim.base_url, write_prompts(tmp_path / "p.jsonl", 3000), run_dir)
    p = _start(tmp_path, cfg)
    try:
        wait_for(lambda: _done(run_dir) >= 40 or p.poll() is not None, 60)
        assert p.poll() is None, (tmp_path / "run.err").read_text()
        os.rename(run_dir, moved)
        code = p.wait(20)
    finally:
        if p.poll() is None:
            p.kill()
    out = _lines(tmp_path / "run.out")
    assert code == EXIT_DIR_LOST, out[-5:]
    assert out[-1].startswith(f"run stopped: run directory {run_dir} was moved while running (now at {moved}); ")
    assert out[-1].endswith(f"store {moved / 'store.sqlite'} (moved from {run_dir / 'store.sqlite'})")
    time.sleep(1.0)
    completed = [e["prompt_key"] for e in read_log(tmp_path / "sim.jsonl") if e["outcome"] == "completed"]
    db = sqlite3.connect(moved / "store.sqlite")
    stored = {k for (k,) in db.execute("SELECT key FROM results")}
    db.close()
    assert set(completed) == stored and len(completed) == len(stored)  # every billed completion stored, once
    assert not run_dir.exists()


# ---- disks: root and a tmpfs ---------------------------------------------------------------------
needs_mount = pytest.mark.skipif(not can_mount(), reason="needs root and permission to mount a tmpfs")


@pytest.fixture
def tmpfs(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@needs_mount
def test_nearly_full_disk_pauses_before_writes_fail_and_resumes(tmp_path, tmpfs):
    # a 64 MiB tmpfs: the reserve is 5% of it, 3.4 MB (resume at 5.1 MB); about 5.5 MB left free, filled by
    # the store and its WAL at ~250 kB/s (~1.5 kB results, 16 streams of 0.1 s)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(tmpfs)], check=True)
    filler = tmpfs / "filler"
    filler.write_bytes(b"\0" * (61 * 1024 * 1024 - 2 * 1024 * 1024))
    sim = SimProcess("--tokens-per-s", "2000", "--mean-completion-tokens", "200", log=tmp_path / "sim.jsonl")
    try:
        n = 3000
        cfg = _config(tmp_path, sim.base_url, write_prompts(tmp_path / "p.jsonl", n), tmpfs / "run")
        p = _start(tmp_path, cfg)
        try:
            wait_for(lambda: any("disk nearly full" in line for line in _lines(tmp_path / "run.out"))
                     or p.poll() is not None, 90)
            assert p.poll() is None, _lines(tmp_path / "run.out")[-5:]
            time.sleep(2.0)  # paused: in-flight streams finish and are stored
            done_paused = _done(tmpfs / "run")
            time.sleep(2.0)
            assert _done(tmpfs / "run") == done_paused  # nothing more is bought while paused
            filler.unlink()
            code = p.wait(120)
        finally:
            if p.poll() is None:
                p.kill()
    finally:
        sim.stop()
    out, err = _lines(tmp_path / "run.out"), _lines(tmp_path / "run.err")
    assert code == 0, (out[-5:], err)
    paused = next(line for line in out if line.startswith("GUARD: run paused by a guard: disk nearly full: "))
    assert f"free on the filesystem of {tmpfs / 'run'}, below the 3.4 MB the run keeps" in paused
    assert not any("store commits fail" in line or "commit failed" in line for line in out + err)  # never failed
    db = sqlite3.connect(tmpfs / "run" / "store.sqlite")
    assert db.execute("SELECT COUNT(*) FROM results").fetchone()[0] == n
    db.close()


@needs_mount
def test_full_disk_prints_a_few_lines_not_thousands(tmp_path, tmpfs):
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", str(tmpfs)], check=True)
    sim = SimProcess("--tokens-per-s", "0", "--mean-completion-tokens", "2000", log=tmp_path / "sim.jsonl")
    try:
        cfg = _config(tmp_path, sim.base_url, write_prompts(tmp_path / "p.jsonl", 400), tmpfs / "run")
        p = _start(tmp_path, cfg)
        try:
            wait_for(lambda: any("store commits fail" in line for line in _lines(tmp_path / "run.out"))
                     or p.poll() is not None, 60)
            time.sleep(15.0)  # before: ~200 lines a second here, 160 of them logging tracebacks in 40 s
            p.send_signal(signal.SIGTERM)
            code = p.wait(60)
        finally:
            if p.poll() is None:
                p.kill()
    finally:
        sim.stop()
    out, err = _lines(tmp_path / "run.out"), _lines(tmp_path / "run.err")
    assert code == 130
    assert not any("Traceback" in line or "Logging error" in line for line in out + err), err[:20]
    failed = [line for line in err if line.startswith("ERROR store commit failed (will retry): database or disk is full")]
    assert 1 <= len(failed) <= 2, err  # once, then once more with its count at the end
    assert len(err) <= 12, err
    assert len(out) <= 60  # progress lines every second for ~20 s, nothing else repeated


# ---- another local user -------------------------------------------------------------------------
def _can_setpriv() -> bool:
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


@pytest.fixture
def open_base():
    """A directory every user may search (pytest's own tmp directories are 0700), removed after."""
    base = Path(f"/tmp/datagen-perm-{uuid.uuid4().hex[:8]}")
    base.mkdir(mode=0o755)
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _as_nobody(argv: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", PY, "-m", "datagen", *argv],
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not _can_setpriv(), reason="needs root and setpriv to run a command as another user (nobody)")
def test_another_user_gets_one_line_per_command(tmp_path, sim, open_base):
    run_dir = open_base / "run"
    cfg = _config(tmp_path, sim.base_url, write_prompts(tmp_path / "p.jsonl", 10), run_dir)
    assert subprocess.run([PY, "-m", "datagen", "run", str(cfg), "--headless"], env=run_env(),
                          capture_output=True, timeout=120).returncode == 0
    assert os.stat(run_dir).st_mode & 0o777 == 0o700  # as every run directory is made
    env = {**run_env(), "MPLCONFIGDIR": str(open_base / "mpl")}
    cases = [(["status", str(run_dir)], 1), (["status", str(run_dir), "--json"], 1),
             (["ctl", str(run_dir), "pause"], 1), (["validate", str(run_dir)], 2),
             (["export", str(run_dir), "--out", str(open_base / "x")], 2),
             (["report", str(run_dir), "--out", str(open_base / "x")], 2)]
    for argv, want in cases:
        r = _as_nobody(argv, env)
        assert r.returncode == want, (argv, r.stderr)
        assert r.stdout == ""
        assert r.stderr.splitlines() == [
            f"error: permission denied: {run_dir} (owned by root, mode 0700): datagen {argv[0]} needs read, write and "
            f"search (rwx) on the run directory and read and write (rw) on its store.sqlite (SQLite's WAL mode writes "
            f"even to read); run it as root, or ask root to grant access (e.g. chmod g+rwx and a shared group)"], argv
    os.chmod(run_dir, 0o755)  # a closed directory above it (pytest's 0700 tmp) is named as such
    hidden = tmp_path / "hidden-run"
    hidden.mkdir()
    r = _as_nobody(["status", str(hidden)], env)
    assert (r.returncode, r.stderr.splitlines()) == (1, [
        f"error: permission denied: {hidden} (a directory above it cannot be searched by this user): datagen status "
        f"needs read, write and search (rwx) on the run directory and read and write (rw) on its store.sqlite "
        f"(SQLite's WAL mode writes even to read)"])
    assert json.loads(subprocess.run([PY, "-m", "datagen", "status", str(run_dir), "--json"], capture_output=True,
                                     text=True, check=True).stdout)["totals"]["done"] == 10  # the owner still reads it
