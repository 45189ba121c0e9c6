"""The run directory's watch and the guards on it (issue 34), and log handlers that survive a full disk.

- :class:`engine.storage.rundir.RunDirWatch` on real directories: deleted (``rm -rf``), moved (``mv``),
  replaced (deleted and made again), the store alone deleted, a read-only filesystem (a tmpfs remounted
  ``ro``, root only).
- :mod:`engine.run.guards`: the reserve of free space, the stop and pause decisions and their lines.
- :mod:`engine.run.logsafe`: the same warning within a minute is counted, not repeated; a log file
  on a full device (``/dev/full``: ENOSPC on every write) drops and counts lines, says so once, and
  says how many were dropped once it can write again.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

import pytest
from mounts import can_mount

from engine.money.inflight import InFlightCost
from engine.run import guards
from engine.run.logsafe import LimitedStreamHandler, RepeatLimiter, SafeFileHandler
from engine.run.runstate import PauseKind, RunState
from engine.storage.rundir import DELETED, MOVED, OK, DirHealth, RunDirWatch, store_where

MB = 1_000_000


def _run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "store.sqlite").write_bytes(b"x" * 100)
    return d


# ---- RunDirWatch on real directories ---------------------------------------------------------------
def test_watch_reads_ok_with_free_space(tmp_path):
    d = _run_dir(tmp_path)
    w = RunDirWatch(d, d / "store.sqlite")
    try:
        h = w.probe()
        st = os.statvfs(d)
        assert (h.state, h.unwritable, h.lost) == (OK, "", False)
        assert h.total_bytes == st.f_blocks * st.f_frsize
        assert abs(h.free_bytes - st.f_bavail * st.f_frsize) < 50 * MB  # other tests write meanwhile
    finally:
        w.close()


def test_watch_sees_rm_rf_as_deleted(tmp_path):
    d = _run_dir(tmp_path)
    w = RunDirWatch(d, d / "store.sqlite")
    try:
        shutil.rmtree(d)
        h = w.probe()
        assert (h.state, h.what, h.replaced) == (DELETED, "run directory", False)
        d.mkdir()  # someone makes it again: still the run's own is gone
        h = w.probe()
        assert (h.state, h.replaced) == (DELETED, True)
        assert store_where(h, d / "store.sqlite") == f"{d / 'store.sqlite'} (deleted)"
    finally:
        w.close()


def test_watch_sees_mv_as_moved_and_where_to(tmp_path):
    d = _run_dir(tmp_path)
    w = RunDirWatch(d, d / "store.sqlite")
    try:
        os.rename(d, tmp_path / "elsewhere")
        h = w.probe()
        assert (h.state, h.what, h.now_at, h.replaced) == (MOVED, "run directory", str(tmp_path / "elsewhere"), False)
        assert store_where(h, d / "store.sqlite") == (f"{tmp_path / 'elsewhere' / 'store.sqlite'} "
                                                      f"(moved from {d / 'store.sqlite'})")
    finally:
        w.close()


def test_watch_sees_the_store_alone_deleted(tmp_path):
    d = _run_dir(tmp_path)
    w = RunDirWatch(d, d / "store.sqlite")
    try:
        (d / "store.sqlite").unlink()
        h = w.probe()
        assert (h.state, h.what) == (DELETED, "store")
    finally:
        w.close()


@pytest.mark.skipif(not can_mount(), reason="needs root and permission to mount a tmpfs")
def test_watch_sees_a_read_only_filesystem_and_its_size(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True)
    try:
        d = _run_dir(mnt)
        (mnt / "filler").write_bytes(b"\0" * (3 * 1024 * 1024))
        w = RunDirWatch(d, d / "store.sqlite")
        try:
            h = w.probe()
            assert h.total_bytes == 4 * 1024 * 1024
            assert 0 < h.free_bytes <= 1024 * 1024 - 4096
            subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
            h = w.probe()
            assert (h.state, h.unwritable) == (OK, "read-only file system")
        finally:
            w.close()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


# ---- the guards (pure) -------------------------------------------------------------------------------
def test_reserve_is_margin_plus_slots_capped_at_5_percent():
    assert guards.disk_reserve_bytes(None, 2500) == 32 * 2**20 + 2500 * 64 * 2**10  # 188 MiB
    assert guards.disk_reserve_bytes(10**12, 16) == 33 * 2**20
    assert guards.disk_reserve_bytes(40 * MB, 16) == 2 * MB  # 5% of a 40 MB filesystem


def test_deleted_directory_stops_with_an_abort_and_says_what_was_cut():
    h = DirHealth("/runs/x", DELETED)
    d = guards.run_dir_lost(h, InFlightCost(32, 0.01, 0.04, 0.0242))
    assert (d.abort, d.exit_code) == (True, 4)
    # the headline is what was generated (before: the abort estimate if billed in full, $0.0242 here)
    assert d.reason == ("run directory /runs/x was deleted while running; 32 in-flight stream(s) cut (est. $0.0100 "
                        "already generated is billed for nothing, about $0.0400 if billed in full); the store went "
                        "with it, nothing more is bought")
    assert guards.run_dir_lost(DirHealth("/runs/x"), InFlightCost()) is None


def test_moved_directory_stops_with_a_drain_and_says_where_it_went():
    d = guards.run_dir_lost(DirHealth("/runs/x", MOVED, now_at="/runs/y"), InFlightCost(3))
    assert (d.abort, d.exit_code) == (False, 4)
    assert d.reason == ("run directory /runs/x was moved while running (now at /runs/y); 3 in-flight stream(s) drain "
                        "into the store there; to go on, point run.dir at /runs/y (or move it back) and run again")


def test_disk_pause_and_resume_with_hysteresis():
    run = RunState()
    total, slots = 40 * MB, 16  # reserve 2 MB, resume at 3 MB
    low = DirHealth("/r", free_bytes=int(1.5 * MB), total_bytes=total)
    p = guards.disk(low, run, slots)
    assert p.kind == PauseKind.DISK
    assert p.reason.startswith("disk nearly full: 1.5 MB free on the filesystem of /r, below the 2.0 MB")
    assert p.reason.endswith("resumes by itself at 3.0 MB free")
    run.set_pause(p.kind, p.reason)
    assert guards.disk(low, run, slots) is None  # already paused
    assert not guards.disk_recovered(DirHealth("/r", free_bytes=int(2.5 * MB), total_bytes=total), run, slots)
    assert guards.disk_recovered(DirHealth("/r", free_bytes=3 * MB, total_bytes=total), run, slots)
    run.set_pause(PauseKind.USER, "")  # never lifts another kind of pause
    assert not guards.disk_recovered(DirHealth("/r", free_bytes=30 * MB, total_bytes=total), run, slots)


def test_unwritable_directory_pauses():
    run = RunState()
    p = guards.disk(DirHealth("/r", unwritable="read-only file system", free_bytes=10**9), run, 16)
    assert p.reason.startswith("run directory /r cannot be written (read-only file system); paused")


# ---- logging that survives a full disk ---------------------------------------------------------------
def test_repeat_limiter_counts_repeats_within_the_window():
    t = [0.0]
    lim = RepeatLimiter(60.0, clock=lambda: t[0])
    assert lim.check("k") == (True, 0, 0.0)
    for i in range(311):
        t[0] = 0.1 * (i + 1)
        assert lim.check("k") == (False, 0, 0.0)
    t[0] = 61.0
    assert lim.check("k") == (True, 311, 61.0)
    assert lim.check("other")[0]
    t[0] = 70.0
    lim.check("k")
    assert lim.held() == [("k", 1, 9.0)]


def test_stream_handler_prints_a_repeated_error_once_then_its_count(tmp_path):
    t = [0.0]
    out = (tmp_path / "err.txt").open("w")
    h = LimitedStreamHandler(out, RepeatLimiter(60.0, clock=lambda: t[0]))
    h.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    lg = logging.getLogger("test.repeat")
    lg.propagate, lg.handlers = False, [h]
    lg.setLevel(logging.INFO)
    for i in range(500):
        t[0] = i * 0.1
        lg.error("store commit failed (will retry): %s", "database or disk is full")
    lg.info("info lines are never limited")
    lg.info("info lines are never limited")
    t[0] = 100.0
    lg.error("store commit failed (will retry): %s", "database or disk is full")
    h.close()
    out.close()
    assert (tmp_path / "err.txt").read_text().splitlines() == [
        "ERROR store commit failed (will retry): database or disk is full",
        "INFO info lines are never limited",
        "INFO info lines are never limited",
        "ERROR store commit failed (will retry): database or disk is full (repeated 499 times in the last 100 s)",
    ]


def test_file_handler_on_a_full_device_drops_counts_and_notes_once(tmp_path):
    notes: list[str] = []
    h = SafeFileHandler("/dev/full", note=notes.append)  # every write: ENOSPC
    h.setFormatter(logging.Formatter("%(message)s"))
    lg = logging.getLogger("test.full")
    lg.propagate, lg.handlers = False, [h]
    for i in range(57):
        lg.warning("line %d", i)
    assert h.dropped == 57
    assert notes == ["cannot write /dev/full (No space left on device); log lines are dropped and counted until it "
                     "can be written again"]
    h.baseFilename = str(tmp_path / "datagen.log")  # the disk has room again
    lg.warning("back")
    h.close()
    assert (tmp_path / "datagen.log").read_text().splitlines() == [
        "57 log line(s) dropped while /dev/full could not be written (No space left on device)", "back"]


def test_file_handler_in_a_deleted_directory_never_raises(tmp_path, capfd):
    d = tmp_path / "run"
    d.mkdir()
    notes: list[str] = []
    h = SafeFileHandler(d / "datagen.log", note=notes.append)
    lg = logging.getLogger("test.gone")
    lg.propagate, lg.handlers = False, [h]
    lg.warning("before")
    shutil.rmtree(d)
    h.close()  # the next line reopens by path: the directory is gone
    lg.warning("after")
    lg.warning("after again")
    assert h.dropped == 2 and len(notes) == 1 and "No such file or directory" in notes[0]
    assert "Logging error" not in capfd.readouterr().err
