"""The header: run, state and reason, time, money (spent, credits, rate, projection), ETA, load.

Three lines; each is built from segments with a priority and shorter forms (:func:`fit`): when the
terminal is narrow the least important segments shorten or go first, so spent / cap, credits, the
projection, the ETA and req/s stay visible at 80 columns, and no number is ever cut.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from engine.api import RunSnapshot, abort_at_end_text, abort_hint, ends_text, range_text
from tui.fmt import fmt_count, fmt_duration, money

STATE_STYLE = {
    "starting": "bold cyan", "running": "bold green", "paused": "bold yellow", "draining": "bold yellow",
    "stopping": "bold yellow", "completed": "bold blue", "stopped": "bold red",
}
"""Rich style per run state."""

Segment = tuple
"""``(priority, text, *shorter)``: priority 0 is never dropped, higher numbers are dropped first;
each ``shorter`` is a ``(priority, text)`` form taken instead of the one before it when reductions
reach that priority (e.g. ``(0, "credits $95.66 (14s ago)", (2, "credits $95.66"))``)."""


def fit(segments: list[Segment], width: int, sep: str = "  ") -> Text:
    """Join ``segments`` with ``sep`` so the line fits ``width`` cells.

    While it is too wide, the reduction with the highest priority number is made (ties: the
    rightmost segment): a segment takes its next shorter form, or, once it has none, is dropped
    (never one of priority 0). If the line is still too wide it is cut at a space before ``width``
    and ends with an ellipsis, so no number is ever cut in the middle.
    """
    items = []
    for prio, text, *shorter in segments:
        if text.plain:
            items.append([prio, [(prio, text), *shorter], 0])

    def cells() -> int:
        return sum(forms[i][1].cell_len for _, forms, i in items) + len(sep) * max(len(items) - 1, 0)

    while cells() > width:
        best: tuple[float, int] | None = None
        for pos, (prio, forms, i) in enumerate(items):
            if i + 1 < len(forms):
                step = forms[i + 1][0]
            elif prio > 0:
                step = prio
            else:
                continue
            if best is None or (step, pos) >= best:
                best = (step, pos)
        if best is None:
            break
        item = items[best[1]]
        if item[2] + 1 < len(item[1]):
            item[2] += 1
        else:
            del items[best[1]]
    line = Text(sep).join(forms[i][1] for _, forms, i in items)
    if line.cell_len > width:
        cut = line.plain.rfind(" ", 0, max(width, 1))
        line.truncate(max(cut, 0))
        line.rstrip()
        line.append("…")
    return line


def _t(*parts: tuple[str, str] | str | Text) -> Text:
    t = Text()
    for p in parts:
        t.append(*(p if isinstance(p, tuple) else (p,)))
    return t


def drain_segment(s: RunSnapshot) -> Segment:
    """While a drain runs: the requests still in flight, their estimated dollars, the countdown to the
    abort of what is left with what that abort would cut and bill, when the streams are expected to
    end, and the key that aborts now (``draining 1,222 in flight ($8.85) · abort in 14m12s: ~310 cut,
    est. $2.10 · all end in ~33m20s · a: abort now``); narrow, shorter words first, then the end, then
    the abort's figures. While the run is paused with streams in flight: :func:`paused_segment`. Else empty."""
    if s.drain_left_s is None:
        return paused_segment(s)
    left = (fmt_duration(s.drain_left_s), "bold")
    dollars = f" ({money(s.cost_in_flight_usd)})"
    head = _t(("draining ", "bold yellow"), (f"{s.in_flight:,} in flight", "bold"), f"{dollars} · abort in ", left)
    short_head = head  # "N in flight ... abort in T" stays whole at 80 columns
    cut, ends = abort_at_end_text(s, money), ends_text(s)
    o = s.drain
    cost = f": {money(o.abort_usd if o.expected_s is not None else s.abort_cost_usd)}" if cut and o is not None else ""
    end = f" · end ~{fmt_duration(o.expected_s)}" if o is not None and o.expected_s is not None else ""
    key, short_key = _t(" · ", ("a", "bold reverse"), ": abort now"), _t(" · ", ("a", "bold reverse"), " aborts")
    full = _t(head, (f": {cut}", "yellow") if cut else "", f" · {ends}" if ends else "", key)
    return (0, full, (1.2, _t(short_head, (f" ({cut})", "yellow") if cut else "", end, short_key)),
            (1.1, _t(short_head, (cost, "yellow"), end, short_key)), (0.5, _t(short_head, (cost, "yellow"), short_key)),
            (0.4, _t(short_head, short_key)))


