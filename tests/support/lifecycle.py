"""Helpers for process-lifecycle tests: a run's descendants and semaphores from /proc, a config with
slow simulated streams and an optional ``[tokenizer]``, and a wrapper that records an exit code."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

from helpers import SAMPLES

#: ``python WRAPPER RCFILE CMD...``: runs CMD in the wrapper's process group (a terminal's Ctrl-C and
#: ``killpg`` reach both), survives those signals itself (Python handlers, reset at exec: CMD gets
#: default dispositions) and writes CMD's exit code to RCFILE.
WRAPPER = """
import signal, subprocess, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(s, lambda *a: None)
rc = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write(str(rc))
"""


def write_wrapper(tmp: Path) -> Path:
    p = tmp / "rc_wrapper.py"
    p.write_text(WRAPPER)
    return p


def ppid_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children, grandchildren...)."""
    parents: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            pp = ppid_of(int(d))
            if pp is not None:
                parents[int(d)] = pp
    out: set[int] = set()
    frontier = {pid}
    while frontier:
        nxt = {c for c, pp in parents.items() if pp in frontier and c not in out}
        out |= nxt
        frontier = nxt
    return {p for p in out if alive(p)}


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def sem_names(pids: set[int]) -> set[str]:
    """POSIX semaphores (``/dev/shm/sem.*``) mapped by any of ``pids`` (from /proc/PID/maps)."""
    out: set[str] = set()
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                if "/dev/shm/sem." in line:
                    out.add(line.split("/dev/shm/", 1)[1].split()[0])
        except OSError:
            pass
    return out


def sig_ignored(pid: int) -> int:
    """The ``SigIgn`` mask of ``pid`` (bit n-1 set: signal n ignored)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    return 0


def lifecycle_config(tmp: Path, executor: str, *, drain: str = "30", tokens: int = 300, tokens_per_s: int = 100,
                     conc: int = 8, total_s: int = 120, kimi: Path | None = None) -> Path:
    """A simulated run over the ShareGPT sample (98 prompts) with ``conc`` slow streams in flight;
    ``executor``: ``process`` | ``thread`` adds a ``[tokenizer]`` (kimi layout) with 2 workers, ``none``
    leaves it out. ``drain``: the TOML value of ``run.drain_timeout_s`` (``""``: not set, i.e. auto)."""
    cfg = tmp / "config.toml"
    drain_line = f"drain_timeout_s = {drain}\n" if drain else ""
    text = f"""
[run]
name = "life"
dir = "{tmp / 'run'}"
progress_interval_s = 1
commit_interval_s = 0.2
{drain_line}
[provider]
kind = "simulated"
[provider.timeouts]
stall_s = 60
total_s = {total_s}
[provider.sim]
seed = 3
latency_ms = 50
tokens_per_s = {tokens_per_s}
mean_completion_tokens = {tokens}
{f'tokenizer = "{kimi}"' if kimi else ''}
[classes.short]
max_tokens = 20000
concurrency = {conc}
[[datasets]]
name = "sharegpt"
path = "{SAMPLES}/b7_sharegpt.json"
format = "sharegpt"
"""
    if executor != "none":
        text += f'[tokenizer]\npath = "{kimi}"\nexecutor = "{executor}"\nworkers = 2\nmax_failure_rate = 0\n'
    cfg.write_text(text)
    return cfg


def store_counts(run_dir: Path) -> dict[str, int]:
    """results, validations, aborted attempts and prompts by state of a run's store."""
    db = sqlite3.connect(run_dir / "store.sqlite", timeout=30)
    try:
        out = {"results": db.execute("SELECT COUNT(*) FROM results").fetchone()[0],
               "aborted": db.execute("SELECT COUNT(*) FROM attempts WHERE outcome='aborted'").fetchone()[0]}
        try:
            out["validations"] = db.execute("SELECT COUNT(*) FROM validations").fetchone()[0]
        except sqlite3.OperationalError:
            out["validations"] = 0
        for state, n in db.execute("SELECT state, COUNT(*) FROM prompts GROUP BY state"):
            out[f"prompts_{state}"] = n
        return out
    finally:
        db.close()


PY = sys.executable
