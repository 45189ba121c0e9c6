"""What happens to a prompt whose request ended in an error, and ``retry-failed``.

:class:`Failures` is a collaborator of :class:`engine.run.scheduler.Scheduler`: it receives the run
state (whose own methods return a prompt to pending, wake the dispatchers and check the end), the
writer, the store, the telemetry and the run's event log through its constructor. The rules that
decide whether an error is the run's or the prompt's are pure and live in :mod:`engine.run.runwide`;
the pause it decides is returned (a :class:`engine.run.guards.Pause`), and the run applies it
(:func:`engine.run.guards.apply`).

- an error of the account, the route or the configuration (401, 402, 404 / "No endpoints found",
  the same 4xx on the first few prompts), or a server that cannot be reached (``connect`` after the
  retries, no endpoint left to try) or accepts connections and never answers (a ``stall`` with not
  one byte of a response, while no result arrived within the stall timeout and no stream in flight
  has received text) returns the prompt to ``pending`` and pauses the RUN with the reason; it never
  fails the prompt and never feeds a dataset's anomaly guard;
- any other error fails the prompt with its reason (a 4xx of a prompt that could still be the
  start of a configuration mistake is written when that is ruled out: at the next success, a
  different rejection, or the end of the run); OpenRouter's ``weight_exceeds_budget`` 402 (one
  request too expensive for the in-flight budget) is written at once, never held;
- :meth:`Failures.retry_failed` returns failed prompts to ``pending`` (``datagen ctl RUN
  retry-failed``, the dashboard's ``f``).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable

from engine.client.types import RequestError
from engine.run import guards
from engine.run.runwide import Condition, ConfigMistakeDetector, condition_of, is_rejection, signature
from engine.storage.store import PendingPrompt

if TYPE_CHECKING:
    from engine.run.runstate import DatasetRuntime, RunState
    from engine.run.telemetry import Telemetry
    from engine.storage.store import Store
    from engine.storage.writer import StoreWriter

log = logging.getLogger(__name__)


class Failures:
    """Failure handling of one run (see the module docstring).

    Args:
        run: the run state (datasets' counters, pause, stop).
        writer: the run's store writer (failures, attempt counts).
        store: the run's store (``retry-failed`` reads it).
        telemetry: the run's telemetry (anomaly windows reset on retry).
        api_key_env: ``provider.api_key_env``, named in a rejected key's pause reason.
        reach: what an unreachable server's pause reason names (``cannot reach REACH``): the base URL,
            or "any of the 3 endpoints".
        event: ``event(level, kind, dataset, message)`` of the run.
        stall_s: ``[provider.timeouts] stall_s`` (s): a result within it is a sign the endpoint answers.
        clock: monotonic clock (s).

    Attributes:
        config_check: the :class:`~engine.run.runwide.ConfigMistakeDetector`; its items are
            ``(dataset runtime, prompt, attempts, error class, error text)``.
        run_condition: the run-wide condition the run is paused for (None: none).
    """

    def __init__(self, run: "RunState", writer: "StoreWriter", store: "Store", telemetry: "Telemetry", *,
                 api_key_env: str, reach: str = "the server",
                 event: Callable[[str, str, "str | None", str], None], stall_s: float = 120.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.run = run
        self.writer = writer
        self.store = store
        self.telemetry = telemetry
        self.api_key_env = api_key_env
        self.reach = reach
        self._event = event
        # held items: (dataset runtime, prompt, attempts, error class, error text)
        self.config_check: ConfigMistakeDetector[tuple[Any, ...]] = ConfigMistakeDetector()
        self.run_condition: Condition | None = None
        self.stall_s = float(stall_s)
        self.clock = clock
        #: when the last request succeeded (monotonic s; None: none yet in this process)
        self.last_success_at: float | None = None

    # ---- judging --------------------------------------------------------------------------
    def run_wide(self, e: RequestError) -> Condition | None:
        """The run-wide condition ``e`` shows (by itself, or as the rejection the run is paused for
        while that pause lasts), or None when ``e`` is the prompt's own."""
        cond = condition_of(e.error_class.value, e.status, e.message, endpoint_fault=e.endpoint_fault,
                            where=self.reach, no_answer=e.no_answer)
        if cond is not None:
            if e.no_answer and self.answering():  # others are answered: this silence is the request's own
                return None
            return cond
        rc = self.run_condition
        if (rc is not None and rc.signature is not None and self.run.paused
                and signature(e.error_class.value, e.bare_message) == rc.signature):
            return rc
        return None

    def answering(self) -> bool:
        """True when the endpoint shows it answers: a request succeeded within the last ``stall_s``,
        or a stream in flight has received text (a slow stream sending bytes is never a silent server)."""
        if self.last_success_at is not None and self.clock() - self.last_success_at < self.stall_s:
            return True
        return any(pr.chars_received > 0 for rt in self.run.datasets.values() for _c, pr, _e in rt.streams.values())

    def on_failure(self, rt: "DatasetRuntime", p: PendingPrompt, e: RequestError, attempts: int) -> guards.Pause | None:
        """Prompt ``p`` of ``rt`` (in flight) ended in ``e`` after ``attempts``: fail it, hold it
        (a possible configuration mistake), or return it to pending; returns the run pause this
        decides (the caller applies it: :func:`engine.run.guards.apply`), or None."""
        ec = e.error_class.value
        cond = self.run_wide(e)
        if cond is not None:
            self.writer.set_attempts(p.id, attempts)
            self.run.return_to_pending(rt, p, attempts)
            return self._pause_for(cond)
        rt.in_flight -= 1
        rt.failed += 1
        item = (rt, p, attempts, ec, str(e))
        if is_rejection(ec, e.status, e.message):
            # the same rejection from any replica (several base_urls: the message names the endpoint)
            found, release = self.config_check.on_rejection(p.id, signature(ec, e.bare_message), item)
            self.write_failures(release)
            if found is not None:
                cond, undo = found
                self._undo_failures(undo)
                return self._pause_for(cond)
        else:
            self.write_failures([item])
        self.run.check_finished()
        return None

    def on_success(self) -> None:
        """A request succeeded: held 4xx rejections are the prompts' own; write them."""
        self.last_success_at = self.clock()
        self.write_failures(self.config_check.on_success())

    def write_failures(self, items: list) -> None:
        """Commit the failures of ``items`` (``(rt, prompt, attempts, class, text)``)."""
        for _rt, p, attempts, ec, text in items:
            self.writer.add_failure(p.id, ec, text, attempts)

    def _undo_failures(self, items: list) -> None:
        """Return prompts counted as failed but not written (held by the config check) to pending."""
        for rt, p, attempts, _ec, _text in items:
            rt.failed -= 1
            rt.pending[p.cls] += 1
            rt.requeue[p.cls].appendleft(
                PendingPrompt(p.id, p.dataset, p.key, p.cls, p.messages, p.tools, attempts, p.est_prompt_tokens))
            self.writer.set_attempts(p.id, attempts)
        self.run.notify()

    def _pause_for(self, cond: Condition) -> guards.Pause | None:
        """The run pause for ``cond`` (once per condition: prompts still in flight that meet it too
        only return to pending), or None."""
        if self.run.stopping:  # a stop in progress: the prompt is pending, that is all
            return None
        if self.run.paused and self.run_condition is not None and self.run_condition.kind == cond.kind:
            return None
        self.run_condition = cond
        return guards.run_wide(cond, self.api_key_env)

    def on_resume(self) -> None:
        """The run is resumed: a configuration-mistake pause resumed by the user means "not the
        config": that rejection fails its prompts from now on."""
        rc = self.run_condition
        if rc is not None and rc.signature is not None:
            self.config_check.dismiss(rc.signature)
        self.run_condition = None

    def release_held(self) -> None:
        """Write the failures the config check still holds (the run ends, or ``retry-failed``)."""
        self.write_failures(self.config_check.release())

    # ---- retry-failed -----------------------------------------------------------------------
    async def retry_failed(self, dataset: str | None = None, reason: str | None = None) -> int:
        """Return the failed prompts of ``dataset`` (None: every dataset) whose error class is
        ``reason`` (None: any) to pending; they are dispatched again (after the ones already
        pending) and counted, and the run logs an event. Returns how many.

        Raises:
            ValueError: unknown dataset.
        """
        datasets = self.run.datasets
        if dataset is not None and dataset not in datasets:
            raise ValueError(f"unknown dataset {dataset!r}; expected one of: {', '.join(datasets)}")
        self.release_held()
        await self.writer.flush()  # failures still queued count too
        back = await self.store.retry_failed(dataset, reason)
        by_ds: dict[str, int] = {}
        for p in back:
            rt = datasets.get(p.dataset)
            if rt is None or p.cls not in rt.pending:
                continue
            rt.failed -= 1
            rt.pending[p.cls] += 1
            rt.requeue[p.cls].append(p)
            by_ds[p.dataset] = by_ds.get(p.dataset, 0) + 1
        for name, n in by_ds.items():
            if self.telemetry.anomaly is not None:
                self.telemetry.anomaly.reset(name)  # measured afresh
            self._event("info", "retry_failed", name, f"{n} failed prompt(s){' (' + reason + ')' if reason else ''} "
                        f"of {name} returned to pending by retry-failed")
        self.run.notify()
        return len(back)


__all__ = ["Failures"]
