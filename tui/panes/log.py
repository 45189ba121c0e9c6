"""The bounded log pane: run events from ``snapshot.events`` plus Python logging records."""

from __future__ import annotations

import re
from collections.abc import Iterable

from rich.highlighter import Highlighter
from rich.text import Text
from textual.widgets import Log

from engine.api import RunSnapshot

MAX_LINES = 2000
"""Lines kept in the pane (older ones are dropped)."""

_LEVEL = re.compile(r"^(\S+) +(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")

GUARD = re.compile(r"guard|credits floor|calibration gate|cannot reserve|budget met|cost cap|cap met|exit on pause|"
                   r"out of credits|store commits fail", re.I)
"""What a guard's decision says (a pause, a stop, a budget met): such lines are shown bold."""


def line_spans(line: str) -> list[tuple[int, int, str]]:
    """The styles of one log line (``"12:14:09 WARNING [b1] dataset paused: anomaly guard: ..."``) as
    ``(start, end, rich style)``: the time dim; WARNING yellow and ERROR/CRITICAL red (the level word
    bold); a guard's decision (:data:`GUARD`) bold, its level word reversed; DEBUG dim."""
    m = _LEVEL.match(line)
    if m is None:
        return []
    level = m.group(2)
    spans = [(0, m.end(1), "dim")]
    colour = {"WARNING": "yellow", "ERROR": "red", "CRITICAL": "red"}.get(level, "")
    guard = GUARD.search(line, m.end()) is not None
    if guard:
        spans += [(m.start(2), m.end(2), f"bold reverse {colour or 'yellow'}"),
                  (m.end(2), len(line), f"bold {colour}".strip())]
    elif colour:
        spans += [(m.start(2), m.end(2), f"bold {colour}"), (m.end(2), len(line), colour)]
    elif level == "DEBUG":
        spans.append((m.start(2), len(line), "dim"))
    return spans


def styled_line(line: str) -> Text:
    """``line`` as Rich text with :func:`line_spans` applied (the detail view's log lines)."""
    t = Text(line)
    for start, end, style in line_spans(line):
        t.stylize(style, start, end)
    return t


class LevelHighlighter(Highlighter):
    """Styles each log pane line by its level and whether it is a guard's decision (:func:`line_spans`)."""

    def highlight(self, text: Text) -> None:
        for start, end, style in line_spans(text.plain):
            text.stylize(style, start, end)


def new_events(prev: tuple[str, ...], cur: tuple[str, ...], prev_total: int = 0, total: int = 0) -> tuple[str, ...]:
    """Lines of ``cur`` not yet shown, given ``prev`` was shown last (both oldest first).

    ``events`` is a sliding window of the most recent lines. With the event counts (``total``:
    ``snapshot.events_total`` now, ``prev_total``: at ``prev``) the new lines are the last
    ``total - prev_total`` of ``cur`` (all of ``cur`` when more arrived than the window holds): exact
    even when lines repeat (``-`` then ``+`` pressed in the same second). Without counts (0): what
    follows the longest suffix of ``prev`` that is a prefix of ``cur``.
    """
    if total:
        n = total - prev_total
        return cur[-n:] if 0 < n < len(cur) else (cur if n > 0 else ())
    if cur == prev:
        return ()
    for k in range(min(len(prev), len(cur)), 0, -1):
        if prev[-k:] == cur[:k]:
            return cur[k:]
    return cur


class LogPane(Log):
    """A :class:`~textual.widgets.Log` with ``max_lines`` set, appended to, never rewritten.

    It follows the newest line unless the user scrolled up. Textual's own ``auto_scroll`` follows
    only while the pane sits exactly at its end at the moment of a write, and the end moves under it
    without a scroll: the width of new lines is measured in a thread, so a horizontal scrollbar could
    appear a moment later and take the bottom row (one row short of the end: never followed again,
    on every fresh run), and a resize changes the rows. So the pane keeps its own ``following``
    flag: cleared when the scroll offset moves up (the user scrolled), set again when it reaches the
    end; while following, every update (twice a second, lines or not) and every resize scrolls to
    the end. The horizontal scrollbar takes no row (``scrollbar-size-horizontal: 0``): long lines
    still scroll sideways with the arrow keys once the pane has focus. Once the pane holds
    ``max_lines``, each write drops as many old lines as it adds while the offset stays the same,
    so the pane is repainted whole after such a write.
    """

    DEFAULT_CSS = "LogPane { scrollbar-size-horizontal: 0; }"

    def __init__(self, max_lines: int = MAX_LINES, **kw) -> None:
        super().__init__(max_lines=max_lines, auto_scroll=False, highlight=True, **kw)
        self.highlighter = LevelHighlighter()
        self._events: tuple[str, ...] = ()
        self._events_total = 0
        self.following = True
        """True while new lines are scrolled into view (False once the user scrolled up)."""

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value >= self.max_scroll_y:
            self.following = True
        elif new_value < old_value:
            self.following = False

    def follow(self) -> None:
        """Scroll to the newest line if following and not already there (cheap when there)."""
        if self.following and self.scroll_y != self.max_scroll_y and not self.is_vertical_scrollbar_grabbed:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
            self.refresh()

    def on_resize(self) -> None:
        self.call_after_refresh(self.follow)

    def update_from(self, snapshot: RunSnapshot | None, extra: Iterable[str] = ()) -> None:
        """Append the events that are new since the last call, then ``extra`` lines (logging);
        scroll to the newest line while following."""
        lines: list[str] = []
        if snapshot is not None:
            lines.extend(new_events(self._events, snapshot.events, self._events_total, snapshot.events_total))
            self._events, self._events_total = snapshot.events, snapshot.events_total
        lines.extend(extra)
        if lines:
            full = self.max_lines is not None and len(self.lines) + len(lines) > self.max_lines
            self.write_lines(lines, scroll_end=False)
            if full:  # old lines were dropped: every visible row changed (see the class docstring)
                self.refresh()
        self.follow()
        self.call_after_refresh(self.follow)  # the width is measured in a thread: the end may move
