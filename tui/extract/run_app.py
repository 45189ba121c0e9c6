"""``datagen extract CONFIG`` on a terminal: the extraction view over a live
:class:`engine.extract.run.ExtractRun`, on one event loop.

:class:`RunExtractApp` awaits ``run.run()`` (prepare, spawn and supervise the workers) in a task of
its own loop and shows :meth:`~engine.extract.run.ExtractRun.snapshot` twice a second. Signals work
like headless ``datagen extract`` (:func:`engine.extract.launch.run_extract`): SIGINT/SIGTERM/SIGHUP go
to ``run.interrupt`` (the first drains, the second kills the workers), and so does the Ctrl-C key
(a key in the terminal's raw mode, not a signal); SIGHUP, or a watchdog that
finds the terminal gone, also stops drawing (:class:`tui.terminal.TerminalWatch`), and the drain
finishes off-screen. The app exits with the run's exit code: 0 done or drained by ``q``, 1 failed,
130 interrupted (a signal or Ctrl-C) with samples left, or aborted. :func:`run_extract_dashboard` runs it and
re-raises what ``prepare`` raised once the terminal is restored, so the caller prints an ``error:`` line on a normal screen.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from engine.api import ControlError, interrupt_action, open_metrics, start_metrics
from tui.extract.app import ExtractApp
from tui.extract.screen import ExtractScreen
from tui.logbridge import quiet_terminal_logging
from tui.terminal import TerminalWatch, use_real_terminal_size

log = logging.getLogger("datagen.extract.dashboard")


class ExtractTerminalWatch(TerminalWatch):
    """:class:`tui.terminal.TerminalWatch` for :class:`RunExtractApp`: every signal goes to the
    run's ``interrupt`` (which counts them: the first drains, the second kills the workers)."""

    app: RunExtractApp

    def stopping(self) -> bool:
        """True once a signal arrived, or a quit (drain/abort) is in the control file."""
        if self.signals_seen > 0:
            return True
        snap = self.app.host.snapshot()
        return snap is not None and snap.quit_mode is not None

    def on_signal(self, signame: str) -> None:
        """SIGINT/SIGTERM/SIGHUP: ``run.interrupt``; SIGHUP also stops drawing and reading the tty."""
        action = interrupt_action(signame, self.stopping())
        self.signals_seen += 1
        log.warning("%s received: %s", signame, action)
        if signame == "SIGHUP":
            self.on_terminal_lost()
        self.app.begin_quit(action, interrupted=signame)


class RunExtractApp(ExtractApp):
    """The extraction view driving a live run.

    Args:
        run: an :class:`engine.extract.run.ExtractRun` (prepared or not; built with
            ``progress_s=None`` and ``worker_output="file"`` so nothing writes to this terminal).
        refresh_hz / keymap: as :class:`tui.extract.app.ExtractApp`.
        install_signals: handle SIGINT/SIGTERM/SIGHUP on the app's loop (False in pilot tests).

    Attributes:
        run: the run.
        metrics: the Prometheus endpoint of ``[run] metrics_port`` over ``run.snapshot`` (bound here,
            served on the app's loop from mount to unmount), or None.
        error: what ``run.run()`` raised (ExtractError, DirectoryInUse, ...), else None.
        terminal: the :class:`ExtractTerminalWatch`.
    """

    def __init__(self, run: Any, *, refresh_hz: float = 2.0, keymap: dict[str, str] | None = None,
                 install_signals: bool = True) -> None:
        super().__init__(run, refresh_hz=refresh_hz, keymap=keymap)
        self.metrics = open_metrics(run.cfg.run, extract=run.snapshot)  # MetricsError: before the app runs
        self.run_ = run
        self.error: BaseException | None = None
        self.terminal = ExtractTerminalWatch(self)
        self._install_signals = install_signals
        self._task: asyncio.Task[int] | None = None
        self._exit_when_done = False
        self._interrupts_sent = 0

    def on_mount(self) -> None:  # ExtractApp.on_mount (the screen) runs after this one (Textual walks the MRO)
        # The run is its own task, awaited (shielded) by a worker: Textual cancels workers when
        # the app shuts down, and the run must instead stop its workers cleanly (on_unmount).
        self._task = asyncio.create_task(self.run_.run(), name="extract-run")
        self.run_worker(self._main(self._task), name="extract-run", group="extract-run", exit_on_error=False)
        if self.metrics is not None:
            self.run_worker(start_metrics(self.metrics, self.run_.say), name="metrics", group="metrics")
        if self._install_signals:
            self.terminal.add_signal_handlers()
        if not self.is_headless:
            self.terminal.start_watchdog()

    async def _main(self, task: asyncio.Task[int]) -> None:
        try:
            code = await asyncio.shield(task)
        except Exception as e:  # prepare's errors: run_extract_dashboard re-raises them
            self.error = e
            super().exit(1, return_code=1)
            return
        self.view.poll()
        if self._exit_when_done or self.terminal.signals_seen or self.terminal.lost:
            super().exit(code, return_code=code)

    @property
    def code(self) -> int:
        """The run's exit code (130 while it has none: it did not end)."""
        return self.run_.exit_code if self.run_.exit_code is not None else 130

    def begin_quit(self, mode: str, interrupted: str | None = None) -> None:
        """A signal or the lost terminal: exit now if the run has ended, else pass it to
        ``run.interrupt`` unless ``mode`` is ``"continue"`` (the app exits when the run has).
        ``"abort"`` while only a quit key's drain runs turns that drain into an abort first."""
        if self._task is not None and self._task.done():
            super().exit(self.code, return_code=self.code)
            return
        if mode == "continue":
            return
        name = interrupted or "SIGINT"
        if mode == "abort" and self._interrupts_sent == 0:
            # the first signal while a quit key's drain runs: abort after the current write (the
            # run's own count would make this signal a mere drain)
            self.run_.commands.quit()
        self._interrupts_sent += 1
        self.run_.interrupt(name)

    def on_extract_screen_interrupt(self, message: ExtractScreen.Interrupt) -> None:
        """Ctrl-C: what SIGINT does (:class:`ExtractTerminalWatch`): the first drains and the run
        exits 130 while samples are left, the next aborts (kills the workers)."""
        message.prevent_default()  # not ExtractApp's handler (a quit key's drain, exit 0)
        self.terminal.on_signal("Ctrl-C")

    def on_extract_screen_done(self, message: ExtractScreen.Done) -> None:
        """The job reads ended after a quit key (or ``q`` while it reads ended): exit with the run's
        own exit code once ``run()`` returned. Until then the launcher still supervises workers (a
        status file says stopped or failed before the launcher reaped the process): the first such
        ``q`` with no quit asked yet drains them, and every one says what the app waits for."""
        message.prevent_default()  # not ExtractApp's handler too (it would exit with the screen's code)
        if self._task is not None and not self._task.done():
            self._exit_when_done = True  # _main exits with the run's code once run() returned
            snap = self.run_.snapshot()
            if snap.quit_mode is None and not self.terminal.signals_seen:
                self.view.quits += 1
                try:
                    line = self.run_.commands.quit()
                except (ControlError, OSError) as e:
                    line = f"quit failed: {e}"
            else:
                line = "extraction is stopping: exiting once the launcher has stopped its workers"
            self.notify(line, timeout=3, markup=False)
            return
        super().exit(self.code, return_code=self.code)

    async def on_unmount(self) -> None:
        """Whatever ended the app, stop the workers (drain, then kill) and wait for the run."""
        task = self._task
        if task is not None and not task.done():
            self.run_.interrupt("exit")
            await asyncio.wait({task}, timeout=30)
            if not task.done():
                self.run_.interrupt("exit")
                await asyncio.wait({task}, timeout=10)
            if not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=10)
        if self.metrics is not None:
            await self.metrics.close()
        self.terminal.remove_signal_handlers()