def paused_segment(s: RunSnapshot) -> Segment:
    """While the run is paused with streams in flight: the dollars still streaming, when they are
    expected to end, and how to stop them, the key ``a`` and the command from a shell (``paused:
    1,222 still streaming ($8.85) · all end in ~33m20s · a: abort them (or datagen ctl runs/x abort)``);
    narrow, the command goes first, then shorter words, then the end. Empty otherwise."""
    if s.state != "paused" or not s.in_flight:
        return (0, Text())
    dollars = f" ({money(s.cost_in_flight_usd)})"
    head = _t(("paused: ", "bold yellow"), (f"{s.in_flight:,} still streaming", "bold"), dollars)
    short_head = _t(("paused: ", "bold yellow"), (f"{s.in_flight:,} streaming", "bold"), dollars)
    ends = ends_text(s)
    o = s.drain
    end = f" · end ~{fmt_duration(o.expected_s)}" if o is not None and o.expected_s is not None else ""
    key, short_key = _t(" · ", ("a", "bold reverse"), ": abort them"), _t(" · ", ("a", "bold reverse"), " aborts")
    with_end = _t(head, f" · {ends}" if ends else "", key)
    return (0, _t(with_end, (f" (or {abort_hint(s)})", "dim")), (1.05, with_end),
            (1.2, _t(short_head, end, short_key)), (0.5, _t(short_head, short_key)))


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
    lag_style = "red" if s.loop_lag_ms >= 250 else "yellow" if s.loop_lag_ms >= 50 else ""
    line1 = fit([
        state_segment(s),
        (2, _t(f"elapsed {fmt_duration(s.elapsed_s)}")),
        (2, _t(f"in flight {s.in_flight:,}")),
        (0, _t(f"{s.req_per_s:.1f} req/s")),
        (3, _t(f"{s.tok_per_s:,.0f} tok/s")),
        (4, _t("loop lag ", (f"{s.loop_lag_ms:.0f} ms", lag_style))),
        (1 if s.stream_workers_alive < s.stream_workers or s.stream_workers_frozen else 4, workers_text(s)),
        (0, _t((note, "bold reverse")) if note else Text()),
    ], width)

    line2 = fit([
        spent_segment(s),
        credits_segment(s),
        (3, _t(f"rate {money(s.spend_rate_usd_per_h, 2)}/h")),
        projected_segment(s),
        eta_segment(s),
    ], width)

    line3 = fit([drain_segment(s), errors_segment(s), tokens_segment(s), (2, limits_text(s)),
                 (5, _t((f"writer queue {s.writer_queue:,}", "dim")) if s.writer_queue else Text())], width)
    return [line1, line2, line3]


def state_segment(s: RunSnapshot) -> Segment:
    """The run's name and state, then its reason; a long reason is cut at a word (ellipsis) before
    the req/s and the note are given up (the detail view, the log and ``datagen status`` have it whole)."""
    head = _t((s.name, "bold"), "  ", (s.state.upper(), STATE_STYLE.get(s.state, "bold")))
    if not s.state_reason:
        return (0, head)
    style = "red" if s.state == "stopped" else "yellow"
    words = s.state_reason.split(" ")
    forms = [_t(head, (f" ({' '.join(words[:n])}…)", style)) for n in range(len(words) - 1, 0, -1)]
    return (0, _t(head, (f" ({s.state_reason})", style)), *((1, f) for f in forms), (1, _t(head, (" (…)", style))))


