"""Hugging Face Hub datasets: ``path = "hf://datasets/ORG/NAME"`` -> a commit sha and the shard files to read.

Read through ``huggingface_hub``: its cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, read when called),
``HF_TOKEN``, offline mode ``HF_HUB_OFFLINE=1`` (read when called, or as set when the library was imported)
and ``HF_ENDPOINT`` (as the library read it at import, for API and file URLs alike). Two steps, so that
resuming a run whose dataset did not move costs one API call and no download:

1. :func:`resolve`: the revision (branch, tag or sha; default ``main``) -> its commit sha and the
   repository's file list (``GET /api/datasets/ORG/NAME/revision/REV``), and the files to read: those
   the ``files`` glob matches, else those of the ``split`` by the Hub's conventional layouts
   (:func:`split_patterns`). Offline: the sha from the cache's ``refs/REV``, the files from the cached
   snapshot.
2. :func:`download`: those files into the cache (``snapshot_download`` at the sha; cached files are not
   fetched again), as :class:`~engine.datasets.sources.Shard` s named ``hf://datasets/ORG/NAME/FILE``.

Globs (``files``, and the split patterns) match repository paths as ``huggingface_hub``'s
``allow_patterns`` do (``fnmatch``: ``*`` also matches ``/``). Only data files count
(:data:`engine.datasets.sources.DATA_SUFFIXES`, optionally ``.gz``/``.zst``): a README or
``.gitattributes`` never becomes a shard. Errors are :class:`~engine.datasets.sources.DatasetError`
naming the ``hf://`` path.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.datasets.sources import DatasetError, Shard, compressed_parquet, is_data_file

#: The prefix of a Hub dataset path.
SCHEME = "hf://datasets/"
DEFAULT_REVISION = "main"
DEFAULT_SPLIT = "train"
_PART = r"[A-Za-z0-9][A-Za-z0-9_.\-]*"
_REPO = re.compile(rf"{_PART}/{_PART}")
_SHOWN_FILES = 20
_HTTP_STACKS = frozenset({"httpx", "httpx2", "httpcore", "requests", "urllib3"})


def parse_url(path: str) -> str:
    """The ``ORG/NAME`` of ``hf://datasets/ORG/NAME`` (a trailing ``/`` allowed).

    Raises:
        ValueError: ``"expected hf://datasets/ORG/NAME (a Hub dataset id), got ..."``.
    """
    repo = path.removeprefix(SCHEME).rstrip("/") if path.startswith(SCHEME) else ""
    if not _REPO.fullmatch(repo) or ".." in repo:
        raise ValueError(f"expected hf://datasets/ORG/NAME (a Hub dataset id), got {path!r}")
    return repo


@dataclass(frozen=True, slots=True)
class HubRef:
    """A ``[[datasets]]`` entry's Hub dataset, as configured.

    Attributes:
        repo: ``ORG/NAME``.
        revision: branch, tag or commit sha (default ``main``).
        split: the split whose files are read (default ``train``), by :func:`split_patterns`.
        files: a glob over repository paths that picks the files instead of ``split``.
    """

    repo: str
    revision: str = DEFAULT_REVISION
    split: str = DEFAULT_SPLIT
    files: str | None = None

    @property
    def url(self) -> str:
        """``hf://datasets/ORG/NAME``."""
        return SCHEME + self.repo


@dataclass(frozen=True, slots=True)
class HubRevision:
    """A resolved Hub dataset: the commit and the files to read.

    Attributes:
        ref: what was configured.
        sha: the commit sha (40 hex digits) the revision pointed to.
        files: repository paths of the files to read, sorted.
        pattern: the glob that picked them (``files``, or the split's conventional layout).
    """

    ref: HubRef
    sha: str
    files: tuple[str, ...]
    pattern: str

    def shards(self, root: Path) -> list[Shard]:
        """The files under a snapshot folder ``root``, named ``hf://datasets/ORG/NAME/FILE``."""
        return [Shard(root / f, f"{self.ref.url}/{f}") for f in self.files]


def split_patterns(split: str) -> list[list[str]]:
    """The Hub's conventional layouts of ``split``'s files, as groups of globs tried in order; the first
    group matching any data file wins. For split ``train``:

    1. ``data/train-*``, ``data/train.*`` (``push_to_hub``'s layout: ``data/train-00000-of-00003.parquet``)
    2. ``train-*``, ``train.*`` (``train.jsonl`` at the top)
    3. ``train/*`` (a split directory)
    4. ``*/train/*`` (``CONFIG/train/0000.parquet``, the Hub's Parquet conversion)
    5. ``*/train-*``, ``*/train.*`` (``CONFIG/train-00000.parquet``, ``data/sub/train.jsonl``)

    Then, for ``train`` only and when no data file's name holds a split word (:data:`SPLIT_WORDS`), every
    data file: a repository without splits is all train, as ``datasets`` reads it.
    """
    s = split
    return [[f"data/{s}-*", f"data/{s}.*"], [f"{s}-*", f"{s}.*"], [f"{s}/*"], [f"*/{s}/*"], [f"*/{s}-*", f"*/{s}.*"]]


