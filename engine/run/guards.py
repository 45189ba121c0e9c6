"""Every rule that pauses a dataset or the whole run, and the one place that applies them.

Each rule is a pure function of what it observed that returns a decision: a :class:`Pause` (what
to pause, why, and which guard) or None. :func:`apply` carries a decision out on the run (a
:class:`Pausable`: :class:`engine.run.scheduler.Scheduler` fits it). The rules:

- :func:`anomaly`: the anomaly guard fired on a dataset (error rate, degenerate output:
  :mod:`engine.run.anomaly`, :mod:`engine.run.telemetry`);
- :func:`validation`: a dataset's token-validation failure rate passed ``tokenizer.max_failure_rate``;
- :func:`calibration`: after its first 1% / 50 completions a dataset projects past its cost cap
  (:func:`engine.money.projection.calibration_gate`; not when what is left is a small remainder or
  its cap is already met: it then finishes, or its cap ends it ``budget_met`` with the cap's reason);
- :func:`credits_floor`: credits minus the dollars in flight fell below ``spend.credits_floor_usd``
  (the supervisor's backstop; dispatch checks the floor itself: :func:`reserve_refused`);
- :func:`reserve_refused`: a reservation was refused for credits, or could not be priced;
- :func:`run_wide`: an error of the account, the route or the config (:mod:`engine.run.runwide`);
- :func:`store_failing`: store commits fail (:func:`store_recovered` says when to resume);
- :func:`run_dir_lost`: the run directory (or its store) was deleted, moved or replaced while running:
  the run stops (not a pause: a deleted store cannot take results, a moved one is no longer where
  ``status``, ``ctl`` and a restart look), exit :data:`EXIT_DIR_LOST`;
- :func:`disk`: the run directory stopped accepting new files, or its filesystem is nearly full
  (:func:`disk_reserve_bytes`): the run pauses before commits fail; :func:`disk_recovered` says when to resume;
- :func:`exit_on_pause`: whether a run paused by a guard with nothing in flight should end
  (``--exit-on-pause``, or a rejected key headless), and the reason.

Messages and kinds are part of the interface: events, notices, the status JSON and tests read them.
"""

from __future__ import annotations

import math
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from engine.run.runstate import Control, DatasetState, PauseKind

if TYPE_CHECKING:
    from engine.money.inflight import InFlightCost
    from engine.money.spend import CreditsReading
    from engine.report.snapshot import RunSnapshot
    from engine.run.runstate import DatasetRuntime, RunState
    from engine.run.runwide import Condition
    from engine.storage.rundir import DirHealth

#: ``Pause.dataset`` None: the whole run.
RUN = None


@dataclass(frozen=True)
class Pause:
    """A guard's decision: pause ``dataset`` (None: the whole run) with ``reason``.

    ``kind``: for a run pause, which guard (:class:`~engine.run.runstate.PauseKind`: ``credits``, ``price``,
    ``auth``, ``route``, ``connect``, ``config``, ``store``...; ``pause`` is the user's); unused for a
    dataset pause (always a guard's).
    """

    dataset: str | None
    reason: str
    kind: PauseKind = PauseKind.GUARD

    @property
    def scope(self) -> str:
        """``"run"`` or ``"dataset"``."""
        return "run" if self.dataset is None else "dataset"


class Pausable(Protocol):
    """What :func:`apply` acts on."""

    def pause_all(self, reason: str, kind: PauseKind = PauseKind.USER) -> None: ...
    def set_dataset_control(self, name: str, control: str, reason: str, guard: bool = False) -> Coroutine[Any, Any, None]: ...


# ---- dataset rules ----------------------------------------------------------------------------
def anomaly(rt: "DatasetRuntime", reason: str | None) -> Pause | None:
    """Pause ``rt`` when the anomaly guard fired (``reason``) and it is still active."""
    if reason and rt.control == Control.ACTIVE:
        return Pause(rt.name, f"anomaly guard: {reason}")
    return None


