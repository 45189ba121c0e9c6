"""Pure text formatting shared by the panes (no Textual imports; unit-testable)."""

from __future__ import annotations

from engine.rates import fmt_count, fmt_duration

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


def bar_parts(done: int, skipped: int, total: int, width: int = 10) -> tuple[str, str, str]:
    """A three-part progress bar of ``width`` cells: ``(done, skipped, left)`` strings.

    ``done`` uses full blocks, ``skipped`` light shade (``░``), ``left`` dots; counts are prompts
    (``done`` = finished, stored or failed; ``skipped`` = counted as skipped; the rest is left).
    Without skipped prompts the bar has eighth-block resolution like :func:`bar` (and is never
    all full blocks while prompts are left); otherwise whole cells, a non-zero part always at
    least one (taken from the largest other part), so a dataset with 1 of 140 skipped or 1 left
    never reads as all done. ``total`` <= 0: all dots.
    """
    if total <= 0 or width <= 0:
        return "", "", "·" * max(width, 0)
    done, skipped = max(min(done, total), 0), max(min(skipped, total - max(done, 0)), 0)
    left = total - done - skipped
    if not skipped:  # done vs left only: eighth-block resolution, as :func:`bar`
        b = bar(done / total, width)
        filled = b.rstrip("·")
        if left and filled == "█" * width:
            filled = filled[:-1] + "▉"
        return filled, "", b[len(filled):]
    cells = [round(done / total * width), 0, 0]
    cells[1] = round((done + skipped) / total * width) - cells[0]
    cells[2] = width - cells[0] - cells[1]
    for i, n in enumerate((done, skipped, left)):
        if n > 0 and cells[i] == 0:
            j = max(range(3), key=lambda k: cells[k])
            if cells[j] > 1:
                cells[j] -= 1
                cells[i] += 1
    return "█" * cells[0], "░" * cells[1], "·" * cells[2]


def trim(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis noting the cut."""
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[: max(limit - 1, 0)] + "…"
