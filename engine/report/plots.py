"""The charts of ``datagen report``: :func:`engine.report.runreport.gather`'s figures -> PNG bytes.

matplotlib is imported here, lazily (:func:`matplotlib_api`), on matplotlib's Agg backend through its
object API (``Figure`` + ``FigureCanvasAgg``: no pyplot, no global figure state, no display), so
no other command loads it. Without matplotlib, :func:`matplotlib_api` raises :class:`ReportError` naming the
``report`` extra. Each function returns one PNG (bytes, deterministic: no metadata) or None when
its data is absent (``*_figure``: the ``Figure`` it is drawn from). Legends never cover the data:
beside or above the plot, or inside with the y range raised above it. Units: seconds, tokens, USD.
"""

from __future__ import annotations

import io
from itertools import pairwise
from typing import Any

from engine.report.runreport import ReportError
from engine.report.series import time_unit

#: Figure width (inches) and resolution: 1,100 px wide, within the page's 1,140 px column.
WIDTH_IN, DPI = 11.0, 100
#: Colours of the outcomes (matplotlib's tab10 otherwise).
VALID, INVALID = "#2ca02c", "#d62728"


def matplotlib_api() -> tuple[Any, Any]:
    """``(Figure, FigureCanvasAgg)``, imported on first use.

    Raises:
        ReportError: matplotlib is not installed.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ReportError(f"datagen report draws its charts with matplotlib, which is not installed ({e}): "
                          "install the `report` extra, pip install 'eagle-datagen[report]'") from None
    return Figure, FigureCanvasAgg


def _figure(height_in: float, rows: int = 1, cols: int = 1, **kw: Any) -> tuple[Any, Any]:
    Figure, FigureCanvasAgg = matplotlib_api()
    fig = Figure(figsize=(WIDTH_IN, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)  # attached now: legends are measured before the final draw (_legends_above_data)
    axes = fig.subplots(rows, cols, squeeze=False, **kw)
    return fig, axes


def _legends_above_data(fig: Any, axes: list[Any]) -> None:
    """Raise each axis' y range until its legend (placed inside, at the top) sits above every bar:
    the legend's height is measured on a laid-out draw and the data (bar tops, ``dataLim``) kept in
    the part of the axes below it. Lines across the whole height (``axvline``) still pass under it."""
    fig.canvas.draw()
    for a in axes:
        leg = a.get_legend()
        if leg is None:
            continue
        box, frame = leg.get_window_extent(), a.get_window_extent()
        free = (box.y0 - frame.y0) / frame.height  # the axes' fraction below the legend
        lo, hi = a.get_ylim()
        top = a.dataLim.y1
        if free > 0.2 and top > lo:
            a.set_ylim(lo, max(hi, lo + (top - lo) / (free * 0.96)))


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _legend(fig: Any, a: Any, twin: Any) -> None:
    """One legend for an axis and its twin, above the axes (clear of the data)."""
    h1, l1 = a.get_legend_handles_labels()
    h2, l2 = twin.get_legend_handles_labels()
    fig.legend(h1 + h2, l1 + l2, loc="outside upper right", ncols=len(h1 + h2), fontsize="small")


def _x(tl: dict[str, Any]) -> tuple[list[float], str, float]:
    """Bin centres in the time unit that suits the run's span, its label and the bar width."""
    unit, per = time_unit(tl["t1"] - tl["t0"])
    w = tl["bin_s"] / per
    return [(i + 0.5) * w for i in range(tl["bins"])], f"time since the first request ({unit})", w


def throughput_spend(tl: dict[str, Any] | None) -> bytes | None:
    """Completions/s and completion tokens/s per bin (top), spend so far in USD (bottom)."""
    if tl is None:
        return None
    fig, ax = _figure(5.2, 2, 1, sharex=True)
    xs, xlabel, w = _x(tl)
    top, bottom = ax[0][0], ax[1][0]
    rate = [c / tl["bin_s"] for c in tl["completions"]]
    top.bar(xs, rate, width=w * 0.9, color="#1f77b4", label="completions/s")
    top.set_ylabel("completions/s")
    tok = top.twinx()
    tok.plot(xs, [k / tl["bin_s"] for k in tl["completion_tokens"]], color="#ff7f0e", marker=".",
             label="completion tokens/s")
    tok.set_ylabel("completion tokens/s")
    top.set_title(f"Throughput (bins of {tl['bin_s']:g} s)")
    _legend(fig, top, tok)
    edges = [(i + 1) * w for i in range(tl["bins"])]
    bottom.step([0.0] + edges, [0.0] + tl["spend_usd_cum"], where="pre", color="#9467bd")
    bottom.fill_between([0.0] + edges, [0.0] + tl["spend_usd_cum"], step="pre", color="#9467bd", alpha=0.2)
    bottom.set_ylabel("spent (USD)")
    bottom.set_xlabel(xlabel)
    bottom.set_title(f"Spend so far: ${tl['spend_usd_cum'][-1]:,.4f} (results, failed and aborted attempts)")
    return _png(fig)


