"""The dashboard: a Textual app that hosts the engine and shows one immutable snapshot at a time.

The app owns the event loop. It talks to its host only through :class:`tui.host.DashboardHost`
(snapshots, commands, quit). In engine mode (``DashboardApp(cfg)``, host :class:`tui.host.EngineHost`)
:meth:`~tui.host.EngineHost.run` (prepare, writer, supervisor, ``scheduler.run()``, close) runs on
that loop in a task that an async worker awaits; on unmount the app stops it and waits for the
store to close. The UI pulls ``host.snapshot()`` every ``1/refresh_hz`` seconds with a
self-rescheduling timer (polls never overlap) and sends commands through ``host.controller``
(:class:`engine.run.controller.Controller`). Nothing in the engine sends the UI a message per request.
For tests and screenshots, ``DashboardApp(snapshot_source=..., controller=...)`` shows an injected
snapshot source instead (host :class:`tui.host.StaticHost`).

The keys' actions, the toasts, the drawing and the terminal watch are manager objects
(:class:`tui.actions.DashboardActions`, :class:`tui.toasts.Toasts`, :class:`tui.view.DashboardView`,
:class:`tui.terminal.TerminalWatch`) that get the app and its host through their constructors; the
app's ``action_*`` methods and event handlers call them (they see it as a :class:`tui.surface.DashboardSurface`
or :class:`tui.surface.WatchedApp`, and import nothing of this module). The engine is reached only through
:mod:`engine.api`; :func:`tui.launch.run_dashboard` runs the app on a terminal (``datagen run``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Callable

from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import DataTable

from engine.api import (
    Config,
    GpuPoller,
    GpuReading,
    MetricsServer,
    RunSnapshot,
    open_metrics,
    start_metrics,
)
from tui.actions import DashboardActions, DashboardCommands
from tui.extract.chain import ChainedExtraction
from tui.extract.screen import ExtractScreen
from tui.footer import PriorityFooter
from tui.host import Commands, DashboardHost, EngineHost, InjectedCommands, StaticHost
from tui.layout import CSS, HORIZONTAL_BREAKPOINTS, VERTICAL_BREAKPOINTS, parse_keymap
from tui.logbridge import PaneLogHandler
from tui.panes import (
    DatasetsTable,
    ErrorsPane,
    GpusPane,
    HeaderPane,
    LogPane,
    ProvidersPane,
    SamplePane,
    ThroughputPane,
)
from tui.terminal import TerminalWatch
from tui.toasts import Toasts
from tui.view import DashboardView

log = logging.getLogger("datagen.dashboard")

FOOTER_DROP_ORDER = ("exclude_provider", "concurrency_down", "concurrency_up", "abort", "resume_all", "pause_all")
"""Footer keys left out first when the footer is too narrow (``? Help`` and ``q Quit`` never are, and
``e`` outranks these): at 80 columns with chaining, ``x Exclude`` goes (still in ``?`` and Ctrl-P)."""


class DashboardApp(App[int]):
    """The run dashboard.

    Args:
        cfg: run config; the app then hosts the engine (prepare + run + close) in a worker.
        snapshot_source: instead of ``cfg``: a callable returning the snapshot to show (or None).
        controller: with ``snapshot_source``: the command target (a :class:`tui.host.InjectedCommands`:
            the controller's command methods plus ``dataset_class``, e.g. :class:`tui.testing.FakeController`).
        gpu_source: callable returning a :class:`~engine.extract.gpu.GpuReading`; default a
            :class:`~engine.extract.gpu.GpuPoller` thread started on mount.
        refresh_hz: snapshot polls per second (default 2).
        exit_on_pause: exit with code 3 when a guard pauses the whole run (not a user pause).
        install_signals: drain on SIGTERM/SIGINT and on SIGHUP (terminal gone); default: in
            engine mode.
        keymap: ``{binding id: keys}`` overrides (also read from ``$DATAGEN_KEYS``).
        log_handler: the :class:`~tui.logbridge.PaneLogHandler` whose lines the log pane shows
            (attached by the caller); by default, in engine mode, the app attaches its own to the
            root logger while it runs.

    Attributes:
        host: the :class:`tui.host.DashboardHost` (an :class:`~tui.host.EngineHost` in engine mode).
        chained: in engine mode with ``[extract] after_run`` other than ``never``, the
            :class:`~tui.extract.chain.ChainedExtraction` run beside the engine (its view: key ``e``); else None.
        actions, toasts, view, terminal: the manager objects (see the module docstring).
    """

    TITLE = "eagle-datagen"
    CSS = CSS
    COMMANDS = App.COMMANDS | {DashboardCommands}
    HORIZONTAL_BREAKPOINTS = HORIZONTAL_BREAKPOINTS
    VERTICAL_BREAKPOINTS = VERTICAL_BREAKPOINTS
    BINDINGS = [
        Binding("p", "pause_selected", "Pause", id="dashboard.pause"),
        Binding("p", "resume_selected", "Resume", id="dashboard.resume"),
        Binding("s", "skip_selected", "Skip", id="dashboard.skip"),
        Binding("P", "pause_all", "Pause all", id="dashboard.pause_all"),
        Binding("R", "resume_all", "Resume all", id="dashboard.resume_all"),
        Binding("a", "abort", "Abort", id="dashboard.abort"),
        Binding("plus", "concurrency_up", "Conc+", id="dashboard.concurrency_up"),
        Binding("minus", "concurrency_down", "Conc-", id="dashboard.concurrency_down"),
        Binding("x", "exclude_provider", "Exclude", id="dashboard.exclude_provider"),
        Binding("f", "retry_failed", "Retry failed", id="dashboard.retry_failed", show=False),  # in ? and ctrl+p
        Binding("i", "details", "Details", id="dashboard.details", show=False),  # hinted on the table
        Binding("question_mark", "help", "Help", id="dashboard.help"),
        # With [extract] after_run: the extraction view and back (the footer shows whichever applies).
        Binding("e", "show_extract", "Extraction", id="dashboard.show_extract"),
        Binding("e", "show_generation", "Generation", id="dashboard.show_generation"),
        Binding("q", "quit", "Quit", id="dashboard.quit"),
        # Ctrl-C reaches a raw-mode terminal as a key, not SIGINT: it interrupts like SIGINT does.
        Binding("ctrl+c", "interrupt", "Interrupt", show=False, priority=True, id="dashboard.interrupt"),
    ]

    def __init__(
        self,
        cfg: Config | None = None,
        *,
        snapshot_source: Callable[[], RunSnapshot | None] | None = None,
        controller: InjectedCommands | None = None,
        gpu_source: Callable[[], GpuReading] | None = None,
        refresh_hz: float = 2.0,
        exit_on_pause: bool = False,
        install_signals: bool | None = None,
        keymap: dict[str, str] | None = None,
        log_handler: PaneLogHandler | None = None,
    ) -> None:
        super().__init__()
        if refresh_hz <= 0:
            raise ValueError("refresh_hz must be > 0")
        self.engine: EngineHost | None = None
        """The hosted engine (engine mode), else None."""
        self.host: DashboardHost
        if cfg is not None and snapshot_source is None:
            self.host = self.engine = EngineHost(cfg, exit_on_pause)
        elif snapshot_source is not None and cfg is None:
            self.host = StaticHost(snapshot_source, controller)
        else:
            raise ValueError("give either cfg (engine mode) or snapshot_source")
        self._gpu_source = gpu_source
        self._poller: GpuPoller | None = None
        self.refresh_hz = refresh_hz
        self._install_signals = (cfg is not None) if install_signals is None else install_signals
        self._keymap = {**parse_keymap(os.environ.get("DATAGEN_KEYS", "")), **(keymap or {})}
        self._own_handler = PaneLogHandler() if log_handler is None and cfg is not None else None
        self.log_handler = log_handler or self._own_handler
        self.snapshot: RunSnapshot | None = None
        """The latest snapshot pulled (None before the engine is prepared)."""
        self.polls = 0
        self.renders = 0
        self._exit_when_done = False
        self._closing = False
        self._engine_task: asyncio.Task[int] | None = None
        self.toasts = Toasts(self)
        self.actions = DashboardActions(self, self.host, self.toasts)
        self.terminal = TerminalWatch(self)
        self.view = DashboardView(self, self.actions, self.log_handler)
        self.chained: ChainedExtraction | None = None
        if self.engine is not None and cfg is not None and cfg.extract.after_run != "never":
            self.chained = ChainedExtraction(self, self.engine, cfg, refresh_hz)
        self.metrics: MetricsServer | None = None
        """The Prometheus endpoint of ``[run] metrics_port`` (engine mode), bound here (MetricsError
        before the app runs), served on the app's loop from mount to unmount; else None."""
        if self.engine is not None and cfg is not None:
            self.metrics = open_metrics(cfg.run, run=self.engine.snapshot,
                                        extract=self.chained.chain.snapshot if self.chained is not None else None)

    # ---- composition ------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield HeaderPane(id="header")
        yield DatasetsTable(id="datasets", details_key=self._keymap.get("dashboard.details", "i"))
        with Horizontal(id="middle"):
            yield ThroughputPane(id="throughput", classes="pane")
            yield ErrorsPane(id="errors", classes="pane")
            yield ProvidersPane(id="providers", classes="pane")
        with Horizontal(id="bottom"):
            yield SamplePane(id="sample", classes="pane")
            with Vertical(id="right"):
                yield GpusPane(id="gpus", classes="pane")
                yield LogPane(id="log", classes="pane")
        yield PriorityFooter(drop_order=FOOTER_DROP_ORDER)

    def on_mount(self) -> None:
        for wid, title in (("datasets", "datasets"), ("throughput", "throughput"), ("errors", "errors by class"),
                           ("providers", "providers"), ("sample", "latest sample"), ("gpus", "GPUs"), ("log", "log")):
            self.query_one(f"#{wid}").border_title = title
        if self._keymap:
            self.set_keymap(self._keymap)
        if self._gpu_source is None:
            self._poller = GpuPoller().start()
            self._gpu_source = self._poller.latest
        if self._own_handler is not None:
            logging.getLogger().addHandler(self._own_handler)
        if self.engine is not None:
            # The engine runs in its own task, awaited (shielded) by the worker: Textual cancels workers
            # when the app shuts down, and the engine must instead stop cleanly (see on_unmount).
            self._engine_task = asyncio.create_task(self.engine.run(), name="engine")
            self.run_worker(self._engine_main(self.engine, self._engine_task), name="engine", group="engine",
                            exit_on_error=False)
        if self.chained is not None:
            self.chained.start()
        if self.metrics is not None:
            self.run_worker(start_metrics(self.metrics), name="metrics", group="metrics")  # its line: the log pane
        if self._install_signals:
            self.terminal.add_signal_handlers()
        if not self.is_headless:
            self.terminal.start_watchdog()
        self.query_one(DatasetsTable).focus()
        self._tick()

    async def on_unmount(self) -> None:
        """Whatever ended the app, stop the engine (abort, or the drain already asked for) and wait
        until it has flushed and closed the store, so no aiosqlite thread outlives the loop."""
        self._closing = True
        if self.chained is not None:
            await self.chained.close()
        task, engine = self._engine_task, self.engine
        if task is not None and not task.done() and engine is not None:
            engine.request_quit("drain" if engine.quit_mode == "drain" else "abort")
            await asyncio.wait({task}, timeout=engine.close_limit_s())
            if not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=10)
        if self.metrics is not None:
            await self.metrics.close()
        if self._own_handler is not None:
            logging.getLogger().removeHandler(self._own_handler)
        if self._poller is not None:
            self._poller.stop()
        self.terminal.remove_signal_handlers()

    # ---- engine -----------------------------------------------------------------------------
    async def _engine_main(self, engine: EngineHost, task: asyncio.Task[int]) -> None:
        try:
            code = await asyncio.shield(task)
        except Exception as e:  # kept in engine.error; run_dashboard re-raises it
            log.error("engine failed: %s: %s", type(e).__name__, e)
            self.exit(1, return_code=1)
            return
        self._poll_once()
        if engine.quit_mode or self._exit_when_done or self.terminal_lost or code == 3:
            self.exit(code, return_code=code)
        elif self.chained is not None and self.chained.running:
            self.notify(f"generation {self.snapshot.state if self.snapshot else 'ended'}; extraction goes on "
                        "(e: its view)", timeout=10)
        else:
            self.notify(f"run {self.snapshot.state if self.snapshot else 'ended'}; press q to exit", timeout=10)

    # ---- chained extraction ([extract] after_run): tui.extract.chain.ChainedExtraction does the work ----
    @property
    def chain(self):
        """The :class:`~engine.run.chain.ExtractChain` (None without chaining)."""
        return self.chained.chain if self.chained is not None else None

    @property
    def wants_exit(self) -> bool:
        """True once an exit waits for the engine or the chain to stop."""
        return self._exit_when_done

    def exit_when_done(self) -> None:
        """Exit once generation and the chained extraction have both stopped."""
        self._exit_when_done = True
        if self.engine is not None and self.engine.finished and not (self.chained and self.chained.running):
            self.exit()

    def on_extract_screen_done(self, message: ExtractScreen.Done) -> None:
        """The extraction view's quit ended extraction (or ``q`` once it ended): drain generation
        too, and exit once it has stopped."""
        self.begin_quit("drain")

    def on_extract_screen_interrupt(self, message: ExtractScreen.Interrupt) -> None:
        """The extraction view's Ctrl-C (when remapped apart from the dashboard's): interrupt both."""
        self.action_interrupt()

    def action_show_extract(self) -> None:
        """Show the chained extraction's view (generation goes on; ``e`` comes back)."""
        if self.chained is not None:
            self.chained.show()

    def action_show_generation(self) -> None:
        """Back to the generation view (extraction goes on)."""
        if self.chained is not None:
            self.chained.back()

    def exit(self, result: Any = None, return_code: int = 0, message: Any = None) -> None:
        """Exit the app; while the hosted engine runs, stop it first (abort, or the drain already
        asked for) and exit when it has closed the store, so no request or row is left behind. A
        chained extraction is drained likewise; the exit code then combines both."""
        if self.engine is not None and not self.engine.finished:
            self._exit_when_done = True
            mode = "drain" if self.engine.quit_mode == "drain" else "abort"
            self.engine.request_quit(mode)
            if self.chained is not None:
                self.chained.hold_exit(mode)
            return
        if self.chained is not None:
            if self.chained.hold_exit("abort" if self.chained.chain.quit_mode == "abort" else "drain"):
                self._exit_when_done = True
                return
            code = self.chained.exit_code()
            if code is not None:
                result = return_code = code
        super().exit(result, return_code, message)

    @property
    def controller(self) -> Commands | None:
        """The command target (None while the engine is being prepared)."""
        return self.host.controller

    @property
    def engine_finished(self) -> bool:
        """True once the hosted engine's run returned (always False with an injected source)."""
        return self.engine is not None and self.engine.finished

    @property
    def terminal_lost(self) -> bool:
        """True once the terminal went away (see :class:`tui.terminal.TerminalWatch`)."""
        return self.terminal.lost

    def begin_quit(self, mode: str, interrupted: str | None = None) -> None:
        """Quit: exit now if the run has ended, else stop it (``"drain"``/``"abort"``) and exit when
        the engine has flushed and closed the store. ``interrupted`` (a signal or ``"Ctrl-C"``):
        the run exits 130. With an injected source the quit ends the app at once (exit code 0).
        A chained extraction is stopped the same way (``mode``), as an interrupt when ``interrupted``
        (it then exits 130 with samples left, like ``datagen extract`` after SIGINT)."""
        if self.chained is not None:
            if interrupted is not None:
                self.chained.chain.interrupt(interrupted, mode)
            else:
                self.chained.chain.request_quit(mode)
        if not self.host.finished:
            line = self.host.request_quit(mode, interrupted)
            if not self.host.finished:  # the engine stops; _engine_main exits once it has closed
                self.notify(line, timeout=5)
                self.request_poll()
                return
        code = self.host.exit_code if self.host.exit_code is not None else 1
        self.exit(code, return_code=code)

    # ---- actions: keys and command palette call these; tui.actions.DashboardActions does the work ----
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Footer state (see :meth:`tui.actions.DashboardActions.check`); ``e`` shows the view it
        switches to, only with a chained extraction."""
        if action in ("show_extract", "show_generation"):
            return self.chained is not None and self.chained.check(action)
        return self.actions.check(action)

    def action_pause_selected(self, name: str | None = None) -> None:
        """Pause the selected (or named) dataset: stop dispatching; in-flight requests drain."""
        self.actions.pause_selected(name)

    def action_resume_selected(self, name: str | None = None) -> None:
        """Resume the selected (or named) dataset (a skipped one after a confirmation)."""
        self.actions.resume_selected(name)

    def action_skip_selected(self, name: str | None = None) -> None:
        """Ask, then skip the selected (or named) dataset."""
        self.actions.skip_selected(name)

    def action_retry_failed(self, name: str | None = None) -> None:
        """Retry the selected (or named) dataset's failed prompts (pick all or one error class)."""
        self.actions.retry_failed(name)

    def action_pause_all(self) -> None:
        """Pause the whole run (drain: in-flight requests finish)."""
        self.actions.pause_all()

    def action_resume_all(self) -> None:
        """Resume the whole run."""
        self.actions.resume_all()

    def action_abort(self) -> None:
        """Ask, then cancel every in-flight request."""
        self.actions.abort()

    def action_concurrency_up(self) -> None:
        """Raise the selected dataset's class concurrency by about 10 % (at least 1)."""
        self.actions.concurrency(+1)

    def action_concurrency_down(self) -> None:
        """Lower the selected dataset's class concurrency by about 10 % (at least 1, not below 1)."""
        self.actions.concurrency(-1)

    def action_exclude_provider(self) -> None:
        """Pick a provider and exclude it (or include an excluded one again)."""
        self.actions.exclude_provider()

    def action_details(self, name: str | None = None) -> None:
        """Open the detail view of the selected (or named) dataset."""
        self.actions.details(name)

    def action_help(self) -> None:
        """Show the keys."""
        self.actions.help()

    async def action_quit(self) -> None:  # async as in textual's App (a binding or the palette awaits it)
        """Quit: at once when nothing is in flight or the run has ended; else ask drain/abort."""
        self.actions.quit()

    def action_interrupt(self) -> None:
        """Ctrl-C in the dashboard (a key in raw mode): drain and exit 130 like SIGINT; again: abort."""
        self.terminal.on_signal("Ctrl-C")

    # ---- polling ----------------------------------------------------------------------------
    @property
    def main_screen(self) -> Screen[Any]:
        """The dashboard's own screen (the bottom of the stack): ``self.query_one`` would search the
        active screen, a modal's while one is open."""
        return self.screen_stack[0]

    @property
    def selected_dataset(self) -> str | None:
        """Name of the dataset under the table cursor."""
        return self.main_screen.query_one(DatasetsTable).selected

    def _tick(self) -> None:
        try:
            self._poll_once()
        except Exception:  # a bad snapshot must not kill the dashboard
            log.exception("dashboard refresh failed")
        finally:
            if not self._closing:
                self.set_timer(1.0 / self.refresh_hz, self._tick, name="poll")

    def request_poll(self) -> None:
        """Pull and render a snapshot now (outside the timer; polls are synchronous, never overlap)."""
        if not self._closing:
            self._poll_once()

    def _poll_once(self) -> None:
        snap = self.host.snapshot()
        self.snapshot = snap
        self.polls += 1
        if snap is not None:
            self.actions.observe(snap)
            self.toasts.announce(snap)
        if self.chained is not None:
            self.chained.observe()  # the first chained extraction started: show it (e: back)
        if self.terminal_lost:
            return  # nobody is looking: skip rendering (panes keep updating under a modal: it shows them)
        try:
            self._render(snap)
        except (NoMatches, IndexError):  # the app is shutting down: its screens and widgets are gone
            self._closing = True

    def _render(self, snap: RunSnapshot | None) -> None:
        self.renders += 1
        note = ""
        if self.engine_finished and self.chained is not None and self.chained.note():
            note = self.chained.note() or ""
        elif self.engine_finished:
            note = "run ended: press q to exit"
        elif self.host.quit_mode:
            note = f"quitting ({self.host.quit_mode})…"
        self.view.render(snap, note, self._gpu_source)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if not self.screen_stack:  # a highlight still queued while the app exits: nothing left to draw
            return
        self.view.render_sample()
        self.view.refresh_footer()

    def on_resize(self, event: events.Resize) -> None:
        """Lay out for the NEW size: this handler runs before Textual's own (``App._on_resize``),
        so ``self.size`` still holds the previous size here; ``event.size`` is the new one."""
        self.view.resize(event.size.width)
        self.call_after_refresh(self.request_poll)  # panes shown by the new size get drawn now

