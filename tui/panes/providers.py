"""Providers: requests, error %, p50/p95 latency, TTFT, tok/s per stream, cost, wire flags; excluded marked.

``flags`` (shown once any provider has one): responses that raised a wire-conformance flag
(``engine.client.conformance``), red with ``!`` when any of them keeps records out of training (e.g.
``replacement_char``), else dim; none shows ``-``.

With several endpoints (``[provider] base_urls``), one row per endpoint follows: state (healthy,
draining, down), in flight (/ its cap), requests, error %, p50 latency and tok/s it returns.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from engine.api import FAILING, EndpointSnapshot, ProviderSnapshot, RunSnapshot
from tui.fmt import money, pct, secs


def providers_table(providers: tuple[ProviderSnapshot, ...]) -> Table | Text:
    """One row per provider (as ordered by the engine: most requests first)."""
    if not providers:
        return Text("no provider has answered yet", style="dim")
    t = Table(box=None, expand=True, show_edge=False, pad_edge=False, header_style="bold")
    t.add_column("provider", no_wrap=True, overflow="ellipsis", ratio=1, min_width=6)
    show_flags = any(p.flags for p in providers)
    for col in ("req", "err", "lat p50/95", "TTFT", "tok/s", "cost") + (("flags",) if show_flags else ()):
        t.add_column(col, justify="right", no_wrap=True)
    for p in providers:
        name = Text(p.name, style="strike dim" if p.excluded else "bold")
        if p.excluded:
            name = Text("✗ ", style="bold red") + name
        err_style = "red" if p.error_rate >= 0.2 else "yellow" if p.error_rate >= 0.05 else ""
        t.add_row(
            name, f"{p.requests:,}", Text(pct(p.error_rate), style=err_style),
            f"{secs(p.latency_p50_s)}/{secs(p.latency_p95_s)}", secs(p.ttft_p50_s),
            "--" if p.tok_per_s_per_stream is None else f"{p.tok_per_s_per_stream:.0f}", money(p.cost_usd),
            *((flags_text(p.flags),) if show_flags else ()),
        )
    return t


def flags_text(flags: dict[str, int]) -> Text:
    """A provider's wire-flag count: failing flags (records kept out of training) in red, notes dim."""
    bad = sum(n for f, n in flags.items() if f in FAILING)
    total = sum(flags.values())
    if not total:
        return Text("-", style="dim")
    return Text(f"{bad:,}!" if bad else f"{total:,}", style="bold red" if bad else "dim")


#: Style of each endpoint state in the endpoints table.
STATE_STYLE = {"healthy": "green", "draining": "yellow", "down": "bold red"}


def endpoint_name(url: str) -> str:
    """An endpoint's url as shown: without the scheme and a trailing ``/v1`` (``127.0.0.1:8001``)."""
    return url.split("://", 1)[-1].removesuffix("/v1")


def endpoints_table(endpoints: tuple[EndpointSnapshot, ...]) -> Table:
    """One row per endpoint (config order): state, in flight (/cap), requests, error %, p50 latency, tok/s."""
    t = Table(box=None, expand=True, show_edge=False, pad_edge=False, header_style="bold")
    t.add_column("endpoint", no_wrap=True, overflow="ellipsis", ratio=1, min_width=6)
    for name in ("state", "infl", "req", "err", "p50", "tok/s"):
        t.add_column(name, justify="right", no_wrap=True)
    for e in endpoints:
        err_style = "red" if e.error_rate >= 0.2 else "yellow" if e.error_rate >= 0.05 else ""
        t.add_row(
            endpoint_name(e.url), Text(e.state, style=STATE_STYLE.get(e.state, "")),
            f"{e.in_flight}" + ("" if e.concurrency is None else f"/{e.concurrency}"), f"{e.requests:,}",
            Text(pct(e.error_rate), style=err_style), secs(e.latency_p50_s), f"{e.tok_per_s:.0f}",
        )
    return t


class ProvidersPane(Static):
    """Per-provider figures from ``snapshot.providers``."""

    def __init__(self, **kw) -> None:
        super().__init__("", **kw)
        self._last: tuple | None = None

    def update_from(self, snapshot: RunSnapshot) -> None:
        """Redraw when any provider's or endpoint's figures changed."""
        key = (snapshot.providers, snapshot.endpoints)
        if key != self._last:
            self._last = key
            body: RenderableType = providers_table(snapshot.providers)
            if snapshot.endpoints:
                body = Group(body, Text(""), endpoints_table(snapshot.endpoints))
            self.update(body, layout=False)
