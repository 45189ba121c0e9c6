"""Atomic file output: write to a temporary name in the same directory, fsync, then rename."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[str]:
    """Yield a temporary path beside ``path``; on success it is fsynced and renamed over ``path``.

    On any exception the temporary file is removed and ``path`` is left untouched, so a reader
    never sees a partial file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_lines(path: Path, lines) -> int:
    """Write ``lines`` (strings without newlines) to ``path`` atomically, one per line; returns the count."""
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line)
            f.write("\n")
            n += 1
    return n


_NOTHING = object()


def write_unless_empty(path: Path, items, write) -> int:
    """Write ``items`` to ``path`` with ``write(path, items) -> count`` only when there is at least one.

    An empty iterable writes no file and REMOVES an older file at ``path`` (an earlier export's file
    must not survive beside a new export; a 0-row file breaks loaders that read a whole directory,
    e.g. ``datasets.load_dataset("parquet", data_dir=...)``). Returns the count written (0: no file).
    """
    it = iter(items)
    first = next(it, _NOTHING)
    if first is _NOTHING:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return 0

    def chained():
        yield first
        yield from it

    return write(path, chained())
