"""Headless progress lines: pure formatting of a :class:`~engine.report.snapshot.RunSnapshot`."""

from __future__ import annotations

from collections.abc import Iterable

from engine.metrics.rates import fmt_count, fmt_duration
from engine.report.snapshot import DatasetSnapshot, RunSnapshot


def dataset_line(d: DatasetSnapshot) -> str:
    """One line: done/total, req/s (recent 60 s window), errors, avg completion tokens, tokens, cost, ETA.

    Example: ``[b7] running 40/98 done, 1 failed, 12 in flight | 3.2 req/s (60s) | errors 4 |
    avg 412 tok | 16.5k tok | $0.0312 | ETA 18s``.
    """
    errs = sum(d.errors.values())
    budget = f"/{fmt_count(d.token_budget)}" if d.token_budget else ""
    parts = [
        f"[{d.name}] {d.state} {d.done}/{d.prompts} done, {d.failed} failed"
        + (f", {d.skipped} skipped" if d.skipped else "")
        + (f", {d.in_flight} in flight" if d.in_flight else ""),
        f"{d.req_per_s:.1f} req/s (60s)",
        f"errors {errs}" + (" (" + ", ".join(f"{k} {v}" for k, v in sorted(d.errors.items())) + ")" if errs else ""),
        f"avg {d.avg_completion_tokens:.0f} tok",
        f"{fmt_count(d.completion_tokens)}{budget} tok",
        f"${d.cost_usd:.4f}",
        f"ETA {fmt_duration(d.eta_s)}",
    ]
    line = " | ".join(parts)
    if d.state_reason and d.state in ("paused", "skipped"):
        line += f" | {d.state_reason}"
    return line


def format_notices(notices: Iterable[tuple[int, str]], after: int) -> tuple[list[str], int]:
    """Headless lines for the guard-pause notices numbered above ``after`` (see
    :attr:`engine.report.snapshot.RunSnapshot.notices`), and the last number seen.

    Example: ``(["GUARD: [b1] paused by a guard: anomaly guard: ... Resume: ..."], 3)``.
    """
    lines, last = [], after
    for seq, text in notices:
        if seq > after:
            lines.append(f"GUARD: {text}")
            last = max(last, seq)
    return lines, last


def format_progress(snap: RunSnapshot, printed_final: set[str], final: bool = False) -> list[str]:
    """Lines for datasets that started and are not finished; finished ones are printed once.

    ``printed_final`` is updated with datasets already reported as done/skipped. With ``final``
    every dataset is printed.
    """
    out = []
    for d in snap.datasets:
        if final:
            out.append(dataset_line(d))
        elif d.state in ("done", "skipped"):
            if d.name not in printed_final and (d.done or d.failed or d.skipped):
                printed_final.add(d.name)
                out.append(dataset_line(d))
        elif d.state != "pending" or d.in_flight:
            out.append(dataset_line(d))
    if not final and out:
        out.append(
            f"[run {snap.name}] {snap.state}{' (' + snap.state_reason + ')' if snap.state_reason else ''} | "
            f"{snap.in_flight} in flight | {snap.req_per_s:.1f} req/s | ${snap.cost_usd:.4f} | "
            f"elapsed {fmt_duration(snap.elapsed_s)}"
        )
    return out


def final_report(snap: RunSnapshot, store_path: object) -> list[str]:
    """The lines printed when a run ends, headless or after the dashboard closes: every dataset's
    :func:`dataset_line`, then ``run STATE[: REASON]; $COST spent; store PATH`` (cost in USD, 4 decimals).

    ``store_path``: the store's path (``str()`` is printed; ``"?"`` when there is none).
    Example last line: ``run done; $0.0312 spent; store runs/demo/store.sqlite``.
    """
    return [*format_progress(snap, set(), final=True),
            f"run {snap.state}{': ' + snap.state_reason if snap.state_reason else ''}; "
            f"${snap.cost_usd:.4f} spent; store {store_path}"]
