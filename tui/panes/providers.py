"""Providers: requests, error %, p50/p95 latency, TTFT, tok/s per stream, cost, wire flags, fidelity; excluded marked.

``flags`` (shown once any provider has one): responses that raised a wire-conformance flag
(``engine.client.conformance``), red with ``!`` when any of them keeps records out of training (e.g.
``replacement_char``), else dim; none shows ``-``.

``fid`` (shown once any provider has a fidelity verdict, docs/fidelity.md): ``ok`` green, ``drift`` bold
red (``drift✓`` dim once the user cleared it), ``12/20`` dim (records of the minimum a verdict needs) or
``n/a``; ``-`` not judged yet (:func:`tui.fidelity.fid_cell`; ``i`` shows the evidence).

Width: the pane is :data:`PANE_WIDTH` cells inside; when the optional columns would leave the provider's
name fewer than :data:`NAME_MIN` cells, the columns of :data:`DROP_ORDER` go, in that order, until it fits.

With several endpoints (``[provider] base_urls``), one row per endpoint follows: state (healthy,
draining, down), in flight (/ its cap), requests, error %, p50 latency and tok/s it returns.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from engine.api import FAILING, EndpointSnapshot, ProviderSnapshot, RunSnapshot
from tui.fidelity import fid_cell
from tui.fmt import money, pct, secs

PANE_WIDTH = 58
"""Cells inside the providers pane (62 wide, less its border and padding: tui/layout.py)."""

NAME_MIN = 8
"""Cells the provider's name keeps before optional columns are dropped."""

DROP_ORDER = ("TTFT", "lat p50/95", "tok/s")
"""Columns dropped, in this order, when the name would get fewer than :data:`NAME_MIN` cells."""


def _fit(columns: list[str], rows: list[dict[str, Text | str]], names: list[str], width: int) -> list[str]:
    """``columns`` less those of :data:`DROP_ORDER` (in order) that must go for the name column to keep
    ``min(NAME_MIN, longest name)`` cells in ``width`` (each column as wide as its widest cell or
    heading, 2 cells between columns)."""
    def cells(v: Text | str) -> int:
        return v.cell_len if isinstance(v, Text) else Text(v).cell_len

    def wide(col: str) -> int:
        return max([len(col), *(cells(r[col]) for r in rows)])

    need = min(NAME_MIN, max((Text(n).cell_len for n in names), default=0))
    cols = list(columns)
    for drop in DROP_ORDER:
        if width - sum(wide(c) + 2 for c in cols) >= need:
            break
        cols.remove(drop)
    return cols


def providers_table(providers: tuple[ProviderSnapshot, ...], width: int | None = None) -> Table | Text:
    """One row per provider (as ordered by the engine: most requests first); ``width``: the cells it
    has (None: no column dropped)."""
    if not providers:
        return Text("no provider has answered yet", style="dim")
    show_flags = any(p.flags for p in providers)
    show_fid = any(p.fidelity is not None for p in providers)
    columns = ["req", "err", "lat p50/95", "TTFT", "tok/s", "cost"] + (["flags"] if show_flags else []) + (
        ["fid"] if show_fid else [])
    names: list[str] = []
    rows: list[dict[str, Text | str]] = []
    for p in providers:
        names.append(("✗ " if p.excluded else "") + p.name)
        err_style = "red" if p.error_rate >= 0.2 else "yellow" if p.error_rate >= 0.05 else ""
        rows.append({
            "req": f"{p.requests:,}", "err": Text(pct(p.error_rate), style=err_style),
            "lat p50/95": f"{secs(p.latency_p50_s)}/{secs(p.latency_p95_s)}", "TTFT": secs(p.ttft_p50_s),
            "tok/s": "--" if p.tok_per_s_per_stream is None else f"{p.tok_per_s_per_stream:.0f}",
            "cost": money(p.cost_usd), "flags": flags_text(p.flags), "fid": fid_cell(p.fidelity),
        })
    if width is not None:
        columns = _fit(columns, rows, names, width)
    t = Table(box=None, expand=True, show_edge=False, pad_edge=False, header_style="bold")
    t.add_column("provider", no_wrap=True, overflow="ellipsis", ratio=1, min_width=6)
    for col in columns:
        t.add_column(col, justify="right", no_wrap=True)
    for p, row in zip(providers, rows, strict=True):
        name = Text(p.name, style="strike dim" if p.excluded else "bold")
        if p.excluded:
            name = Text("✗ ", style="bold red") + name
        t.add_row(name, *(row[c] for c in columns))
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
        width = self.content_size.width or PANE_WIDTH  # 0 before the first layout and while hidden
        key = (snapshot.providers, snapshot.endpoints, width)
        if key != self._last:
            self._last = key
            body: RenderableType = providers_table(snapshot.providers, width)
            if snapshot.endpoints:
                body = Group(body, Text(""), endpoints_table(snapshot.endpoints))
            self.update(body, layout=False)
