"""The bounded log pane: run events from ``snapshot.events`` plus Python logging records."""

from __future__ import annotations

from collections.abc import Iterable

from textual.widgets import Log

from engine.snapshot import RunSnapshot

MAX_LINES = 2000
"""Lines kept in the pane (older ones are dropped)."""


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

    It follows the newest line unless the user scrolled up (Textual's ``auto_scroll``). Once the
    pane holds ``max_lines``, each write drops as many old lines as it adds: the scroll offset then
    stays the same and Textual's ``Log`` repaints only rows past the old end, so the visible rows
    kept showing stale lines; :meth:`update_from` repaints the pane after such a write.
    """

    def __init__(self, max_lines: int = MAX_LINES, **kw) -> None:
        super().__init__(max_lines=max_lines, auto_scroll=True, **kw)
        self._events: tuple[str, ...] = ()
        self._events_total = 0

    def update_from(self, snapshot: RunSnapshot | None, extra: Iterable[str] = ()) -> None:
        """Append the events that are new since the last call, then ``extra`` lines (logging)."""
        lines: list[str] = []
        if snapshot is not None:
            lines.extend(new_events(self._events, snapshot.events, self._events_total, snapshot.events_total))
            self._events, self._events_total = snapshot.events, snapshot.events_total
        lines.extend(extra)
        if lines:
            full = self.max_lines is not None and len(self.lines) + len(lines) > self.max_lines
            self.write_lines(lines)
            if full:  # old lines were dropped: every visible row changed (see the class docstring)
                self.refresh()