def spent_segment(s: RunSnapshot) -> Segment:
    """``spent $4.34 / cap $25.00`` (``spent $4.34/$25.00`` when narrow); red once the cap is reached."""
    if s.max_cost_usd is None:
        return (0, _t("spent ", (money(s.cost_usd), "bold")))
    style = "bold red" if s.cost_usd >= s.max_cost_usd else "bold"
    return (0, _t("spent ", (money(s.cost_usd), style), f" / cap {money(s.max_cost_usd)}"),
            (1, _t("spent ", (money(s.cost_usd), style), f"/{money(s.max_cost_usd)}")))


def credits_segment(s: RunSnapshot) -> Segment:
    """``credits $95.66 (14s ago)``; the age goes first when narrow; ``credits --`` while unknown."""
    if s.credits_usd is None:
        return (0, _t("credits --"))
    short = _t("credits ", (money(s.credits_usd), "bold"))
    if s.credits_age_s is None:
        return (0, short)
    return (0, _t(short, (f" ({fmt_duration(s.credits_age_s)} ago)", "dim")), (2, short))


def projected_segment(s: RunSnapshot) -> Segment:
    """The projected total: ``projected $10.05`` (a range while calibrating); ``capped at $25.00``
    when the run stops at its cap before finishing (``projection_capped``); ``> cap!`` or
    ``> credits!`` in red when it would go over. Narrow: ``proj $10.05``, a range as its high end
    ``proj ≤$2.17``."""
    proj = s.projected_total_cost_usd
    cal = s.calibration
    if getattr(s, "projection_capped", False):  # the clamped figure (the range's high end while calibrating)
        capped = s.projected_cost_high_usd if cal is not None and s.projected_cost_high_usd is not None else proj
        cap = s.max_cost_usd
        if capped is not None and cap is not None and capped > cap + 0.005:  # the streams in flight pass it
            return (0, _t((money(capped), "bold yellow"), f" > cap {money(cap)} (in flight)"))
        return (0, _t("capped at ", (money(capped if capped is not None else cap), "bold yellow")))
    # while calibrating, warn on the low end only: the high end assumes max_tokens per request
    warn_at = proj if cal is None else s.projected_cost_low_usd
    over_cap = warn_at is not None and s.max_cost_usd is not None and warn_at > s.max_cost_usd
    short = warn_at is not None and s.credits_usd is not None and warn_at - s.cost_usd > s.credits_usd
    style = "bold red" if over_cap or short else "bold"
    warn = (" > cap!" if over_cap else " > credits!", "bold red") if over_cap or short else ""
    full = range_text(proj, s.projected_cost_low_usd, s.projected_cost_high_usd, cal, money)
    if cal is None:
        return (0, _t("projected ", (full, style), warn), (1, _t("proj ", (full, style), warn)))
    if s.projected_cost_low_usd is None or s.projected_cost_high_usd is None:
        return (0, _t("projected ", (full, "dim")), (1, _t("proj ", (f"cal {cal[0]}/{cal[1]}", "dim"))))
    rng = range_text(proj, s.projected_cost_low_usd, s.projected_cost_high_usd, cal, money, short=True)
    high = money(max(s.projected_cost_low_usd, s.projected_cost_high_usd))
    return (0, _t("projected ", (full, style), warn), (2, _t("projected ", (rng, style), warn)),
            (1, _t("proj ", (f"≤{high}", style), warn)))