def validation(rt: "DatasetRuntime | None", reason: str | None) -> Pause | None:
    """Pause ``rt`` when its validation failure rate passed the limit (``reason``, from
    :meth:`engine.tokens.service.ReconstructionService.guard`) and it is still active."""
    if reason and rt is not None and rt.control == Control.ACTIVE:
        return Pause(rt.name, f"anomaly guard (validation): {reason}")
    return None


#: How a calibration gate pause's reason starts (re-judged at a restart: engine.run.supervisor).
CALIBRATION_PREFIX = "calibration gate: "


def calibration(rt: "DatasetRuntime", gate_reason: str | None) -> Pause | None:
    """Pause ``rt`` once when the calibration gate fired (``gate_reason``) and it is still active
    (marks ``rt.gate_fired``: the gate fires once per dataset and process)."""
    if rt.gate_fired or rt.control != Control.ACTIVE or not gate_reason:
        return None
    rt.gate_fired = True
    return Pause(rt.name, f"{CALIBRATION_PREFIX}{gate_reason}")


# ---- run rules --------------------------------------------------------------------------------
def credits_floor(cr: "CreditsReading | None", floor_usd: float, in_flight_usd: float,
                  run: "RunState") -> Pause | None:
    """Pause the run (not paused yet) when the credits left (USD) minus the dollars in flight fall below the floor."""
    if cr is None or cr.remaining_usd is None or run.paused:
        return None
    if cr.remaining_usd - in_flight_usd < floor_usd:
        return Pause(RUN, f"credits floor: ${cr.remaining_usd:.2f} left minus ${in_flight_usd:.2f} "
                          f"in flight is below credits_floor_usd ${floor_usd:.2f}", kind=PauseKind.CREDITS)
    return None


def reserve_refused(e: BaseException) -> Pause:
    """Pause the run when a reservation was refused: credits would fall below the floor
    (:class:`engine.money.creditsfloor.CreditsFloorReached`), or no price for a dollar cap (never spend blind)."""
    from engine.money.creditsfloor import CreditsFloorReached

    if isinstance(e, CreditsFloorReached):
        return Pause(RUN, str(e), kind=PauseKind.CREDITS)
    return Pause(RUN, f"cannot reserve: {e}", kind=PauseKind.PRICE)


def run_wide(cond: "Condition", api_key_env: str) -> Pause:
    """Pause the run for a run-wide condition (:mod:`engine.run.runwide`), with what to do about it."""
    reason = cond.reason
    if cond.kind == "auth":
        reason += f". Check the key in ${api_key_env}."
    elif cond.kind == "route":
        reason += ". Check [provider] model and [provider.routing]; resume when the provider serves it again."
    elif cond.kind == "connect":
        reason += (". Nothing failed: start the server (or fix the URL in [provider]); on resume the pending "
                   "prompts are sent again")
    elif cond.kind == "config":
        reason += ". Fix the config and run again (nothing failed), or resume to fail such prompts one by one."
    return Pause(RUN, reason, kind=PauseKind(cond.kind))


def store_failing(e: BaseException, run: "RunState") -> Pause | None:
    """Pause the run when store commits fail (once: not while already paused for it)."""
    if run.pause == PauseKind.STORE:
        return None
    return Pause(RUN, f"store commits fail ({type(e).__name__}: {e}); nothing is lost: results wait in "
                      f"memory and are committed when the disk works again", kind=PauseKind.STORE)


def store_recovered(run: "RunState") -> bool:
    """Whether a commit that succeeded again lifts the run's pause (only a pause for the store)."""
    return run.pause == PauseKind.STORE


# ---- the run directory and its disk --------------------------------------------------------------
#: ``datagen run``'s exit status when its run directory (or store) was deleted, moved or replaced while running.
EXIT_DIR_LOST = 4
#: Free space (bytes) the run keeps on the run directory's filesystem beyond what its slots may need.
DISK_MARGIN_BYTES = 32 * 1024 * 1024
#: Bytes one request slot may need to store its result (a long reasoning completion, its token ids, the WAL).
DISK_PER_SLOT_BYTES = 64 * 1024
#: The reserve is at most this share of the filesystem (a small filesystem is not paused from the start).
DISK_MAX_SHARE = 0.05
#: A disk pause lifts once free space reaches this multiple of the reserve (no pause/resume flapping).
DISK_RESUME_FACTOR = 1.5


