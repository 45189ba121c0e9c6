"""The dashboard's ``f``: retry the selected dataset's failed prompts (``datagen ctl RUN retry-failed``).

Mixed into :class:`tui.actions.ActionsMixin`. The failed prompts are counted by error class from
the store (in a worker), a pick offers all of them or one class (Escape cancels), and the
controller returns the picked ones to pending; the run sends them again (they are billed again).
"""

from __future__ import annotations

from functools import partial

from tui.modals import PickScreen


class RetryFailedAction:
    """``action_retry_failed`` of :class:`tui.app.DashboardApp` (uses the app's controller,
    snapshot, toasts and workers through :class:`tui.actions.ActionsMixin`)."""

    def action_retry_failed(self, name: str | None = None) -> None:
        """Retry the selected (or named) dataset's failed prompts: pick all of them or those of one
        error class (Escape cancels); they return to pending and are requested (billed) again."""
        name = name or self.selected_dataset  # type: ignore[attr-defined]
        if not name or self._no_engine():  # type: ignore[attr-defined]
            return
        if getattr(self, "engine_finished", False):
            self.notify(f"the run has ended: `datagen ctl RUN_DIR retry-failed {name}`, then run it again",  # type: ignore[attr-defined]
                        severity="warning", markup=False)
            return
        d = self._dataset(name)  # type: ignore[attr-defined]
        if d is not None and d.failed == 0:
            self.notify(f"{name} has no failed prompts", severity="warning")  # type: ignore[attr-defined]
            return
        ctl = self.controller  # type: ignore[attr-defined]
        if getattr(ctl, "retry_failed", None) is None:
            self.notify("retrying failed prompts is not available in this engine build", severity="warning")  # type: ignore[attr-defined]
            return

        async def ask() -> None:
            try:
                counts = await ctl.failed_counts(name)
            except Exception as e:  # noqa: BLE001 - store errors: say so, change nothing
                self.toast(str(e), severity="error", timeout=6)  # type: ignore[attr-defined]
                return
            total = sum(counts.values())
            if not total:
                self.notify(f"{name} has no failed prompts", severity="warning")  # type: ignore[attr-defined]
                return
            options = [("*", f"all {total:,} failed prompts")]
            options += [(cls, f"{cls}: {n:,}") for cls, n in counts.items()] if len(counts) > 1 else []

            def picked(choice: str | None) -> None:
                if choice:
                    self._run_command(partial(ctl.retry_failed, name, None if choice == "*" else choice))  # type: ignore[attr-defined]

            self.push_screen(PickScreen(f"Retry failed prompts of {name}? They return to pending and are "  # type: ignore[attr-defined]
                                        f"requested (and billed) again", options), picked)

        self.run_worker(ask(), group="commands", exit_on_error=False)  # type: ignore[attr-defined]


__all__ = ["RetryFailedAction"]
