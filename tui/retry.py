"""The dashboard's ``f``: retry the selected dataset's failed prompts (``datagen ctl RUN retry-failed``).

Called by :meth:`tui.actions.DashboardActions.retry_failed`. The failed prompts are counted by error
class from the store (in a worker), a pick offers all of them or one class (Escape cancels), and the
controller returns the picked ones to pending; the run sends them again (they are billed again).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.api import RunCommand
from tui.modals import PickScreen

if TYPE_CHECKING:
    from tui.surface import RetryContext


def retry_failed(actions: RetryContext, name: str | None) -> None:
    """Retry dataset ``name``'s failed prompts: pick all of them or those of one error class (Escape
    cancels); they return to pending and are requested (billed) again. After the run ended, say how
    to do it from the command line instead.

    Args:
        actions: the dashboard's actions (its app, host, toasts and command worker).
        name: the dataset (None: nothing selected, nothing happens).
    """
    app = actions.app
    if not name or (ctl := actions.commands()) is None:
        return
    if actions.host.finished:
        app.notify(f"the run has ended: `datagen ctl RUN_DIR retry-failed {name}`, then run it again",
                   severity="warning", markup=False)
        return
    d = actions.dataset(name)
    if d is not None and d.failed == 0:
        app.notify(f"{name} has no failed prompts", severity="warning")
        return

    async def ask() -> None:
        try:
            counts = await ctl.failed_counts(name)
        except Exception as e:  # store errors: say so, change nothing
            actions.toasts.toast(str(e), severity="error", timeout=6)
            return
        total = sum(counts.values())
        if not total:
            app.notify(f"{name} has no failed prompts", severity="warning")
            return
        options = [("*", f"all {total:,} failed prompts")]
        options += [(cls, f"{cls}: {n:,}") for cls, n in counts.items()] if len(counts) > 1 else []

        def picked(choice: str | None) -> None:
            if choice:
                actions.run_command(ctl, RunCommand.retry_failed(name, None if choice == "*" else choice))

        app.push_screen(PickScreen(f"Retry failed prompts of {name}? They return to pending and are "
                                   f"requested (and billed) again", options), picked)

    app.run_worker(ask(), group="commands", exit_on_error=False)


__all__ = ["retry_failed"]
