"""Controlling an extraction job: ``out_dir/control.json``, written atomically, read by every worker.

The file is the one channel for pause / resume / skip / quit, whoever asks: the dashboard's keys and
the headless launcher's signals (through :class:`ExtractControl`), or another shell (``datagen ctl
OUT_OR_RUN_DIR extract-pause|extract-resume|extract-skip DS``, :func:`send`). Workers read it between
batches (:class:`ControlReader`, re-parsed only when the file changed):

- ``paused``: a worker finishes and writes the batch in hand, then waits (status ``paused``) until
  it is false again;
- ``skip``: datasets whose pending samples are dropped from every batch not yet started (what is
  written stays); kept across restarts, so a later ``datagen extract`` honours it too;
- ``quit``: ``"drain"`` (finish the batch in hand, flush the shards, exit 0; status ``stopped``) or
  ``"abort"`` (stop after the write in progress; the batch in hand is dropped, a rerun redoes it).

A new launcher clears ``paused`` and ``quit`` at start (a job starts running) and keeps ``skip``.
Read-modify-write is serialised by ``flock`` on ``out_dir/.control.lock``; the file itself is
replaced atomically (temp + rename), so a reader never sees half of it.

Format: ``{"paused": bool, "skip": [dataset, ...], "quit": null | "drain" | "abort", "seq": int,
"updated_at": epoch s}`` (``seq`` counts changes).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from engine.errors import DatagenError

CONTROL = "control.json"
CONTROL_LOCK = ".control.lock"
#: Per-dataset plan totals the launcher writes at start (what ``ctl extract-skip`` checks names against).
PLAN = "plan.json"
QUIT_MODES = (None, "drain", "abort")
VERBS = ("extract-pause", "extract-resume", "extract-skip")


class ControlError(DatagenError):
    """The control file or the target directory cannot be used; the message names the path."""


@dataclass(frozen=True)
class Control:
    """What the control file asks (see the module doc). ``seq`` counts changes since it was created."""

    paused: bool = False
    skip: tuple[str, ...] = ()
    quit: str | None = None
    seq: int = 0
    updated_at: float = 0.0

    def to_json(self) -> str:
        return json.dumps({"paused": self.paused, "skip": list(self.skip), "quit": self.quit, "seq": self.seq,
                           "updated_at": self.updated_at})

    @classmethod
    def parse(cls, text: str, where: str = CONTROL) -> "Control":
        """Parse the file's text.

        Raises:
            ControlError: not a JSON object of the documented shape (names ``where`` and the key).
        """
        try:
            d = json.loads(text)
        except ValueError as e:
            raise ControlError(f"{where}: not JSON ({e})") from None
        if not isinstance(d, dict):
            raise ControlError(f"{where}: expected a JSON object, got {type(d).__name__}")
        skip = d.get("skip", [])
        if not isinstance(skip, list) or not all(isinstance(s, str) for s in skip):
            raise ControlError(f"{where}: 'skip' must be a list of dataset names, got {skip!r}")
        quit_ = d.get("quit")
        if quit_ not in QUIT_MODES:
            raise ControlError(f"{where}: 'quit' must be null, \"drain\" or \"abort\", got {quit_!r}")
        paused = d.get("paused", False)
        if not isinstance(paused, bool):
            raise ControlError(f"{where}: 'paused' must be true or false, got {paused!r}")
        return cls(paused, tuple(skip), quit_, int(d.get("seq", 0)), float(d.get("updated_at", 0.0)))


def control_path(out_dir: str | Path) -> Path:
    return Path(out_dir) / CONTROL


def read_control(out_dir: str | Path) -> Control:
    """The control file of ``out_dir`` (the default :class:`Control` when there is none).

    Raises:
        ControlError: the file exists but is malformed.
    """
    p = control_path(out_dir)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Control()
    return Control.parse(text, str(p))


@contextmanager
def _locked(out_dir: Path) -> Iterator[None]:
    fd = os.open(out_dir / CONTROL_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def update_control(out_dir: str | Path, change: Callable[[Control], Control]) -> Control:
    """Apply ``change`` to the current control under the lock and write the result atomically.

    Returns:
        the control as written (``seq`` + 1, ``updated_at`` now).

    Raises:
        ControlError: ``out_dir`` is not a directory, or the current file is malformed.
    """
    d = Path(out_dir)
    if not d.is_dir():
        raise ControlError(f"{d}: not an extraction output directory (missing)")
    with _locked(d):
        new = change(read_control(d))
        new = replace(new, seq=new.seq + 1, updated_at=time.time())
        tmp = d / f".{CONTROL}.{os.getpid()}.tmp"
        tmp.write_text(new.to_json(), encoding="utf-8")
        os.replace(tmp, control_path(d))
    return new


def reset_for_start(out_dir: str | Path) -> Control:
    """What a new launcher does: clear ``paused`` and ``quit``, keep ``skip``."""
    return update_control(out_dir, lambda c: replace(c, paused=False, quit=None))


class ControlReader:
    """A worker's view of the control file, re-read at every :meth:`read` (a few hundred bytes: no
    change detection by mtime, whose granularity could hide two quick writes of the same size).

    A malformed file keeps the last good control (and ``error`` says why), so a bad hand edit never
    crashes a worker.
    """

    def __init__(self, out_dir: str | Path) -> None:
        self.path = control_path(out_dir)
        self.current = Control()
        self.error = ""

    def read(self) -> Control:
        """The current control."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self.current, self.error = Control(), ""
            return self.current
        except OSError as e:
            self.error = str(e)
            return self.current
        try:
            self.current, self.error = Control.parse(text, str(self.path)), ""
        except ControlError as e:
            self.error = str(e)
        return self.current


