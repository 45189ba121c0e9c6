"""``datagen run CONFIG`` in a real terminal (tmux, 160x48): the panes render, ``p`` pauses the
selected dataset (read back with ``datagen status --json``), and when the terminal goes away
(``tmux kill-session``: SIGHUP) the process drains, exits and does not spin meanwhile."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tmuxterm import Tmux
from waiting import wait_for

from tui.testing import SAMPLES

REPO = Path(__file__).resolve().parents[2]
DATAGEN = Path(sys.executable).with_name("datagen")

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (apt-get install -y tmux); CI installs it")

CONFIG = """
[run]
name = "tmux-test"
dir = "{run_dir}"
commit_interval_s = 0.1
drain_timeout_s = 3

[provider]
kind = "simulated"

[provider.sim]
seed = 2
latency_ms = 20
tokens_per_s = 40
mean_completion_tokens = 120

[classes.short]
max_tokens = 2000
concurrency = 4

[[datasets]]
name = "sharegpt"
path = "{samples}/b7_sharegpt.json"
format = "sharegpt"

[[datasets]]
name = "glaive"
path = "{samples}/b1_glaive.jsonl"
format = "glaive"
"""


def status(run_dir: Path) -> dict | None:
    cmd = [str(DATAGEN), "status", str(run_dir), "--json"] if DATAGEN.exists() else \
        [sys.executable, "-m", "datagen", "status", str(run_dir), "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=20)
    return json.loads(r.stdout) if r.returncode == 0 else None


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of ``pid`` from /proc (seconds); None when it has exited."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def test_datagen_run_in_tmux_renders_pauses_and_survives_terminal_loss(tmp_path):
    run_dir = tmp_path / "run"
    cfg = tmp_path / "config.toml"
    cfg.write_text(CONFIG.format(run_dir=run_dir, samples=SAMPLES))
    cmd = f"{DATAGEN} run {cfg}" if DATAGEN.exists() else f"{sys.executable} -m datagen run {cfg}"
    tmux = Tmux()
    tmux("new-session", "-d", "-s", "dash", "-x", "160", "-y", "48", "-c", str(REPO),
         f"env TERM=xterm-256color {cmd}; sleep 30")
    try:
        tmux("set-option", "-sg", "escape-time", "10")
        titles = ("datasets", "throughput", "errors by class", "providers", "GPUs", "latest sample", "log", "Pause", "Quit")
        # every pane drawn (under load the first frames can show the upper panes only)
        screen = wait_for(lambda: (s := tmux.screen()) and "sharegpt" in s and "glaive" in s
                          and all(t in s for t in titles) and s, 30, "the dashboard at 160x48 with every pane",
                          show=lambda: tmux("display", "-p", "-t", "dash", "#{window_width}x#{window_height}") + tmux.screen())
        for title in titles:
            assert title in screen, f"{title!r} not on screen:\n{screen}"
        doc = wait_for(lambda: (d := status(run_dir)) and d["run"]["alive"] and d, 20, "a live run")
        pid = doc["run"]["pid"]

        # The dashboard's own CPU at 2 Hz with 4 requests streaming (printed, not asserted).
        c0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(3)
        c1, t1 = cpu_seconds(pid), time.monotonic()
        print(f"\n[tmux] datagen process CPU while running: {100 * (c1 - c0) / (t1 - t0):.1f}% of one core")

        t_key = time.monotonic()
        tmux("send-keys", "-t", "dash", "p")
        doc = wait_for(lambda: (d := status(run_dir)) and d["datasets"][0]["state"] == "paused" and d, 10,
                   "sharegpt paused in datagen status")
        print(f"[tmux] p -> 'paused' in datagen status --json: {time.monotonic() - t_key:.2f}s "
              "(includes the 0.1 s commit and the status process)")
        assert doc["datasets"][0]["state_reason"] == "paused by user"
        wait_for(lambda: "Resume" in tmux.screen().splitlines()[-1], 5, "footer Resume")

        # The terminal goes away: SIGHUP. The process must drain, exit, and not spin meanwhile.
        c0, t0 = cpu_seconds(pid), time.monotonic()
        last = [c0, t0]

        def gone() -> bool:
            c = cpu_seconds(pid)
            if c is None:
                return True
            last[:] = [c, time.monotonic()]
            return False

        tmux("kill-session", "-t", "dash")
        wait_for(gone, 20, "the process to exit after SIGHUP", interval=0.1)
        busy = (last[0] - c0) / max(last[1] - t0, 1e-3)
        print(f"[tmux] exited {time.monotonic() - t0:.1f}s after the terminal went away; "
              f"CPU meanwhile {100 * busy:.0f}% of one core")
        if last[1] - t0 >= 1.0:
            assert busy < 0.8, "the process spun after losing its terminal"
        doc = status(run_dir)
        assert doc is not None and not doc["run"]["alive"] and doc["totals"]["in_flight"] == 0
        t = doc["totals"]
        assert t["done"] + t["failed"] + t["pending"] + t["skipped"] == t["prompts"]
        log = (run_dir / "datagen.log").read_text()
        assert "SIGHUP" in log
    finally:
        tmux("kill-server", check=False)


# ------------------------------------------------------------------ child processes and signals (issue 16)

def _dashboard(tmp_path: Path, tmux: Tmux, cfg: Path, children: int) -> tuple[int, Path]:
    """Start ``datagen run CFG`` (dashboard) in tmux under the exit-code wrapper; wait until it runs
    with requests in flight and ``children`` reconstruction workers. Returns (pid, rc file)."""
    from lifecycle import cmdline, descendants, write_wrapper

    rc = tmp_path / "rc"
    run = f"{DATAGEN} run {cfg}" if DATAGEN.exists() else f"{sys.executable} -m datagen run {cfg}"
    tmux("new-session", "-d", "-s", "dash", "-x", "160", "-y", "48", "-c", str(REPO),
         # exec: the pane's process is the wrapper, which outlives group signals (a shell would die of
         # them, close the pane and SIGHUP the run: a second signal)
         f"exec env TERM=xterm-256color {sys.executable} {write_wrapper(tmp_path)} {rc} {run}")
    tmux("set-option", "-sg", "escape-time", "10")
    doc = wait_for(lambda: rc.exists() or ((d := status(tmp_path / "run")) and d["run"]["alive"]
                                       and d["totals"]["in_flight"] >= 4 and d), 60, "a live run with 4 in flight",
               show=lambda: tmux.screen() + (tmp_path / "run" / "datagen.log").read_text()[-3000:])
    assert not rc.exists(), f"datagen exited {rc.read_text()} at start:\n{tmux.screen()}"
    pid = doc["run"]["pid"]
    wait_for(lambda: len([k for k in descendants(pid) if "spawn_main" in cmdline(k)]) >= children, 30,
         f"{children} reconstruction workers")
    wait_for(lambda: "sharegpt" in tmux.screen(), 20, "the dashboard", show=tmux.screen)
    return pid, rc


@pytest.mark.parametrize("executor", ["process", "thread", pytest.param("none", marks=pytest.mark.slow)])
@pytest.mark.slow  # issue 27: long e2e test (>9 s on 2 cores), run by `make slow`
def test_dashboard_with_tokenizer_starts_and_ctrl_c_drains_and_exits_130(tmp_path, executor):
    """Before: with [tokenizer] (process pool) the dashboard exited 1 at start (ValueError: bad
    value(s) in fds_to_keep); Ctrl-C (a key in raw mode) did nothing."""
    from fixtures_tokens import kimi_dir
    from lifecycle import alive, descendants, lifecycle_config, sem_names, store_counts

    cfg = lifecycle_config(tmp_path, executor, drain="30", tokens=200, tokens_per_s=100, conc=4, kimi=kimi_dir())
    tmux = Tmux()
    try:
        pid, rc = _dashboard(tmp_path, tmux, cfg, 2 if executor == "process" else 0)
        kids = descendants(pid)
        sems = sem_names({pid} | kids)
        t0 = time.monotonic()
        tmux("send-keys", "-t", "dash", "C-c")
        wait_for(rc.exists, 40, "datagen to exit after Ctrl-C", show=tmux.screen)
        assert time.monotonic() - t0 < 30 + 10
        assert rc.read_text() == "130"
        c = store_counts(tmp_path / "run")
        assert c["aborted"] == 0 and c["results"] == c["prompts_done"] > 0
        assert c["validations"] == (c["results"] if executor != "none" else 0)
        log = (tmp_path / "run" / "datagen.log").read_text()
        assert "Ctrl-C received: draining" in log and "BrokenProcessPool" not in log
        wait_for(lambda: not any(alive(k) for k in kids), 10, "no child process left")
        assert not [s for s in sems if (Path("/dev/shm") / s).exists()]
    finally:
        tmux("kill-server", check=False)


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
def test_dashboard_second_ctrl_c_aborts_at_once_with_the_countdown_and_the_loss_shown(tmp_path):
    from fixtures_tokens import kimi_dir
    from lifecycle import alive, descendants, lifecycle_config, store_counts

    # ~30 s streams; the default drain waits for them (provider.timeouts.total_s = 120 s).
    cfg = lifecycle_config(tmp_path, "process", drain="", tokens=3000, tokens_per_s=100, conc=4, kimi=kimi_dir())
    tmux = Tmux()
    try:
        pid, rc = _dashboard(tmp_path, tmux, cfg, 2)
        kids = descendants(pid)
        tmux("send-keys", "-t", "dash", "C-c")
        screen = wait_for(lambda: (s := tmux.screen()) and "abort in" in s and s, 10, "the drain countdown",
                      show=tmux.screen)
        assert re.search(r"draining [1-4] in flight \(\$0\.\d{4}\) · abort in (1m5\ds|2m00s)", screen), screen
        t0 = time.monotonic()
        tmux("send-keys", "-t", "dash", "C-c")
        wait_for(rc.exists, 15, "datagen to exit after a second Ctrl-C", show=tmux.screen)
        assert time.monotonic() - t0 < 10
        assert rc.read_text() == "130"
        log = (tmp_path / "run" / "datagen.log").read_text()
        m = re.search(r"aborted (\d+) in-flight stream\(s\): est\. \$([0-9.]+) already generated is billed", log)
        assert m and int(m.group(1)) >= 1 and float(m.group(2)) > 0, log[-2000:]
        assert store_counts(tmp_path / "run")["aborted"] == int(m.group(1))
        wait_for(lambda: not any(alive(k) for k in kids), 10, "no child process left")
    finally:
        tmux("kill-server", check=False)


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
def test_dashboard_sigterm_to_the_process_group_drains_and_exits_130(tmp_path):
    from fixtures_tokens import kimi_dir
    from lifecycle import alive, descendants, lifecycle_config, store_counts

    cfg = lifecycle_config(tmp_path, "process", drain="30", tokens=200, tokens_per_s=100, conc=4, kimi=kimi_dir())
    tmux = Tmux()
    try:
        pid, rc = _dashboard(tmp_path, tmux, cfg, 2)
        kids = descendants(pid)
        os.killpg(os.getpgid(pid), signal.SIGTERM)  # `kill -TERM -PGID`: the run and every worker
        wait_for(rc.exists, 40, "datagen to exit after SIGTERM to its group", show=tmux.screen)
        assert rc.read_text() == "130"
        c = store_counts(tmp_path / "run")
        assert c["aborted"] == 0 and c["validations"] == c["results"] == c["prompts_done"] > 0
        wait_for(lambda: not any(alive(k) for k in kids), 10, "no child process left")
    finally:
        tmux("kill-server", check=False)


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
def test_dashboard_ctrl_c_after_drain_then_quit_aborts_at_once(tmp_path):
    """Before: after ``q`` -> "Drain, then quit", Ctrl-C only started draining again ("Ctrl-C received:
    draining") and the engine kept running until a second Ctrl-C. Any stop in progress counts as the first."""
    from lifecycle import lifecycle_config

    # ~30 s streams; the drain would wait for them (provider.timeouts.total_s = 120 s).
    cfg = lifecycle_config(tmp_path, "none", drain="", tokens=3000, tokens_per_s=100, conc=4)
    tmux = Tmux()
    try:
        pid, rc = _dashboard(tmp_path, tmux, cfg, 0)
        wait_for(lambda: re.search(r"in flight [1-9]", tmux.screen()), 10, "requests in flight", show=tmux.screen)
        tmux("send-keys", "-t", "dash", "q")
        wait_for(lambda: "Drain, then quit" in tmux.screen(), 10, "the quit dialog", show=tmux.screen)
        tmux("send-keys", "-t", "dash", "d")
        screen = wait_for(lambda: (s := tmux.screen()) and "abort in" in s and s, 10, "the drain", show=tmux.screen)
        assert re.search(r"sharegpt\s+draining", screen), screen  # the row follows the run's stop
        t0 = time.monotonic()
        tmux("send-keys", "-t", "dash", "C-c")
        wait_for(rc.exists, 15, "datagen to exit after one Ctrl-C during the drain", show=tmux.screen)
        assert time.monotonic() - t0 < 10
        assert rc.read_text() == "130"
        log = (tmp_path / "run" / "datagen.log").read_text()
        assert "run stopping: quit (drain)" in log and "Ctrl-C received: aborting" in log
        assert "Ctrl-C received: draining" not in log
    finally:
        tmux("kill-server", check=False)
