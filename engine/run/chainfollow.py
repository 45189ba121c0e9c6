"""``[extract] after_run = "follow"``: extraction that follows generation in increments.

While ``datagen run`` buys, the chain (:class:`engine.run.chain.ExtractChain`) looks at the run's
store every ``poll_s``. A dataset's *waiting* records are its validated (valid) records that no
extraction has covered yet. An extraction starts when some dataset has ``follow_records`` waiting,
or when a dataset ended (finished and every result validated, or generation ended) with any
waiting; it takes every waiting record of every followed dataset that has some (one model load
serves them all), one extraction at a time. Its input is frozen first
(:func:`engine.run.followinput.freeze_increment`: the records not in the output manifest yet,
written once to a Parquet file), so every worker sees the same set while the store grows; each
increment appends shards and manifest lines to the same output directory, exactly once by id.

*Covered* is counted, not listed: at start it is what the output manifest holds per dataset (a
restart after ``kill -9`` picks up where the output directory stands); when an increment is frozen
it is set to the valid records the store held then (each is extracted already or in the frozen
input), and after an increment that ended with samples left, to what the manifest holds. Records
an extraction leaves out by design (``over_length = "skip"``) thus never trigger a second time, and
a record validated after a freeze always counts as waiting, so the dataset's last increment takes it.

:func:`pick_increment` decides (pure); :class:`Follower` reads the figures and runs the loop.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from engine.errors import DatagenError
from engine.extract.control import ControlError, read_control
from engine.extract.shards import OutDir
from engine.extract.snapshot import JobState
from engine.report.snapshot import RunSnapshot
from engine.run.chainready import FINISHED_STATES, dataset_counts, readiness
from engine.run.followinput import freeze_increment, remove_increment, remove_leftovers
from engine.storage.schema import StoreError


class FollowedChain(Protocol):
    """What the follow loop uses of :class:`engine.run.chain.ExtractChain` (named here so that this
    module does not import the chain's)."""

    cfg: Any
    paused: bool
    quit_mode: str | None
    poll_s: float
    runs: list[Any]
    left_out: dict[str, str]
    source: Path | None

    def say(self, line: str) -> None: ...

    def _leave_out(self, verdicts: dict[str, tuple[str, str]]) -> None: ...

    async def _one(self, datasets: tuple[str, ...] | None) -> int: ...


@dataclass(frozen=True)
class FollowRow:
    """One dataset's figures at one look (records, i.e. results of the store).

    Attributes:
        finished: generation adds no result to it any more (its state is a finished one).
        done: its completed prompts (generation's snapshot); total: its prompts (the line's ``/N``).
        committed / unvalidated / validated / invalid: the store's figures
            (:func:`engine.run.chainready.dataset_counts`).
        covered: valid records already extracted or handed to an extraction (see the module doc).
    """

    finished: bool
    done: int
    total: int
    committed: int
    unvalidated: int
    validated: int
    invalid: int
    covered: int

    @property
    def valid(self) -> int:
        """Validated records that passed (what an extraction reads)."""
        return self.validated - self.invalid

    @property
    def waiting(self) -> int:
        """Valid records not covered yet (>= 0)."""
        return max(0, self.valid - self.covered)


@dataclass(frozen=True)
class FollowPick:
    """What to do after one look.

    Attributes:
        take: datasets to extract now (config order; empty: none now); waiting: ``{dataset: records}``
            waiting for every followed dataset; complete: datasets ended with nothing waiting (no
            further extraction); leave: ``{dataset: why}`` datasets not extracted further.
    """

    take: tuple[str, ...] = ()
    waiting: dict[str, int] = field(default_factory=dict)
    complete: tuple[str, ...] = ()
    leave: dict[str, str] = field(default_factory=dict)


def pick_increment(rows: dict[str, FollowRow], follow_records: int, *, final: bool, max_failure_rate: float,
                   failure_window: int, skipped: tuple[str, ...] = ()) -> FollowPick:
    """Which datasets to extract now (pure).

    Args:
        rows: the followed datasets (config order; ended or left-out ones not passed).
        follow_records: records a running dataset needs waiting to start an extraction (>= 1).
        final: generation ended (every dataset is at its end).
        max_failure_rate / failure_window: ``[tokenizer]``'s anomaly-guard rule
            (:func:`engine.run.chainready.readiness`): a dataset past it is left out.
        skipped: datasets skipped in the extraction (its control file): left out.

    Returns:
        A :class:`FollowPick`. An extraction starts when a dataset has ``follow_records`` waiting or
        ended with any waiting; it then takes every dataset with records waiting.
    """
    waiting: dict[str, int] = {}
    leave: dict[str, str] = {}
    complete: list[str] = []
    trigger = False
    for name, r in rows.items():
        if name in skipped:
            leave[name] = "skipped in the extraction (control file)"
            continue
        verdict, why = readiness(r.done if r.finished else 0, r.committed, r.unvalidated if r.finished else 0,
                                 r.validated, r.invalid, max_failure_rate, failure_window)
        if verdict == "refuse":
            leave[name] = why
            continue
        ended = (r.finished and verdict == "ready") or final
        w = r.waiting
        waiting[name] = w
        if w and (ended or w >= follow_records):
            trigger = True
        elif not w and ended:
            if r.unvalidated or r.committed < r.done:
                left = r.unvalidated or r.done - r.committed
                leave[name] = (f"{left} result(s) not {'validated' if r.unvalidated else 'committed'} when "
                               "generation ended (a rerun extracts them)")
            else:
                complete.append(name)
    take = tuple(n for n, w in waiting.items() if w) if trigger else ()
    return FollowPick(take=take, waiting=waiting, complete=tuple(complete), leave=leave)


def increment_line(dataset: str, new: int, extracted: int, total: int) -> str:
    """``200 new records of a2 (400/1,000 extracted)`` (``total``: the dataset's prompts)."""
    return f"{new:,} new record{'s' if new != 1 else ''} of {dataset} ({extracted:,}/{total:,} extracted)"


def waiting_text(waiting: dict[str, int], follow_records: int) -> str:
    """``a1 12/200, a2 0/200 new records`` for the view's waiting line ("" when nothing is followed)."""
    if not waiting:
        return ""
    return ", ".join(f"{n} {w:,}/{follow_records:,}" for n, w in waiting.items()) + " new records"


def extracted_counts(out_dir: str | Path) -> Counter[str]:
    """``{dataset: samples}`` listed in the output manifest (each id once; a torn last line ignored)."""
    seen: dict[str, str] = {}
    for e in OutDir(out_dir).read_manifest():
        seen.setdefault(str(e.get("id")), str(e.get("dataset", "")))
    return Counter(seen.values())


class Follower:
    """The follow loop of one :class:`~engine.run.chain.ExtractChain` (its ``mode`` is ``follow``).

    Attributes:
        covered: ``{dataset: records}`` covered (see the module doc); extracted: the manifest's
            counts after the last look at it; complete: datasets that ended fully extracted;
            last: the last look's :class:`FollowPick` (what the view says while waiting);
            finished_at: epoch seconds at which each increment's extraction ended.
    """

    def __init__(self, chain: FollowedChain) -> None:
        self.chain = chain
        cfg = chain.cfg
        self.order = [d.name for d in cfg.datasets]
        ex = cfg.extract
        # as engine.extract.job.resolve_job places it
        self.out_dir = (Path(ex.out_dir) if ex.out_dir is not None else Path(cfg.run.dir) / "extract").resolve()
        self.follow_records = ex.follow_records
        self.covered: dict[str, int] = {}
        self.extracted: Counter[str] = Counter()
        self.complete: list[str] = []
        self.last = FollowPick()
        self.finished_at: list[float] = []
        self._seq = 0

    def start(self) -> None:
        """Before the first look: what the output directory holds already (a restart resumes from
        it). Blocking (reads the manifest)."""
        self.extracted = extracted_counts(self.out_dir) if self.out_dir.is_dir() else Counter()
        remove_leftovers(self.out_dir)
        self.covered = {n: self.extracted[n] for n in self.order}

    def look(self, snap: RunSnapshot | None, final: bool) -> tuple[FollowPick, dict[str, FollowRow]]:
        """Read the store and the control file and pick (blocking: run it off the event loop; it
        changes nothing). Returns the pick and the rows it was made from."""
        names = [n for n in self.order if n not in self.complete and n not in self.chain.left_out]
        if not names:
            return FollowPick(), {}
        try:
            counts = dataset_counts(self.chain.cfg.run.dir, names)
        except StoreError:  # no store (or no validations table) yet: nothing validated to extract
            return FollowPick(), {}
        by_name = {d.name: d for d in snap.datasets} if snap is not None else {}
        rows = {}
        for n in names:
            d = by_name.get(n)
            committed, unvalidated, validated, invalid = counts[n]
            rows[n] = FollowRow(finished=d is not None and d.state in FINISHED_STATES,
                                done=d.done if d is not None else committed,
                                total=d.prompts if d is not None else validated - invalid,
                                committed=committed, unvalidated=unvalidated, validated=validated, invalid=invalid,
                                covered=self.covered.get(n, 0))
        tok = self.chain.cfg.tokenizer
        rate, window = (tok.max_failure_rate, tok.failure_window) if tok is not None else (0.0, 200)
        try:
            skipped = read_control(self.out_dir).skip
        except ControlError:
            skipped = ()
        return pick_increment(rows, self.follow_records, final=final, max_failure_rate=rate, failure_window=window,
                              skipped=skipped), rows

    async def run(self, snapshot: Callable[[], RunSnapshot | None], ended: Callable[[], int | None]) -> int:
        """Follow until generation ended and every followed dataset is complete or left out.

        Returns:
            0 (done, or drained after a quit), else the first failing extraction's exit code.
        """
        chain = self.chain
        await asyncio.to_thread(self.start)
        if any(self.extracted.values()):
            chain.say("following generation; already extracted: "
                      + ", ".join(f"{n} {self.extracted[n]:,}" for n in self.order if self.extracted[n]))
        while not chain.quit_mode:
            gen = ended()
            pick, rows = await asyncio.to_thread(self.look, snapshot(), gen is not None)
            self.last = pick
            self.complete.extend(n for n in pick.complete if n not in self.complete)
            chain._leave_out({n: ("refuse", why) for n, why in pick.leave.items()})
            if pick.take and not chain.paused:
                code = await self._increment(pick, rows)
                if code != 0 or chain.quit_mode:
                    return code
                continue
            if gen is not None and not pick.take:
                return 0
            await asyncio.sleep(chain.poll_s)
        return 0

    async def _increment(self, pick: FollowPick, rows: dict[str, FollowRow]) -> int:
        """Freeze the records of ``pick.take`` not extracted yet, extract them (one
        :class:`~engine.extract.run.ExtractRun` over that input), then say what it extracted.
        Returns its exit code (0 also when no record was new: nothing started)."""
        chain = self.chain
        self._seq += 1
        try:
            frozen = await asyncio.to_thread(freeze_increment, chain.cfg.run.dir, self.out_dir, pick.take, self._seq)
        except (DatagenError, OSError) as e:  # NoStoreError, ExportError (stored ids disagree), disk
            chain.say(f"extraction not started: cannot read the new records ({type(e).__name__}: {e})")
            return 1
        for n in pick.take:  # what the store held then is now extracted, or in this increment's input
            self.covered[n] = max(rows[n].valid, frozen.read[n])
        take = tuple(n for n in pick.take if frozen.new[n])
        if frozen.path is None or not take:
            return 0
        chain.say("extracting " + ", ".join(f"{frozen.new[n]:,} new record{'s' if frozen.new[n] != 1 else ''}"
                                            f" of {n}" for n in take)
                  + f" (follow_records {self.follow_records:,})")
        before = Counter(self.extracted)
        n_runs = len(chain.runs)
        chain.source = frozen.path
        try:
            code = await chain._one(take)
        finally:
            chain.source = None
            self.finished_at.append(time.time())
            await asyncio.to_thread(remove_increment, frozen)
        run = chain.runs[-1] if len(chain.runs) > n_runs else None
        self.extracted = await asyncio.to_thread(extracted_counts, self.out_dir)
        full = run is not None and code == 0 and run.final_state == JobState.DONE
        for n in take:
            if not full:  # samples left: what is not in the manifest waits again
                self.covered[n] = self.extracted[n]
            chain.say(increment_line(n, self.extracted[n] - before[n], self.extracted[n], rows[n].total))
        if code == 0 and not full and run is not None and run.info is not None and not chain.quit_mode:
            chain.quit_mode = "drain"  # a quit in its control file (`datagen ctl`): follow no further
            chain.say("extraction stopped before its end: no other extraction starts (a rerun resumes)")
        return code

    def reason(self) -> str:
        """What the next extraction waits for (the view's line)."""
        text = waiting_text(self.last.waiting, self.follow_records)
        return ("waiting for new validated records: " + text) if text else "waiting for validated records"


__all__ = ["FollowPick", "FollowRow", "FollowedChain", "Follower", "extracted_counts", "increment_line", "pick_increment",
           "waiting_text"]
