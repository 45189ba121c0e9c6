"""Disk guard: refuse a job that will not fit, pause a worker while free space is under the margin.

Sizes are bytes. ``stated_free`` replaces the file system's answer (``--free-bytes``, for tests and
rehearsals): it is then the free space at start, minus what this process has written since.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Callable

from engine.extract.job import ExtractError


def fmt_bytes(n: float) -> str:
    """``1.23 GB`` style (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} PB"


class DiskGuard:
    """Free-space checks for ``path`` (an existing directory).

    Args:
        path: the output directory.
        margin_bytes: bytes that must stay free.
        stated_free: free bytes to assume instead of asking the file system (see module doc).
        poll_s: seconds between free-space checks while paused.
    """

    def __init__(self, path: str | Path, margin_bytes: int, stated_free: int | None = None, poll_s: float = 10.0) -> None:
        self.path = Path(path)
        self.poll_s = poll_s
        self.margin = int(margin_bytes)
        self.stated_free = stated_free
        self.written = 0
        self._lock = threading.Lock()

    def free(self) -> int:
        """Free bytes now."""
        if self.stated_free is not None:
            with self._lock:
                return self.stated_free - self.written
        return shutil.disk_usage(self.path).free

    def note_written(self, nbytes: int) -> None:
        """Count bytes written by this process (only matters with ``stated_free``)."""
        with self._lock:
            self.written += nbytes

    def check_start(self, projected: int) -> str:
        """Check a job of ``projected`` bytes fits; returns the line to print.

        Raises:
            ExtractError: ``projected > free - margin`` (nothing has been written).
        """
        free = self.free()
        line = (f"projected output {fmt_bytes(projected)} ({projected} bytes); free on {self.path}: "
                f"{fmt_bytes(free)} ({free} bytes); margin {fmt_bytes(self.margin)}")
        if projected > free - self.margin:
            raise ExtractError(f"not enough disk space: {line}. Free space, lower [extract] disk_margin_gb, "
                               "set max_seq_len, or point out_dir elsewhere")
        return line

    def fits(self, nbytes: int) -> bool:
        """True when writing ``nbytes`` more still leaves the margin free."""
        return self.free() - nbytes >= self.margin

    def wait_for_space(self, nbytes: int, on_pause: Callable[[str], None], on_resume: Callable[[], None],
                       stop: threading.Event | None = None) -> bool:
        """Block while writing ``nbytes`` would eat into the margin, polling every ``poll_s`` seconds.

        Calls ``on_pause(reason)`` once when it starts waiting and ``on_resume()`` when space is back.
        Returns False if ``stop`` was set while waiting (nothing should be written), else True.
        """
        if self.fits(nbytes):
            return True
        free = self.free()
        on_pause(f"low disk space: {fmt_bytes(free)} free on {self.path}, margin {fmt_bytes(self.margin)}, "
                 f"next shard {fmt_bytes(nbytes)}; waiting for space")
        stop = stop or threading.Event()
        while not self.fits(nbytes):
            if stop.wait(self.poll_s):
                return False
        on_resume()
        return True


def check_job_fits(out_dir: str | Path, projected: int, margin_bytes: int, stated_free: int | None) -> str:
    """:meth:`DiskGuard.check_start` for a job about to start (creates ``out_dir``)."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    if stated_free is None:
        shutil.disk_usage(out_dir)  # raises a clear OSError early for an unusable path
    return DiskGuard(out_dir, margin_bytes, stated_free).check_start(projected)


__all__ = ["DiskGuard", "ExtractError", "check_job_fits", "fmt_bytes"]