def errors(tl: dict[str, Any] | None) -> bytes | None:
    """Failed attempts per bin, stacked by error class; None when there were none."""
    fig = errors_figure(tl)
    return None if fig is None else _png(fig)


def errors_figure(tl: dict[str, Any] | None) -> Any:
    """The matplotlib ``Figure`` of :func:`errors` (None without errors)."""
    if tl is None or not tl["errors"]:
        return None
    fig, ax = _figure(3.2)
    a = ax[0][0]
    xs, xlabel, w = _x(tl)
    base = [0.0] * tl["bins"]
    for cls, counts in tl["errors"].items():
        a.bar(xs, counts, width=w * 0.9, bottom=base, label=f"{cls} ({sum(counts):.0f})")
        base = [b + c for b, c in zip(base, counts, strict=True)]
    a.set_ylabel(f"errors per {tl['bin_s']:g} s")
    a.set_xlabel(xlabel)
    a.set_title("Errors by class (failed attempts, retried or final)")
    a.legend(loc="upper right", fontsize="small", ncols=min(4, len(tl["errors"])))
    _legends_above_data(fig, [a])
    return fig


def lengths(items: list[dict[str, Any]]) -> bytes | None:
    """One histogram of completion lengths per dataset with, per class, the configured percentile
    (dashed), the reservation the next request holds (solid) and ``max_tokens`` (dotted, when it
    falls inside the plotted range); each legend above the bars (:func:`_legends_above_data`)."""
    fig = lengths_figure(items)
    return None if fig is None else _png(fig)


