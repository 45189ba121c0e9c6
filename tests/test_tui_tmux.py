"""``datagen run CONFIG`` in a real terminal (tmux, 160x48): the panes render, ``p`` pauses the
selected dataset (read back with ``datagen status --json``), and when the terminal goes away
(``tmux kill-session``: SIGHUP) the process drains, exits and does not spin meanwhile."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tui.testing import SAMPLES

REPO = Path(__file__).resolve().parents[1]
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


class Tmux:
    """A private tmux server (own socket, no user config)."""

    def __init__(self) -> None:
        self.sock = f"datagen-test-{uuid.uuid4().hex[:8]}"

    def __call__(self, *args: str, check: bool = True) -> str:
        r = subprocess.run(["tmux", "-L", self.sock, "-f", "/dev/null", *args], capture_output=True, text=True,
                           timeout=10)
        if check and r.returncode:
            raise RuntimeError(f"tmux {' '.join(args)}: {r.stderr}")
        return r.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "dash")


def wait(cond, timeout: float, what: str, step: float = 0.2, show=None):
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f":\n{show()}" if show else ""))
        time.sleep(step)


def status(run_dir: Path) -> dict | None:
    cmd = [str(DATAGEN), "status", str(run_dir), "--json"] if DATAGEN.exists() else \
        [sys.executable, "-m", "engine.cli", "status", str(run_dir), "--json"]
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
    cmd = f"{DATAGEN} run {cfg}" if DATAGEN.exists() else f"{sys.executable} -m engine.cli run {cfg}"
    tmux = Tmux()
    tmux("new-session", "-d", "-s", "dash", "-x", "160", "-y", "48", "-c", str(REPO),
         f"env TERM=xterm-256color {cmd}; sleep 30")
    try:
        tmux("set-option", "-sg", "escape-time", "10")
        screen = wait(lambda: (s := tmux.screen()) and "sharegpt" in s and "glaive" in s and "providers" in s
                      and s, 30, "the dashboard at 160x48",
                      show=lambda: tmux("display", "-p", "-t", "dash", "#{window_width}x#{window_height}") + tmux.screen())
        for title in ("datasets", "throughput", "errors by class", "providers", "GPUs", "latest sample", "log",
                      "Pause", "Quit"):
            assert title in screen, f"{title!r} not on screen:\n{screen}"
        doc = wait(lambda: (d := status(run_dir)) and d["run"]["alive"] and d, 20, "a live run")
        pid = doc["run"]["pid"]

        # The dashboard's own CPU at 2 Hz with 4 requests streaming (printed, not asserted).
        c0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(3)
        c1, t1 = cpu_seconds(pid), time.monotonic()
        print(f"\n[tmux] datagen process CPU while running: {100 * (c1 - c0) / (t1 - t0):.1f}% of one core")

        t_key = time.monotonic()
        tmux("send-keys", "-t", "dash", "p")
        doc = wait(lambda: (d := status(run_dir)) and d["datasets"][0]["state"] == "paused" and d, 10,
                   "sharegpt paused in datagen status")
        print(f"[tmux] p -> 'paused' in datagen status --json: {time.monotonic() - t_key:.2f}s "
              "(includes the 0.1 s commit and the status process)")
        assert doc["datasets"][0]["state_reason"] == "paused by user"
        wait(lambda: "Resume" in tmux.screen().splitlines()[-1], 5, "footer Resume")

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
        wait(gone, 20, "the process to exit after SIGHUP", 0.1)
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