def write_plan(out_dir: str | Path, datasets: dict[str, dict[str, int]]) -> None:
    """Write ``out_dir/status/plan.json``: ``{"datasets": {name: {"samples", "tokens"}}}`` (the whole
    input, done or not), atomically."""
    p = Path(out_dir) / "status" / PLAN
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{PLAN}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"datasets": datasets}), encoding="utf-8")
    os.replace(tmp, p)


def read_plan(out_dir: str | Path) -> dict[str, dict[str, int]]:
    """The per-dataset totals written by :func:`write_plan` (``{}`` when there are none)."""
    try:
        d = json.loads((Path(out_dir) / "status" / PLAN).read_text(encoding="utf-8"))
        return {str(k): {"samples": int(v["samples"]), "tokens": int(v["tokens"])} for k, v in d["datasets"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


class ExtractControl:
    """:class:`engine.extract.snapshot.ExtractCommands` through the control file of ``out_dir``.

    Args:
        out_dir: the job's output directory.
        datasets: the job's dataset names (what ``skip`` accepts); empty: read ``status/plan.json``.
        on_change: called with each control written and the result line (the launcher logs it).
    """

    def __init__(self, out_dir: str | Path, datasets: Sequence[str] = (),
                 on_change: Callable[[Control, str], None] | None = None) -> None:
        self.out_dir = Path(out_dir)
        self._datasets = tuple(datasets)
        self._on_change = on_change

    def datasets(self) -> tuple[str, ...]:
        """Dataset names of the job."""
        return self._datasets or tuple(read_plan(self.out_dir))

    def _apply(self, change: Callable[[Control], Control], text: Callable[[Control], str]) -> str:
        c = update_control(self.out_dir, change)
        line = text(c)
        if self._on_change is not None:
            self._on_change(c, line)
        return line

    def pause(self) -> str:
        """Workers finish and write the batch in hand, then wait."""
        return self._apply(lambda c: replace(c, paused=True),
                           lambda c: "extraction paused: workers finish and write the batch in hand, then wait")

    def resume(self) -> str:
        """Paused workers continue."""
        return self._apply(lambda c: replace(c, paused=False), lambda c: "extraction resumed")

    def skip(self, dataset: str) -> str:
        """No more batches of ``dataset`` (persisted).

        Raises:
            ValueError: ``dataset`` is not one of the job's datasets (the message lists them).
        """
        names = self.datasets()
        if dataset not in names:
            raise ValueError(f"unknown dataset {dataset!r}; expected one of: {', '.join(names) or '(none)'}")
        return self._apply(lambda c: c if dataset in c.skip else replace(c, skip=c.skip + (dataset,)),
                           lambda c: f"{dataset} skipped: its pending samples are dropped (what is written stays)")

    def unskip(self, dataset: str) -> str:
        """Take ``dataset`` off the skip list (applies to batches not yet started; a rerun does the rest)."""
        return self._apply(lambda c: replace(c, skip=tuple(s for s in c.skip if s != dataset)),
                           lambda c: f"{dataset} no longer skipped")

    def quit(self) -> str:
        """First call: drain (finish the batch in hand, flush shards, exit 0). Second: abort after the
        write in progress."""
        def change(c: Control) -> Control:
            return replace(c, quit="drain" if c.quit is None else "abort", paused=False)

        return self._apply(change, lambda c: (
            "quitting: workers finish the batch in hand and flush their shards; quit again to abort"
            if c.quit == "drain" else "aborting: workers stop after the write in progress"))


def resolve_out_dir(path: str | Path) -> Path:
    """The extraction output directory named by ``path``: itself when it holds ``job.json``,
    ``control.json`` or ``manifest.jsonl``; a run directory's ``extract.json`` target; else
    ``path/extract`` when that holds a job.

    Raises:
        ControlError: none of these (the message says what was looked for).
    """
    p = Path(path)
    if not p.is_dir():
        raise ControlError(f"{p}: no such directory (expected an extraction output directory or a run directory)")
    if any((p / n).exists() for n in ("job.json", CONTROL, "manifest.jsonl")):
        return p
    link = p / "extract.json"
    if link.is_file():
        try:
            return Path(json.loads(link.read_text())["out_dir"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ControlError(f"{link}: expected {{\"out_dir\": PATH}} ({e})") from None
    if (p / "extract" / "job.json").exists():
        return p / "extract"
    raise ControlError(f"{p}: not an extraction output directory (no job.json, control.json or manifest.jsonl) and "
                       f"not a run directory with an extraction (no extract.json)")


@dataclass(frozen=True)
class CtlResult:
    """What an ``extract-*`` ``ctl`` verb did: ``text`` for the user, ``ok`` False when refused."""

    text: str
    ok: bool


def _live(out_dir: Path) -> bool:
    from engine.extract.status import ACTIVE, _holder, read_workers

    return _holder(out_dir) is not None or any(w.get("state") in ACTIVE for w in read_workers(out_dir))


def send(path: str | Path, verb: str, dataset: str | None = None) -> CtlResult:
    """``datagen ctl OUT_OR_RUN_DIR extract-pause|extract-resume|extract-skip DS``.

    Pause and resume act on a live job only (refused, ``ok`` False, when no launcher or worker is
    running: a job starts unpaused); a skip is saved either way and honoured at the next start.

    Raises:
        ControlError: ``path`` names no extraction; ValueError: unknown verb, missing or unknown dataset.
    """
    if verb not in VERBS:
        raise ValueError(f"unknown command {verb!r}; expected one of {', '.join(VERBS)}")
    out = resolve_out_dir(path)
    live = _live(out)
    ctl = ExtractControl(out)
    if verb == "extract-skip":
        if not dataset:
            raise ValueError("usage: datagen ctl OUT_OR_RUN_DIR extract-skip DATASET")
        text = ctl.skip(dataset)
        return CtlResult(text + ("" if live else ": saved, no extraction is running; applies at the next start"), True)
    if dataset:
        raise ValueError(f"{verb} takes no dataset (it acts on the whole extraction)")
    if not live:
        return CtlResult(f"not applied: no extraction is running in {out} (a job starts unpaused)", False)
    return CtlResult(ctl.pause() if verb == "extract-pause" else ctl.resume(), True)


def control_dict(c: Control) -> dict[str, Any]:
    """The control as JSON-ready data (``datagen status``)."""
    return json.loads(c.to_json())


__all__ = ["CONTROL", "Control", "ControlError", "ControlReader", "CtlResult", "ExtractControl", "VERBS",
           "control_dict", "read_control", "read_plan", "reset_for_start", "resolve_out_dir", "send",
           "update_control", "write_plan"]