def run_extract_dashboard(run: Any, *, refresh_hz: float = 2.0) -> int:
    """Show ``run`` (an :class:`engine.extract.run.ExtractRun`) in the extraction view until it
    ends and a quit (or a signal) closes the view.

    Returns:
        0 done or drained, 1 failed, 130 interrupted or aborted.

    Raises:
        Whatever ``run.run()`` raised (ExtractError: bad settings, input, model or disk;
        engine.proc.runlock.DirectoryInUse), after the app has restored the terminal.
    """
    use_real_terminal_size()
    app = RunExtractApp(run, refresh_hz=refresh_hz)
    with quiet_terminal_logging():
        app.run()
    if app.error is not None:
        raise app.error
    if not app.terminal.lost:
        try:
            for line in list(run.events)[-3:]:
                print(line, flush=True)
        except OSError:
            pass
    return app.code


__all__ = ["ExtractTerminalWatch", "RunExtractApp", "run_extract_dashboard"]


async def screenshot_run(run: Any, out: Path, size: tuple[int, int], after_samples: int,
                         timeout_s: float = 300.0) -> Path:
    """Run ``run`` headless in the view until ``after_samples`` samples are done (or it ended),
    save the view as an SVG to ``out``, then drain the run and wait for it. Returns ``out``.

    Raises:
        TimeoutError: the run did not get there within ``timeout_s`` seconds.
        Whatever ``run.run()`` raised (ExtractError, DirectoryInUse).
    """
    app = RunExtractApp(run, refresh_hz=4, install_signals=False)
    async with app.run_test(size=size) as pilot:
        deadline = time.monotonic() + timeout_s
        while True:
            if app.error is not None:
                raise app.error
            snap = run.snapshot()
            if snap.samples_done >= after_samples or run.exit_code is not None:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{after_samples} samples not done within {timeout_s:.0f} s")
            await pilot.pause(0.2)
        app.view.poll()
        await pilot.pause(0.3)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(app.export_screenshot(title="eagle-datagen extract"), encoding="utf-8")
        run.commands.quit()
        while run.exit_code is None and app.error is None:
            await pilot.pause(0.2)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m tui.extract.run_app CONFIG --screenshot OUT.svg [--data DIR] [--size 150x34]
    [--after-samples N]``: a real extraction in the view (headless), saved as an SVG once N samples
    are done, then drained."""
    import argparse

    from engine.api import ExtractRun, load_config
    from tui.extract.__main__ import size_arg

    p = argparse.ArgumentParser(prog="python -m tui.extract.run_app", description=main.__doc__)
    p.add_argument("config")
    p.add_argument("--screenshot", metavar="OUT.svg", required=True)
    p.add_argument("--data", help="a tokens Parquet export (dir or file) instead of the run directory")
    p.add_argument("--size", type=size_arg, default=(150, 34))
    p.add_argument("--after-samples", type=int, default=200)
    args = p.parse_args(argv)
    cfg = load_config(args.config, check_files=False)
    run = ExtractRun(cfg, data=Path(args.data) if args.data else None, say=lambda _l: None, progress_s=None,
                     worker_output="file")
    print(asyncio.run(screenshot_run(run, Path(args.screenshot), args.size, args.after_samples)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
