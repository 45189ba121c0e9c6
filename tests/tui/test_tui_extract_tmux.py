"""``datagen extract CONFIG`` in a real terminal (tmux, 160x48) on the tiny model (CPU workers):
the extraction view appears, ``p`` pauses (the worker's status file says ``paused`` and the
manifest stops growing), ``p`` resumes, ``q`` drains and the process exits 0 with every written
sample in the manifest once (a rerun finishes the rest: every sample exactly once); Ctrl-C once
drains and exits 130 (samples left), twice aborts (exit 130) and a rerun resumes exactly once; a
start refused by prepare (not enough disk) prints an ``error:`` line on the restored terminal and
exits 1. Marked slow: Ctrl-C once and twice, SIGINT twice to the process
group, the terminal lost (kill-session) and a signal after `q`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from extract_jobs import DATAGEN, exit_code, extract_config, finish_headless, manifest_ids, worker_state
from tmuxterm import Tmux
from waiting import wait_for

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.serial,
              pytest.mark.skipif(shutil.which("tmux") is None,
                                 reason="tmux is not installed (apt-get install -y tmux); CI installs it")]

N = 900  # samples: small batches of these keep a CPU worker busy for several seconds


@pytest.mark.slow  # issue 27: long e2e test (>9 s on 2 cores), run by `make slow`
def test_view_pause_resume_quit(tmp_path: Path, tiny: Path, tmux: Tmux) -> None:
    cfg, out, ids = extract_config(tmp_path, tiny)
    rc = tmux.start(tmp_path, f"{DATAGEN} extract {cfg} --data {tmp_path / 'data'}")
    wait_for(lambda: "GPUs · workers" in tmux.screen() and "RUNNING" in tmux.screen().upper(), 60,
         "the extraction view, running", tmux.screen)
    wait_for(lambda: worker_state(out).get("samples_done", 0) > 0, 60, "the first batch", tmux.screen)
    # the workers never write to the dashboard's terminal: their output is in a log file
    assert (out / "status" / "worker-0.log").is_file()

    tmux("send-keys", "-t", "dash", "p")
    wait_for(lambda: worker_state(out).get("state") == "paused", 30, "the worker to pause", tmux.screen)
    assert json.loads((out / "control.json").read_text())["paused"] is True
    wait_for(lambda: "PAUSED" in tmux.screen(), 10, "the view to show PAUSED", tmux.screen)
    at = len(manifest_ids(out))
    time.sleep(1.0)
    assert len(manifest_ids(out)) == at  # nothing written while paused
    assert at < N

    tmux("send-keys", "-t", "dash", "p")
    wait_for(lambda: worker_state(out).get("state") == "running", 30, "the worker to resume", tmux.screen)
    wait_for(lambda: len(manifest_ids(out)) > at, 30, "a shard after resuming", tmux.screen)

    tmux("send-keys", "-t", "dash", "q")
    assert exit_code(rc, tmux) == 0
    doc = worker_state(out)
    got = manifest_ids(out)
    assert doc["state"] in ("stopped", "done")
    assert len(got) == len(set(got)) == doc["samples_done"]  # drained: what was extracted is committed, once
    assert set(got) <= ids
    finish_headless(cfg, tmp_path, out, ids)


@pytest.mark.slow  # ~20 s on a loaded machine; the key's path (Ctrl-C -> run.interrupt) is a pilot test in make test
def test_ctrl_c_once_drains_and_exits_130_with_samples_left(tmp_path: Path, tiny: Path, tmux: Tmux) -> None:
    """The Ctrl-C key is SIGINT's twin: one drains and, samples being left, exits 130 (before: the
    quit key's drain, exit 0 with 1274 of 1994 samples done)."""
    cfg, out, ids = extract_config(tmp_path, tiny)
    rc = tmux.start(tmp_path, f"{DATAGEN} extract {cfg} --data {tmp_path / 'data'}")
    wait_for(lambda: worker_state(out).get("samples_done", 0) > 0 and "GPUs · workers" in tmux.screen(), 60,
         "the view and the first batch", tmux.screen)
    tmux("send-keys", "-t", "dash", "C-c")
    assert exit_code(rc, tmux) == 130
    assert json.loads((out / "control.json").read_text())["quit"] == "drain"
    got = manifest_ids(out)
    assert len(got) == len(set(got)) == worker_state(out)["samples_done"] < N  # drained: committed, once


@pytest.mark.slow  # the job can finish before the second Ctrl-C on a loaded machine (exit 0, not 130): make slow
def test_ctrl_c_twice_aborts_then_rerun_resumes_once(tmp_path: Path, tiny: Path, tmux: Tmux) -> None:
    cfg, out, ids = extract_config(tmp_path, tiny)
    rc = tmux.start(tmp_path, f"{DATAGEN} extract {cfg} --data {tmp_path / 'data'}")
    wait_for(lambda: worker_state(out).get("samples_done", 0) > 0 and "GPUs · workers" in tmux.screen(), 60,
         "the view and the first batch", tmux.screen)
    tmux("send-keys", "-t", "dash", "C-c")
    wait_for(lambda: json.loads((out / "control.json").read_text()).get("quit") == "drain", 10, "the drain",
         tmux.screen)
    tmux("send-keys", "-t", "dash", "C-c")
    assert exit_code(rc, tmux) == 130
    assert len(manifest_ids(out)) < N
    finish_headless(cfg, tmp_path, out, ids)


