"""The dashboard's key actions and command-palette commands.

:class:`DashboardActions` is a manager object (the app's ``action_*`` methods call it): it gets the
app, its host (:class:`tui.host.DashboardHost`) and its toasts through its constructor. Each key
builds a :class:`~engine.run.commands.RunCommand` and sends it through the host's command target
(:meth:`tui.host.Commands.apply`: the engine's one command path). Every action
returns at once: commands run in a Textual worker (group ``commands``) and
confirmations use ``push_screen(screen, callback)``, so a key never waits on the store or on a
modal, and the scheduler's state changes within one loop iteration of the key press.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Callable

from textual.command import DiscoveryHit, Hit, Hits, Provider

from engine.api import DatasetSnapshot, RunCommand, RunSnapshot
from tui.detail import DetailScreen, detail_text
from tui.host import Commands, DashboardHost
from tui.modals import ConfirmScreen, HelpScreen, QuitScreen, abort_body, quit_body
from tui.panes import LogPane
from tui.providerpick import pick_provider
from tui.retry import retry_failed
from tui.toasts import Toasts

if TYPE_CHECKING:
    from tui.surface import DashboardSurface

HELP = [
    ("p", "pause / resume the selected dataset (pause drains: in-flight requests finish; un-skipping asks first)"),
    ("s", "skip the selected dataset (confirm): its pending prompts count as skipped"),
    ("P", "pause the whole run (drain)"),
    ("R", "resume the whole run and every paused dataset"),
    ("a", "abort in-flight requests now (confirm, shows the dollars in flight)"),
    ("+ / -", "raise / lower the concurrency of the selected dataset's request class by ~10% (1 to 4x configured)"),
    ("x", "exclude a provider, include an excluded one, or clear a drifting one's fidelity verdict (pick)"),
    ("f", "retry the selected dataset's failed prompts: pick all or one error class; they return to pending"),
    ("↑ ↓", "select a dataset (the sample pane follows the selection)"),
    ("i", "details of the selected dataset: reason, errors by class, log lines, limits, provider fidelity"),
    ("?", "this help"),
    ("e", "switch between the generation and the extraction view (with [extract] after_run)"),
    ("q", "quit (asks to drain or abort when requests are in flight)"),
]
"""Key, explanation: what ``?`` shows."""


DASHBOARD_ACTIONS = frozenset({
    "pause_selected", "resume_selected", "skip_selected", "pause_all", "resume_all", "abort", "concurrency_up",
    "concurrency_down", "exclude_provider", "retry_failed", "details", "help", "quit",
})
"""The actions bound to dashboard keys."""

ENDING = ("stopping", "stopped", "completed")
"""Run states in which the dataset keys (pause, resume, skip, un-skip; P and R) are refused."""

RESUMABLE = ("paused", "skipped", "budget_met")
"""Dataset states that ``p`` resumes (the footer then reads "Resume")."""


def concurrency_step(current: int, direction: int, cap: int | None = None) -> int:
    """The next concurrency after ``+`` (direction 1) or ``-`` (-1): ``+`` adds about 10 % and ``-``
    takes off about 1/11 (undoing a ``+``: 2000 -> 2200 -> 2000), a step of at least 1, kept within
    ``1..cap`` (``cap`` None: no upper bound). 0 is never reached: stopping dispatch is a pause
    (``P`` / ``p``), which the dashboard then shows."""
    step = max(1, round(current * 0.1)) if direction > 0 else max(1, round(current / 11))
    new = max(1, current + direction * step)
    return min(new, cap) if cap else new


class DashboardActions:
    """The key actions of :class:`tui.app.DashboardApp` (a :class:`tui.surface.DashboardSurface`).

    Args:
        app: the dashboard (its latest snapshot, selection, modals, workers and polls).
        host: where commands go (:attr:`DashboardHost.controller`) and whether the run has ended.
        toasts: the app's toasts (command results replace each other by key).

    Attributes:
        conc_target: the concurrency asked per class and not yet shown by a snapshot, so that
            repeated ``+``/``-`` step from the value asked, not the one last shown.
    """

    SKIP_REFUSED = {
        "skipped": "{name} is already skipped (p brings it back)",
        "done": "{name} is done: nothing left to skip",
        "budget_met": "{name} met its token budget: nothing left to skip",
    }
    """Why ``s`` does nothing, by dataset state."""

    def __init__(self, app: DashboardSurface, host: DashboardHost, toasts: Toasts) -> None:
        self.app = app
        self.host = host
        self.toasts = toasts
        self.conc_target: dict[str, int] = {}

    # ---- helpers ----------------------------------------------------------------------------
    def dataset(self, name: str | None) -> DatasetSnapshot | None:
        """Dataset ``name`` in the latest snapshot (None: no name, no snapshot or unknown name)."""
        snap = self.app.snapshot
        if name is None or snap is None:
            return None
        try:
            return snap.dataset(name)
        except KeyError:
            return None

    def selected(self) -> DatasetSnapshot | None:
        """The dataset under the table cursor, in the latest snapshot."""
        return self.dataset(self.app.selected_dataset)

    def class_of(self, dataset: str | None) -> str:
        """The request class of ``dataset``: the host's ``dataset_class`` when it knows it, else the
        snapshot's first class ("" without a snapshot)."""
        cls = self.host.dataset_class(dataset) if dataset else None
        if cls is not None:
            return cls
        snap = self.app.snapshot
        return snap.classes[0].name if snap is not None and snap.classes else ""

    def observe(self, snap: RunSnapshot) -> None:
        """Forget the concurrency targets that ``snap`` shows reached."""
        for c in snap.classes:
            if self.conc_target.get(c.name) == c.concurrency:
                del self.conc_target[c.name]

    def run_command(self, ctl: Commands, cmd: RunCommand, done: str | None = None, key: str | None = None) -> None:
        """Apply ``cmd`` through ``ctl`` (:meth:`tui.host.Commands.apply`) in a worker; toast its result
        (replacing the previous toast of the same ``key``, see :meth:`tui.toasts.Toasts.toast`): an error
        toast when it was refused (or the store failed)."""

        async def job() -> None:
            try:
                res = await ctl.apply(cmd)
            except Exception as e:  # store errors
                self.toasts.toast(str(e), key=key, severity="error", timeout=6)
                return
            if not res.ok:
                self.toasts.toast(res.message, key=key, severity="error", timeout=6)
                return
            self.toasts.toast(done or res.message, key=key, timeout=3)
            self.app.request_poll()

        self.app.run_worker(job(), group="commands", exit_on_error=False)

    def commands(self) -> Commands | None:
        """The host's command target; None (and a warning toast) while the engine is starting."""
        ctl = self.host.controller
        if ctl is None:
            self.app.notify("the engine is still starting", severity="warning")
        return ctl

    def check(self, action: str) -> bool | None:
        """Footer state: ``p`` reads Pause or Resume, ``P``/``R`` whichever applies. While a modal is
        open the dashboard's keys are off (its own keys answer it). Textual's ``check_action``:
        True shown and active, False hidden, None shown disabled."""
        if action in DASHBOARD_ACTIONS and len(self.app.screen_stack) > 1:
            return False
        d = self.selected()
        snap = self.app.snapshot
        if action == "pause_selected":
            if d is None or d.state in RESUMABLE:
                return False if d is not None else None
            return True  # on a finished dataset, p says why nothing happens
        if action == "resume_selected":
            return d is not None and d.state in RESUMABLE
        if action == "skip_selected":  # on a finished dataset, s says why nothing happens
            return None if d is None else True
        if action == "pause_all":
            return snap is None or snap.state != "paused"
        if action == "resume_all":  # the run's pause and every paused dataset
            return snap is not None and (snap.state == "paused" or any(d.state == "paused" for d in snap.datasets))
        return True

    # ---- dataset actions --------------------------------------------------------------------
    def refused_while_ending(self, what: str) -> bool:
        """True (and a one-line warning) when the run is ending: a quit was asked (drain or abort), it
        stopped or completed (:data:`ENDING`). Dataset states then no longer change: keys typed while
        a run exits (text pasted into its terminal) must not pause or skip a dataset and carry that
        into the next start. The engine refuses them too (:meth:`engine.run.controller.Controller.pause`)."""
        snap = self.app.snapshot
        state = snap.state if snap is not None else ""
        if self.host.quit_mode is None and not self.host.finished and state not in ENDING:
            return False
        self.app.notify(f"the run is {'completed' if state == 'completed' else 'stopping'}: {what} refused "
                        f"(dataset states no longer change while it ends)", severity="warning", timeout=4)
        return True

    def pause_selected(self, name: str | None = None) -> None:
        """Pause the selected (or named) dataset: stop dispatching; in-flight requests drain."""
        name = name or self.app.selected_dataset
        if self.refused_while_ending(f"pause {name}"):
            return
        d = self.selected() if name == self.app.selected_dataset else None
        if d is not None and d.state == "done":
            self.app.notify(f"{name} is done: nothing left to pause", severity="warning")
            return
        if name and (ctl := self.commands()) is not None:
            self.run_command(ctl, RunCommand.pause(name))

    def resume_selected(self, name: str | None = None) -> None:
        """Resume the selected (or named) dataset: a paused one at once; a skipped one only after a
        confirmation (un-skipping undoes a confirmed skip: its prompts are requested and billed)."""
        name = name or self.app.selected_dataset
        if not name or self.refused_while_ending(f"resume {name}") or (ctl := self.commands()) is None:
            return
        d = self.dataset(name)
        if d is None or d.state != "skipped":
            self.run_command(ctl, RunCommand.resume(name))
            return
        body = (f"{d.skipped:,} prompts counted as skipped return to pending and are requested (and billed) "
                f"again.{' Reason it was skipped: ' + d.state_reason if d.state_reason else ''}")

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_command(ctl, RunCommand.resume(name))
            else:
                self.app.notify(f"{name} stays skipped", timeout=3)

        self.app.push_screen(ConfirmScreen(f"Un-skip {name}?", body, yes="Un-skip"), answered)

    def skip_selected(self, name: str | None = None) -> None:
        """Ask, then skip the selected (or named) dataset; on a finished or skipped one, say why not."""
        name = name or self.app.selected_dataset
        if not name or self.refused_while_ending(f"skip {name}") or (ctl := self.commands()) is None:
            return
        d = self.dataset(name)
        if d is not None and d.state in self.SKIP_REFUSED:
            self.app.notify(self.SKIP_REFUSED[d.state].format(name=name), severity="warning")
            return
        body = (f"{d.pending:,} pending prompts will count as skipped; {d.in_flight:,} in flight finish "
                f"and are stored. Resume with p." if d else "")

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_command(ctl, RunCommand.skip(name))
            else:  # Enter on the focused Cancel: say so, or the key seems to do nothing
                self.app.notify(f"{name} not skipped", timeout=3)

        self.app.push_screen(ConfirmScreen(f"Skip {name}?", body, yes="Skip"), answered)

    def retry_failed(self, name: str | None = None) -> None:
        """Retry the selected (or named) dataset's failed prompts (see :mod:`tui.retry`)."""
        retry_failed(self, name or self.app.selected_dataset)

    # ---- run actions ------------------------------------------------------------------------
    def pause_all(self) -> None:
        """Pause the whole run (drain: in-flight requests finish)."""
        if not self.refused_while_ending("pause of the run") and (ctl := self.commands()) is not None:
            self.run_command(ctl, RunCommand.pause())

    def resume_all(self) -> None:
        """Resume the whole run and every paused dataset (:meth:`engine.run.controller.Controller.resume`)."""
        if not self.refused_while_ending("resume of the run") and (ctl := self.commands()) is not None:
            self.run_command(ctl, RunCommand.resume())

    def abort(self) -> None:
        """Ask, showing the dollars and the count in flight, then cancel every in-flight request."""
        snap = self.app.snapshot
        if (ctl := self.commands()) is None or snap is None:
            return
        if snap.in_flight == 0:
            self.app.notify("nothing in flight")
            return
        body = abort_body(snap)

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_command(ctl, RunCommand.abort())
            else:
                self.app.notify("nothing aborted: the requests in flight go on", timeout=3)

        self.app.push_screen(ConfirmScreen("Abort in-flight requests?", body, yes="Abort"), answered)

    def concurrency(self, direction: int) -> None:
        """``+`` (direction 1) or ``-`` (-1): step the selected dataset's class concurrency
        (:func:`concurrency_step`); at a bound, say so instead."""
        name = self.app.selected_dataset
        snap = self.app.snapshot
        if (ctl := self.commands()) is None or snap is None or not snap.classes:
            return
        cls = self.class_of(name)
        c = next((c for c in snap.classes if c.name == cls), None)
        current = self.conc_target.get(cls)
        if current is None:
            current = c.concurrency if c is not None else 0
        cap = c.max_concurrency if c is not None and c.max_concurrency else None
        new = concurrency_step(current, direction, cap)
        if new == current:
            why = (f"at its maximum {cap:,} (4x the configured {c.configured:,})" if direction > 0 and c is not None
                   else "at its minimum 1 (P pauses the run, p the dataset)")
            self.toasts.toast(f"class {cls} concurrency is {why}", key="concurrency", severity="warning", timeout=5)
            return
        self.conc_target[cls] = new
        self.run_command(ctl, RunCommand.concurrency(cls, new), key="concurrency")

    def exclude_provider(self) -> None:
        """Pick a provider and exclude it, an excluded one and include it again, or a drifting one and
        clear its fidelity verdict (see :mod:`tui.providerpick`)."""
        pick_provider(self)

    def details(self, name: str | None = None) -> None:
        """Open the detail view (:mod:`tui.detail`) of the selected (or named) dataset; it follows
        the snapshots the app keeps polling while it is open."""
        name = name or self.app.selected_dataset
        if not name:
            self.app.notify("no dataset selected")
            return

        def render() -> Any:
            d, snap = self.dataset(name), self.app.snapshot
            if d is None or snap is None:
                return None
            try:
                lines = self.app.main_screen.query_one(LogPane).lines
            except Exception:  # no log pane (shutting down)
                lines = ()
            return detail_text(d, snap, self.class_of(name), lines)

        self.app.push_screen(DetailScreen(name, render))

    def help(self) -> None:
        """Show the keys."""
        self.app.push_screen(HelpScreen(HELP))

    def quit(self) -> None:
        """Quit: at once when nothing is in flight or the run has ended; else ask drain/abort. Decides on
        a snapshot pulled now, not the last one shown (which may be up to a poll interval old)."""
        self.app.request_poll()
        snap = self.app.snapshot
        if self.host.finished or snap is None or snap.in_flight == 0:
            self.app.begin_quit("drain")
            return
        body = quit_body(snap)

        def chosen(choice: str | None) -> None:
            if choice:
                self.app.begin_quit(choice)

        self.app.push_screen(QuitScreen(body), chosen)


