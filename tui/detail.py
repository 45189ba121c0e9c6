"""The detail view of one dataset: everything the table and panes cut, in full.

Opened with ``i`` (binding id ``dashboard.details``, remappable through ``DATAGEN_KEYS``) on the
selected dataset. It shows the full state reason, every count, tokens and money with their
limits, the current limits of every request class (concurrency, in flight, max tokens), the
errors of the dataset by class with the latest message of each, and its latest log lines. It
re-reads the app's current snapshot twice a second while open. The run's latest warnings and
errors that name no dataset (a provider excluded, a store failing) follow, then, once any provider
was judged, the evidence of each provider's fidelity verdict (:func:`tui.fidelity.fidelity_section`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Label, Static

from engine.api import DatasetSnapshot, RunSnapshot, progress_percent
from tui.fidelity import fidelity_section
from tui.fmt import fmt_count, money
from tui.panes.datasets import eta_cell
from tui.panes.log import styled_line

LOG_LINES = 12
"""Latest log lines of the dataset shown."""

RUN_LINES = 6
"""Latest run-wide warnings and errors shown (lines of no dataset)."""

_RUN_PROBLEM = re.compile(r"^\S+ (WARNING|ERROR|CRITICAL)\s+(?!\[)")


LIMIT_EXPLAINED = {
    "budget-limited": " (in flight / class slots): its token budget holds dispatch below the class's concurrency, "
                      "so the tokens reserved in flight never take it past the budget",
}
"""What a ``limit_reason`` (by its first word) means, after it in the detail view."""


def _row(t: Text, label: str, *parts: tuple[str, str] | str) -> None:
    t.append(f"\n{label:<10}", style="bold")
    for p in parts:
        t.append(*(p if isinstance(p, tuple) else (p,)))


def dataset_log_lines(name: str, lines: Iterable[str], limit: int = LOG_LINES) -> list[str]:
    """The last ``limit`` of ``lines`` that concern dataset ``name`` (they carry ``[name]``), in
    order, each once."""
    tag = f"[{name}]"
    out: list[str] = []
    seen: set[str] = set()
    for line in lines:
        if tag in line and line not in seen:
            seen.add(line)
            out.append(line)
    return out[-limit:]


def run_problem_lines(lines: Iterable[str], limit: int = RUN_LINES) -> list[str]:
    """The last ``limit`` WARNING/ERROR lines of ``lines`` that name no dataset (``[name]``), each once."""
    out: list[str] = []
    for line in lines:
        if _RUN_PROBLEM.match(line) and line not in out:
            out.append(line)
    return out[-limit:]


def detail_text(d: DatasetSnapshot, snap: RunSnapshot, cls: str = "", log_lines: Iterable[str] = ()) -> Text:
    """The detail view of dataset ``d`` in run snapshot ``snap``.

    Args:
        d: the dataset (one of ``snap.datasets``).
        snap: the run snapshot (classes, run-wide latest error messages, events, providers' fidelity).
        cls: the request class most of the dataset's remaining prompts use (marked in the limits).
        log_lines: log lines shown so far (the log pane's); the dataset's are picked from these and
            from ``snap.events``.

    Nothing is trimmed: long reasons, messages and log lines wrap.
    """
    t = Text()
    t.append(d.name, style="bold")
    t.append(f"  {d.state}", style="bold yellow" if d.state == "paused" else "")
    _row(t, "reason", (d.state_reason or "--", "yellow" if d.state_reason else "dim"))
    if d.limit_reason:  # the table's reason cell shows it (cut) when the dataset has no state reason
        _row(t, "limit", (d.limit_reason, "yellow"), (LIMIT_EXPLAINED.get(d.limit_reason.split(" ")[0], ""), "dim"))
    finished = d.done + d.failed
    pct = f"{progress_percent(finished, d.prompts)}%" if d.prompts else "--"  # rounded down, as the row
    _row(t, "prompts", f"{d.prompts:,} valid, {d.rejected:,} rejected at ingest")
    _row(t, "progress", f"{d.done:,} done, {d.failed:,} failed, {d.skipped:,} skipped, {d.pending:,} pending, "
                        f"{d.in_flight:,} in flight ({pct} finished)")
    budget = f"{d.token_budget:,}" if d.token_budget else "none"
    _row(t, "tokens", f"completion {d.completion_tokens:,} of budget {budget}, reserved {d.reserved_tokens:,}; "
                      f"prompt {d.prompt_tokens:,}, reasoning {d.reasoning_tokens:,}")
    _row(t, "cost", f"{money(d.cost_usd)} of cap {money(d.max_cost_usd, 2) if d.max_cost_usd is not None else 'none'}"
                    f", projected {'capped at ' if d.projection_capped else ''}{money(d.projected_cost_usd)}")
    eta = eta_cell(d, label=True)[0] or "--"  # the table's text (a range while calibrating)
    _row(t, "speed", f"{d.req_per_s:.2f} req/s (60 s), {d.req_per_s_since_start:.2f} since start; "
                     f"{fmt_count(d.tok_per_s)} tok/s; ETA {eta}; avg {d.avg_completion_tokens_recent:.0f} tok "
                     f"recent, {d.avg_completion_tokens:.0f} all")

    t.append("\n\nlimits", style="bold underline")
    for c in snap.classes:
        mark = "  <- this dataset's class" if c.name == cls else ""
        paused = " (0: dispatch paused)" if c.concurrency == 0 else ""
        _row(t, f"  {c.name}", f"concurrency {c.concurrency:,}{paused}, {c.in_flight:,} in flight, "
                               f"max_tokens {c.max_tokens:,}", (mark, "cyan"))
    _row(t, "  budget", f"tokens {budget}; dataset cap "
                        f"{money(d.max_cost_usd, 2) if d.max_cost_usd is not None else 'none'}; run cap "
                        f"{money(snap.max_cost_usd, 2) if snap.max_cost_usd is not None else 'none'}")

    t.append("\n\nerrors by class", style="bold underline")
    t.append("  (this dataset's failed attempts; latest message of the class, run-wide)", style="dim")
    if not d.errors:
        t.append("\n  none", style="green")
    for name, n in sorted(d.errors.items(), key=lambda kv: (-kv[1], kv[0])):
        t.append(f"\n  {name:<12}", style="red")
        t.append(f"{n:>6,}  ")
        t.append(snap.latest_errors.get(name, ""))

    t.append("\n\nlatest log lines", style="bold underline")
    lines = dataset_log_lines(d.name, [*log_lines, *snap.events])
    if not lines:
        t.append("\n  none yet", style="dim")
    for line in lines:
        t.append("\n")
        t.append_text(styled_line(line))
    run_lines = run_problem_lines([*log_lines, *snap.events])
    if run_lines:
        t.append("\n\nlatest run warnings and errors", style="bold underline")
        for line in run_lines:
            t.append("\n")
            t.append_text(styled_line(line))
    if (fid := fidelity_section(snap.providers)) is not None:
        t.append_text(fid)
    return t


class DetailScreen(ModalScreen[None]):
    """The detail view of dataset ``name``; ``render`` returns its current text (None when the
    dataset is gone). Escape, ``q`` or ``i`` close it; arrows and Page Up/Down scroll it."""

    DEFAULT_CSS = """
    DetailScreen { align: center middle; }
    DetailScreen > Vertical {
        width: 90%; max-width: 120; height: auto; max-height: 90%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    DetailScreen .title { text-style: bold; }
    DetailScreen VerticalScroll { height: auto; max-height: 100%; }
    """
    BINDINGS = [Binding("escape,q,i", "close", "Close", id="detail.close")]

    def __init__(self, name: str, render: Callable[[], Text | None], refresh_s: float = 0.5) -> None:
        super().__init__()
        self.dataset = name
        self._render_text = render
        self._refresh_s = refresh_s
        self._last: tuple | None = None

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"dataset {self.dataset}  (esc closes)", classes="title")
            with VerticalScroll():
                yield Static(id="detail-body")
        yield Footer()  # the view's own keys (the dashboard's footer sits under this screen)

    def on_mount(self) -> None:
        self._update()
        self.query_one(VerticalScroll).focus()
        self.set_interval(self._refresh_s, self._update, name="detail")

    def _update(self) -> None:
        text = self._render_text()
        if text is None:
            text = Text(f"dataset {self.dataset} is no longer in the run", style="dim")
        key = (text.plain, tuple(text.spans))
        if key != self._last:
            self._last = key
            self.query_one("#detail-body", Static).update(text)

    def action_close(self) -> None:
        self.dismiss(None)


__all__ = ["DetailScreen", "dataset_log_lines", "detail_text", "run_problem_lines"]