@pytest.mark.slow  # ~20 s each on a loaded machine; the keys' path above runs in `make test`
def test_signals_to_the_process_group(tmp_path: Path, tiny: Path, tmux: Tmux) -> None:
    """SIGINT twice to the foreground process group (what a Ctrl-C from tmux outside the app sends):
    the first drains, the second kills the workers: exit 130, and a rerun resumes exactly once."""
    cfg, out, ids = extract_config(tmp_path, tiny)
    # the pane's shell traps the signals (it shares the group) so it survives to write the exit code
    rc = tmux.start(tmp_path, f"{DATAGEN} extract {cfg} --data {tmp_path / 'data'}", trap=True)
    wait_for(lambda: worker_state(out).get("samples_done", 0) > 0 and "GPUs · workers" in tmux.screen(), 60,
         "the view and the first batch", tmux.screen)
    shell = int(tmux("list-panes", "-t", "dash", "-F", "#{pane_pid}").split()[0])
    pgid = int(subprocess.run(["ps", "-o", "tpgid=", "-p", str(shell)], capture_output=True, text=True).stdout)
    kids = subprocess.run(["pgrep", "-P", str(shell)], capture_output=True, text=True).stdout.split()
    assert [k for k in kids if os.getpgid(int(k)) == pgid]  # datagen is in the terminal's foreground group
    os.killpg(pgid, 2)
    wait_for(lambda: json.loads((out / "control.json").read_text()).get("quit") == "drain", 10, "the drain",
         tmux.screen)
    os.killpg(pgid, 2)
    assert exit_code(rc, tmux) == 130
    finish_headless(cfg, tmp_path, out, ids)


def test_prepare_error_prints_error_after_the_view(tmp_path: Path, tiny: Path, tmux: Tmux) -> None:
    """Not enough disk is found by prepare, inside the app: the error line is on the restored screen."""
    cfg, out, _ = extract_config(tmp_path, tiny, n=10)
    rc = tmux.start(tmp_path, f"{DATAGEN} extract {cfg} --data {tmp_path / 'data'} --free-bytes 1000")
    assert exit_code(rc, tmux) == 1
    screen = tmux.screen()
    assert "error:" in screen and "GPUs · workers" not in screen, screen
    assert not list(out.glob("shard-*"))


@pytest.mark.slow  # ~20 s each on a loaded machine; the keys' path above runs in `make test`
def test_terminal_lost_drains(tmp_path: Path, tiny: Path, tmux: Tmux) -> None:
    """``tmux kill-session`` (SIGHUP, the tty gone): the launcher drains its workers and exits; the
    written samples are in the manifest once and a rerun finishes exactly once."""
    cfg, out, ids = extract_config(tmp_path, tiny)
    tmux.start(tmp_path, f"{DATAGEN} extract {cfg} --data {tmp_path / 'data'}")
    wait_for(lambda: worker_state(out).get("samples_done", 0) > 0 and "GPUs · workers" in tmux.screen(), 60,
         "the view and the first batch", tmux.screen)
    shell = int(tmux("list-panes", "-t", "dash", "-F", "#{pane_pid}").split()[0])
    launcher = int(subprocess.run(["pgrep", "-P", str(shell)], capture_output=True, text=True).stdout.split()[0])
    tmux("kill-session", "-t", "dash")

    def gone() -> bool:
        try:
            os.kill(launcher, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie is gone too
            return Path(f"/proc/{launcher}/stat").read_text().split(")")[1].split()[0] == "Z"
        except OSError:
            return True

    wait_for(gone, 60, "the launcher to exit")
    assert json.loads((out / "control.json").read_text())["quit"] == "drain"
    doc = worker_state(out)
    assert doc["state"] in ("stopped", "done")
    got = manifest_ids(out)
    assert len(got) == len(set(got)) == doc["samples_done"]
    finish_headless(cfg, tmp_path, out, ids)


@pytest.mark.slow  # ~20 s each on a loaded machine; the keys' path above runs in `make test`
def test_signal_after_quit_key_aborts(tmp_path: Path, tiny: Path, tmux: Tmux) -> None:
    """``q`` (drain) then SIGTERM to the launcher: the stop in progress counted as the first, so
    the signal aborts (control file ``abort``) and the process exits 130."""
    cfg, out, ids = extract_config(tmp_path, tiny, n=3000)
    rc = tmux.start(tmp_path, f"{DATAGEN} extract {cfg} --data {tmp_path / 'data'}")
    wait_for(lambda: worker_state(out).get("samples_done", 0) > 0 and "GPUs · workers" in tmux.screen(), 60,
         "the view and the first batch", tmux.screen)
    shell = int(tmux("list-panes", "-t", "dash", "-F", "#{pane_pid}").split()[0])
    launcher = int(subprocess.run(["pgrep", "-P", str(shell)], capture_output=True, text=True).stdout.split()[0])
    tmux("send-keys", "-t", "dash", "p")  # paused: the drain cannot end before the signal arrives
    wait_for(lambda: worker_state(out).get("state") == "paused", 30, "the worker to pause", tmux.screen)
    tmux("send-keys", "-t", "dash", "q")
    wait_for(lambda: json.loads((out / "control.json").read_text()).get("quit") == "drain", 10, "the drain",
         tmux.screen)
    os.kill(launcher, 15)
    assert exit_code(rc, tmux) == 130
    assert json.loads((out / "control.json").read_text())["quit"] == "abort"
    finish_headless(cfg, tmp_path, out, ids)
