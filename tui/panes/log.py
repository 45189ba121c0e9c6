"""The bounded log pane: run events from ``snapshot.events`` plus Python logging records."""

from __future__ import annotations

from collections.abc import Iterable

from textual.widgets import Log

from engine.snapshot import RunSnapshot

MAX_LINES = 2000
"""Lines kept in the pane (older ones are dropped)."""


def new_events(prev: tuple[str, ...], cur: tuple[str, ...]) -> tuple[str, ...]:
    """Lines of ``cur`` not yet shown, given ``prev`` was shown last (both oldest first).

    ``events`` is a sliding window of the most recent lines, so the new lines are what follows the
    longest suffix of ``prev`` that is a prefix of ``cur``.
    """
    if cur == prev:
        return ()
    for k in range(min(len(prev), len(cur)), 0, -1):
        if prev[-k:] == cur[:k]:
            return cur[k:]
    return cur


class LogPane(Log):
    """A :class:`~textual.widgets.Log` with ``max_lines`` set, appended to, never rewritten."""

    def __init__(self, max_lines: int = MAX_LINES, **kw) -> None:
        super().__init__(max_lines=max_lines, auto_scroll=True, **kw)
        self._events: tuple[str, ...] = ()

    def update_from(self, snapshot: RunSnapshot | None, extra: Iterable[str] = ()) -> None:
        """Append the events that are new since the last call, then ``extra`` lines (logging)."""
        lines: list[str] = []
        if snapshot is not None:
            lines.extend(new_events(self._events, snapshot.events))
            self._events = snapshot.events
        lines.extend(extra)
        if lines:
            self.write_lines(lines)
