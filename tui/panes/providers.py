"""Providers: requests, error %, p50/p95 latency, TTFT, tok/s per stream, cost; excluded marked."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from engine.report.snapshot import RunSnapshot
from engine.metrics.stats import ProviderSnapshot
from tui.fmt import money, pct, secs


def providers_table(providers: tuple[ProviderSnapshot, ...]) -> Table | Text:
    """One row per provider (as ordered by the engine: most requests first)."""
    if not providers:
        return Text("no provider has answered yet", style="dim")
    t = Table(box=None, expand=True, show_edge=False, pad_edge=False, header_style="bold")
    t.add_column("provider", no_wrap=True, overflow="ellipsis", ratio=1, min_width=6)
    for name in ("req", "err", "lat p50/95", "TTFT", "tok/s", "cost"):
        t.add_column(name, justify="right", no_wrap=True)
    for p in providers:
        name = Text(p.name, style="strike dim" if p.excluded else "bold")
        if p.excluded:
            name = Text("✗ ", style="bold red") + name
        err_style = "red" if p.error_rate >= 0.2 else "yellow" if p.error_rate >= 0.05 else ""
        t.add_row(
            name, f"{p.requests:,}", Text(pct(p.error_rate), style=err_style),
            f"{secs(p.latency_p50_s)}/{secs(p.latency_p95_s)}", secs(p.ttft_p50_s),
            "--" if p.tok_per_s_per_stream is None else f"{p.tok_per_s_per_stream:.0f}", money(p.cost_usd),
        )
    return t


class ProvidersPane(Static):
    """Per-provider figures from ``snapshot.providers``."""

    def __init__(self, **kw) -> None:
        super().__init__("", **kw)
        self._last: tuple | None = None

    def update_from(self, snapshot: RunSnapshot) -> None:
        """Redraw when any provider's figures changed."""
        if snapshot.providers != self._last:
            self._last = snapshot.providers
            self.update(providers_table(snapshot.providers), layout=False)
