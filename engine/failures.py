"""What the scheduler does with a prompt whose request ended in an error, and ``retry-failed``.

Mixed into :class:`engine.scheduler.Scheduler` (it uses the scheduler's counters, writer, store and
pause), kept apart so the dispatch core stays readable. The rules that decide whether an error is
the run's or the prompt's are pure and live in :mod:`engine.runwide`:

- an error of the account, the route or the configuration (401, 402, 404 / "No endpoints found",
  the same 4xx on the first few prompts) returns the prompt to ``pending`` and pauses the RUN with
  the reason; it never fails the prompt and never feeds a dataset's anomaly guard;
- any other error fails the prompt with its reason (a 4xx of a prompt that could still be the
  start of a configuration mistake is written when that is ruled out: at the next success, a
  different rejection, or the end of the run);
- :meth:`FailureMixin.retry_failed` returns failed prompts to ``pending`` (``datagen ctl RUN
  retry-failed``, the dashboard's ``f``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from engine import guards
from engine.client.types import RequestError
from engine.runwide import Condition, ConfigMistakeDetector, condition_of, is_rejection, signature
from engine.store import PendingPrompt

if TYPE_CHECKING:
    from engine.runstate import DatasetRuntime

log = logging.getLogger(__name__)


class FailureMixin:
    """Failure handling of :class:`~engine.scheduler.Scheduler` (see the module docstring).

    Attributes (set in the scheduler's constructor):
        config_check: the :class:`~engine.runwide.ConfigMistakeDetector`; its items are
            ``(dataset runtime, prompt, attempts, error class, error text)``.
        run_condition: the run-wide condition the run is paused for (None: none).
    """

    config_check: ConfigMistakeDetector
    run_condition: Condition | None

    # ---- judging --------------------------------------------------------------------------
    def run_wide(self, e: RequestError) -> Condition | None:
        """The run-wide condition ``e`` shows (by itself, or as the rejection the run is paused for
        while that pause lasts), or None when ``e`` is the prompt's own."""
        cond = condition_of(e.error_class.value, e.status, e.message)
        if cond is not None:
            return cond
        rc = self.run_condition
        if (rc is not None and rc.signature is not None and self.run_paused  # type: ignore[attr-defined]
                and signature(e.error_class.value, e.message) == rc.signature):
            return rc
        return None

    def _on_failure(self, rt: "DatasetRuntime", p: PendingPrompt, e: RequestError, attempts: int) -> None:
        ec = e.error_class.value
        cond = self.run_wide(e)
        if cond is not None:
            self.writer.set_attempts(p.id, attempts)  # type: ignore[attr-defined]
            self._return_to_pending(rt, p, attempts)  # type: ignore[attr-defined]
            self._pause_for(cond)
            return
        rt.in_flight -= 1
        rt.failed += 1
        item = (rt, p, attempts, ec, str(e))
        if is_rejection(ec, e.status):
            found, release = self.config_check.on_rejection(p.id, signature(ec, e.message), item)
            self._write_failures(release)
            if found is not None:
                cond, undo = found
                self._undo_failures(undo)
                self._pause_for(cond)
                return
        else:
            self._write_failures([item])
        self._check_finished()  # type: ignore[attr-defined]

    def _write_failures(self, items: list) -> None:
        """Commit the failures of ``items`` (``(rt, prompt, attempts, class, text)``)."""
        for _rt, p, attempts, ec, text in items:
            self.writer.add_failure(p.id, ec, text, attempts)  # type: ignore[attr-defined]

    def _undo_failures(self, items: list) -> None:
        """Return prompts counted as failed but not written (held by the config check) to pending."""
        for rt, p, attempts, _ec, _text in items:
            rt.failed -= 1
            rt.pending[p.cls] += 1
            rt.requeue[p.cls].appendleft(
                PendingPrompt(p.id, p.dataset, p.key, p.cls, p.messages, p.tools, attempts, p.est_prompt_tokens))
            self.writer.set_attempts(p.id, attempts)  # type: ignore[attr-defined]
        self.notify()  # type: ignore[attr-defined]

    def _pause_for(self, cond: Condition) -> None:
        """Pause the run for ``cond`` (once per condition: prompts still in flight that meet it too
        only return to pending)."""
        if self._stopping:  # type: ignore[attr-defined]  # a stop in progress: the prompt is pending, that is all
            return
        if self.run_paused and self.run_condition is not None and self.run_condition.kind == cond.kind:  # type: ignore[attr-defined]
            return
        self.run_condition = cond
        guards.apply(self, guards.run_wide(cond, self.cfg.provider.api_key_env))  # type: ignore[arg-type, attr-defined]

    def on_resume(self) -> None:
        """The run is resumed: a configuration-mistake pause resumed by the user means "not the
        config": that rejection fails its prompts from now on."""
        rc = self.run_condition
        if rc is not None and rc.signature is not None:
            self.config_check.dismiss(rc.signature)
        self.run_condition = None

    def release_held_failures(self) -> None:
        """Write the failures the config check still holds (the run ends, or ``retry-failed``)."""
        self._write_failures(self.config_check.release())

    # ---- retry-failed -----------------------------------------------------------------------
    async def retry_failed(self, dataset: str | None = None, reason: str | None = None) -> int:
        """Return the failed prompts of ``dataset`` (None: every dataset) whose error class is
        ``reason`` (None: any) to pending; they are dispatched again (after the ones already
        pending) and counted, and the run logs an event. Returns how many.

        Raises:
            ValueError: unknown dataset.
        """
        if dataset is not None and dataset not in self.datasets:  # type: ignore[attr-defined]
            raise ValueError(f"unknown dataset {dataset!r}; expected one of: {', '.join(self.datasets)}")  # type: ignore[attr-defined]
        self.release_held_failures()
        await self.writer.flush()  # type: ignore[attr-defined]  # failures still queued count too
        back = await self.store.retry_failed(dataset, reason)  # type: ignore[attr-defined]
        by_ds: dict[str, int] = {}
        for p in back:
            rt = self.datasets.get(p.dataset)  # type: ignore[attr-defined]
            if rt is None or p.cls not in rt.pending:
                continue
            rt.failed -= 1
            rt.pending[p.cls] += 1
            rt.requeue[p.cls].append(p)
            by_ds[p.dataset] = by_ds.get(p.dataset, 0) + 1
        for name, n in by_ds.items():
            if self.telemetry.anomaly is not None:  # type: ignore[attr-defined]
                self.telemetry.anomaly.reset(name)  # type: ignore[attr-defined]  # measured afresh
            self.event("info", "retry_failed", name, f"{n} failed prompt(s){' (' + reason + ')' if reason else ''} "  # type: ignore[attr-defined]
                       f"of {name} returned to pending by retry-failed")
        self.notify()  # type: ignore[attr-defined]
        return len(back)


__all__ = ["FailureMixin"]