def disk_reserve_bytes(total_bytes: int | None, slots: int) -> int:
    """Free bytes under which the run pauses: :data:`DISK_MARGIN_BYTES` plus :data:`DISK_PER_SLOT_BYTES`
    per request slot (``slots``: the classes' concurrency summed), at most :data:`DISK_MAX_SHARE` of
    the filesystem's size ``total_bytes`` (bytes; None: unknown, no cap). E.g. 2,500 slots: 188 MiB."""
    need = DISK_MARGIN_BYTES + max(0, slots) * DISK_PER_SLOT_BYTES
    if total_bytes:
        need = min(need, int(total_bytes * DISK_MAX_SHARE))
    return need


def _mb(n: float, up: bool = False) -> str:
    """Bytes as ``2.1 MB`` (one decimal: rounded down, or up with ``up``: a free figure never reads as its reserve)."""
    tenths = math.ceil(n / 1e5) if up else math.floor(n / 1e5)
    return f"{tenths / 10:,.1f} MB"


@dataclass(frozen=True)
class DirLost:
    """The decision when the run directory is gone: stop with ``reason`` (the run's state reason and
    last line), aborting the streams in flight (``abort``: their results have nowhere to go) or
    draining them into the store where it now is; exit :data:`EXIT_DIR_LOST`."""

    reason: str
    abort: bool
    exit_code: int = EXIT_DIR_LOST


def run_dir_lost(h: "DirHealth", cost: "InFlightCost") -> DirLost | None:
    """Stop the run when its directory or store was deleted, moved or replaced (``h`` from
    :meth:`engine.storage.rundir.RunDirWatch.probe`); ``cost``: the streams in flight (USD, their count).

    Deleted: the streams in flight are cut at once (what they would bring cannot be stored), e.g.
    ``run directory runs/x was deleted while running; 32 in-flight stream(s) cut (est. $0.0123 already
    generated is billed for nothing, about $0.0450 if billed in full); the store went with it, nothing
    more is bought`` (the figures of :func:`engine.money.inflight.abort_line`: ``generated_usd``, what
    the streams had generated, and ``expected_usd``, their whole completions, as providers that keep
    generating after a disconnect bill them). Moved: the store is still written through
    its open file, so the streams in flight drain into it, e.g. ``run directory runs/x was moved while
    running (now at runs/y); 32 in-flight stream(s) drain into the store there; to go on, point run.dir
    at runs/y (or move it back) and run again``.
    """
    if not h.lost:
        return None
    name = f"{h.what} {h.path}" if h.what == "run directory" else f"store of {h.path}"
    swapped = "; something else now exists at that path" if h.replaced else ""
    if h.state == "deleted":
        cut = (f"{cost.streams:,} in-flight stream(s) cut (est. ${cost.generated_usd:.4f} already generated is "
               f"billed for nothing, about ${cost.expected_usd:.4f} if billed in full)"
               if cost.streams else "nothing was in flight")
        return DirLost(f"{name} was deleted while running; {cut}; the store went with it, nothing more "
                       f"is bought{swapped}", abort=True)
    at = f" (now at {h.now_at})" if h.now_at else ""
    drain = (f"{cost.streams:,} in-flight stream(s) drain into the store{' there' if h.now_at else ''}"
             if cost.streams else "nothing was in flight")
    hint = f"; to go on, point run.dir at {h.now_at} (or move it back) and run again" if h.now_at else ""
    return DirLost(f"{name} was moved while running{at}; {drain}{hint}{swapped}", abort=False)


