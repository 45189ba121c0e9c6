"""The report's "Provider fidelity" table: each provider's fidelity verdict (pure: text only).

Its input is ``gather``'s ``fidelity`` (:mod:`engine.report.runreport`): ``{provider: fidelity object}``
from the store's ``provider_verdicts`` (:func:`engine.storage.verdicts.by_provider`: the same objects
``datagen status --json`` gives each provider as ``fidelity``, docs/fidelity.md). The verdict and
records cells carry ``data-path`` ``["providers", NAME, "fidelity", KEY]`` into the status document and
``data-value``, like the status tables (:mod:`engine.report.page`).
"""

from __future__ import annotations

import json
from html import escape
from typing import Any, Mapping

#: What a drift did (``acted``), as the table says it.
ACTED = {"exclude": "excluded", "flag": "flagged", "report": "reported"}
#: Where a verdict comes from (``source``).
SOURCES = {"target": "phase two", "cheap": "cheap signals"}
#: The order of verdicts in the table (drifting first).
ORDER = {"drifting": 0, "ok": 1, "insufficient": 2}


def action_text(f: Mapping[str, Any]) -> str:
    """What the verdict did: ``excluded`` / ``flagged`` / ``reported``, ``cleared (was excluded)`` after
    the user cleared it, ``-`` when nothing was done."""
    acted = ACTED.get(str(f.get("acted")), "") if f.get("acted") else ""
    if f.get("cleared"):
        return f"cleared (was {acted})" if acted else "cleared"
    return acted or "-"


def rows(fid: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The table's rows, drifting providers first then by name: ``{"provider", "verdict", "source",
    "records", "tokens", "reason", "action", "evidence"}`` (``verdict`` reads ``drifting (cleared)``
    once cleared; ``source`` as :data:`SOURCES` names it, ``-`` without one)."""
    out = []
    for name, f in fid.items():
        verdict = str(f.get("verdict") or "insufficient")
        out.append({"provider": name, "verdict": verdict + (" (cleared)" if f.get("cleared") else ""),
                    "source": SOURCES.get(str(f.get("source")), "-"), "records": int(f.get("records") or 0),
                    "tokens": int(f.get("tokens") or 0), "reason": str(f.get("reason") or ""),
                    "action": action_text(f), "evidence": f.get("evidence") or ""})
    return sorted(out, key=lambda r: (ORDER.get(r["verdict"], 1), r["provider"]))


def _cell(name: str, key: str, value: Any, text: str) -> str:
    path = ["providers", name, "fidelity", key]
    cls = ' class="n"' if isinstance(value, int) else ""
    return (f'<td{cls} data-path="{escape(json.dumps(path))}" data-value="{escape(json.dumps(value))}">'
            f"{escape(text)}</td>")


def fidelity_html(fid: Mapping[str, Mapping[str, Any]]) -> str:
    """The report's provider-fidelity part: a note when no provider was judged, else the table
    ``id="fidelity"`` (provider, verdict, source, records, tokens, reason, action, evidence file)."""
    if not fid:
        return ('<p class="note">No provider judged yet: no fidelity verdict in the store (docs/fidelity.md; '
                "phase two needs <code>datagen extract</code>, cheap signals need records from two providers).</p>")
    head = "".join(f"<th>{h}</th>" for h in ("provider", "verdict", "source", "records", "tokens", "reason",
                                             "action", "evidence file"))
    body = []
    for r in rows(fid):
        f = fid[r["provider"]]
        style = ' style="color:#b00;font-weight:bold"' if r["verdict"] == "drifting" else ""
        evidence = f"<code>{escape(r['evidence'])}</code>" if r["evidence"] else "-"
        body.append(f"<tr><th>{escape(r['provider'])}</th>"
                    + _cell(r["provider"], "verdict", f.get("verdict"), r["verdict"]).replace("<td", f"<td{style}", 1)
                    + f"<td>{escape(r['source'])}</td>"
                    + _cell(r["provider"], "records", r["records"], f"{r['records']:,}")
                    + f'<td class="n">{r["tokens"]:,}</td><td>{escape(r["reason"])}</td>'
                    f"<td>{escape(r['action'])}</td><td>{evidence}</td></tr>")
    return ("<p>Does each provider sell the target's own distribution? Phase two scores its records under the "
            "target model; without one, cheap signals compare it with the other providers (docs/fidelity.md). "
            "The records of a drifting provider excluded or flagged carry <code>provider_drift</code> and stay "
            "out of training exports unless its verdict is cleared (<code>datagen ctl RUN_DIR clear-verdict "
            "NAME</code>, or <code>x</code> on the dashboard).</p>\n"
            f'<table id="fidelity"><tr>{head}</tr>{"".join(body)}</table>')


__all__ = ["ACTED", "SOURCES", "action_text", "fidelity_html", "rows"]
