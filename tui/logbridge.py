"""Python logging while the dashboard owns the terminal.

Textual draws on the terminal through stderr, so a ``StreamHandler`` to stderr/stdout garbles the
screen. :func:`quiet_terminal_logging` detaches such handlers (and ``logging.lastResort``) for the
duration of the app and attaches a :class:`PaneLogHandler`; the file log in the run directory
(``runner.setup_file_logging``) is left alone.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections import deque
from collections.abc import Iterator


class PaneLogHandler(logging.Handler):
    """Collects formatted records in a bounded deque, drained by the dashboard at each refresh.

    Thread-safe (``deque.append``/``popleft`` are atomic), O(1) per record, and never touches
    the UI from the logging thread, so a burst of records costs no UI messages.

    Args:
        maxlen: records kept between two drains (older ones are dropped and counted).
        level: minimum level (default INFO).

    Records that ``engine.run.scheduler`` logs from its ``event`` method are skipped (the same run
    events reach the pane through ``snapshot.events``), and so are per-request records below
    WARNING of the HTTP and SQLite libraries (one line per request would bury everything else) and
    ingest's INFO summaries (``prepare`` prints the same lines, which reach the pane once).
    """

    QUIET = ("httpx", "httpcore", "aiosqlite", "asyncio")
    """Loggers whose records below WARNING are dropped."""

    PRINTED = ("engine.run.ingest",)
    """Loggers whose records below WARNING ``prepare`` also prints (the pane shows the printed copy)."""

    def __init__(self, maxlen: int = 1000, level: int = logging.INFO) -> None:
        super().__init__(level)
        self.lines: deque[str] = deque(maxlen=maxlen)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "engine.run.scheduler" and record.funcName == "event":
            return
        if record.levelno < logging.WARNING and (record.name.split(".", 1)[0] in self.QUIET
                                                 or record.name in self.PRINTED):
            return
        try:
            msg = self.format(record)
        except Exception:  # a bad record must not break the app
            msg = f"{record.levelname} {record.name}: {record.msg!r}"
        self.lines.extend(msg.splitlines() or [""])

    def drain(self) -> list[str]:
        """Remove and return the lines collected so far (oldest first)."""
        out: list[str] = []
        pop = self.lines.popleft
        while True:
            try:
                out.append(pop())
            except IndexError:
                return out


def _is_terminal_stream(h: logging.Handler) -> bool:
    if isinstance(h, logging.FileHandler) or not isinstance(h, logging.StreamHandler):
        return False
    stream = getattr(h, "stream", None)
    if stream in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__):
        return True
    try:
        return bool(stream is not None and stream.isatty())
    except (ValueError, OSError):
        return False


@contextlib.contextmanager
def quiet_terminal_logging(handler: logging.Handler | None = None) -> Iterator[list[logging.Handler]]:
    """Detach terminal stream handlers from every logger (and ``lastResort``); attach ``handler``
    to the root logger; restore everything on exit. Yields the detached handlers."""
    removed: list[tuple[logging.Logger, logging.Handler]] = []
    loggers = [logging.getLogger()] + [
        lg for lg in list(logging.Logger.manager.loggerDict.values()) if isinstance(lg, logging.Logger)
    ]
    for lg in loggers:
        for h in list(lg.handlers):
            if _is_terminal_stream(h):
                lg.removeHandler(h)
                removed.append((lg, h))
    last_resort = logging.lastResort
    logging.lastResort = None
    root = logging.getLogger()
    if handler is not None:
        root.addHandler(handler)
    try:
        yield [h for _, h in removed]
    finally:
        if handler is not None:
            root.removeHandler(handler)
        logging.lastResort = last_resort
        for lg, h in removed:
            lg.addHandler(h)
