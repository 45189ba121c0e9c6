"""The run directory under a running engine, and the access a command needs to read it.

- :class:`RunDirWatch`: holds the run directory and its store open by descriptor from the start, and
  :meth:`RunDirWatch.probe` says, in a :class:`DirHealth`, whether the directory is still the one the
  run opened (same ``(st_dev, st_ino)`` at its path, still linked), where it went when it was moved
  (Linux: ``/proc/self/fd``), whether it still accepts new files, and the free space on its
  filesystem (``statvfs`` of the directory itself, so a directory moved elsewhere is measured where it is).
  What the run does about it is decided by :mod:`engine.run.guards` (pure) and carried out by the supervisor.
- :func:`access_problem`: the one line a command prints when the user may not read (or write) a run
  directory, e.g. another local user's ``datagen status`` on a 0700 directory.

Why descriptors: a deleted directory's store can still be written through the connection's open file,
so commits go on succeeding into a file nobody can reach (measured before this module: 277-483
completions bought and "stored" after an ``rm -rf``). ``fstat`` of a held descriptor says ``st_nlink == 0``
once it is unlinked, and the path's ``stat`` says whether something else took its place.

The store's descriptor must outlive the SQLite connection: closing any descriptor of a file drops
every POSIX lock the process holds on it (SQLite's locks included), so :meth:`RunDirWatch.close` is
called after the store is closed.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

#: :attr:`DirHealth.state` values.
OK, DELETED, MOVED = "ok", "deleted", "moved"


@dataclass(frozen=True)
class DirHealth:
    """One reading of the run directory (:meth:`RunDirWatch.probe`).

    Attributes:
        path: the run directory as configured.
        state: ``ok``; ``deleted`` (the directory or its store was unlinked: what the run writes reaches
            nobody); ``moved`` (the directory the run opened still exists, elsewhere or renamed, and
            something else or nothing is at ``path``).
        what: ``"run directory"`` or ``"store"``: which of the two was deleted or moved.
        now_at: moved: where the directory (or the store) is now, when the system can tell; else None.
        replaced: something else now exists at the path (a new directory or file).
        unwritable: "" when the directory accepts new files, else why not (``read-only file system``,
            ``permission denied (mode 0500, owner uid 0)``).
        free_bytes: bytes an unprivileged writer may still use on the directory's filesystem (``f_bavail``).
        total_bytes: the filesystem's size (bytes).
    """

    path: str
    state: str = OK
    what: str = "run directory"
    now_at: str | None = None
    replaced: bool = False
    unwritable: str = ""
    free_bytes: int | None = None
    total_bytes: int | None = None

    @property
    def lost(self) -> bool:
        """The run can no longer write where it was started: deleted or moved."""
        return self.state != OK


def _where(fd: int) -> tuple[str | None, bool]:
    """(path the kernel gives for ``fd``, whether it is marked deleted); (None, False) where unknown."""
    try:
        link = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None, False
    if link.endswith(" (deleted)"):
        return link[: -len(" (deleted)")], True
    return link, False


class RunDirWatch:
    """The run directory and its store, held by descriptor; :meth:`probe` reads their state.

    Args:
        run_dir: the run directory (must exist).
        store_path: the store file inside it (must exist).

    Raises:
        OSError: either cannot be opened.
    """

    def __init__(self, run_dir: Path, store_path: Path) -> None:
        self.path = Path(run_dir)
        self.store_path = Path(store_path)
        self.dir_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self.store_fd: int | None = os.open(self.store_path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(self.dir_fd)
            raise
        d, s = os.fstat(self.dir_fd), os.fstat(self.store_fd)
        self.dir_id = (d.st_dev, d.st_ino)
        self.store_id = (s.st_dev, s.st_ino)

    def probe(self) -> DirHealth:
        """Read the directory's state now (a few ``stat`` calls and one ``statvfs``; no writes).

        Returns:
            a :class:`DirHealth`; never raises for a missing or unreadable path (that is what it reports).
        """
        path = str(self.path)
        d = os.fstat(self.dir_fd)
        s = os.fstat(self.store_fd) if self.store_fd is not None else None
        here = _stat_id(self.path)
        if d.st_nlink == 0:
            return DirHealth(path, DELETED, "run directory", replaced=here is not None)
        if s is not None and s.st_nlink == 0:
            return DirHealth(path, DELETED, "store", replaced=_stat_id(self.store_path) is not None)
        if here != self.dir_id:
            at, gone = _where(self.dir_fd)
            if here is None and not gone and at == str(self.path.resolve()):  # still here, the path unreadable
                return DirHealth(path, OK, unwritable="cannot reach the path (a directory above it denies access)")
            if gone:
                return DirHealth(path, DELETED, "run directory", replaced=here is not None)
            return DirHealth(path, MOVED, "run directory", now_at=at, replaced=here is not None)
        store_here = _stat_id(self.store_path)
        if store_here != self.store_id and self.store_fd is not None:
            at, _ = _where(self.store_fd)
            return DirHealth(path, MOVED, "store", now_at=at, replaced=store_here is not None)
        free = total = None
        unwritable = ""
        try:
            v = os.statvfs(self.dir_fd)
            free, total = v.f_bavail * v.f_frsize, v.f_blocks * v.f_frsize
            if v.f_flag & os.ST_RDONLY:
                unwritable = "read-only file system"
        except OSError:
            pass
        if not unwritable and not os.access(self.path, os.W_OK | os.X_OK):
            unwritable = f"permission denied (mode {stat.S_IMODE(d.st_mode):04o}, owner uid {d.st_uid})"
        return DirHealth(path, OK, unwritable=unwritable, free_bytes=free, total_bytes=total)

    def close(self) -> None:
        """Close both descriptors (after the store's connection is closed: see the module docstring)."""
        for fd in (self.dir_fd, self.store_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.store_fd = None


def _stat_id(p: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(p)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def store_where(h: DirHealth | None, store_path: object) -> str:
    """The store as the run's last line names it: its path, or where it went, or that it is gone."""
    if h is None or not h.lost:
        return str(store_path)
    if h.state == MOVED and h.now_at:
        return (f"{h.now_at}/{Path(str(store_path)).name}" if h.what == "run directory" else h.now_at) + \
            f" (moved from {store_path})"
    if h.state == MOVED:
        return f"{store_path} (moved away; where to is unknown)"
    return f"{store_path} (deleted)"


# ---- another user's command on a run directory ---------------------------------------------------
#: errno values an operator causes: permissions, a full disk or quota, a read-only filesystem, a too-large file.
OPERATOR_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


def _owner(p: Path) -> str:
    try:
        st = os.stat(p)
    except OSError:
        return ""
    try:
        import pwd

        who = pwd.getpwuid(st.st_uid).pw_name
    except (ImportError, KeyError):
        who = f"uid {st.st_uid}"
    return f"owned by {who}, mode {stat.S_IMODE(st.st_mode):04o}"


def access_problem(run_dir: Path, command: str, *, store_name: str = "store.sqlite") -> str | None:
    """Why this user may not run ``command`` on ``run_dir``, as one line; None when it may (or when
    the directory does not exist or is not a directory: the command says that itself).

    Every command on a run directory needs read and write access, reads included: the store is in
    SQLite's WAL mode, where a reader writes the ``-shm`` file (created in the directory when absent).

    Args:
        run_dir: the run directory.
        command: e.g. ``"datagen status"`` (named in the line).
        store_name: the store's file name inside ``run_dir``.

    Example: ``permission denied: /runs/x (owned by alice, mode 0700): datagen status needs read, write and
    search (rwx) on the run directory and read and write (rw) on its store.sqlite (SQLite's WAL mode
    writes even to read); run it as alice, or ask alice to grant access (e.g. chmod g+rwx and a shared group)``.
    """
    run_dir = Path(run_dir)
    need = (f"{command} needs read, write and search (rwx) on the run directory and read and write (rw) on its "
            f"{store_name} (SQLite's WAL mode writes even to read)")
    try:
        st = os.stat(run_dir)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError:  # a directory above it is closed to this user
        return f"permission denied: {run_dir} (a directory above it cannot be searched by this user): {need}"
    if not stat.S_ISDIR(st.st_mode):
        return None
    store = run_dir / store_name
    bad: Path | None = None
    if not os.access(run_dir, os.R_OK | os.W_OK | os.X_OK):
        bad = run_dir
    elif store.exists() and not os.access(store, os.R_OK | os.W_OK):
        bad = store
    if bad is None:
        return None
    owner = _owner(bad)
    who = owner.split(",")[0].removeprefix("owned by ") if owner else "its owner"
    try:
        if os.statvfs(bad).f_flag & os.ST_RDONLY:
            return f"{bad}: read-only file system: {need}; copy the run directory to a writable disk first"
    except OSError:
        pass
    return (f"permission denied: {bad}{' (' + owner + ')' if owner else ''}: {need}; run it as {who}, or ask "
            f"{who} to grant access (e.g. chmod g+rwx and a shared group)")


__all__ = ["DELETED", "DirHealth", "MOVED", "OK", "OPERATOR_ERRNOS", "RunDirWatch", "access_problem", "store_where"]
