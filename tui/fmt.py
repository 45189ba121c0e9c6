"""Pure text formatting shared by the panes (no Textual imports; unit-testable)."""

from __future__ import annotations

from engine.api import fmt_count, fmt_duration

__all__ = ["bar", "bar_parts", "fmt_count", "fmt_duration", "money", "pct", "secs", "trim", "GIB"]

GIB = 1024**3
"""Bytes per GiB."""


def money(usd: float | None, digits: int | None = None) -> str:
    """Dollars: ``"--"`` for None; 4 decimals under $1, 2 from $1 (or ``digits`` decimals)."""
    if usd is None:
        return "--"
    if digits is None:
        digits = 4 if abs(usd) < 1 else 2
    return f"${usd:,.{digits}f}"


def pct(fraction: float | None) -> str:
    """A fraction (0.0-1.0) as a percentage: ``0.123 -> "12.3%"``; ``"--"`` for None."""
    if fraction is None:
        return "--"
    return f"{fraction * 100:.1f}%" if fraction < 0.1 else f"{fraction * 100:.0f}%"


def secs(s: float | None) -> str:
    """Seconds for latencies: ``0.0123 -> "12ms"``, ``2.54 -> "2.5s"``, ``12.3 -> "12s"``; ``"--"`` for None."""
    if s is None:
        return "--"
    if s < 1:
        return f"{s * 1000:.0f}ms"
    return f"{s:.1f}s" if s < 10 else f"{s:.0f}s"


def bar(fraction: float, width: int = 10) -> str:
    """A text progress bar of ``width`` cells with eighth-block resolution (fraction 0.0-1.0)."""
    f = min(max(fraction, 0.0), 1.0)
    eighths = int(round(f * width * 8))
    full, rem = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[rem] if rem and full < width else ""
    return ("█" * full + partial).ljust(width, "·")


def bar_parts(done: int, skipped: int, total: int, width: int = 10, failed: int = 0) -> tuple[str, str, str, str]:
    """A progress bar of ``width`` cells in four parts: ``(done, failed, skipped, left)`` strings.

    ``done`` and ``failed`` use full blocks (the caller colours them), ``skipped`` light shade
    (``░``), ``left`` dots; the arguments are prompt counts, the rest of ``total`` is left.
    Cells are proportional (cumulative rounding). Without skipped prompts and with too few failures
    for a cell, the bar has eighth-block resolution like :func:`bar` and is never all full blocks
    while prompts are left; otherwise skipped and left prompts get at least one cell each (taken
    from the largest part), so 1 of 140 skipped or left never reads as all done. ``total`` <= 0:
    all dots.
    """
    if total <= 0 or width <= 0:
        return "", "", "", "·" * max(width, 0)
    done = max(min(done, total), 0)
    failed = max(min(failed, total - done), 0)
    skipped = max(min(skipped, total - done - failed), 0)
    counts = (done, failed, skipped, total - done - failed - skipped)
    cells, acc = [], 0
    for n in counts:  # cumulative rounding: the parts always sum to ``width``
        prev = round(acc / total * width)
        acc += n
        cells.append(round(acc / total * width) - prev)
    if not skipped and not cells[1]:  # done vs left (failures too few for a cell): eighth blocks
        b = bar((done + failed) / total, width)
        filled = b.rstrip("·")
        if counts[3] and filled == "█" * width:
            filled = filled[:-1] + "▉"
        return filled, "", "", b[len(filled):]
    for i in (2, 3):  # skipped or left prompts never vanish into a full bar
        if counts[i] > 0 and cells[i] == 0:
            j = max(range(4), key=lambda k: cells[k])
            if cells[j] > 1:
                cells[j] -= 1
                cells[i] += 1
    return "█" * cells[0], "█" * cells[1], "░" * cells[2], "·" * cells[3]


def trim(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis noting the cut."""
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[: max(limit - 1, 0)] + "…"
