"""The run's shared mutable state: the run's phase and pause, and each dataset's counters.

Owned by the run (:class:`engine.run.scheduler.Scheduler` creates one at construction); the dispatcher
writes it, the snapshot builder (:mod:`engine.run.observe`), the controller and the supervisor read it.
States are :class:`enum.StrEnum` members: each compares equal to its string (``RunPhase.PAUSED ==
"paused"``), so the store, the status JSON and the dashboard read the same values as before.
Pure state: no I/O, no awaits.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from enum import StrEnum

from engine.metrics.rates import RateWindow


class RunPhase(StrEnum):
    """The run's state (``RunSnapshot.state``, the store's ``runtime.state``)."""

    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPING = "stopping"
    STOPPED = "stopped"
    COMPLETED = "completed"


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
    tok_rate: RateWindow = field(default_factory=lambda: RateWindow(60))
    tasks: set = field(default_factory=set)
    blocked: set = field(default_factory=set)  # classes waiting for reservations to settle
    streams: dict = field(default_factory=dict)  # prompt id -> (class, StreamProgress, est prompt tokens) in flight
    censored_at: float = -1e9
    gate_fired: bool = False
    limited_at: dict = field(default_factory=dict)  # class -> clock time its budget last held dispatch back

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
        phase: the run's state; ``reason`` says why (a pause's or stop's reason).
        paused: dispatch is paused run-wide; ``pause_kind`` says by whom (``pause`` = the user,
            ``credits``, ``price``, ``auth``, ``route``, ``config``, ``store``...).
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
    """

    datasets: dict[str, DatasetRuntime] = field(default_factory=dict)
    phase: RunPhase = RunPhase.STARTING
    reason: str = ""
    paused: bool = False
    pause_kind: str = ""
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

    def in_flight(self) -> int:
        """Requests in flight, run-wide."""
        return sum(rt.in_flight for rt in self.datasets.values())

    def elapsed_s(self, now: float) -> float:
        """Run seconds at monotonic clock ``now``: this process's time plus earlier processes'."""
        return self.prior_elapsed_s + (now - self.t0)


__all__ = ["Control", "DatasetRuntime", "DatasetState", "PERSISTED_CONTROLS", "RunPhase", "RunState",
           "TERMINAL_CONTROLS"]
