"""What :class:`engine.run.chain.ExtractChain` shows, says and takes from the extraction view: the
view's snapshot (an ``ExtractHost``'s :meth:`~ChainView.snapshot`) between, during and after its
extractions, the datasets it still waits for, the lines the command prints once it ended, and the
view's commands (:class:`ChainCommands`). A mixin over the
chain's state (the attributes below), so that the chain's module keeps to running it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from engine.extract.snapshot import ExtractSnapshot, JobState

if TYPE_CHECKING:
    from engine.config import Config
    from engine.extract.run import ExtractRun


class ChainCommands:
    """The extraction view's commands over the chain (``engine.extract.snapshot.ExtractCommands``):
    they act on the extraction in hand and hold for the next ones (a pause also keeps the next
    extraction from starting; a quit starts no other and drains generation too)."""

    def __init__(self, chain: Any) -> None:
        self._chain = chain

    def pause(self) -> str:
        """Pause extraction (workers finish and write the batch in hand); no new extraction starts."""
        c = self._chain
        c.paused = True
        return c.current.commands.pause() if c.current is not None else "extraction paused: none starts until resumed"

    def resume(self) -> str:
        """Resume extraction."""
        c = self._chain
        c.paused = False
        return c.current.commands.resume() if c.current is not None else "extraction resumed"

    def skip(self, dataset: str) -> str:
        """Skip ``dataset`` in the extraction in hand (persisted in the control file).

        Raises:
            ValueError: no extraction has started yet, or ``dataset`` is not one of its datasets.
        """
        run = self._chain.current or (self._chain.runs[-1] if self._chain.runs else None)
        if run is None:
            raise ValueError("no extraction has started yet: skip a dataset once its extraction started")
        return run.commands.skip(dataset)

    def quit(self) -> str:
        """First: drain the extraction in hand, start no other, drain generation. Second: abort both."""
        return self._chain.quit()


class ChainView:
    """The view half of the chain; its state is the chain's (see :class:`engine.run.chain.ExtractChain`)."""

    cfg: "Config"
    mode: str
    runs: "list[ExtractRun]"
    current: "ExtractRun | None"
    starts: list[tuple[float, tuple[str, ...]]]
    handed: tuple[str, ...]
    left_out: dict[str, str]
    paused: bool
    quit_mode: str | None
    exit_code: int | None
    events: Any
    follow: Any

    def incomplete_line(self) -> str | None:
        """Once the chain ended: ``extraction incomplete: 4,004 samples left (rerun to resume)`` when
        its last extraction stopped with samples left (a quit's drain, an interrupt, a failure), also
        naming the datasets a quit kept from any extraction; None when nothing is left to extract.
        A rerun (``datagen run`` or ``datagen extract``) extracts exactly the samples left."""
        left = 0
        run = self.runs[-1] if self.runs else None
        if run is not None:
            try:
                snap = run.snapshot()
                left = max(0, snap.samples_total - snap.samples_done)
            except Exception:  # its status file unreadable: the datasets below still say it
                left = 0
        waiting = self.waiting_for() if self.quit_mode else []
        if not left and not waiting:
            return None
        what = [f"{left:,} sample{'s' if left != 1 else ''} left"] if left else []
        if waiting:
            what.append(f"{', '.join(waiting)} not {'fully ' if self.follow is not None else ''}extracted yet")
        return f"extraction incomplete: {'; '.join(what)} (rerun to resume)"

    def end_lines(self) -> list[str]:
        """The lines the command prints about the chain once it ended (after generation's report):
        its exit code, the number of extraction runs and the datasets left out, then
        :meth:`incomplete_line` when samples are left. Empty when the chain did nothing."""
        if not (self.runs or self.left_out or self.quit_mode):
            return []
        lines = []
        if self.runs or self.left_out:
            lines.append(f"extraction (after_run = \"{self.mode}\"): exit code {self.exit_code}, "
                         f"{len(self.runs)} extraction run(s)"
                         + (f"; not extracted: {', '.join(self.left_out)}" if self.left_out else ""))
        incomplete = self.incomplete_line()
        if incomplete:
            lines.append(incomplete)
        return lines

    def waiting_for(self) -> list[str]:
        """Datasets neither handed to an extraction nor left out (in config order); ``follow``: not
        ended fully extracted (nor left out)."""
        taken = self.follow.complete if self.follow is not None else self.handed
        return [d.name for d in self.cfg.datasets if d.name not in taken and d.name not in self.left_out]

    def _waiting_reason(self) -> str:
        """Why no extraction runs now: the last one finished (if any), and what the next one waits for."""
        last = f"extraction of {', '.join(self.starts[-1][1])} finished; " if self.starts else ""
        if self.quit_mode:
            return last + ("quitting: no other extraction starts" if last else "quitting: no extraction starts")
        held = "paused: no extraction starts until resumed; " if self.paused else ""
        if self.mode == "run":
            return last + held + "waiting for the generation run to complete"
        if self.follow is not None:
            return last + held + self.follow.reason()
        left = self.waiting_for()
        return last + held + ("waiting for generation and validation of " + ", ".join(left) if left
                              else "no dataset left to wait for")

    def snapshot(self) -> ExtractSnapshot | None:
        """What the extraction view shows: the extraction in hand (or the last one); before the
        first, state ``not_started``, and between two, ``waiting`` (``paused`` while paused), each
        with what it waits for (or that a quit starts no other). Once the chain ended: the last
        extraction's final state (``stopped`` when a quit left datasets unextracted), or
        ``done``/``stopped`` with why nothing was extracted."""
        run = self.current or (self.runs[-1] if self.runs else None)
        events = tuple(self.events)
        if self.exit_code is not None and run is None:
            reasons = [f"{n}: {w}" for n, w in self.left_out.items()]
            if self.quit_mode:
                reasons.insert(0, f"quit ({self.quit_mode}) before any extraction started")
            return ExtractSnapshot(state=JobState.STOPPED if reasons else JobState.DONE,
                                   reason="; ".join(reasons) or "nothing to extract",
                                   events=events, quit_mode=self.quit_mode)
        live = self.current.snapshot() if self.exit_code is None and self.current is not None else None
        # dataset/follow mode: its workers are done and it is closing: between extractions (p holds the next one)
        closing = self.mode != "run" and live is not None and live.state == JobState.DONE
        if closing or (self.exit_code is None and self.current is None):
            state = JobState.PAUSED if self.paused else (JobState.WAITING if self.runs else JobState.NOT_STARTED)
            why = self._waiting_reason()
            if run is None:
                return ExtractSnapshot(state=state, reason=why, events=events, quit_mode=self.quit_mode)
            snap = live if closing and live is not None else run.snapshot()
            return replace(snap, state=state, reason=why, events=events, workers=(), quit_mode=self.quit_mode)
        assert run is not None
        snap = live if live is not None and run is self.current else run.snapshot()
        if self.exit_code is not None and self.quit_mode and snap.state == JobState.DONE and self.waiting_for():
            snap = replace(snap, state=JobState.STOPPED, reason=f"quit ({self.quit_mode}): "
                           f"{', '.join(self.waiting_for())} not extracted; a rerun extracts them")
        return replace(snap, events=events, quit_mode=snap.quit_mode or self.quit_mode)


__all__ = ["ChainCommands", "ChainView"]
