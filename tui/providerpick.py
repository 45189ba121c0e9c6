"""The dashboard's ``x``: exclude a provider, include an excluded one again, or clear a drifting one's
fidelity verdict (``datagen ctl RUN_DIR clear-verdict NAME``).

Called by :meth:`tui.actions.DashboardActions.exclude_provider`. The pick lists what
:func:`tui.fidelity.pick_options` offers (Escape cancels); exclude and include are sent at once, a clear
only after a confirmation that shows the verdict, its reason and what clearing does.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from engine.api import RunCommand
from tui.fidelity import clear_body, parse_pick, pick_options
from tui.modals import ConfirmScreen, PickScreen

if TYPE_CHECKING:
    from tui.surface import RetryContext


def pick_provider(actions: RetryContext) -> None:
    """Open ``x``'s pick over the latest snapshot's providers and send what is picked.

    Args:
        actions: the dashboard's actions (its app, the command target and the command worker).
    """
    app = actions.app
    snap = app.snapshot
    if (ctl := actions.commands()) is None or snap is None:
        return
    options = pick_options(snap.providers)
    if not options:
        app.notify("no provider to exclude yet")
        return
    fidelity = {p.name: p.fidelity for p in snap.providers}

    def cleared(yes: bool | None, name: str) -> None:
        if yes:
            actions.run_command(ctl, RunCommand.clear_verdict(name))
        else:
            app.notify(f"{name} stays judged drifting", timeout=3, markup=False)

    def picked(value: str | None) -> None:
        verb, name = parse_pick(value or "")
        if verb == "clear":
            app.push_screen(ConfirmScreen(f"Clear {name}'s drifting verdict?", clear_body(name, fidelity.get(name)),
                                          yes="Clear"), partial(cleared, name=name))
        elif name:
            actions.run_command(ctl, RunCommand.include_provider(name) if verb == "include"
                                else RunCommand.exclude_provider(name))

    app.push_screen(PickScreen("Exclude which provider?", options), picked)


__all__ = ["pick_provider"]
