"""The generation dashboard's chained extraction (``[extract] after_run``): a manager object that
runs :class:`engine.run.chain.ExtractChain` beside the hosted engine on the app's loop, shows its
:class:`~tui.extract.screen.ExtractScreen` (opened when the first extraction starts; key ``e``
switches views), and stops it with the app: a quit from either view drains both, the exit code
combines both (:func:`engine.run.chain.combined_exit_code`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from engine.api import Config, ExtractChain, combined_exit_code
from tui.extract.screen import ExtractScreen

log = logging.getLogger("datagen.dashboard")

SCREEN = "extract"
"""The installed extraction screen's name."""


class ChainedExtraction:
    """Chained extraction in the dashboard.

    Args:
        app: the :class:`tui.app.DashboardApp` (its loop, screens, notifications, ``exit``).
        engine: the app's :class:`tui.host.EngineHost` (generation's snapshot, exit code, quit).
        cfg: the config (``[extract] after_run`` is ``run`` or ``dataset``).
        refresh_hz: the extraction view's polls per second.

    Attributes:
        chain: the :class:`~engine.run.chain.ExtractChain` (its lines go to the log pane, prefixed
            ``extract:``); task: its task once started.
    """

    def __init__(self, app: Any, engine: Any, cfg: Config, refresh_hz: float) -> None:
        self.app = app
        self.engine = engine
        self.refresh_hz = refresh_hz
        self.chain = ExtractChain(cfg, say=lambda line: log.info("extract: %s", line), progress_s=None,
                                  worker_output="file", on_quit=self._quit_generation)
        self.task: asyncio.Task[int] | None = None
        self.shown = False

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Install the extraction screen and start the chain on the app's loop (on mount)."""
        self.app.install_screen(ExtractScreen(self.chain, self.refresh_hz), name=SCREEN)
        self.task = asyncio.create_task(self.chain.run(self.engine.snapshot, self.generation_ended),
                                        name="extract-chain")
        self.app.run_worker(self._main(self.task), name="extract-chain", group="engine", exit_on_error=False)

    @property
    def running(self) -> bool:
        """True while the chain's task runs."""
        return self.task is not None and not self.task.done()

    def generation_ended(self) -> int | None:
        """Generation's exit code once it ended (1 when it raised), else None."""
        if not self.engine.finished:
            return None
        return self.engine.exit_code if self.engine.exit_code is not None else 1

    def _quit_generation(self, mode: str) -> None:
        """The extraction view quit: stop generation the same way, and exit once both stopped."""
        if not self.engine.finished:
            self.engine.request_quit(mode)
        self.app.exit_when_done()

    async def _main(self, task: asyncio.Task[int]) -> None:
        try:
            code = await asyncio.shield(task)
        except Exception as e:  # say it; generation goes on
            log.error("chained extraction failed: %s: %s", type(e).__name__, e)
            code = 1
        if self.app.wants_exit or self.app.terminal_lost or self.engine.quit_mode:
            self.app.exit()
        else:
            self.app.notify(f"extraction ended (exit code {code}); press q to exit", timeout=10)

    def hold_exit(self, mode: str) -> bool:
        """Before the app exits: stop the chain (``drain``/``abort``); True while it still runs (the
        app exits when it ended)."""
        if not self.running:
            return False
        self.chain.request_quit(mode)
        return True

    async def close(self) -> None:
        """On unmount: abort what still runs and wait for its workers (cancel after 60 s)."""
        task = self.task
        if task is None or task.done():
            return
        self.chain.request_quit("abort")  # workers stop after the write in progress
        await asyncio.wait({task}, timeout=60)
        if not task.done():
            task.cancel()  # ExtractRun.run kills its workers when cancelled
            await asyncio.wait({task}, timeout=10)

    def exit_code(self) -> int | None:
        """``datagen run``'s exit code once generation and the chain ended, else None."""
        gen = self.generation_ended()
        if gen is None or self.running:
            return None
        x = self.chain.exit_code
        return combined_exit_code(gen, x if x is not None else 130)

    # ---- views --------------------------------------------------------------------------------
    def observe(self) -> None:
        """On each dashboard poll: open the extraction view when the first extraction started."""
        if self.chain.runs and not self.shown and len(self.app.screen_stack) == 1:
            self.show()

    def show(self) -> None:
        """The extraction view (from the generation view only, not over a modal)."""
        if len(self.app.screen_stack) == 1:
            self.shown = True
            self.app.push_screen(SCREEN)

    def back(self) -> None:
        """Back to the generation view."""
        if isinstance(self.app.screen, ExtractScreen):
            self.app.pop_screen()

    def check(self, action: str) -> bool:
        """Footer state of ``e``: Extraction on the generation view, Generation on the extraction view."""
        if action == "show_extract":
            return len(self.app.screen_stack) == 1
        return isinstance(self.app.screen, ExtractScreen)

    def note(self) -> str | None:
        """The generation header's note once generation ended while extraction goes on."""
        return "generation ended; extraction goes on (e: its view)" if self.running else None


__all__ = ["ChainedExtraction", "SCREEN"]
