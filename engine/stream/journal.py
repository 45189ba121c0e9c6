"""The stream workers' journals: a paid completion is on disk before anything can lose it.

Each worker appends every finished completion to its own journal, ``RUN_DIR/journal/w{slot}-{pid}-{seq}.jsonl``
(one JSON object a line: the prompt's id, dataset and key, and the completion), and sends the result
to the run only once the line is written and fsynced. Lines are written in groups: a completion waits
at most for the fsync in progress plus its own (``WorkerInit.fsync_s`` bounds the wait before a
group is written). A segment is closed after :data:`SEGMENT_BYTES` and a new one opened.

The run's store ingests the journals exactly once by prompt key (``results`` is unique on dataset +
key): at start (:mod:`engine.stream.recover`) and, while running, from a worker that died before
it could send what it had journaled (:meth:`engine.stream.pool.StreamWorkerPool`). A segment whose
every line is in the store is deleted (:func:`prune`).

Beside the journal each worker keeps its in-flight ledger, ``inflight-w{slot}-{pid}.json``, rewritten
every ``WorkerInit.ledger_s``: the streams it has open with the tokens received so far. After a kill
of the whole run those streams are gone, billed for what was generated (or in full, by a provider
that keeps generating after a disconnect): the ledger is how that spend is counted (lost spend,
:mod:`engine.stream.recover`, estimated, then trued up from ``/generation`` by generation id).

A line cut by a kill in the middle of a write is skipped when read (it was never fsynced, so its
result was never sent: the prompt is still pending and is requested again).

Every file's name says whose it is (:func:`file_owner`: slot and process id): recovery at start reads
and deletes only the files of earlier processes, never those of the workers the run has just started,
and pruning never deletes a live worker's open segment. Should a worker's open segment be unlinked
anyway (by hand, or a bug), the worker notices at its next write (the file has no link left) and
writes the group again into a new segment, so the lines it fsyncs are always reachable by name.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Iterator

from engine.client.types import Completion, ToolCall, Usage

log = logging.getLogger(__name__)

#: A journal segment is closed once it holds this many bytes.
SEGMENT_BYTES = 64 * 1024 * 1024
JOURNAL_DIR = "journal"

#: ``w{slot}-{pid}-{seq}.jsonl`` (a segment) and ``inflight-w{slot}-{pid}.json`` / ``.tmp`` (a ledger).
_OWNED = re.compile(r"^(?:w(\d+)-(\d+)-\d+\.jsonl|inflight-w(\d+)-(\d+)\.(?:json|tmp))$")


def file_owner(path: str | Path) -> tuple[int, int] | None:
    """``(slot, pid)`` of the worker that wrote journal file ``path`` (a segment or an in-flight
    ledger, see the module docstring); None for any other name."""
    m = _OWNED.match(Path(path).name)
    if m is None:
        return None
    slot, pid = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3), m.group(4))
    return int(slot), int(pid)


def journal_dir(run_dir: str | Path) -> Path:
    """``RUN_DIR/journal``."""
    return Path(run_dir) / JOURNAL_DIR


def completion_to_dict(c: Completion) -> dict[str, Any]:
    """A :class:`Completion` as plain JSON types (inverse: :func:`completion_from_dict`)."""
    u = c.usage
    return {"reasoning": c.reasoning, "content": c.content,
            "tool_calls": [[t.id, t.name, t.arguments, t.type] for t in c.tool_calls],
            "finish_reason": c.finish_reason, "native_finish_reason": c.native_finish_reason,
            "usage": [u.prompt_tokens, u.completion_tokens, u.reasoning_tokens, u.cost_usd],
            "provider": c.provider, "model": c.model, "generation_id": c.generation_id, "latency_s": c.latency_s,
            "ttft_s": c.ttft_s, "usage_reported": c.usage_reported, "flags": list(c.flags),
            "token_ids": None if c.token_ids is None else list(c.token_ids),
            "endpoint": c.endpoint, "system_fingerprint": c.system_fingerprint, "temperature": c.temperature,
            "top_p": c.top_p}


def completion_from_dict(d: dict[str, Any]) -> Completion:
    """Rebuild the :class:`Completion` of :func:`completion_to_dict`.

    Raises:
        KeyError / TypeError / ValueError: not such a dict.
    """
    p, c, r, cost = d["usage"]
    return Completion(
        reasoning=d["reasoning"], content=d["content"],
        tool_calls=tuple(ToolCall(i, n, a, t) for i, n, a, t in d["tool_calls"]),
        finish_reason=d["finish_reason"], native_finish_reason=d["native_finish_reason"],
        usage=Usage(int(p), int(c), int(r), cost), provider=d["provider"], model=d["model"],
        generation_id=d["generation_id"], latency_s=float(d["latency_s"]), ttft_s=d["ttft_s"],
        usage_reported=bool(d["usage_reported"]), flags=tuple(d.get("flags") or ()),
        token_ids=None if d.get("token_ids") is None else tuple(int(x) for x in d["token_ids"]),
        endpoint=str(d.get("endpoint") or ""), system_fingerprint=str(d.get("system_fingerprint") or ""),
        temperature=_opt_float(d.get("temperature")), top_p=_opt_float(d.get("top_p")),
    )


def _opt_float(v: Any) -> float | None:
    """A journaled sampling setting: a float, or None (absent in lines written before it was journaled)."""
    return None if v is None else float(v)


def record_line(rid: int, ref: tuple[int, str, str], started: float, ended: float, c: Completion) -> bytes:
    """One journal line: request id, prompt ``ref`` = (prompt id, dataset, key), wall-clock start and
    end of the attempt (s since the epoch), the completion."""
    pid, dataset, key = ref
    return (json.dumps({"rid": rid, "p": pid, "d": dataset, "k": key, "t0": started, "t1": ended,
                        "c": completion_to_dict(c)}, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


class JournalWriter:
    """Appends journal lines for one worker; :meth:`write` is blocking (run it in a thread).

    Args:
        directory: the run's journal directory (created 0700).
        slot: the worker's slot. pid: the worker's process id (a restarted worker writes new files).
        segment_bytes: size after which a segment is closed.
    """

    def __init__(self, directory: Path, slot: int, pid: int, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.prefix = f"w{slot}-{pid}"
        self.segment_bytes = segment_bytes
        self.seq = 0
        self.size = 0
        #: open segments found unlinked (by someone else) so far.
        self.unlinked = 0
        self._f = self._open()

    @property
    def path(self) -> Path:
        """The segment being written."""
        return self.dir / f"{self.prefix}-{self.seq:04d}.jsonl"

    def _open(self):
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return os.fdopen(fd, "ab", buffering=0)

    def write(self, lines: list[bytes]) -> None:
        """Append ``lines`` and fsync; opens the next segment once this one is full.

        A segment unlinked while open (its link count is 0: nothing could read it after a kill) is
        left: the next segment is opened and ``lines`` written there (lines already in the unlinked
        one were sent to the run before; only those not yet committed could be lost with it).

        Raises:
            OSError: the disk refused the write (the worker then sends the results unjournaled;
                the store still takes them).
        """
        data = b"".join(lines)
        if self._unlinked():
            self._next()
        self._f.write(data)
        os.fsync(self._f.fileno())
        if self._unlinked():  # unlinked during the write: write the group again where it can be found
            self._next()
            self._f.write(data)
            os.fsync(self._f.fileno())
        self.size += len(data)
        if self.size >= self.segment_bytes:
            self._next()

    def _unlinked(self) -> bool:
        if os.fstat(self._f.fileno()).st_nlink > 0:
            return False
        self.unlinked += 1
        log.warning("journal segment %s was deleted while this worker had it open; writing to %s",
                    self.path.name, self.dir / f"{self.prefix}-{self.seq + 1:04d}.jsonl")
        return True

    def _next(self) -> None:
        self._f.close()
        self.seq += 1
        self.size = 0
        self._f = self._open()

    def close(self) -> None:
        """Close the open segment."""
        self._f.close()


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """The journal lines of one segment as dicts; a line cut by a kill (no newline, bad JSON) is skipped."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return
    for line in data.split(b"\n"):
        if not line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and {"p", "d", "k", "c"} <= rec.keys():
            yield rec