def disk(h: "DirHealth", run: "RunState", slots: int) -> Pause | None:
    """Pause the run (not already paused) when its directory refuses new files or free space fell
    below :func:`disk_reserve_bytes`: in-flight streams still finish and are stored (the store's
    file is open and the reserve holds them); it resumes by itself (:func:`disk_recovered`)."""
    if h.lost or run.paused:
        return None
    if h.unwritable:
        return Pause(RUN, f"run directory {h.path} cannot be written ({h.unwritable}); paused: streams in flight "
                          f"finish and are stored, the run resumes by itself once it is writable again",
                     kind=PauseKind.DISK)
    reserve = disk_reserve_bytes(h.total_bytes, slots)
    if h.free_bytes is not None and h.free_bytes < reserve:
        return Pause(RUN, f"disk nearly full: {_mb(h.free_bytes)} free on the filesystem of {h.path}, below the "
                          f"{_mb(reserve, up=True)} the run keeps for the results in flight; paused before writes fail: "
                          f"free space and the run resumes by itself at {_mb(reserve * DISK_RESUME_FACTOR, up=True)} free",
                     kind=PauseKind.DISK)
    return None


def disk_recovered(h: "DirHealth", run: "RunState", slots: int) -> bool:
    """Whether a pause for the disk (only that kind) can lift: writable again and free space at
    :data:`DISK_RESUME_FACTOR` times the reserve (bytes)."""
    if run.pause != PauseKind.DISK or h.lost or h.unwritable:
        return False
    return h.free_bytes is None or h.free_bytes >= disk_reserve_bytes(h.total_bytes, slots) * DISK_RESUME_FACTOR


def guard_paused(snap: "RunSnapshot", run: "RunState") -> str | None:
    """The reason when the whole run is paused by a guard (credits, 402, price, or every unfinished
    dataset paused by the anomaly guard / calibration gate) with nothing in flight; else None."""
    if snap.in_flight:
        return None
    if run.paused and run.pause != PauseKind.USER:
        return snap.state_reason
    open_ = [d for d in snap.datasets if d.state not in (DatasetState.DONE, DatasetState.SKIPPED,
                                                         DatasetState.BUDGET_MET)]
    if open_ and all(d.state == DatasetState.PAUSED and d.state_reason.startswith(("anomaly guard", "calibration gate"))
                     for d in open_):
        return "; ".join(f"{d.name}: {d.state_reason}" for d in open_)
    return None


@dataclass(frozen=True)
class Stop:
    """A decision to end the run: ``reason`` (the state reason), ``exit_code``, ``why`` (for the line)."""

    reason: str
    exit_code: int
    why: str
    paused_for: str


def exit_on_pause(snap: "RunSnapshot", run: "RunState", *, exit_on_pause: bool, stop_on_auth: bool) -> Stop | None:
    """End a run paused by a guard with nothing in flight: always with ``exit_on_pause`` (exit 3, or
    2 for a rejected key), and for a rejected key (401) with ``stop_on_auth`` (headless: the key comes
    from the process's environment, nothing can fix it while the run waits); else None."""
    reason = guard_paused(snap, run)
    if not reason:
        return None
    auth = run.pause == PauseKind.AUTH
    if not (exit_on_pause or (stop_on_auth and auth)):
        return None
    why = "--exit-on-pause" if exit_on_pause else "the key comes from this process's environment"
    return Stop(reason if auth else f"exit on pause: {reason}", 2 if auth else 3, why, reason)


# ---- the one place decisions are applied --------------------------------------------------------
def apply(run: Pausable, decision: Pause | None) -> Any:
    """Carry ``decision`` out on ``run``: a run pause at once (:meth:`Pausable.pause_all` with its
    kind); a dataset pause as a task on the running loop (it persists the state:
    :meth:`Pausable.set_dataset_control` with ``guard=True``). Returns that task, or None."""
    if decision is None:
        return None
    if decision.dataset is None:
        run.pause_all(decision.reason, kind=decision.kind)
        return None
    import asyncio

    return asyncio.get_running_loop().create_task(
        run.set_dataset_control(decision.dataset, Control.PAUSED, decision.reason, guard=True))


__all__ = ["DirLost", "EXIT_DIR_LOST", "Pause", "Pausable", "Stop", "anomaly", "apply", "calibration", "credits_floor",
           "disk", "disk_recovered", "disk_reserve_bytes", "exit_on_pause", "guard_paused", "reserve_refused",
           "run_dir_lost", "run_wide", "store_failing", "store_recovered", "validation"]
