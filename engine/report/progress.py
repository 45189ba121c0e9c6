"""Headless progress lines: pure formatting of a :class:`~engine.report.snapshot.RunSnapshot`."""

from __future__ import annotations

from collections.abc import Callable, Iterable

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


def ends_text(snap: RunSnapshot) -> str:
    """When the streams in flight are expected to have ended (:attr:`RunSnapshot.drain`), e.g.
    ``"all end in ~33m20s"``; ``"end unknown (measuring rate)"`` before any stream rate is known;
    "" without an outlook."""
    o = snap.drain
    if o is None:
        return ""
    if o.expected_s is None:
        return "end unknown (measuring rate)"
    return f"all end in ~{fmt_duration(o.expected_s)}"


def abort_at_end_text(snap: RunSnapshot, fmt: Callable[[float], str] = lambda usd: f"${usd:.4f}") -> str:
    """What the abort at the end of a drain's countdown would cut and bill, e.g. ``"~310 cut, est.
    $2.1000"`` (a figure under 0.5 streams reads ``"~0 cut"``; ``fmt`` formats the USD); while no stream
    rate is known, the abort of everything in flight now (``"up to 1,222 cut, est. up to $8.8500"``);
    "" while no drain runs or with no outlook."""
    o = snap.drain
    if o is None or o.deadline_s is None:
        return ""
    if o.expected_s is None:
        return f"up to {o.streams:,} cut, est. up to {fmt(snap.abort_cost_usd)}"
    return f"~{o.cut_streams:,.0f} cut, est. {fmt(o.abort_usd)}"


def abort_hint(snap: RunSnapshot) -> str:
    """How to abort the streams in flight from a shell: ``"datagen ctl RUN_DIR abort"``."""
    return f"datagen ctl {snap.run_dir or 'RUN_DIR'} abort"


def streaming_note(snap: RunSnapshot) -> str:
    """While the run is paused or draining with streams in flight: the dollars still streaming and how
    to stop them, e.g. ``"$8.8500 still streaming in 1,222 stream(s), all end in ~33m20s; abort them:
    datagen ctl runs/x abort"``; "" otherwise (nothing in flight, or the run neither paused nor draining)."""
    if not snap.in_flight or (snap.state != "paused" and snap.drain_left_s is None):
        return ""
    ends = ends_text(snap)
    return (f"${snap.cost_in_flight_usd:.4f} still streaming in {snap.in_flight:,} stream(s)"
            + (f", {ends}" if ends else "") + f"; abort them: {abort_hint(snap)}")


def format_progress(snap: RunSnapshot, printed_final: set[str], final: bool = False) -> list[str]:
    """Lines for datasets that started and are not finished; finished ones are printed once; then
    the run's line (with :func:`streaming_note` while paused: the headless drain has its own line).

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
            + (f" | {note}" if (note := streaming_note(snap)) and snap.drain_left_s is None else "")
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