def segments(directory: Path, prefix: str = "w") -> list[Path]:
    """Journal segments in ``directory`` whose name starts with ``prefix`` (e.g. ``w0-1234-``), oldest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted((p for p in d.glob(f"{prefix}*.jsonl")), key=lambda p: (p.stat().st_mtime, p.name))


def ledger_path(directory: Path, slot: int, pid: int) -> Path:
    """The in-flight ledger of worker ``slot`` with process id ``pid``."""
    return Path(directory) / f"inflight-w{slot}-{pid}.json"


def write_ledger(path: Path, streams: list[list[Any]]) -> None:
    """Replace the in-flight ledger atomically: ``streams`` = ``[prompt id, dataset, key, tokens
    received, generation id, provider, started (s since the epoch)]`` per open stream."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"streams": streams}, f, separators=(",", ":"))
    os.replace(tmp, path)


def ledgers(directory: Path) -> list[Path]:
    """The in-flight ledgers in ``directory`` (``inflight-*.json``), by name."""
    d = Path(directory)
    return sorted(d.glob("inflight-*.json")) if d.is_dir() else []


def read_ledger(path: Path) -> list[list[Any]]:
    """The open streams of one ledger (see :func:`write_ledger`); ``[]`` when unreadable or gone."""
    try:
        streams = json.loads(Path(path).read_text()).get("streams") or []
    except (OSError, ValueError, AttributeError):
        return []
    return [s for s in streams if isinstance(s, list) and len(s) >= 7]


def read_ledgers(directory: Path) -> list[list[Any]]:
    """Every open stream in the ledgers of ``directory`` (see :func:`write_ledger`); unreadable ledgers are skipped."""
    return [s for p in ledgers(directory) for s in read_ledger(p)]


def remove_ledgers(directory: Path, prefix: str = "inflight-") -> None:
    """Delete the in-flight ledgers (all, or those starting with ``prefix``) once their streams are accounted."""
    d = Path(directory)
    if d.is_dir():
        for p in d.glob(f"{prefix}*"):
            p.unlink(missing_ok=True)


__all__ = ["JOURNAL_DIR", "SEGMENT_BYTES", "JournalWriter", "completion_from_dict", "completion_to_dict",
           "file_owner", "journal_dir", "ledger_path", "ledgers", "read_ledger", "read_ledgers", "read_records",
           "record_line", "remove_ledgers", "segments", "write_ledger"]
