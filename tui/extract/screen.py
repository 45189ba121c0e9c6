"""The extraction view: a Textual screen that shows one :class:`~engine.extract.snapshot.ExtractSnapshot`
at a time and sends :class:`~engine.extract.snapshot.ExtractCommands`.

Panes, top to bottom: header (state, elapsed, samples and tokens done/total, tokens/s, ETA, bytes
written vs projected, disk free vs margin), one row per GPU joined with its worker, per-dataset
progress, the log (``snapshot.events``); the footer lists the keys. At 80x24 the header, all eight
GPU rows and the footer stay visible (the datasets and log panes get what is left).

Keys (binding ids in parentheses, remappable with ``App.set_keymap``): ``p`` pause / resume
(``extract.pause``/``extract.resume``: the footer shows the one that applies), ``s`` skip the
highlighted dataset after a confirmation (``extract.skip``), ``q`` quit (``extract.quit``: first
drain, exit 0; again abort; at once once the job has ended; never a no-op), Ctrl-C interrupt
(``extract.interrupt``: what SIGINT does, posted as :class:`ExtractScreen.Interrupt` for the app:
first drain, exit 130 with samples left; again abort). Each key calls the host's commands object
and toasts its answer. The screen is the same inside the generation dashboard and in
:class:`tui.extract.app.ExtractApp`: when the job has ended after a quit (or ``q`` is pressed
while it reads ended) it posts :class:`ExtractScreen.Done` with the exit code; the app decides what
to do (a live launcher that has not returned yet drains what still runs and exits when it has).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.message import Message
from textual.notifications import SeverityLevel
from textual.screen import Screen

from engine.api import ExtractCommands, ExtractSnapshot, JobState
from tui.extract.cells import FINAL_STATES, exit_code
from tui.extract.host import ExtractHost
from tui.extract.panes import ExtractDatasetsTable, ExtractHeader, GpuWorkerTable
from tui.footer import PriorityFooter
from tui.modals import ConfirmScreen
from tui.panes.log import LogPane, new_events

log = logging.getLogger("datagen.dashboard")

# No "ExtractScreen" prefix: Textual scopes a DEFAULT_CSS to its class (see tui.modals.modal_css).
CSS = """
.x-pane { border: round $primary-darken-2; border-title-color: $text-accent; padding: 0 1; }
#x-gpus {
    height: auto; border: round $primary; border-title-color: $text-accent; border-subtitle-color: $text-muted;
    scrollbar-size: 0 0;
}
#x-datasets { height: auto; max-height: 12; min-height: 3; scrollbar-size: 0 1; }
#x-log { height: 1fr; min-height: 3; }
"""


class ExtractScreen(Screen[None]):
    """The extraction view over an :class:`~tui.extract.host.ExtractHost`.

    Args:
        host: snapshots and commands.
        refresh_hz: snapshot polls per second (> 0; default 2).

    Attributes:
        snapshot: the latest snapshot pulled (None before the job is planned).
        quits: how often the quit key called ``commands.quit()``.
        interrupted: True once Ctrl-C was pressed (the exit code is then 130 unless the job is done).
        polls: snapshots pulled so far.

    Raises:
        ValueError: ``refresh_hz`` <= 0.
    """

    DEFAULT_CSS = CSS
    BINDINGS = [
        Binding("p", "pause", "Pause", id="extract.pause"),
        Binding("p", "resume", "Resume", id="extract.resume"),
        Binding("s", "skip", "Skip dataset", id="extract.skip"),
        Binding("q", "quit_extract", "Quit", id="extract.quit"),
        # Ctrl-C reaches a raw-mode terminal as a key, not SIGINT: it interrupts like SIGINT does.
        Binding("ctrl+c", "interrupt_extract", "Interrupt", show=False, priority=True, id="extract.interrupt"),
    ]

    class Done(Message):
        """The job ended after a quit (or ``q`` was pressed while it reads ended): ``code`` is the
        exit code (:func:`tui.extract.cells.exit_code`). Posted at each such ``q``."""

        def __init__(self, code: int) -> None:
            super().__init__()
            self.code = code

    class Interrupt(Message):
        """Ctrl-C in the view: the app treats it as SIGINT (the first drains and the exit code is 130
        while samples are left, the second aborts). :class:`tui.extract.app.ExtractApp` over a static
        host drains and aborts through the commands; the live one sends it to the run's interrupt."""

    def __init__(self, host: ExtractHost, refresh_hz: float = 2.0, **kw) -> None:
        super().__init__(**kw)
        if refresh_hz <= 0:
            raise ValueError(f"refresh_hz must be > 0, got {refresh_hz}")
        self.host = host
        self.refresh_hz = refresh_hz
        self.snapshot: ExtractSnapshot | None = None
        self.quits = 0
        self.interrupted = False
        self.polls = 0
        self._events: tuple[str, ...] = ()
        self._bindings_key: tuple | None = None
        self._done_sent = False

    def compose(self) -> ComposeResult:
        try:  # the footer's keys depend on the state (pause, skip): composed right the first time
            self.snapshot = self.host.snapshot()
        except Exception:  # on_mount's poll logs it
            pass
        yield ExtractHeader(id="x-header")
        yield GpuWorkerTable(id="x-gpus")
        yield ExtractDatasetsTable(id="x-datasets", classes="x-pane")
        yield LogPane(id="x-log", classes="x-pane")
        yield PriorityFooter()

    def on_mount(self) -> None:
        for wid, title in (("x-gpus", "GPUs · workers"), ("x-datasets", "datasets"), ("x-log", "log")):
            self.query_one(f"#{wid}").border_title = title
        self.query_one(ExtractDatasetsTable).focus()
        self.poll()
        self.set_interval(1.0 / self.refresh_hz, self.poll, name="extract-poll")

    # ---- polling ----------------------------------------------------------------------------
    def poll(self) -> None:
        """Pull a snapshot and draw it; post :class:`Done` when the job ended after a quit."""
        try:
            snap = self.host.snapshot()
        except Exception:  # a failing host must not kill the dashboard
            log.exception("extraction snapshot failed")
            return
        self.snapshot = snap
        self.polls += 1
        try:
            self.render_snapshot(snap)
        except (NoMatches, IndexError):  # shutting down: the widgets are gone
            return
        if snap is not None and snap.state in FINAL_STATES and (self.quits or snap.quit_mode):
            self._done(snap)

    def render_snapshot(self, snap: ExtractSnapshot | None) -> None:
        """Draw ``snap`` into every pane and refresh the footer's keys when the state changed."""
        note = ""
        if snap is not None and snap.state in FINAL_STATES:
            note = f"extraction {snap.state}: press q to exit"
        with self.app.batch_update():
            self.query_one(ExtractHeader).update_from(snap, note)
            self.query_one(GpuWorkerTable).update_from(snap)
            self.query_one(ExtractDatasetsTable).update_from(snap)
            if snap is not None:
                lines = new_events(self._events, snap.events)
                self._events = snap.events
                self.query_one(LogPane).update_from(None, lines)
        key = (snap.state if snap else None, self.query_one(ExtractDatasetsTable).selected)
        if key != self._bindings_key:
            self._bindings_key = key
            self.refresh_bindings()

    def on_resize(self) -> None:
        self.query_one(ExtractHeader)._last = None  # re-fit the header to the new width
        self.call_after_refresh(self.poll)

    def _done(self, snap: ExtractSnapshot) -> None:
        if not self._done_sent:
            self._done_sent = True
            self.post_message(self.Done(exit_code(snap, self.interrupted)))

    # ---- keys -------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """``p`` reads Pause or Resume from the job's state; pause/resume/skip are greyed out
        (None) while nothing can be paused or skipped (starting, draining, ended)."""
        state = self.snapshot.state if self.snapshot is not None else None
        if action == "pause":
            return False if state == JobState.PAUSED else (None if state in (None, JobState.DRAINING, *FINAL_STATES)
                                                          else True)
        if action == "resume":
            return True if state == JobState.PAUSED else False
        if action == "skip":
            live = state is not None and state not in (JobState.DRAINING, *FINAL_STATES)
            try:
                selected = self.query_one(ExtractDatasetsTable).selected
            except NoMatches:  # composing: the table selects its first row once it is drawn
                selected = None
            rows = selected or (self.snapshot is not None and bool(self.snapshot.datasets))
            return True if live and rows else None
        return True

    def action_pause(self) -> None:
        """Pause extraction: workers finish and write the batch in hand, then wait."""
        self._command("pause", lambda c: c.pause())

    def action_resume(self) -> None:
        """Resume a paused extraction."""
        self._command("resume", lambda c: c.resume())

    def action_skip(self) -> None:
        """Ask, then skip the highlighted dataset (what is written stays)."""
        name = self.query_one(ExtractDatasetsTable).selected
        if name is None:
            self.app.notify("no dataset to skip", severity="warning", timeout=3)
            return
        d = next((d for d in self.snapshot.datasets if d.name == name), None) if self.snapshot else None
        left = f"{d.samples_total - d.samples_done:,} samples not extracted yet; " if d else ""
        body = (f"{left}no more batches of {name} (what is written stays).\n"
                "Persisted: a restarted extraction skips it too.")

        def answered(yes: bool | None) -> None:
            if yes:
                self._command("skip", lambda c: c.skip(name))

        self.app.push_screen(ConfirmScreen(f"Skip dataset {name}?", body, yes="Skip"), answered)

    def action_quit_extract(self) -> None:
        """Quit: once the job reads ended, post :class:`Done` (each press: the app exits, or drains
        a launcher that is still running); else first drain (finish the batches in hand, flush
        shards, exit 0), a second time abort after the current write."""
        snap = self.snapshot
        if snap is not None and snap.state in FINAL_STATES:
            self._done_sent = True
            self.post_message(self.Done(exit_code(snap, self.interrupted)))
            return
        if self.host.commands is None:  # nothing started yet: nothing to drain
            self.post_message(self.Done(130))
            return
        self.quits += 1
        self._command("quit", lambda c: c.quit())

    def action_interrupt_extract(self) -> None:
        """Ctrl-C: an interrupt, like SIGINT to the process (:class:`Interrupt`, handled by the app)."""
        self.interrupted = True
        self.post_message(self.Interrupt())

    def _command(self, what: str, call: Callable[[ExtractCommands], str | Awaitable[str]]) -> None:
        """Call the host's commands object and toast its answer (a ``ValueError``'s message as an
        error); an awaitable answer is awaited in a worker."""
        commands = self.host.commands
        if commands is None:
            self.app.notify("extraction is starting; try again in a moment", severity="warning", timeout=3)
            return
        try:
            result = call(commands)
        except ValueError as e:
            self._toast(str(e), "error")
            return
        except Exception as e:  # say it, keep the dashboard
            log.exception("extraction %s failed", what)
            self._toast(f"{what} failed: {type(e).__name__}: {e}", "error")
            return
        if inspect.isawaitable(result):
            self.run_worker(self._await(what, result), group="extract-commands")
        else:
            self._toast(result)
        self.call_after_refresh(self.poll)

    async def _await(self, what: str, result: Awaitable[str]) -> None:
        try:
            self._toast(await result)
        except ValueError as e:
            self._toast(str(e), "error")
        except Exception as e:
            log.exception("extraction %s failed", what)
            self._toast(f"{what} failed: {type(e).__name__}: {e}", "error")

    def _toast(self, message: str, severity: SeverityLevel = "information") -> None:
        # markup=False: dataset names and error texts are text, not markup
        self.app.notify(message, severity=severity, timeout=5 if severity == "error" else 3, markup=False)


__all__ = ["ExtractScreen"]
