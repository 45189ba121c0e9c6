"""Throughput: req/s and tok/s over the last minutes as sparklines (from ``snapshot.history``)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Sparkline

from engine.api import RunSnapshot
from tui.fmt import fmt_count, fmt_duration

WINDOW_S = 600.0
"""Seconds of history shown (the last 10 minutes)."""


class ThroughputPane(Vertical):
    """Two labelled sparklines: completions per second and completion tokens per second."""

    DEFAULT_CSS = """
    ThroughputPane { height: 1fr; }
    ThroughputPane Label { width: 1fr; }
    ThroughputPane Sparkline { height: 1fr; min-height: 1; margin-bottom: 1; }
    """

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self._last: tuple | None = None

    def compose(self) -> ComposeResult:
        yield Label("req/s", id="req-label")
        yield Sparkline([], id="req-spark", summary_function=max)
        yield Label("tok/s", id="tok-label")
        yield Sparkline([], id="tok-spark", summary_function=max)

    def update_from(self, snapshot: RunSnapshot) -> None:
        """Show the samples of the last :data:`WINDOW_S` seconds of ``snapshot.history``."""
        h = snapshot.history
        if h:
            cutoff = h[-1][0] - WINDOW_S
            h = tuple(x for x in h if x[0] >= cutoff)
        key = (h, snapshot.req_per_s, snapshot.tok_per_s)
        if key == self._last:
            return
        self._last = key
        req = [x[1] for x in h]
        tok = [x[2] for x in h]
        span = fmt_duration(h[-1][0] - h[0][0]) if len(h) > 1 else "--"
        self.query_one("#req-label", Label).update(
            f"req/s {snapshot.req_per_s:.1f}  max {max(req + [snapshot.req_per_s]):.1f}  last {span}", layout=False
        )
        self.query_one("#tok-label", Label).update(
            f"tok/s {fmt_count(snapshot.tok_per_s)}  max {fmt_count(max(tok + [snapshot.tok_per_s]))}  last {span}", layout=False
        )
        self.query_one("#req-spark", Sparkline).data = req
        self.query_one("#tok-spark", Sparkline).data = tok
