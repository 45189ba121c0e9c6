"""One live writer per directory: an exclusive ``flock`` on a lock file inside it.

``datagen run`` holds ``RUN_DIR/run.lock`` from before it opens the store (and before the dashboard
opens) until it exits; ``datagen validate`` holds it while it writes verdicts; ``datagen extract``
holds ``OUT_DIR/extract.lock`` on its output directory. A second command on the same directory gets
:class:`DirectoryInUse` at once ("run directory in use by pid N since TIME") and has sent and written
nothing. The kernel releases the lock when the holder exits, however it exits (``kill -9``
included), so a stale lock file never blocks anything: the file's content (pid, start time, host,
command, as JSON) only says who holds it while it is held.

``datagen status`` and ``datagen ctl`` never take it (they read, or go through the commands table).
Works across hosts only on file systems with working ``flock`` (e.g. NFSv4, Lustre, GPFS).

Within one process, acquiring a directory this process already holds shares the lock (a count), so
``datagen run`` can take it before the dashboard and ``engine.run.runner.prepare`` take it again.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from engine.errors import DatagenError

#: File names of the lock, per kind of directory.
RUN_LOCK = "run.lock"
EXTRACT_LOCK = "extract.lock"

_RETRIES = 5          # a `status` probe holds a shared lock for microseconds: retry before saying "in use"
_RETRY_S = 0.05


@dataclass(frozen=True)
class Holder:
    """Who holds a directory's lock.

    Attributes:
        pid: process id; since: wall-clock start of the hold (epoch seconds); host: hostname;
        command: the holder's command line (``"datagen run config.toml"``), arguments only, no secrets
        (datagen takes none on its command line).
    """

    pid: int
    since: float
    host: str
    command: str

    def since_text(self) -> str:
        """``since`` as local ISO time to the second, e.g. ``2026-12-01 01:07:48``."""
        return datetime.fromtimestamp(self.since).strftime("%Y-%m-%d %H:%M:%S")

    def as_dict(self) -> dict:
        """JSON-ready: ``{"pid", "since" (epoch s), "since_utc" (ISO 8601), "host", "command"}``."""
        utc = datetime.fromtimestamp(self.since, tz=timezone.utc).isoformat(timespec="seconds")
        return {"pid": self.pid, "since": self.since, "since_utc": utc, "host": self.host, "command": self.command}


class DirectoryInUse(DatagenError):
    """Another live process holds the directory's lock.

    Attributes:
        directory: the directory; holder: its :class:`Holder` (None when its file could not be read);
        what: ``"run directory"`` or ``"extract output directory"``.
    """

    def __init__(self, directory: Path, holder: Holder | None, what: str) -> None:
        self.directory, self.holder, self.what = directory, holder, what
        if holder is None:
            who = "another process"
        else:
            where = "" if holder.host == socket.gethostname() else f" on {holder.host}"
            who = f"pid {holder.pid}{where} since {holder.since_text()} ({holder.command})"
        # `ctl abort` would not end a run (its prompts return to pending): SIGTERM drains and exits.
        hint = f" (Ctrl-C in its terminal, or `kill -TERM {holder.pid}`: it drains and exits)" if holder else ""
        super().__init__(f"{what} in use by {who}: {directory}; nothing was sent or written. "
                         f"One live process per directory: wait for it to end, or stop it{hint}")


_held: dict[str, list] = {}  # realpath of the lock file -> [fd, count]


def _command() -> str:
    argv = list(sys.argv) or ["?"]
    if Path(argv[0]).name in ("datagen", "cli.py", "__main__.py"):
        argv[0] = "datagen"
    else:
        argv.insert(0, "python")
    return " ".join(argv)


def _read(path: Path) -> Holder | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8") or "null")
        return Holder(int(doc["pid"]), float(doc["since"]), str(doc["host"]), str(doc["command"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None


class DirLock:
    """An acquired directory lock; :meth:`release` (or the process's exit) frees it.

    Use :func:`acquire` to make one.
    """

    def __init__(self, path: Path, key: str) -> None:
        self.path = path
        self._key = key
        self._released = False

    def release(self) -> None:
        """Release this hold (the lock is freed when the process's last hold is released). Idempotent."""
        if self._released:
            return
        self._released = True
        entry = _held.get(self._key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _held[self._key]
        fd = entry[0]
        try:
            os.ftruncate(fd, 0)  # nobody holds it now; the kernel frees the lock on close either way
        except OSError:
            pass
        os.close(fd)

    def release_and_remove(self) -> None:
        """Remove the lock file, then release (a start refused before it created anything else).
        The file is unlinked while still locked, so no other process can hold the removed file."""
        entry = _held.get(self._key)
        if entry is not None and entry[1] == 1:
            try:
                self.path.unlink()
            except OSError:
                pass
        self.release()

    def __enter__(self) -> "DirLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire(directory: Path, name: str = RUN_LOCK, what: str = "run directory") -> DirLock:
    """Take the exclusive lock ``directory/name`` without waiting, and write who holds it.

    Args:
        directory: an existing directory (the run directory, or extract's output directory).
        name: the lock file's name (:data:`RUN_LOCK`, :data:`EXTRACT_LOCK`).
        what: how messages name the directory.

    Returns:
        the :class:`DirLock` (a second hold when this process already holds it).

    Raises:
        DirectoryInUse: another process holds it (its pid, start time, host and command in the message).
        OSError: the lock file cannot be created or opened (e.g. a read-only directory).
    """
    path = Path(directory) / name
    key = os.path.realpath(path)
    entry = _held.get(key)
    if entry is not None:
        entry[1] += 1
        return DirLock(path, key)
    for attempt in range(_RETRIES):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if attempt + 1 < _RETRIES:
                time.sleep(_RETRY_S)
                continue
            raise DirectoryInUse(Path(directory), _read(path), what) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # the file was removed (a refused start) between our open and our lock: try again
            os.close(fd)
            continue
        break
    else:
        raise DirectoryInUse(Path(directory), _read(path), what)
    doc = Holder(os.getpid(), time.time(), socket.gethostname(), _command()).as_dict()
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(doc) + "\n").encode(), 0)
    _held[key] = [fd, 1]
    return DirLock(path, key)


def holder(directory: Path, name: str = RUN_LOCK) -> Holder | None:
    """Who holds ``directory/name`` now, or None when nobody does (no file, or not locked).

    Never blocks and never creates the file. When this process holds it, returns this process.
    """
    path = Path(directory) / name
    if os.path.realpath(path) in _held:
        return _read(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read(path) or Holder(0, 0.0, "", "")
    except OSError:
        return None
    finally:
        os.close(fd)  # closing frees the shared lock if we got it
    return None
