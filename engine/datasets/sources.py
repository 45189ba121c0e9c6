"""Where a dataset's bytes come from: compressed files (by suffix) and shard sets (a directory or glob).

A ``[[datasets]] path`` names one file, a directory, or a glob; :func:`local_shards` turns it into the
list of :class:`Shard` files to read, in sorted order, each with the name its rows' sources carry
(``"{shown}:{n}"``: the shard file, so errors and stored sources stay stable whatever else the
directory holds). A directory and a glob pick the same files: data files (:func:`is_data_file`),
not hidden ones. Files are decompressed by suffix (:mod:`engine.datasets.compressed`):

=============== ===================================================================
``.gz``         gzip (stdlib :mod:`zlib`; multi-member files read through)
``.zst``        Zstandard (the ``zstandard`` package; multi-frame files read through)
=============== ===================================================================

The suffix before the compression one picks the file format (``a.jsonl.gz`` is JSON lines). A
compressed Parquet file is refused (:func:`compressed_parquet`). Data are streamed: nothing is
decompressed whole into memory.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path

from engine.errors import DatagenError

#: Compression suffix -> the name reasons use for it.
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}
#: The file-format suffixes a directory's files are picked by (each also with a compression suffix).
DATA_SUFFIXES = (".jsonl", ".ndjson", ".json", ".traj", ".parquet")
_GLOB_CHARS = frozenset("*?[")
_SHOWN_NAMES = 5


class DatasetError(DatagenError):
    """A problem with a whole dataset file or path, as opposed to one bad row.

    Raised for: a missing, unreadable or non-regular file; a file that is neither JSON lines, a JSON
    array nor Parquet; a compressed file that is not of its suffix's kind, or a compressed Parquet
    file; a directory without data files or a glob matching none; an unknown format name; unknown
    ``fields`` mapping keys; a Parquet file that pyarrow cannot open or read; a Hub dataset that
    cannot be resolved or downloaded; a compressed file whose integrity check fails or that is cut
    before anything in it could be checked (:mod:`engine.datasets.compressed`). The message names the
    path and what was expected.
    """


@dataclass(frozen=True, slots=True)
class Shard:
    """One file to read.

    Attributes:
        path: the local file.
        shown: how its rows' sources name it (``"{shown}:{n}"``): the path as the config gave it for a
            single file, the shard's path for a directory or glob, ``hf://datasets/ORG/NAME/FILE`` for a
            Hub file (whose ``path`` is in the local cache).
    """

    path: Path
    shown: str


def split_suffix(path: str | Path) -> tuple[str, str | None]:
    """``(format suffix, compression)`` of a file name, lower-cased: ``"a.jsonl.gz"`` ->
    ``(".jsonl", "gzip")``, ``"a.parquet"`` -> ``(".parquet", None)``, ``"a.gz"`` -> ``("", "gzip")``."""
    p = Path(path)
    kind = COMPRESSIONS.get(p.suffix.lower())
    if kind is None:
        return p.suffix.lower(), None
    return Path(p.stem).suffix.lower(), kind


def is_glob(path: str | Path) -> bool:
    """Whether ``path`` holds glob characters (``*``, ``?``, ``[``)."""
    return any(c in _GLOB_CHARS for c in str(path))


def is_data_file(name: str) -> bool:
    """Whether a directory entry is picked as a shard: a :data:`DATA_SUFFIXES` file, optionally
    compressed, not hidden."""
    return not name.startswith(".") and split_suffix(name)[0] in DATA_SUFFIXES


def local_shards(path: str | Path) -> list[Shard]:
    """The files a local ``path`` names, in the order they are read.

    * a file: itself (``shown`` is ``str(path)``, as before shard sets existed);
    * a directory: every :func:`is_data_file` below it (recursively; hidden files and directories
      skipped), sorted by their path relative to it;
    * a glob (``*``, ``?``, ``[...]``; ``**`` spans directories): the regular files it matches that
      are :func:`is_data_file` s, sorted (``shards/*`` skips a ``README.md`` there, as a directory does).

    Anything else is returned as one shard, for the reader to report (missing, not a regular file).

    Raises:
        DatasetError: a directory without data files, a glob matching no data file (the message names
            what it matched), or a compressed Parquet file among the shards (:func:`compressed_parquet`).
    """
    p = Path(path)
    try:
        globbed, directory = is_glob(path) and not p.exists(), p.is_dir()
    except OSError:  # e.g. EACCES on a parent directory: the reader reports it for the path itself
        return [Shard(p, str(path))]
    if globbed:
        files = sorted(m for m in glob.glob(str(path), recursive=True) if os.path.isfile(m))
        found = [m for m in files if is_data_file(os.path.basename(m))]
        if not files:
            raise DatasetError(f"{path}: the glob matches no file; expected one or more {_expected()} files")
        if not found:
            raise DatasetError(f"{path}: the glob matches no dataset file, only {len(files)} other file(s) "
                               f"({_names(files)}); expected one or more {_expected()} files")
        shards = [Shard(Path(m), m) for m in found]
    elif directory:
        found_paths = sorted(_walk(p), key=lambda q: q.relative_to(p).as_posix())
        if not found_paths:
            raise DatasetError(f"{path}: no dataset files in the directory; expected {_expected()} files")
        shards = [Shard(q, str(q)) for q in found_paths]
    else:
        shards = [Shard(p, str(path))]
    for s in shards:
        why = compressed_parquet(s.shown)
        if why is not None:
            raise DatasetError(why if s.shown == str(path) else f"{why} (one of the files of {path})")
    return shards


def compressed_parquet(name: str) -> str | None:
    """The reason a file named ``name`` is refused as a gzip/zstd-compressed Parquet file (None when
    it is not one): Parquet compresses its own pages."""
    ext, kind = split_suffix(name)
    return compressed_parquet_reason(name, kind) if ext == ".parquet" and kind is not None else None


def compressed_parquet_reason(shown: str, kind: str) -> str:
    """``"{shown}: a gzip-compressed Parquet file; ..."``: why a compressed Parquet file is refused."""
    return f"{shown}: a {kind}-compressed Parquet file; Parquet compresses its own pages, so give the .parquet file itself"


def _names(paths: list[str]) -> str:
    shown = ", ".join(os.path.basename(m) for m in paths[:_SHOWN_NAMES])
    return shown + (", ..." if len(paths) > _SHOWN_NAMES else "")


def _walk(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        out += [Path(dirpath) / f for f in filenames if is_data_file(f)]
    return out


def _expected() -> str:
    return "/".join(DATA_SUFFIXES) + " (optionally " + "/".join(COMPRESSIONS) + ")"
