"""The HTML page of ``datagen report``: figures and charts -> one self-contained file.

No external URL, no script, no web font: charts are embedded as ``data:image/png;base64`` images
and the style sheet is inline, so the file opens from anywhere (a mail attachment, a laptop
without the run directory). Every figure of the status tables carries the value
``datagen status --json`` has for it: ``data-path`` (a JSON list of keys into that document, a list
entry found by its ``name``, an endpoint by its ``url``) and ``data-value`` (the value, JSON), next to
the human-readable text.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
from html import escape
from pathlib import Path
from typing import Any

from engine.metrics.rates import fmt_duration
from engine.report.fidelityreport import fidelity_html

#: The run-level figures of the status table: (label, path into the status document, format).
RUN_ROWS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("state", ("run", "state"), "text"), ("state reason", ("run", "state_reason"), "text"),
    ("elapsed", ("run", "elapsed_s"), "duration"), ("spent", ("totals", "cost_usd"), "usd"),
    ("lost (no result)", ("totals", "lost_cost_usd"), "usd"), ("spend rate ($/h)", ("spend_rate_usd_per_h",), "usd"),
    ("projected total", ("projected_total_cost_usd",), "usd"), ("credits", ("credits_usd",), "usd"),
    ("ETA", ("eta_s",), "duration"), ("prompts", ("totals", "prompts"), "int"), ("done", ("totals", "done"), "int"),
    ("failed", ("totals", "failed"), "int"), ("skipped", ("totals", "skipped"), "int"),
    ("pending", ("totals", "pending"), "int"), ("in flight", ("totals", "in_flight"), "int"),
    ("rejected rows", ("totals", "rejected"), "int"), ("prompt tokens", ("totals", "prompt_tokens"), "int"),
    ("completion tokens", ("totals", "completion_tokens"), "int"),
    ("reasoning tokens", ("totals", "reasoning_tokens"), "int"), ("errors", ("totals", "errors"), "errors"),
)
#: The first :data:`RUN_SPLIT` rows (state, money, time) and the rest (counts) go side by side.
RUN_SPLIT = 9
#: Per-dataset columns: (heading, key, format).
DATASET_COLS = (("state", "state", "text"), ("prompts", "prompts", "int"), ("done", "done", "int"),
                ("failed", "failed", "int"), ("skipped", "skipped", "int"), ("pending", "pending", "int"),
                ("in flight", "in_flight", "int"), ("rejected", "rejected", "int"),
                ("completion tok", "completion_tokens", "int"), ("budget", "token_budget", "int"),
                ("cost", "cost_usd", "usd"), ("errors", "errors", "errors"))
PROVIDER_COLS = (("requests", "requests", "int"), ("error rate", "error_rate", "pct"),
                 ("latency p50", "latency_p50_s", "secs"), ("latency p95", "latency_p95_s", "secs"),
                 ("tok/s/stream", "tok_per_s_per_stream", "num"), ("cost", "cost_usd", "usd"),
                 ("wire flags", "flags", "errors"))
#: Per-endpoint columns (several ``[provider] base_urls``; status ``endpoints``): (heading, key, format).
ENDPOINT_COLS = (("state", "state", "text"), ("reason", "reason", "text"), ("in flight", "in_flight", "int"),
                 ("cap", "concurrency", "int"), ("requests", "requests", "int"), ("errors", "errors", "errors"),
                 ("error rate", "error_rate", "pct"), ("latency p50", "latency_p50_s", "secs"),
                 ("latency p95", "latency_p95_s", "secs"), ("tok/s", "tok_per_s", "num"),
                 ("completion tok", "completion_tokens", "int"), ("in state", "state_for_s", "duration"))
EXTRACT_ROWS = (("state", "state", "text"), ("samples done", "samples_done", "int"),
                ("samples total", "samples_total", "int"), ("tokens done", "tokens_done", "int"),
                ("tokens total", "tokens_total", "int"), ("in the manifest", "manifest_samples", "int"))

STYLE = """
body { font: 14px/1.45 "DejaVu Sans", Arial, sans-serif; color: #222; margin: 0; background: #fff; }
main { max-width: 1140px; margin: 0 auto; padding: 16px 20px 40px; }
h1 { font-size: 22px; margin: 8px 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; }
p.meta { color: #555; margin: 0 0 12px; } p.note { color: #555; font-style: italic; }
table { border-collapse: collapse; margin: 6px 0 12px; } th, td { padding: 2px 10px; border-bottom: 1px solid #eee; }
th { text-align: left; background: #f5f5f5; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
img { display: block; max-width: 100%; margin: 4px 0 8px; }
.grid { display: flex; gap: 28px; flex-wrap: wrap; align-items: flex-start; }
"""


def fmt(value: Any, kind: str) -> str:
    """A figure as text: ``usd`` ($0.0123 / $12.34), ``int`` (1,234), ``duration`` (12m05s),
    ``pct``, ``secs``, ``num``, ``errors`` (``class n, ...``), ``text``; ``--`` for None."""
    if value is None:
        return "--"
    if kind == "usd":
        return f"${value:,.4f}" if abs(value) < 1 else f"${value:,.2f}"
    if kind == "int":
        return f"{value:,}"
    if kind == "duration":
        return fmt_duration(value)
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "secs":
        return f"{value:.2f}s"
    if kind == "num":
        return f"{value:,.1f}"
    if kind == "errors":
        return ", ".join(f"{k} {v}" for k, v in sorted(value.items())) or "none"
    return str(value) or "-"


def _cell(path: list[str], value: Any, kind: str, tag: str = "td", note: str = "") -> str:
    cls = ' class="n"' if kind not in ("text", "errors") else ""
    return (f'<{tag}{cls} data-path="{escape(json.dumps(path))}" data-value="{escape(json.dumps(value))}">'
            f"{escape(fmt(value, kind) + note)}</{tag}>")


def credits_age_note(st: dict[str, Any]) -> str:
    """After the credits figure, how old the reading was when the report was written:
    ``" (read 14s before this report)"``; empty without a reading or an age."""
    age = st.get("credits_age_s")
    if st.get("credits_usd") is None or age is None:
        return ""
    return f" (read {fmt_duration(age)} before this report)"


def row_note(st: dict[str, Any], path: tuple[str, ...]) -> str:
    """What follows a run figure of the status table: the credits reading's age, ``" (capped at the
    run's max_cost_usd)"`` after a projection clamped at the cap (spend cannot pass it), ``" (why)"``
    after an ETA that is not known (``run.eta_reason``)."""
    if path == ("credits_usd",):
        return credits_age_note(st)
    if path == ("projected_total_cost_usd",) and st.get("projection_capped"):
        return " (capped at the run's max_cost_usd)"
    if path == ("eta_s",) and st.get("eta_s") is None and (st.get("run") or {}).get("eta_reason"):
        return f" ({st['run']['eta_reason']})"
    return ""


def _get(doc: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = doc
    for k in path:
        value = value.get(k) if isinstance(value, dict) else None
    return value


def status_tables(st: dict[str, Any]) -> str:
    """The status figures as tables (run, datasets, providers and, with several endpoints, one row per
    endpoint), each cell with ``data-path``/``data-value``."""
    out = ['<div class="grid">']
    for tid, rows in (("status-run", RUN_ROWS[:RUN_SPLIT]), ("status-counts", RUN_ROWS[RUN_SPLIT:])):
        out.append(f'<table id="{tid}">')
        out += [f"<tr><th>{escape(label)}</th>"
                f"{_cell(list(path), _get(st, path), kind, note=row_note(st, path))}"
                "</tr>" for label, path, kind in rows]
        out.append("</table>")
    out.append("</div>")
    out.append('<table id="status-datasets"><tr><th>dataset</th>' + "".join(f"<th>{h}</th>" for h, _, _ in DATASET_COLS) + "</tr>")
    for d in st["datasets"] + [dict(st["totals"], name="TOTAL")]:
        root = ["totals"] if d["name"] == "TOTAL" else ["datasets", d["name"]]
        cells = "".join(_cell(root + [k], d.get(k), kind) if k in d else "<td></td>" for _, k, kind in DATASET_COLS)
        out.append(f"<tr><th>{escape(d['name'])}</th>{cells}</tr>")
    out.append("</table>")
    if st.get("providers"):
        out.append('<table id="status-providers"><tr><th>provider</th>' + "".join(f"<th>{h}</th>" for h, _, _ in PROVIDER_COLS) + "</tr>")
        for p in st["providers"]:
            out.append(f"<tr><th>{escape(p['name'])}</th>"
                       + "".join(_cell(["providers", p["name"], k], p.get(k), kind) for _, k, kind in PROVIDER_COLS) + "</tr>")
        out.append("</table>")
    if st.get("endpoints"):
        out.append('<table id="status-endpoints"><tr><th>endpoint</th>'
                   + "".join(f"<th>{h}</th>" for h, _, _ in ENDPOINT_COLS) + "</tr>")
        for e in st["endpoints"]:
            out.append(f"<tr><th>{escape(e['url'])}</th>"
                       + "".join(_cell(["endpoints", e["url"], k], e.get(k), kind) for _, k, kind in ENDPOINT_COLS)
                       + "</tr>")
        out.append("</table>")
    return "\n".join(out)


def _img(png: bytes | None, alt: str, missing: str) -> str:
    if png is None:
        return f'<p class="note">{escape(missing)}</p>'
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def _td(c: Any) -> str:
    if isinstance(c, (int, float)) and not isinstance(c, bool):
        return f'<td class="n">{c:,}</td>'
    return f"<td>{escape(str(c))}</td>"


def _table(head: list[str], rows: list[list[Any]], tid: str) -> str:
    h = "".join(f"<th>{escape(x)}</th>" for x in head)
    body = "".join("<tr>" + "".join(_td(c) for c in r) + "</tr>" for r in rows)
    return f'<table id="{tid}"><tr>{h}</tr>{body}</table>'


def _lengths_table(items: list[dict[str, Any]]) -> str:
    rows = []
    for it in items:
        for c in it["classes"]:
            r = c["reservation"]
            pt = c["percentile_tokens"]
            rows.append([it["dataset"], c["class"], c["n"], f"p{100 * c['percentile']:g}",
                         "--" if pt is None else int(pt), r["tokens"], r["basis"], c["max_tokens"]])
    return _table(["dataset", "class", "completions", "percentile", "its tokens", "reserved", "reservation basis",
                   "max_tokens"], rows, "lengths")


def _validation_html(val: dict[str, Any] | None, charts: dict[str, bytes | None]) -> str:
    if val is None:
        return '<p class="note">No validation: the run has no [tokenizer] and `datagen validate` was not run.</p>'
    s = val["summary"]
    rows = [[n, d["records"], d["ok"], d["invalid"], ", ".join(f"{k} {v}" for k, v in d["checks"].items() if v) or "-"]
            for n, d in s["providers"].items()]
    b = s["billing"]
    mean = "-" if b["mean"] is None else f"{b['mean']:+.3f}"
    return "\n".join([
        f"<p>{s['ok']:,} of {s['records']:,} validated records valid, {s['unvalidated']:,} not validated yet.</p>",
        _img(charts["validation"], "validation outcomes per provider", "No validated record yet."),
        _table(["provider", "records", "valid", "invalid", "failed checks"], rows, "validation-providers"),
        f"<p>Billing difference (validation's <code>billing_diff</code>: rebuilt completion length minus the billed "
        f"completion tokens) over {b['rows']:,} billed, untruncated records: {b['exact']:,} exact, mean {mean}, "
        f"p99 |diff| {b['p99_abs'] if b['p99_abs'] is not None else '-'}.</p>",
        _img(charts["billing"], "billing difference histogram", "No billed, untruncated validated record."),
    ])


def _extraction_html(ex: dict[str, Any] | None, charts: dict[str, bytes | None]) -> str:
    if ex is None:
        return '<p class="note">No extraction linked to this run (no extract.json, nothing in RUN_DIR/extract).</p>'
    st = ex.get("status") or {}
    rows = "".join(f"<tr><th>{escape(label)}</th>{_cell(['extract', k], st.get(k), kind)}</tr>" for label, k, kind in EXTRACT_ROWS)
    per = [[n, d["samples"], d["tokens"]] for n, d in sorted(ex["datasets"].items())]
    return "\n".join([f"<p>Output directory <code>{escape(ex['out_dir'])}</code>.</p>", f'<table id="status-extract">{rows}</table>',
                      _img(charts["extraction"], "extraction progress", "Nothing committed to the manifest yet."),
                      _table(["dataset", "samples in the manifest", "tokens"], per, "extraction-datasets")])


def render(figs: dict[str, Any], charts: dict[str, bytes | None]) -> str:
    """The whole page (a str of HTML) for :func:`engine.report.runreport.gather`'s ``figs`` and
    :func:`engine.report.plots.all_charts`'s ``charts``."""
    st = figs["status"]
    when = dt.datetime.fromtimestamp(figs["generated_at"], dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    sp = figs["settings"]["spend"]
    tl = figs["timeline"]
    body = [
        f"<h1>Run report: {escape(st['run']['name'])}</h1>",
        f'<p class="meta">{escape(figs["run_dir"])} &middot; generated {when} &middot; run {escape(st["run"]["state"])} '
        f"&middot; reservation settings {escape(figs['settings']['source'])}</p>",
        '<h2 id="status">Status</h2>',
        "<p>The figures of <code>datagen status --json</code> when this report was made.</p>",
        status_tables(st),
        '<h2 id="throughput">Throughput and spend</h2>',
        _img(charts["throughput"], "throughput and spend over time", "No attempt stored yet."),
        '<h2 id="lengths">Completion lengths</h2>',
        f"<p>Per dataset; dashed: the configured p{100 * sp['reserve_percentile']:g} of the stored lengths "
        f"(<code>[spend] reserve_percentile</code>), solid: what the next request reserves (that percentile raised "
        f"to its 95% upper bound once <code>calibrate_after</code> = {sp['calibrate_after']} completions are seen, "
        f"else <code>max_tokens</code>).</p>",
        _img(charts["lengths"], "completion length distribution per dataset", "No completion stored yet."),
        _lengths_table(figs["lengths"]) if figs["lengths"] else "",
        '<h2 id="errors">Errors by class</h2>',
        _img(charts["errors"], "errors by class over time",
             "No failed attempt." if tl is not None else "No attempt stored yet."),
        '<h2 id="validation">Validation</h2>',
        _validation_html(figs["validation"], charts),
        '<h2 id="provider-fidelity">Provider fidelity</h2>',
        fidelity_html(figs.get("fidelity") or {}),
        '<h2 id="extraction">Extraction</h2>',
        _extraction_html(figs["extraction"], charts),
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>datagen report: {escape(st['run']['name'])}</title><style>{STYLE}</style></head>\n"
            "<body><main>\n" + "\n".join(body) + "\n</main></body></html>\n")


def write_report(run_dir: Path, out_dir: Path, config: Any = None) -> Path:
    """Gather, draw and write ``out_dir/report.html`` (atomically: a temporary file renamed).

    Returns:
        the path of the report.

    Raises:
        engine.report.runreport.ReportError: no run directory, or matplotlib missing.
        engine.report.status.StatusError: no store in ``run_dir``.
        OSError: ``out_dir`` cannot be created or written.
    """
    from engine.report.plots import all_charts, matplotlib_api
    from engine.report.runreport import gather

    matplotlib_api()  # a missing matplotlib is said before any work
    figs = gather(Path(run_dir), config)
    html = render(figs, all_charts(figs))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.html"
    tmp = out_dir / f".report.html.{os.getpid()}.tmp"
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, path)
    return path
