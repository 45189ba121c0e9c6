"""The run's shared mutable state: the run's phase and pause, and each dataset's counters.

Owned by the run (:class:`engine.run.scheduler.Scheduler` creates one at construction); the dispatcher
writes it, the snapshot builder (:mod:`engine.run.observe`), the controller and the supervisor read it.
States are :class:`enum.StrEnum` members: each compares equal to its string (``RunPhase.PAUSED ==
"paused"``), so the store, the status JSON and the dashboard read the same values as before.

A run-wide pause has one source of truth, :attr:`RunState.pause` (who paused: a :class:`PauseKind`,
None when not paused); :attr:`RunState.paused`, :attr:`RunState.pause_kind` and the ``paused`` phase
are read from it.

Pure state: no I/O, no awaits (waking the dispatchers sets :class:`asyncio.Event` s).
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from enum import StrEnum

from engine.client.progress import TokenRatio
from engine.metrics.rates import RateWindow
from engine.storage.store import PendingPrompt


class RunPhase(StrEnum):
    """The run's state (``RunSnapshot.state``, the store's ``runtime.state``)."""

    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPING = "stopping"
    STOPPED = "stopped"
    COMPLETED = "completed"


class PauseKind(StrEnum):
    """Who paused the whole run (``RunState.pause``; its value is the run's ``pause_kind``)."""

    USER = "pause"
    CREDITS = "credits"
    PRICE = "price"
    AUTH = "auth"
    ROUTE = "route"
    CONNECT = "connect"
    CONFIG = "config"
    STORE = "store"
    DISK = "disk"
    GUARD = "guard"


#: Lifecycle phases over which a run-wide pause shows as :attr:`RunPhase.PAUSED`.
PAUSABLE_PHASES = (RunPhase.STARTING, RunPhase.RUNNING)


class Control(StrEnum):
    """A dataset's control state, persisted in the store's ``datasets.state``."""

    ACTIVE = "active"
    PAUSED = "paused"
    SKIPPED = "skipped"
    BUDGET_MET = "budget_met"


class DatasetState(StrEnum):
    """A dataset's shown state (``DatasetSnapshot.state``): its control state, or where it stands."""

    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    DONE = "done"
    SKIPPED = "skipped"
    BUDGET_MET = "budget_met"
    DRAINING = "draining"
    STOPPING = "stopping"
    STOPPED = "stopped"


#: Control states in which a dataset's pending prompts will never be dispatched.
TERMINAL_CONTROLS = (Control.SKIPPED, Control.BUDGET_MET)
#: Control states restored from the store at start.
PERSISTED_CONTROLS = (Control.PAUSED, Control.SKIPPED, Control.BUDGET_MET)


@dataclass
class DatasetRuntime:
    """Mutable per-dataset counters (engine-internal; read through snapshots).

    Token counts are tokens; dollars live in the spend ledger
    (:attr:`engine.money.spend.SpendControl.dataset_usd`), not here.
    """

    name: str
    position: int
    prompts: int
    rejected: int
    token_budget: int | None
    control: Control = Control.ACTIVE
    reason: str = ""
    done: int = 0
    failed: int = 0
    in_flight: int = 0
    pending: dict[str, int] = field(default_factory=dict)  # class -> pending, not in flight
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    errors: collections.Counter = field(default_factory=collections.Counter)
    cursor: dict[str, int] = field(default_factory=dict)
    buffer: dict[str, collections.deque] = field(default_factory=dict)
    requeue: dict[str, collections.deque] = field(default_factory=dict)
    started: bool = False
    rate: RateWindow = field(default_factory=lambda: RateWindow(60))
    #: completion tokens STREAMED per second (every stream's tokens as they arrive, finished or not;
    #: fed by :meth:`note_streamed`): a rate of finished completions alone reads ~0 while minutes-long
    #: streams run (measured 194 tok/s shown for ~5,500 streaming)
    tok_rate: RateWindow = field(default_factory=lambda: RateWindow(60))
    #: characters per completion token of this dataset's finished completions (its streams' estimate)
    chars_per_token: TokenRatio = field(default_factory=TokenRatio)
    streamed_mark: float | None = None  # completion tokens streamed so far, as last counted (tokens)
    tasks: set = field(default_factory=set)
    blocked: set = field(default_factory=set)  # classes waiting for reservations to settle
    streams: dict = field(default_factory=dict)  # prompt id -> (class, StreamProgress, est prompt tokens) in flight
    censored_at: float = -1e9
    gate_fired: bool = False
    limited_at: dict = field(default_factory=dict)  # class -> clock time its budget last held dispatch back

    def note_streamed(self, now: float, in_flight_tokens: float) -> float:
        """Count what was streamed since the last call into :attr:`tok_rate` and return it (tokens):
        ``completion_tokens`` of the finished completions plus ``in_flight_tokens`` (what the streams
        in flight streamed so far), never counted down (a stream that failed takes its tokens out of
        the sum; the rate counts nothing until the sum passes its previous high)."""
        total = float(self.completion_tokens) + max(0.0, in_flight_tokens)
        if self.streamed_mark is None:
            self.streamed_mark = total
            return 0.0
        delta = total - self.streamed_mark
        if delta <= 0:
            return 0.0
        self.streamed_mark = total
        self.tok_rate.add(now, delta)
        return delta

    @property
    def pending_total(self) -> int:
        return sum(self.pending.values())

    @property
    def finished(self) -> bool:
        """True when no prompt can still be dispatched or is in flight."""
        return self.in_flight == 0 and (self.control in TERMINAL_CONTROLS or self.pending_total == 0)

    def state(self, run_paused: bool) -> DatasetState:
        """The dataset's shown state, ``run_paused``: the whole run is paused."""
        if self.control in TERMINAL_CONTROLS:
            return DatasetState(self.control)
        if self.pending_total == 0 and self.in_flight == 0:
            return DatasetState.DONE
        if self.control == Control.PAUSED or run_paused:
            return DatasetState.PAUSED
        return DatasetState.RUNNING if self.started else DatasetState.PENDING


@dataclass
class RunState:
    """The run-wide part of the state.

    Attributes:
        datasets: per-dataset runtimes in config order.
        lifecycle: the run's phase, a pause aside (``starting``, ``running``, ``stopping``, ``stopped``,
            ``completed``); :attr:`phase` is what is shown. ``reason`` says why (a pause's or stop's reason).
        pause: who paused dispatch run-wide (None: not paused); the one record of a run-wide pause.
        stopping: a stop is in progress: nothing more is dispatched.
        exit_code: the run's exit code (the first non-zero one given is kept).
        started_wall: wall-clock time (s since the epoch) this process started the run.
        prior_elapsed_s: run seconds accumulated by earlier processes of the run.
        t0: monotonic clock reading (s) at this process's start.
        done: set once the run has ended (completed, or stopped with nothing in flight).
        rate: completed requests per second, run-wide.
        excluded_providers: providers added to the routing ``ignore`` list (persisted).
        drain_deadline: clock time a drain in progress aborts what is left (None: no drain).
        credits_wait: dispatch waits for in-flight credit holds (:mod:`engine.money.creditsfloor`).
        wake: per request class, the event its dispatcher waits on (set by :meth:`notify`).
    """

    datasets: dict[str, DatasetRuntime] = field(default_factory=dict)
    lifecycle: RunPhase = RunPhase.STARTING
    reason: str = ""
    pause: PauseKind | None = None
    stopping: bool = False
    exit_code: int = 0
    started_wall: float = field(default_factory=time.time)
    prior_elapsed_s: float = 0.0
    t0: float = 0.0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    rate: RateWindow = field(default_factory=lambda: RateWindow(60))
    excluded_providers: list[str] = field(default_factory=list)
    drain_deadline: float | None = None
    credits_wait: bool = False
    wake: dict[str, asyncio.Event] = field(default_factory=dict)

    # ---- the pause, read from :attr:`pause` ----------------------------------------------------
    @property
    def paused(self) -> bool:
        """Dispatch is paused run-wide."""
        return self.pause is not None

    @property
    def pause_kind(self) -> str:
        """Who paused the run (``pause`` = the user, ``credits``, ``price``, ``auth``, ``route``,
        ``config``, ``store``...); "" when not paused."""
        return "" if self.pause is None else str(self.pause)

    @property
    def phase(self) -> RunPhase:
        """The run's shown state: ``paused`` while paused before it stops or ends, else :attr:`lifecycle`."""
        if self.pause is not None and self.lifecycle in PAUSABLE_PHASES:
            return RunPhase.PAUSED
        return self.lifecycle

    def set_pause(self, kind: PauseKind | str | None, reason: str) -> None:
        """Pause dispatch run-wide (``kind``: who) or lift the pause (None); ``reason`` becomes the state reason."""
        self.pause = None if kind is None else PauseKind(kind)
        self.reason = reason

    # ---- counters shared by dispatch, outcomes, failures and the ending ----------------------
    def in_flight(self) -> int:
        """Requests in flight, run-wide."""
        return sum(rt.in_flight for rt in self.datasets.values())

    def elapsed_s(self, now: float) -> float:
        """Run seconds at monotonic clock ``now``: this process's time plus earlier processes'."""
        return self.prior_elapsed_s + (now - self.t0)

    def notify(self) -> None:
        """Wake every dispatcher (state changed: resume, requeue, concurrency...)."""
        for ev in self.wake.values():
            ev.set()

    def check_finished(self) -> None:
        """Set :attr:`done` once nothing is left: every dataset finished with nothing in flight (the run
        completed, unless it is stopping), or a stop with nothing in flight."""
        if all(rt.finished for rt in self.datasets.values()) and not any(rt.in_flight for rt in self.datasets.values()):
            if not self.stopping:
                self.lifecycle, self.reason = RunPhase.COMPLETED, ""  # a guard's pause reason no longer holds
            self.done.set()
        elif self.stopping and not any(rt.in_flight for rt in self.datasets.values()):
            self.done.set()

    def return_to_pending(self, rt: DatasetRuntime, p: PendingPrompt, attempts: int) -> None:
        """Prompt ``p`` of ``rt`` (in flight) is pending again, next in line, with ``attempts`` made
        (its prompt-token estimate is not carried over, as before)."""
        rt.in_flight -= 1
        rt.pending[p.cls] += 1
        rt.requeue[p.cls].appendleft(PendingPrompt(p.id, p.dataset, p.key, p.cls, p.messages, p.tools, attempts))
        self.notify()
        self.check_finished()

    def unblock(self) -> None:
        """A reservation settled or was released: every dataset waiting for room may fit now (the run
        cost cap and the credits holds are shared, so a settle in one dataset can unblock another)."""
        blocked = [d for d in self.datasets.values() if d.blocked]
        if blocked or self.credits_wait:
            for d in blocked:
                d.blocked.clear()
            self.credits_wait = False
            self.notify()


__all__ = ["Control", "DatasetRuntime", "DatasetState", "PAUSABLE_PHASES", "PERSISTED_CONTROLS", "PauseKind", "RunPhase",
           "RunState", "TERMINAL_CONTROLS"]
