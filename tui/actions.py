"""The dashboard's key actions and command-palette commands.

Every action returns at once: controller calls run in a Textual worker (group ``commands``) and
confirmations use ``push_screen(screen, callback)``, so a key never waits on the store or on a
modal, and the scheduler's state changes within one loop iteration of the key press.
"""

from __future__ import annotations

import inspect
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.notifications import Notification

from tui.detail import DetailScreen, detail_text
from tui.modals import ConfirmScreen, HelpScreen, PickScreen, QuitScreen, abort_body, quit_body
from tui.retry import RetryFailedAction

if TYPE_CHECKING:
    from engine.snapshot import DatasetSnapshot

HELP = [
    ("p", "pause / resume the selected dataset (pause drains: in-flight requests finish; un-skipping asks first)"),
    ("s", "skip the selected dataset (confirm): its pending prompts count as skipped"),
    ("P", "pause the whole run (drain)"),
    ("R", "resume the whole run"),
    ("a", "abort in-flight requests now (confirm, shows the dollars in flight)"),
    ("+ / -", "raise / lower the concurrency of the selected dataset's request class by ~10% (1 to 4x configured)"),
    ("x", "exclude a provider, or include an excluded one again (pick from the providers seen so far)"),
    ("f", "retry the selected dataset's failed prompts: pick all or one error class; they return to pending"),
    ("↑ ↓", "select a dataset (the sample pane follows the selection)"),
    ("i", "details of the selected dataset: full reason, errors by class, log lines, current limits"),
    ("?", "this help"),
    ("q", "quit (asks to drain or abort when requests are in flight)"),
]
"""Key, explanation: what ``?`` shows."""


DASHBOARD_ACTIONS = frozenset({
    "pause_selected", "resume_selected", "skip_selected", "pause_all", "resume_all", "abort", "concurrency_up",
    "concurrency_down", "exclude_provider", "retry_failed", "details", "help", "quit",
})
"""The actions bound to dashboard keys."""

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