#: Words that mark a file as one split's (``datasets``' split keywords): their presence in any data file's
#: path stops the "every file is train" fallback.
SPLIT_WORDS = frozenset({"train", "training", "test", "testing", "eval", "evaluation", "validation", "valid", "val", "dev"})
_WORD_SEP = re.compile(r"[-._ /0-9]+")


def pick_files(names: list[str], split: str, files: str | None) -> tuple[str, list[str]]:
    """``(pattern, picked)``: the data files among repository paths ``names`` that ``files`` (if given)
    or ``split``'s layouts (:func:`split_patterns`) match, sorted; ``picked`` is empty when none match.
    ``pattern`` is the glob(s) that matched, ``", "``-joined.

    Raises:
        DatasetError: (``split`` only) a ``*/``-layout matched files of several top-level directories,
            which are a dataset's configurations (``all/``, ``code/``, ``math/``): ``files`` must pick one.
    """
    from huggingface_hub.utils import filter_repo_objects

    data = sorted(n for n in names if is_data_file(n.rsplit("/", 1)[-1]) and not _hidden(n))
    groups = [[files]] if files is not None else split_patterns(split)
    if files is None and split == DEFAULT_SPLIT and not any(SPLIT_WORDS & set(_WORD_SEP.split(n.lower())) for n in data):
        groups.append(["*"])
    for group in groups:
        picked = sorted(filter_repo_objects(data, allow_patterns=group))
        if not picked:
            continue
        tops = sorted({f.split("/", 1)[0] for f in picked if "/" in f})
        if files is None and group[0].startswith("*/") and len(tops) > 1:
            raise DatasetError(f"split {split!r} (layout {', '.join(group)}) matches files in {len(tops)} directories, "
                               f"a dataset's configurations ({', '.join(t + '/' for t in tops[:8])}): set files to "
                               f"pick one, e.g. files = \"{tops[0]}/*\"")
        return ", ".join(group), picked
    return files if files is not None else "", []


def _hidden(name: str) -> bool:
    return any(part.startswith(".") for part in name.split("/"))


def offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set true now, or was when
    ``huggingface_hub`` was imported."""
    def true(v: str | None) -> bool:
        return (v or "").strip().upper() in {"1", "ON", "YES", "TRUE"}

    if true(os.environ.get("HF_HUB_OFFLINE")) or true(os.environ.get("TRANSFORMERS_OFFLINE")):
        return True
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def cache_dir() -> Path:
    """The hub cache now: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``huggingface_hub``'s default."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expanduser(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        return Path(os.path.expanduser(os.environ["HF_HOME"])) / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def resolve(ref: HubRef) -> HubRevision:
    """The commit ``ref.revision`` points to and the files to read (step 1 of the module docstring).

    Online: one ``dataset_info`` call. Offline (:func:`offline`): the hub cache only, no network.

    Raises:
        DatasetError: the repository or revision does not exist or is not accessible (gated, private
            without ``HF_TOKEN``), the Hub cannot be reached, offline with nothing cached, no data file
            matches ``files``/``split`` (the message lists the repository's files), or a picked file is
            a compressed Parquet file.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    if offline():
        sha, names = _cached(ref)
    else:
        try:
            info = HfApi().dataset_info(ref.repo, revision=ref.revision)
        except RevisionNotFoundError:
            raise DatasetError(f"{ref.url}: revision {ref.revision!r} not found on the Hub") from None
        except GatedRepoError:
            raise DatasetError(f"{ref.url}: a gated dataset: accept its terms on the Hub and set HF_TOKEN") from None
        except RepositoryNotFoundError:
            raise DatasetError(f"{ref.url}: no such dataset on the Hub (or a private one: set HF_TOKEN)") from None
        except HfHubHTTPError as e:
            raise DatasetError(f"{ref.url}: the Hub answered {_status(e)} for revision {ref.revision!r}") from None
        except Exception as e:
            if not network_error(e):
                raise
            raise DatasetError(f"{ref.url}: cannot reach the Hub ({type(e).__name__}: {e}); "
                               f"HF_HUB_OFFLINE=1 reads the cache") from None
        sha, names = str(info.sha), [s.rfilename for s in info.siblings or []]
    try:
        pattern, files = pick_files(names, ref.split, ref.files)
    except DatasetError as e:
        raise DatasetError(f"{ref.url}@{sha[:12]}: {e}") from None
    if not files:
        what = f"files {ref.files!r}" if ref.files is not None else f"split {ref.split!r} (by the layouts {_layouts(ref.split)})"
        shown = ", ".join(sorted(names)[:_SHOWN_FILES]) + (", ..." if len(names) > _SHOWN_FILES else "")
        has = "the cached snapshot (HF_HUB_OFFLINE is set) has" if offline() else "the repository has"
        raise DatasetError(f"{ref.url}@{sha[:12]}: {what} matches no data file; {has}: {shown or '(no files)'}")
    refused = [why for f in files if (why := compressed_parquet(f"{ref.url}/{f}")) is not None]
    if refused:  # refused before anything is downloaded
        raise DatasetError(refused[0] + (f" (and {len(refused) - 1} more such file(s)); set files to leave them out"
                                         if len(refused) > 1 else "; set files to leave it out"))
    return HubRevision(ref, sha, tuple(files), pattern)


def network_error(e: BaseException) -> bool:
    """Whether ``e`` is a connection failure or timeout of the HTTP stack under ``huggingface_hub``
    (``OSError``, or an ``httpx``/``httpx2``/``requests`` error, depending on its version)."""
    return isinstance(e, OSError) or type(e).__module__.split(".")[0] in _HTTP_STACKS


def _layouts(split: str) -> str:
    return " | ".join(", ".join(g) for g in split_patterns(split))


def _status(e: Any) -> str:
    resp = getattr(e, "response", None)
    return f"HTTP {resp.status_code}" if resp is not None else str(e)


def _storage(repo: str) -> Path:
    """The cache folder of dataset ``repo`` (``datasets--ORG--NAME``, huggingface_hub's layout)."""
    from huggingface_hub.file_download import repo_folder_name

    return cache_dir() / repo_folder_name(repo_id=repo, repo_type="dataset")


def _cached(ref: HubRef) -> tuple[str, list[str]]:
    """Offline: ``(sha, files in the cached snapshot)`` of ``ref.revision``, from the cache alone."""
    storage = _storage(ref.repo)
    if re.fullmatch(r"[0-9a-f]{40}", ref.revision):
        sha = ref.revision
    else:
        try:
            sha = (storage / "refs" / ref.revision).read_text().strip()
        except OSError:
            raise DatasetError(f"{ref.url}: revision {ref.revision!r} is not in the Hugging Face cache ({storage}) "
                               f"and HF_HUB_OFFLINE is set: run once online to download it") from None
    snap = storage / "snapshots" / sha
    if not snap.is_dir():
        raise DatasetError(f"{ref.url}: commit {sha[:12]} of revision {ref.revision!r} is not in the Hugging Face "
                           f"cache ({storage}) and HF_HUB_OFFLINE is set: run once online to download it")
    names = [p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file()]
    return sha, names


def check_cached(ref: HubRef) -> str | None:
    """For config validation in offline mode: None when the cache holds ``ref``'s revision with files
    to read, else the reason (no network either way)."""
    try:
        resolve(ref)
    except DatasetError as e:
        return str(e)
    return None


def download(rev: HubRevision) -> list[Shard]:
    """Step 2: the files of ``rev`` in the local cache (downloaded when missing), in order.

    ``snapshot_download`` is asked for the configured revision (so it records ``refs/REV`` -> sha in the
    cache, as for any download, and a later offline run finds it) and only ``rev.files``; the snapshot
    it returns must be ``rev.sha``'s.

    Raises:
        DatasetError: a download failed; the revision moved to another commit since :func:`resolve`
            (run again); or (offline) the cached snapshot misses one of the files.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    where = f"{rev.ref.url}@{rev.sha[:12]}"
    try:
        root = Path(snapshot_download(
            rev.ref.repo, repo_type="dataset", revision=rev.ref.revision,
            allow_patterns=[glob.escape(f) for f in rev.files], cache_dir=str(cache_dir()),
            local_files_only=offline(), tqdm_class=_silent_tqdm(),
        ))
    except Exception as e:
        if not isinstance(e, LocalEntryNotFoundError | HfHubHTTPError) and not network_error(e):
            raise
        raise DatasetError(f"{where}: download failed ({type(e).__name__}: {e})") from None
    if root.name != rev.sha:
        raise DatasetError(f"{rev.ref.url}: revision {rev.ref.revision!r} moved from {rev.sha[:12]} to "
                           f"{root.name[:12]} during the download; run again")
    missing = [f for f in rev.files if not (root / f).is_file()]
    if missing:
        raise DatasetError(f"{where}: {len(missing)} file(s) missing from the cached snapshot, e.g. {missing[0]}")
    return rev.shards(root)


def _silent_tqdm() -> type:
    """A tqdm class that draws nothing (the dashboard owns the terminal; headless prints its own lines)."""
    from tqdm.auto import tqdm

    class Silent(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return Silent
