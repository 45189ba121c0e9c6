"""Where a dataset's bytes come from: compressed files (by suffix) and shard sets (a directory or glob).

A ``[[datasets]] path`` names one file, a directory, or a glob; :func:`local_shards` turns it into the
list of :class:`Shard` files to read, in sorted order, each with the name its rows' sources carry
(``"{shown}:{n}"``: the shard file, so errors and stored sources stay stable whatever else the
directory holds). :func:`open_binary` opens one file, decompressing on the fly by suffix:

=============== ===================================================================
``.gz``         gzip (stdlib :mod:`gzip`; multi-member files read through)
``.zst``        Zstandard (the ``zstandard`` package; multi-frame files read through)
=============== ===================================================================

The suffix before the compression one picks the file format (``a.jsonl.gz`` is JSON lines). Data are
streamed: nothing is decompressed whole into memory.
"""

from __future__ import annotations

import glob
import gzip
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from engine.errors import DatagenError

#: Compression suffix -> the name reasons use for it.
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}
#: The file-format suffixes a directory's files are picked by (each also with a compression suffix).
DATA_SUFFIXES = (".jsonl", ".ndjson", ".json", ".traj", ".parquet")
_GLOB_CHARS = frozenset("*?[")
_ZSTD_STEP = 1 << 18  # decompressed bytes per step aimed at (the output of one step is held at once)


class DatasetError(DatagenError):
    """A problem with a whole dataset file or path, as opposed to one bad row.

    Raised for: a missing, unreadable or non-regular file; a file that is neither JSON lines, a JSON
    array nor Parquet; a compressed file that is not of its suffix's kind, or a compressed Parquet
    file; a directory without data files or a glob matching none; an unknown format name; unknown
    ``fields`` mapping keys; a Parquet file that pyarrow cannot open or read; a Hub dataset that
    cannot be resolved or downloaded. The message names the path and what was expected.
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
    * a glob (``*``, ``?``, ``[...]``; ``**`` spans directories): the regular files it matches, sorted.

    Anything else is returned as one shard, for the reader to report (missing, not a regular file).

    Raises:
        DatasetError: a directory without data files, or a glob matching no file.
    """
    p = Path(path)
    try:
        globbed, directory = is_glob(path) and not p.exists(), p.is_dir()
    except OSError:  # e.g. EACCES on a parent directory: the reader reports it for the path itself
        return [Shard(p, str(path))]
    if globbed:
        found = sorted(m for m in glob.glob(str(path), recursive=True) if os.path.isfile(m))
        if not found:
            raise DatasetError(f"{path}: the glob matches no file; expected one or more {_expected()} files")
        return [Shard(Path(m), m) for m in found]
    if directory:
        found = sorted(_walk(p), key=lambda q: q.relative_to(p).as_posix())
        if not found:
            raise DatasetError(f"{path}: no dataset files in the directory; expected {_expected()} files")
        return [Shard(q, str(q)) for q in found]
    return [Shard(p, str(path))]


def _walk(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        out += [Path(dirpath) / f for f in filenames if is_data_file(f)]
    return out


def _expected() -> str:
    return "/".join(DATA_SUFFIXES) + " (optionally " + "/".join(COMPRESSIONS) + ")"


def open_binary(path: Path) -> BinaryIO:
    """Open ``path`` for reading bytes, decompressing by suffix (:data:`COMPRESSIONS`).

    The stream is buffered (``readline``/iteration work) and decompresses as it is read.

    Raises:
        OSError: the file cannot be opened.
    """
    kind = split_suffix(path)[1]
    if kind is None:
        return open(path, "rb")
    if kind == "gzip":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return io.BufferedReader(_ZstdReader(open(path, "rb")), buffer_size=1 << 16)


class _ZstdReader(io.RawIOBase):
    """Zstandard frames (one after another, as ``zstd`` and ``cat a.zst b.zst`` write them) decompressed
    as they are read. Unlike ``zstandard``'s ``stream_reader``, a file that ends inside a frame raises
    ``EOFError`` instead of ending quietly, so a truncated file is reported, not read as complete."""

    def __init__(self, raw: BinaryIO) -> None:
        import zstandard  # imported here: only .zst files need it

        self._raw = raw
        self._dctx = zstandard.ZstdDecompressor()
        self._obj: object | None = None  # the frame being decompressed
        self._out, self._at = b"", 0  # decompressed bytes, and how many of them were read
        self._feed = 1 << 10  # compressed bytes to decompress in the next step
        self._pending = b""  # compressed bytes past the end of the last frame

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        while self._at >= len(self._out):
            data, self._pending = self._pending or self._raw.read(self._feed), b""
            if not data:
                if self._obj is not None and not self._obj.eof:  # type: ignore[attr-defined]
                    raise EOFError("zstd: the file ends inside a frame (truncated)")
                return 0
            if self._obj is None or self._obj.eof:  # type: ignore[attr-defined]
                self._obj = self._dctx.decompressobj()
            self._out, self._at = self._obj.decompress(data), 0  # type: ignore[attr-defined]
            # feed less when the data compress well, more when not: about _ZSTD_STEP bytes out per step
            ratio = len(self._out) / len(data)
            self._feed = max(64, min(1 << 16, int(_ZSTD_STEP / max(ratio, 1.0))))
            if self._obj.eof:  # type: ignore[attr-defined]
                self._pending = self._obj.unused_data  # type: ignore[attr-defined]
        n = min(len(b), len(self._out) - self._at)
        b[:n] = memoryview(self._out)[self._at:self._at + n]
        self._at += n
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


def stream_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a decompressing stream raises on corrupt or truncated data (gzip's
    ``BadGzipFile``/``EOFError``/``zlib.error``, zstandard's ``ZstdError``)."""
    import zlib

    errors: list[type[BaseException]] = [gzip.BadGzipFile, EOFError, zlib.error]
    try:
        import zstandard

        errors.append(zstandard.ZstdError)
    except ImportError:  # pragma: no cover - zstandard is a dependency
        pass
    return tuple(errors)


def stream_broken(shown: str, e: BaseException) -> str:
    """The reason for a compressed stream that broke: ``"compressed data corrupt or truncated (KIND:
    detail); rest of file skipped"``."""
    kind = COMPRESSIONS.get(Path(shown).suffix.lower(), "compressed")
    return f"compressed data corrupt or truncated ({kind}: {e or type(e).__name__}); rest of file skipped"