class ActionsMixin(RetryFailedAction):
    """Actions of :class:`tui.app.DashboardApp` (mixed into the App; uses its attributes)."""

    # ---- helpers ----------------------------------------------------------------------------
    def _selected_ds(self) -> "DatasetSnapshot | None":
        name, snap = self.selected_dataset, self.snapshot  # type: ignore[attr-defined]
        if name is None or snap is None:
            return None
        try:
            return snap.dataset(name)
        except KeyError:
            return None

    def announce_notices(self, snap: Any) -> None:
        """Toast each guard pause of ``snap.notices`` not yet announced (the log pane shows the
        same pause as a WARNING event line), as loudly as the toast of a user's own pause."""
        seen = getattr(self, "_notice_seen", 0)
        for seq, text in getattr(snap, "notices", ()):
            if seq > seen:
                seen = seq
                # markup=False: "[dataset]" is text, not markup
                self.notify(text, title="paused by a guard", severity="warning",  # type: ignore[attr-defined]
                            timeout=20, markup=False)
        self._notice_seen = seen

    def toast(self, message: str, *, key: str | None = None, severity: str = "information",
              timeout: float = 3, title: str = "") -> None:
        """Show a toast. With ``key``, it replaces the toast shown earlier under the same key (if
        still on screen), so a repeated key (``-`` pressed 30 times) shows one toast, not a stack.
        Must run on the app's loop (key handlers and ``commands`` workers do)."""
        if key is None:
            self.notify(message, title=title, severity=severity, timeout=timeout)  # type: ignore[attr-defined]
            return
        shown = self._notifications  # type: ignore[attr-defined]
        old = self.keyed_toasts.get(key)  # type: ignore[attr-defined]
        if old is not None and old in shown:
            del shown[old]
        note = Notification(message, title, severity, timeout)  # type: ignore[arg-type]
        self.keyed_toasts[key] = note  # type: ignore[attr-defined]
        # What App.notify's message handler does, done now so the next key finds it to replace.
        shown.add(note)
        self._refresh_notifications()  # type: ignore[attr-defined]

    def _run_command(self, call: Callable[[], Any], done: str | None = None, key: str | None = None) -> None:
        """Run ``call()`` (sync or async controller method) in a worker; toast its result (replacing
        the previous toast of the same ``key``, see :meth:`toast`)."""

        async def job() -> None:
            try:
                res = call()
                if inspect.isawaitable(res):
                    res = await res
            except Exception as e:  # noqa: BLE001 - ValueError from the controller, store errors
                self.toast(str(e), key=key, severity="error", timeout=6)
                return
            self.toast(done or str(res), key=key, timeout=3)
            self.request_poll()  # type: ignore[attr-defined]

        self.run_worker(job(), group="commands", exit_on_error=False)  # type: ignore[attr-defined]

    def _no_engine(self) -> bool:
        if self.controller is None:  # type: ignore[attr-defined]
            self.notify("the engine is still starting", severity="warning")  # type: ignore[attr-defined]
            return True
        return False

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Footer state: ``p`` reads Pause or Resume, ``P``/``R`` whichever applies. While a modal is
        open the dashboard's keys are off (its own keys answer it)."""
        if action in DASHBOARD_ACTIONS and len(self.screen_stack) > 1:  # type: ignore[attr-defined]
            return False
        d = self._selected_ds()
        snap = self.snapshot  # type: ignore[attr-defined]
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
        if action == "resume_all":
            return snap is not None and snap.state == "paused"
        return True

    # ---- dataset actions --------------------------------------------------------------------
    def action_pause_selected(self, name: str | None = None) -> None:
        """Pause the selected (or named) dataset: stop dispatching; in-flight requests drain."""
        name = name or self.selected_dataset  # type: ignore[attr-defined]
        d = self._selected_ds() if name == self.selected_dataset else None  # type: ignore[attr-defined]
        if d is not None and d.state == "done":
            self.notify(f"{name} is done: nothing left to pause", severity="warning")  # type: ignore[attr-defined]
            return
        if name and not self._no_engine():
            self._run_command(partial(self.controller.pause, name))  # type: ignore[attr-defined]

    def _dataset(self, name: str) -> "DatasetSnapshot | None":
        snap = self.snapshot  # type: ignore[attr-defined]
        try:
            return snap.dataset(name) if snap is not None else None
        except KeyError:
            return None

    def action_resume_selected(self, name: str | None = None) -> None:
        """Resume the selected (or named) dataset: a paused one at once; a skipped one only after a
        confirmation (un-skipping undoes a confirmed skip: its prompts are requested and billed)."""
        name = name or self.selected_dataset  # type: ignore[attr-defined]
        if not name or self._no_engine():
            return
        d = self._dataset(name)
        if d is None or d.state != "skipped":
            self._run_command(partial(self.controller.resume, name))  # type: ignore[attr-defined]
            return
        body = (f"{d.skipped:,} prompts counted as skipped return to pending and are requested (and billed) "
                f"again.{' Reason it was skipped: ' + d.state_reason if d.state_reason else ''}")

        def answered(yes: bool | None) -> None:
            if yes:
                self._run_command(partial(self.controller.resume, name))  # type: ignore[attr-defined]
            else:
                self.notify(f"{name} stays skipped", timeout=3)  # type: ignore[attr-defined]

        self.push_screen(ConfirmScreen(f"Un-skip {name}?", body, yes="Un-skip"), answered)  # type: ignore[attr-defined]

    SKIP_REFUSED = {
        "skipped": "{name} is already skipped (p brings it back)",
        "done": "{name} is done: nothing left to skip",
        "budget_met": "{name} met its token budget: nothing left to skip",
    }
    """Why ``s`` does nothing, by dataset state."""

    def action_skip_selected(self, name: str | None = None) -> None:
        """Ask, then skip the selected (or named) dataset; on a finished or skipped one, say why not."""
        name = name or self.selected_dataset  # type: ignore[attr-defined]
        if not name or self._no_engine():
            return
        d = self._dataset(name)
        if d is not None and d.state in self.SKIP_REFUSED:
            self.notify(self.SKIP_REFUSED[d.state].format(name=name), severity="warning")  # type: ignore[attr-defined]
            return
        body = (f"{d.pending:,} pending prompts will count as skipped; {d.in_flight:,} in flight finish "
                f"and are stored. Resume with p." if d else "")

        def answered(yes: bool | None) -> None:
            if yes:
                self._run_command(partial(self.controller.skip, name))  # type: ignore[attr-defined]

        self.push_screen(ConfirmScreen(f"Skip {name}?", body, yes="Skip"), answered)  # type: ignore[attr-defined]

    # ---- run actions ------------------------------------------------------------------------
    def action_pause_all(self) -> None:
        """Pause the whole run (drain: in-flight requests finish)."""
        if not self._no_engine():
            self.user_paused = True  # type: ignore[attr-defined]
            self._run_command(partial(self.controller.pause, None))  # type: ignore[attr-defined]

    def action_resume_all(self) -> None:
        """Resume the whole run."""
        if not self._no_engine():
            self.user_paused = False  # type: ignore[attr-defined]
            self._run_command(partial(self.controller.resume, None))  # type: ignore[attr-defined]

    def action_abort(self) -> None:
        """Ask, showing the dollars and the count in flight, then cancel every in-flight request."""
        snap = self.snapshot  # type: ignore[attr-defined]
        if self._no_engine() or snap is None:
            return
        if snap.in_flight == 0:
            self.notify("nothing in flight")  # type: ignore[attr-defined]
            return
        body = abort_body(snap)

        def answered(yes: bool | None) -> None:
            if yes:
                self._run_command(self.controller.abort)  # type: ignore[attr-defined]

        self.push_screen(ConfirmScreen("Abort in-flight requests?", body, yes="Abort"), answered)  # type: ignore[attr-defined]

    def _concurrency(self, direction: int) -> None:
        name = self.selected_dataset  # type: ignore[attr-defined]
        snap = self.snapshot  # type: ignore[attr-defined]
        if self._no_engine() or snap is None or not snap.classes:
            return
        cls = self.class_of(name)  # type: ignore[attr-defined]
        c = next((c for c in snap.classes if c.name == cls), None)
        current = self.conc_target.get(cls)  # type: ignore[attr-defined]
        if current is None:
            current = c.concurrency if c is not None else 0
        cap = c.max_concurrency if c is not None and c.max_concurrency else None
        new = concurrency_step(current, direction, cap)
        if new == current:
            why = (f"at its maximum {cap:,} (4x the configured {c.configured:,})" if direction > 0 and c is not None
                   else "at its minimum 1 (P pauses the run, p the dataset)")
            self.toast(f"class {cls} concurrency is {why}", key="concurrency", severity="warning", timeout=5)
            return
        self.conc_target[cls] = new  # type: ignore[attr-defined]
        self._run_command(partial(self.controller.set_concurrency, cls, new), key="concurrency")  # type: ignore[attr-defined]

    def action_concurrency_up(self) -> None:
        """Raise the selected dataset's class concurrency by about 10 % (at least 1)."""
        self._concurrency(+1)

    def action_concurrency_down(self) -> None:
        """Lower the selected dataset's class concurrency by about 10 % (at least 1, not below 0)."""
        self._concurrency(-1)

    def action_exclude_provider(self) -> None:
        """Pick a provider and exclude it (when the engine supports it)."""
        snap = self.snapshot  # type: ignore[attr-defined]
        if self._no_engine() or snap is None:
            return
        fn = getattr(self.controller, "exclude_provider", None)  # type: ignore[attr-defined]
        if fn is None:
            self.notify("excluding providers is not available in this engine build", severity="warning")  # type: ignore[attr-defined]
            return
        options = [(p.name, f"{p.name}  {p.requests:,} req  {p.error_rate:.0%} err")
                   for p in snap.providers if not p.excluded]
        include = getattr(self.controller, "include_provider", None)  # type: ignore[attr-defined]
        excluded = {p.name for p in snap.providers if p.excluded} if include is not None else set()
        options += [(p, f"{p}  (excluded: pick to include it again)") for p in sorted(excluded)]
        if not options:
            self.notify("no provider to exclude yet")  # type: ignore[attr-defined]
            return

        def picked(name: str | None) -> None:
            if name:
                self._run_command(partial(include if name in excluded else fn, name))

        self.push_screen(PickScreen("Exclude which provider?", options), picked)  # type: ignore[attr-defined]

    def action_details(self, name: str | None = None) -> None:
        """Open the detail view (:mod:`tui.detail`) of the selected (or named) dataset; it follows
        the snapshots the app keeps polling while it is open."""
        name = name or self.selected_dataset  # type: ignore[attr-defined]
        if not name:
            self.notify("no dataset selected")  # type: ignore[attr-defined]
            return

        def render() -> Any:
            snap = self.snapshot  # type: ignore[attr-defined]
            try:
                d = snap.dataset(name) if snap is not None else None
            except KeyError:
                d = None
            if d is None:
                return None
            try:
                lines = self.screen_stack[0].query_one("#log").lines  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - no log pane (shutting down)
                lines = ()
            return detail_text(d, snap, self.class_of(name), lines)  # type: ignore[attr-defined]

        self.push_screen(DetailScreen(name, render))  # type: ignore[attr-defined]

    def action_help(self) -> None:
        """Show the keys."""
        self.push_screen(HelpScreen(HELP))  # type: ignore[attr-defined]

    def action_quit(self) -> None:
        """Quit: at once when nothing is in flight or the run has ended; else ask drain/abort. Decides on
        a snapshot pulled now, not the last one shown (which may be up to a poll interval old)."""
        self.request_poll()  # type: ignore[attr-defined]
        snap = self.snapshot  # type: ignore[attr-defined]
        if self.engine_finished or snap is None or snap.in_flight == 0:  # type: ignore[attr-defined]
            self.begin_quit("drain")  # type: ignore[attr-defined]
            return
        body = quit_body(snap)
        self.push_screen(QuitScreen(body), lambda choice: choice and self.begin_quit(choice))  # type: ignore[attr-defined]


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


__all__ = ["ActionsMixin", "DashboardCommands", "HELP", "concurrency_step"]
