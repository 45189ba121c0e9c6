"""The sample inspector: the latest completion of the selected dataset, trimmed."""

from __future__ import annotations

import re

from rich.text import Text
from textual.widgets import Static

from engine.api import DatasetSnapshot
from tui.fmt import trim

REASONING_CHARS = 400
CONTENT_CHARS = 900
"""Characters shown of the reasoning and the content."""


_BLANKS = re.compile(r"\n\s*\n+")


def _squeeze(text: str, limit: int) -> str:
    """Blank lines collapsed (the pane is small), then trimmed to ``limit`` characters."""
    return trim(_BLANKS.sub("\n", text), limit)


def sample_text(d: DatasetSnapshot | None) -> Text:
    """Header (dataset, key, provider, finish reason, tokens, validation) then reasoning and content.

    Model text is added as plain :class:`~rich.text.Text`, never parsed as markup.
    """
    if d is None:
        return Text("no dataset selected", style="dim")
    t = Text()
    t.append(d.name, style="bold")
    t.append(f"  {d.state}")
    if d.state_reason:
        t.append(f" ({d.state_reason})", style="yellow")
    s = d.latest_sample
    if s is None:
        t.append("\nno completion stored yet", style="dim")
        return t
    if s.restored:
        t.append("  (sample stored by an earlier run)", style="dim")
    t.append(f"\n{s.key}  via {s.provider or '?'}  {s.completion_tokens:,} tok  finish ")
    t.append(s.finish_reason or "?", style="green" if s.finish_reason in ("stop", "tool_calls") else "bold red")
    if s.tool_calls:
        t.append(f"  tools: {', '.join(s.tool_calls)}", style="cyan")
    t.append("\nvalidation: ", style="bold")
    t.append(s.validation or "not run yet", style="" if s.validation else "dim")
    if s.reasoning:
        t.append("\nreasoning: ", style="bold magenta")
        t.append(_squeeze(s.reasoning, REASONING_CHARS), style="dim")
    t.append("\ncontent: ", style="bold")
    t.append(_squeeze(s.content, CONTENT_CHARS) if s.content else "(empty)")
    return t


class SamplePane(Static):
    """Shows :func:`sample_text` of the selected dataset; redraws only when that changes."""

    def __init__(self, **kw) -> None:
        super().__init__("", **kw)
        self._last: tuple | None = None

    def update_from(self, d: DatasetSnapshot | None) -> None:
        """Show dataset ``d``'s latest sample (None: nothing selected)."""
        key = None if d is None else (d.name, d.state, d.state_reason, d.latest_sample)
        if key != self._last or self._last is None:
            self._last = key
            self.update(sample_text(d), layout=False)
