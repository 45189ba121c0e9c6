"""Log handlers that stay quiet when the disk is full: one line per problem, never a traceback.

Two failures made a full disk print thousands of lines (measured: 8,239 lines in 40 s, 160 of them
``--- Logging error ---`` tracebacks): the same error logged at every commit retry, and
:meth:`logging.Handler.handleError` printing a traceback to stderr each time the log file, on the full
disk, refused a line.

- :class:`RepeatLimiter` (pure, its clock injected): the same message again within ``window_s`` is
  counted, not repeated; the next time it passes it carries ``(repeated N times in the last S s)``.
- :class:`LimitedStreamHandler`: the stderr handler, with a limiter on WARNING and above.
- :class:`SafeFileHandler`: ``RUN_DIR/datagen.log``, with a limiter; a line the file refuses (ENOSPC,
  EDQUOT, EROFS, a deleted directory) is dropped and counted instead of printing a traceback; the first
  refusal is said once, as a warning through the other handlers (the terminal or the dashboard); once
  the file takes lines again it gets one line saying how many were dropped.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import OrderedDict
from typing import Callable, cast

#: Seconds during which the same message is counted rather than repeated.
REPEAT_WINDOW_S = 60.0
#: Distinct messages a limiter remembers (the oldest is forgotten first).
MAX_KEYS = 512


class RepeatLimiter:
    """Decides whether a message passes: the first time, and then at most once per ``window_s``.

    Args:
        window_s: seconds during which repeats of a message are counted, not passed.
        clock: monotonic clock (s).
    """

    def __init__(self, window_s: float = REPEAT_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._seen: OrderedDict[object, list[float]] = OrderedDict()  # key -> [window start (s), repeats held]

    def check(self, key: object) -> tuple[bool, int, float]:
        """Whether the message ``key`` passes now, and if so how many repeats were held back since it last
        passed, over how many seconds: ``(passes, repeats, seconds)``; ``(False, 0, 0.0)`` for a repeat."""
        now = self.clock()
        entry = self._seen.get(key)
        if entry is None:
            self._seen[key] = [now, 0]
            if len(self._seen) > MAX_KEYS:
                self._seen.popitem(last=False)
            return True, 0, 0.0
        start, held = entry
        if now - start < self.window_s:
            entry[1] = held + 1
            return False, 0, 0.0
        self._seen[key] = [now, 0]
        self._seen.move_to_end(key)
        return True, int(held), now - start

    def held(self) -> list[tuple[object, int, float]]:
        """Every message with repeats held back: ``(key, repeats, seconds since it last passed)``; clears them."""
        now = self.clock()
        out = [(k, int(v[1]), now - v[0]) for k, v in self._seen.items() if v[1]]
        for k, _n, _s in out:
            self._seen[k] = [now, 0]
        return out


def repeated_suffix(n: int, seconds: float) -> str:
    """`` (repeated 311 times in the last 60 s)``; "" for ``n`` 0."""
    if not n:
        return ""
    return f" (repeated {n:,} time{'s' if n != 1 else ''} in the last {max(1, round(seconds))} s)"


class _Limited(logging.Handler):
    """A handler whose WARNING-and-above messages pass through a :class:`RepeatLimiter`."""

    limiter: RepeatLimiter
    min_level = logging.WARNING

    def handle(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.min_level:
            return bool(super().handle(record))
        try:
            msg = record.getMessage()
        except Exception:  # a bad format: let the normal path report it
            return bool(super().handle(record))
        ok, n, secs = self.limiter.check((record.levelno, record.name, msg))
        if not ok:
            return False
        if n:
            record = logging.makeLogRecord({**record.__dict__, "msg": msg + repeated_suffix(n, secs), "args": None})
        return bool(super().handle(record))

    def flush_repeats(self) -> None:
        """Write one line for each message whose repeats were held back (at close: the counts are not lost)."""
        for key, n, secs in self.limiter.held():
            level, name, msg = cast(tuple[int, str, str], key)
            super().handle(logging.makeLogRecord({"name": name, "levelno": level, "levelname": logging.getLevelName(level),
                                                  "msg": msg + repeated_suffix(n, secs), "args": None}))

    def close(self) -> None:
        try:
            self.flush_repeats()
        except Exception:  # closing must not fail
            pass
        super().close()


class LimitedStreamHandler(_Limited, logging.StreamHandler):
    """A :class:`logging.StreamHandler` (stderr) that does not repeat the same warning within a minute."""

    def __init__(self, stream=None, limiter: RepeatLimiter | None = None) -> None:
        super().__init__(stream)
        self.limiter = limiter or RepeatLimiter()

    def handleError(self, record: logging.LogRecord) -> None:  # the terminal is gone: drop quietly
        pass


class SafeFileHandler(_Limited, logging.FileHandler):
    """A :class:`logging.FileHandler` that survives a full or vanished disk.

    A line the file refuses is dropped and counted (:attr:`dropped`), the file is closed and reopened
    at the next line; the first refusal of an episode is announced once through ``note`` (default: a
    WARNING on the ``engine`` logger, which the other handlers show); the first line written after it
    is preceded by ``N log line(s) dropped while PATH could not be written (REASON)``.

    Args:
        path: the log file (appended to).
        limiter: the repeat limiter (default: a new one, 60 s).
        note: called with the one line announcing that lines are being dropped.
    """

    def __init__(self, path, limiter: RepeatLimiter | None = None, note: Callable[[str], None] | None = None) -> None:
        super().__init__(path, encoding="utf-8")
        self.limiter = limiter or RepeatLimiter()
        self._note = note
        self.dropped = 0
        self.failing: str | None = None  # why the file refuses lines (None: it takes them)
        self._noting = False
        self._failed_now = False
        self._failed_path = self.baseFilename

    def emit(self, record: logging.LogRecord) -> None:
        if self._noting:  # our own announcement: it goes to the other handlers only
            return
        self._failed_now = False
        try:
            if self.stream is None:
                self.stream = self._open()
            if self.failing is not None:
                logging.StreamHandler.emit(self, logging.makeLogRecord({
                    "name": "engine", "levelno": logging.WARNING, "levelname": "WARNING", "args": None,
                    "msg": f"{self.dropped:,} log line(s) dropped while {self._failed_path} could not be written "
                           f"({self.failing})"}))
                if self._failed_now:
                    return
                self.failing, self.dropped = None, 0
            logging.StreamHandler.emit(self, record)
        except Exception:
            self.handleError(record)

    def handleError(self, record: logging.LogRecord) -> None:
        self._failed_now = True
        self.dropped += 1
        err = sys.exc_info()[1]
        stream, self.stream = self.stream, None  # reopened at the next line; what it buffered is dropped
        if stream is not None:
            try:
                stream.close()
            except Exception:
                pass
        if self.failing is None:
            self._failed_path = self.baseFilename
            self.failing = (getattr(err, "strerror", None) or str(err) or type(err).__name__) if err else "unknown"
            line = (f"cannot write {self.baseFilename} ({self.failing}); log lines are dropped and counted until it "
                    f"can be written again")
            self._noting = True
            try:
                if self._note is not None:
                    self._note(line)
                else:
                    logging.getLogger("engine").warning("%s", line)
            except Exception:
                pass
            finally:
                self._noting = False


__all__ = ["LimitedStreamHandler", "REPEAT_WINDOW_S", "RepeatLimiter", "SafeFileHandler", "repeated_suffix"]
