"""``datagen run`` on a terminal: the dashboard (:class:`tui.app.DashboardApp`) hosting the run, then the
final lines printed on the restored screen (:func:`run_dashboard`).
"""

from __future__ import annotations

from engine.api import Config, final_report
from tui.app import DashboardApp
from tui.logbridge import PaneLogHandler, quiet_terminal_logging
from tui.terminal import use_real_terminal_size


def run_dashboard(cfg: Config, *, exit_on_pause: bool = False, refresh_hz: float = 2.0) -> int:
    """Run ``cfg``'s job under the dashboard; returns :func:`engine.run.headless.run_headless`'s exit codes
    (0 completed or quit with ``q``, 2 stopped by a fatal provider error, 3 paused with ``exit_on_pause``,
    130 interrupted: Ctrl-C, SIGINT/SIGTERM/SIGHUP or the terminal lost).

    Terminal log handlers are detached while the app runs (the file log stays); the final progress
    lines are printed after the app has restored the terminal.

    Raises:
        Whatever ``prepare`` raised (ConfigError, DatasetError, StoreError), after the app exits.
    """
    use_real_terminal_size()
    handler = PaneLogHandler()
    app = DashboardApp(cfg, exit_on_pause=exit_on_pause, refresh_hz=refresh_hz, log_handler=handler)
    with quiet_terminal_logging(handler):
        app.run()
    host = app.engine
    assert host is not None
    if host.error is not None:
        raise host.error
    snap = host.snapshot()
    if snap is not None and not app.terminal_lost:
        try:
            for line in final_report(snap, host.store_path or "?"):
                print(line, flush=True)
        except OSError:  # the terminal went away as we exited
            pass
    if host.exit_code is None:
        return 130  # the app ended without the engine finishing (should not happen)
    if app.chained is not None:
        try:
            for line in app.chained.chain.end_lines():  # with "extraction incomplete: N samples left" when so
                print(line, flush=True)
        except OSError:
            pass
        code = app.chained.exit_code()
        return code if code is not None else 130
    return host.exit_code


__all__ = ["run_dashboard"]
