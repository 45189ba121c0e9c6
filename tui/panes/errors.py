"""Errors by class with the latest message of each (``snapshot.errors``, ``latest_errors``)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from engine.api import RunSnapshot
from tui.fmt import trim


def errors_table(errors: dict[str, int], latest: dict[str, str], width: int = 80) -> Table | Text:
    """A table ``class | count | latest message``, most frequent first; a green line when none."""
    if not errors:
        return Text("no errors", style="green")
    t = Table(box=None, expand=True, show_edge=False, pad_edge=False, header_style="bold")
    t.add_column("class", no_wrap=True)
    t.add_column("count", justify="right", no_wrap=True)
    t.add_column("latest message", no_wrap=True, overflow="ellipsis", ratio=1)
    for cls, n in sorted(errors.items(), key=lambda kv: (-kv[1], kv[0])):
        t.add_row(Text(cls, style="red"), f"{n:,}", Text(trim(latest.get(cls, ""), max(width, 20))))
    return t


class ErrorsPane(Static):
    """What is going wrong: counts per error class and the latest message of each."""

    def __init__(self, **kw) -> None:
        super().__init__("", **kw)
        self._last: tuple | None = None

    def update_from(self, snapshot: RunSnapshot) -> None:
        """Redraw when the counts or messages changed."""
        key = (tuple(sorted(snapshot.errors.items())), tuple(sorted(snapshot.latest_errors.items())))
        if key != self._last:
            self._last = key
            self.update(errors_table(snapshot.errors, snapshot.latest_errors, 200), layout=False)
