"""A private tmux server for the terminal tests (own socket, no user config): the dashboard and the
extraction view driven as a user drives them, keys sent and the screen read back."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: Marks a module (or test) whose terminal tests need tmux.
needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (apt-get install -y tmux); CI installs it")


class Tmux:
    """A private tmux server (own socket ``PREFIX-xxxxxxxx``, no user config). ``strict``: a failed
    ``capture-pane`` raises (else the screen reads empty, e.g. after the session ended)."""

    def __init__(self, prefix: str = "datagen-test", strict: bool = True) -> None:
        self.sock = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.strict = strict

    def __call__(self, *args: str, check: bool = True) -> str:
        r = subprocess.run(["tmux", "-L", self.sock, "-f", "/dev/null", *args], capture_output=True, text=True,
                           timeout=10)
        if check and r.returncode:
            raise RuntimeError(f"tmux {' '.join(args)}: {r.stderr}")
        return r.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "dash", check=self.strict)

    def start(self, tmp: Path, cmd: str, trap: bool = False) -> Path:
        """Run ``cmd`` (a shell line) in a 160x48 session; returns the file its exit code lands in."""
        rc = tmp / f"rc-{uuid.uuid4().hex[:6]}"
        env = f"OMP_NUM_THREADS=1 PYTHONPATH={REPO} TERM=xterm-256color"
        self("new-session", "-d", "-s", "dash", "-x", "160", "-y", "48",
             ("trap : INT TERM; " if trap else "") + f"cd {REPO} && {env} {cmd}; echo $? > {rc}; sleep 600")
        return rc

    def close(self) -> None:
        self("kill-server", check=False)