def lengths_figure(items: list[dict[str, Any]]) -> Any:
    """The matplotlib ``Figure`` of :func:`lengths` (None without items)."""
    if not items:
        return None
    cols = 2 if len(items) > 1 else 1
    rows = (len(items) + cols - 1) // cols
    fig, ax = _figure(2.6 * rows + 0.3, rows, cols)
    for i, it in enumerate(items):
        a = ax[i // cols][i % cols]
        h = it["hist"]
        widths = [b - a_ for a_, b in pairwise(h["edges"])]
        a.bar(h["edges"][:-1], h["counts"], width=widths, align="edge", color="#1f77b4", alpha=0.75)
        hi = h["edges"][-1] if h["edges"] else 1.0
        for j, c in enumerate(it["classes"]):
            colour = ("#d62728", "#2ca02c", "#9467bd", "#8c564b")[j % 4]
            pt, res = c["percentile_tokens"], c["reservation"]
            tag = f" ({c['class']})" if len(it["classes"]) > 1 else ""
            if pt is not None:
                a.axvline(pt, color=colour, linestyle="--", label=f"p{100 * c['percentile']:g} = {pt:,.0f}{tag}")
            label = (f"reserved p{100 * res['q']:.1f} = {res['tokens']:,}" if res["q"] is not None
                     else f"reserved {res['tokens']:,} ({res['basis'].split(' (')[0]})")
            if res["tokens"] <= 1.5 * hi:
                a.axvline(res["tokens"], color=colour, linestyle="-", linewidth=2, label=label + tag)
            else:
                a.plot([], [], color=colour, linestyle="-", linewidth=2, label=label + tag + " (off the axis)")
            if c["max_tokens"] <= 1.5 * hi and c["max_tokens"] != res["tokens"]:
                a.axvline(c["max_tokens"], color=colour, linestyle=":", label=f"max_tokens {c['max_tokens']:,}{tag}")
        a.set_title(f"{it['dataset']}: {it['n']:,} completion{'s' if it['n'] != 1 else ''}, mean {it['mean']:,.0f} tokens",
                    fontsize="medium")
        a.set_xlabel("completion tokens")
        a.set_ylabel("completions")
        a.legend(fontsize="x-small", loc="upper right")
    for k in range(len(items), rows * cols):
        ax[k // cols][k % cols].set_visible(False)
    _legends_above_data(fig, [ax[i // cols][i % cols] for i in range(len(items))])
    return fig


def validation_outcomes(val: dict[str, Any] | None) -> bytes | None:
    """Per provider: valid records, and invalid ones split by their first failed check (the legend
    beside the bars)."""
    fig = validation_figure(val)
    return None if fig is None else _png(fig)


def validation_figure(val: dict[str, Any] | None) -> Any:
    """The matplotlib ``Figure`` of :func:`validation_outcomes` (None without validated records)."""
    if val is None or not val["summary"]["providers"]:
        return None
    provs = val["summary"]["providers"]
    names = list(provs)
    fig, ax = _figure(0.5 * len(names) + 1.6)
    a = ax[0][0]
    ys = list(range(len(names)))
    ok = [provs[n]["ok"] for n in names]
    a.barh(ys, ok, color=VALID, label="valid")
    left = list(ok)
    checks = sorted({c for d in val["invalid_by_first_check"].values() for c in d})
    for j, check in enumerate(checks):
        counts = [val["invalid_by_first_check"].get(n, {}).get(check, 0) for n in names]
        a.barh(ys, counts, left=left, color=("#d62728", "#ff7f0e", "#e377c2", "#8c564b", "#7f7f7f")[j % 5],
               label=f"invalid: {check}")
        left = [x + c for x, c in zip(left, counts, strict=True)]
    for y, n in zip(ys, names, strict=True):
        d = provs[n]
        a.text(left[y], y, f"  {d['ok']}/{d['records']} valid", va="center", fontsize="small")
    a.set_yticks(ys, names)
    a.invert_yaxis()
    a.set_xlim(0, max(left) * 1.25 if max(left) else 1)
    a.set_xlabel("validated records")
    a.set_title("Validation outcomes per provider (invalid records by their first failed check)")
    a.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize="small")  # beside the bars
    return fig


def billing(val: dict[str, Any] | None) -> bytes | None:
    """Histogram of the billing difference (rebuilt completion length minus billed completion
    tokens) over the billed, untruncated records."""
    if val is None or not val["billing_diffs"]:
        return None
    diffs = {int(k): n for k, n in val["billing_diffs"].items()}
    b = val["summary"]["billing"]
    fig, ax = _figure(3.0)
    a = ax[0][0]
    xs = sorted(diffs)
    a.bar(xs, [diffs[x] for x in xs], width=0.8 if len(xs) < 60 else (xs[-1] - xs[0] + 1) / 60, color="#17becf")
    if len(xs) < 12:
        a.set_xticks(xs)
    a.set_xlim(min(xs) - 2, max(xs) + 2)
    a.set_xlabel("billing difference (tokens): rebuilt completion length - billed completion tokens")
    a.set_ylabel("records")
    mean = "-" if b["mean"] is None else f"{b['mean']:+.2f}"
    a.set_title(f"Billing difference over {b['rows']:,} billed, untruncated records: {b['exact']:,} exact, mean {mean}")
    return _png(fig)


def extraction(ex: dict[str, Any] | None) -> bytes | None:
    """Samples (and tokens) committed by the extraction over time, from its manifest."""
    if ex is None or not ex["timeline"]["t"]:
        return None
    t = ex["timeline"]["t"]
    t0 = min(t)
    unit, per = time_unit(max(t) - t0)
    xs = [(x - t0) / per for x in t]
    fig, ax = _figure(3.0)
    a = ax[0][0]
    a.step(xs, ex["timeline"]["samples_cum"], where="post", color="#1f77b4", label="samples")
    a.set_ylabel("samples committed")
    total = (ex.get("status") or {}).get("samples_total") or 0
    if total:
        a.axhline(total, color="#7f7f7f", linestyle=":", label=f"samples to extract {total:,}")
    tok = a.twinx()
    tok.step(xs, ex["timeline"]["tokens_cum"], where="post", color="#ff7f0e", label="tokens")
    tok.set_ylabel("tokens committed")
    _legend(fig, a, tok)
    a.set_xlabel(f"time since the first commit ({unit})")
    a.set_title(f"Extraction progress ({ex['timeline']['samples_cum'][-1]:,.0f} samples in the manifest)")
    return _png(fig)


def all_charts(figs: dict[str, Any]) -> dict[str, bytes | None]:
    """Every chart of the report, by section id."""
    tl, val = figs["timeline"], figs["validation"]
    return {"throughput": throughput_spend(tl), "lengths": lengths(figs["lengths"]), "errors": errors(tl),
            "validation": validation_outcomes(val), "billing": billing(val), "extraction": extraction(figs["extraction"])}