def eta_segment(s: RunSnapshot) -> Segment:
    """``ETA 13m40s``; a range while calibrating (its high end ``ETA ≤5h44m`` when narrow);
    ``ETA -- (why)`` while there is none (the reason goes last)."""
    text = eta_text(s)
    full = _t(("ETA ", "bold"), (text, "bold"))
    if text.startswith("-- ("):
        return (0, full, (0.5, _t(("ETA --", "bold"))))
    if s.calibration is not None and s.eta_s_high is not None and "–" in text:
        return (0, full, (1, _t(("ETA ", "bold"), (f"≤{fmt_duration(s.eta_s_high)}", "bold"))))
    if s.calibration is not None and text.startswith("calibrating"):
        return (0, full, (1, _t(("ETA ", "bold"), (f"cal {s.calibration[0]}/{s.calibration[1]}", "bold"))))
    return (0, full)


def errors_segment(s: RunSnapshot) -> Segment:
    """``errors midstream 40  rate_limit 31 ...`` (most first); when narrow the rarest classes go
    into ``+N more``, then only the total remains."""
    if not s.errors:
        return (0, _t(("no errors", "green")))
    ranked = sorted(s.errors.items(), key=lambda kv: (-kv[1], kv[0]))

    def form(n: int) -> Text:
        t = _t(("errors ", "bold red"), "  ".join(f"{k} {v:,}" for k, v in ranked[:n]))
        if n < len(ranked):
            t.append(f"  +{len(ranked) - n} more", style="dim")
        return t

    total = _t(("errors ", "bold red"), f"{sum(s.errors.values()):,}")
    return (0, form(len(ranked)), *((1, form(n)) for n in range(len(ranked) - 1, 0, -1)), (1, total))


def tokens_segment(s: RunSnapshot) -> Segment:
    """Completion tokens vs token budget summed over the datasets that have one
    (``tokens 1.71M/4M budget``), for terminals too narrow for the table's column; empty without
    budgets. Red once a budget is used up, yellow from 90 %. Narrow, it goes after the errors shrink to
    their total (priority 0.9), so the paused/draining line's short form and it both fit 80 columns."""
    budgeted = [d for d in s.datasets if d.token_budget]
    if not budgeted:
        return (1, Text())
    used = sum(d.completion_tokens for d in budgeted)
    budget = sum(d.token_budget or 0 for d in budgeted)
    full = max(((d.completion_tokens + d.reserved_tokens) / (d.token_budget or 1)) for d in budgeted)
    style = "bold red" if full >= 1 else "yellow" if full >= 0.9 else "bold"
    return (0.9, _t("tokens ", (f"{fmt_count(used)}/{fmt_count(budget)}", style), " budget"),
            (2, _t("tok ", (f"{fmt_count(used)}/{fmt_count(budget)}", style))))


def workers_text(s: RunSnapshot) -> Text:
    """``"workers 3"`` (the stream-worker processes), ``"workers 2/3"`` in red while one is down, and
    how many were replaced after dying (``"· 1 restarted"``) and how many are up but not answering
    (``"· 1 frozen"``, red); empty when the run has none."""
    if not s.stream_workers:
        return Text()
    down = s.stream_workers_alive < s.stream_workers
    t = _t("workers ", (f"{s.stream_workers_alive}/{s.stream_workers}" if down else f"{s.stream_workers}",
                        "bold red" if down else ""))
    if s.stream_worker_restarts:
        t.append(f" · {s.stream_worker_restarts} restarted", style="yellow")
    if s.stream_workers_frozen:
        t.append(f" · {s.stream_workers_frozen} frozen", style="bold red")
    return t


def eta_text(s: RunSnapshot) -> str:
    """The header's ETA: ``"--"`` with the state while the run does not progress (paused, stopping,
    draining: the ETA does not count down then), a range while calibrating, else one duration;
    ``"-- (why)"`` with the snapshot's short ``eta_reason`` while running without one."""
    if s.state in ("completed",):
        return "0s"
    reason = getattr(s, "eta_reason", "")
    if s.state not in ("running", "starting"):
        return f"-- ({reason or s.state})"
    text = range_text(s.eta_s, s.eta_s_low, s.eta_s_high, s.calibration, fmt_duration, short=True)
    if text == "--" and reason:
        return f"-- ({reason})"
    return text


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
