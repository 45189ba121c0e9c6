"""The header: run, state and reason, time, money (spent, credits, rate, projection), ETA, load.

Three lines; each is built from segments with a priority, and the least important segments are
dropped first when the terminal is narrow, so spent / projected / ETA stay visible at 80 columns.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from engine.money.projection import range_text
from engine.report.snapshot import RunSnapshot
from tui.fmt import fmt_duration, money

STATE_STYLE = {
    "starting": "bold cyan", "running": "bold green", "paused": "bold yellow", "draining": "bold yellow",
    "stopping": "bold yellow", "completed": "bold blue", "stopped": "bold red",
}
"""Rich style per run state."""

Segment = tuple[int, Text]
"""(priority, text): priority 0 is never dropped; higher numbers are dropped first."""


def fit(segments: list[Segment], width: int, sep: str = "  ") -> Text:
    """Join ``segments`` with ``sep``, dropping the highest-priority-number ones until the line fits
    ``width`` cells (priority-0 segments are kept; the line is then cut with an ellipsis)."""
    keep = [s for s in segments if s[1].plain]
    while len(keep) > 1 and sum(s[1].cell_len for s in keep) + len(sep) * (len(keep) - 1) > width:
        worst = max(range(len(keep)), key=lambda i: (keep[i][0], i))
        if keep[worst][0] == 0:
            break
        del keep[worst]
    line = Text(sep).join(t for _, t in keep)
    line.truncate(width, overflow="ellipsis")
    return line


def _t(*parts: tuple[str, str] | str) -> Text:
    t = Text()
    for p in parts:
        t.append(*(p if isinstance(p, tuple) else (p,)))
    return t


def drain_segment(s: RunSnapshot) -> Text:
    """While a drain runs: the requests still in flight, their estimated dollars and the countdown
    to the abort of what is left (``draining 14 in flight ($0.4210) · abort in 29m12s``); else empty."""
    if s.drain_left_s is None:
        return Text()
    return _t(("draining ", "bold yellow"), (f"{s.in_flight:,} in flight", "bold"),
              f" ({money(s.cost_in_flight_usd)}) · abort in ", (fmt_duration(s.drain_left_s), "bold"))


def header_lines(s: RunSnapshot | None, note: str = "", width: int = 160) -> list[Text]:
    """The header's three lines for snapshot ``s`` (None: the engine is still starting).

    Args:
        s: the snapshot.
        note: shown at the end of line 1 (e.g. "run ended: press q to exit").
        width: cells available per line.
    """
    if s is None:
        return [fit([(0, _t(("datagen", "bold"))), (0, _t(("STARTING", STATE_STYLE["starting"]))),
                     (1, _t("opening the store and ingesting datasets…"))], width), Text(), Text()]
    state = _t((s.name, "bold"), "  ", (s.state.upper(), STATE_STYLE.get(s.state, "bold")))
    if s.state_reason:
        state.append(f" ({s.state_reason})", style="red" if s.state == "stopped" else "yellow")
    lag_style = "red" if s.loop_lag_ms >= 250 else "yellow" if s.loop_lag_ms >= 50 else ""
    line1 = fit([
        (0, state),
        (2, _t(f"elapsed {fmt_duration(s.elapsed_s)}")),
        (1, _t(f"in flight {s.in_flight:,}")),
        (3, _t("loop lag ", (f"{s.loop_lag_ms:.0f} ms", lag_style))),
        (4, workers_text(s)),
        (0, _t((note, "bold reverse")) if note else Text()),
    ], width)

    spent = _t("spent ", (money(s.cost_usd), "bold"))
    if s.max_cost_usd is not None:
        spent.append(f" / cap {money(s.max_cost_usd)}")
    credits = _t("credits ", (money(s.credits_usd), "bold") if s.credits_usd is not None else "--")
    if s.credits_usd is not None and s.credits_age_s is not None:
        credits.append(f" ({fmt_duration(s.credits_age_s)} ago)", style="dim")
    proj = s.projected_total_cost_usd
    cal = s.calibration
    # while calibrating, warn on the low end only: the high end assumes max_tokens per request
    warn_at = proj if cal is None else s.projected_cost_low_usd
    over_cap = warn_at is not None and s.max_cost_usd is not None and warn_at > s.max_cost_usd
    short = warn_at is not None and s.credits_usd is not None and warn_at - s.cost_usd > s.credits_usd
    proj_text = range_text(proj, s.projected_cost_low_usd, s.projected_cost_high_usd, cal, money)
    projected = _t("projected ", (proj_text, "bold red" if over_cap or short else "bold"))
    if over_cap or short:
        projected.append(" > cap!" if over_cap else " > credits!", style="bold red")
    line2 = fit([
        (0, spent),
        (2, credits),
        (3, _t(f"rate {money(s.spend_rate_usd_per_h, 2)}/h")),
        (0, projected),
        (0, _t(("ETA ", "bold"), (eta_text(s), "bold"))),
        (4, _t(f"{s.req_per_s:.1f} req/s  {s.tok_per_s:,.0f} tok/s")),
    ], width)

    if s.errors:
        errs = _t(("errors ", "bold red"),
                  "  ".join(f"{k} {v:,}" for k, v in sorted(s.errors.items(), key=lambda kv: (-kv[1], kv[0]))))
    else:
        errs = _t(("no errors", "green"))
    line3 = fit([(0, drain_segment(s)), (0, errs), (1, limits_text(s)),
                 (5, _t((f"writer queue {s.writer_queue:,}", "dim")) if s.writer_queue else Text())], width)
    return [line1, line2, line3]


def workers_text(s: RunSnapshot) -> Text:
    """``"workers 3"`` (the stream-worker processes), ``"workers 2/3"`` in red while one is down, and
    how many were replaced after dying (``"· 1 restarted"``); empty when the run has none."""
    if not s.stream_workers:
        return Text()
    down = s.stream_workers_alive < s.stream_workers
    t = _t("workers ", (f"{s.stream_workers_alive}/{s.stream_workers}" if down else f"{s.stream_workers}",
                        "bold red" if down else ""))
    if s.stream_worker_restarts:
        t.append(f" · {s.stream_worker_restarts} restarted", style="yellow")
    return t


def eta_text(s: RunSnapshot) -> str:
    """The header's ETA: ``"--"`` with the state while the run does not progress (paused, stopping,
    draining: the ETA does not count down then), a range while calibrating, else one duration."""
    if s.state in ("completed",):
        return "0s"
    if s.state not in ("running", "starting"):
        return f"-- ({s.state})"
    return range_text(s.eta_s, s.eta_s_low, s.eta_s_high, s.calibration, fmt_duration, short=True)


def limits_text(s: RunSnapshot) -> Text:
    """Each class's slots: ``"slots short 5/24  long 0/8"`` (in flight / current concurrency limit);
    a limit changed from the config's shows the configured one, e.g. ``"short 5/48 (cfg 24)"``."""
    if not s.classes:
        return Text()
    t = _t(("slots ", "bold"))
    for i, c in enumerate(s.classes):
        if i:
            t.append("  ")
        t.append(f"{c.name} {c.in_flight:,}/{c.concurrency:,}")
        if c.configured and c.concurrency != c.configured:
            t.append(f" (cfg {c.configured:,})", style="dim")
    return t


class HeaderPane(Static):
    """Three lines at the top; redraws only when its text (or the width) changes."""

    DEFAULT_CSS = "HeaderPane { height: 3; padding: 0 1; background: $boost; }"

    def __init__(self, **kw) -> None:
        super().__init__("", **kw)
        self._last: tuple | None = None

    def update_from(self, snapshot: RunSnapshot | None, note: str = "") -> None:
        """Render ``snapshot`` (None while the engine starts)."""
        width = self.content_size.width or max(self.app.size.width - 2, 20)
        text = Text("\n").join(header_lines(snapshot, note, width))
        key = (text.plain, tuple(text.spans))
        if key != self._last:
            self._last = key
            self.update(text, layout=False)  # fixed height: no re-layout of the screen