class DashboardCommands(Provider):
    """Command-palette commands: the key actions, plus pause/resume/skip of any dataset by name."""

    def _commands(self) -> list[tuple[str, Callable[[], Any], str]]:
        app: Any = self.app
        out: list[tuple[str, Callable[[], Any], str]] = [
            ("Pause selected dataset", app.action_pause_selected, "p: stop dispatching; in-flight drain"),
            ("Resume selected dataset", app.action_resume_selected, "p on a paused dataset"),
            ("Skip selected dataset", app.action_skip_selected, "s: pending prompts count as skipped"),
            ("Pause all", app.action_pause_all, "P: pause the whole run (drain)"),
            ("Resume all", app.action_resume_all, "R: resume the whole run"),
            ("Abort in-flight requests", app.action_abort, "a: cancel every in-flight request now"),
            ("Raise concurrency", app.action_concurrency_up, "+: of the selected dataset's class"),
            ("Lower concurrency", app.action_concurrency_down, "-: of the selected dataset's class"),
            ("Exclude a provider", app.action_exclude_provider, "x: stop routing to a provider"),
            ("Retry failed prompts of the selected dataset", app.action_retry_failed,
             "f: failed prompts return to pending"),
            ("Details of the selected dataset", app.action_details, "i: full reason, errors, log lines, limits"),
            ("Help: keys", app.action_help, "?"),
            ("Quit", app.action_quit, "q: drain or abort, then exit"),
        ]
        snap = app.snapshot
        for d in snap.datasets if snap else ():
            out.append((f"Pause dataset {d.name}", partial(app.action_pause_selected, d.name), d.state))
            out.append((f"Resume dataset {d.name}", partial(app.action_resume_selected, d.name), d.state))
            out.append((f"Skip dataset {d.name}", partial(app.action_skip_selected, d.name), d.state))
            out.append((f"Details of dataset {d.name}", partial(app.action_details, d.name), d.state))
            if d.failed:
                out.append((f"Retry failed prompts of dataset {d.name}", partial(app.action_retry_failed, d.name),
                            f"{d.failed:,} failed"))
        return out

    async def discover(self) -> Hits:
        for label, cb, help_ in self._commands():
            yield DiscoveryHit(label, cb, help=help_)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for label, cb, help_ in self._commands():
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), cb, help=help_)


__all__ = ["DashboardActions", "DashboardCommands", "HELP", "concurrency_step"]
