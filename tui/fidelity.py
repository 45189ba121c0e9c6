"""Provider fidelity on the dashboard: the providers pane's ``fid`` cell, the ``provider fidelity``
section of the details view (``i``) and what ``x`` offers for a drifting provider.

A provider's fidelity object (``ProviderSnapshot.fidelity``; docs/fidelity.md) is
``{"verdict": "ok" | "drifting" | "insufficient", "records", "tokens", "source": "target" | "cheap" | None,
"reason", "acted": "exclude" | "flag" | "report" | None, "cleared", "evidence", "target", "cheap"}``;
``target`` / ``cheap``: ``{"verdict", "records", "tokens", "reason", "looks", "figures"}`` or None.
None: not judged yet. Pure: text only, no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from rich.text import Text

from engine.api import ProviderSnapshot

Fidelity = Mapping[str, Any]

SOURCE_TEXT = {"target": "phase two (scored under the target model)",
               "cheap": "cheap signals (against the other providers; no target)"}
"""What each verdict source is, as the details view names it."""

ACTED_TEXT = {
    "exclude": "excluded from further buying; its records are flagged provider_drift (left out of training exports)",
    "flag": "its records are flagged provider_drift (left out of training exports); still bought from",
    "report": "reported only (on_drift = report): still bought from, its records kept",
}
"""What a drift did (``acted``), as the details view says it."""

_MIN = re.compile(r"needs ([\d,]+) records|fewer than ([\d,]+)")

PICK_SEP = "\x1f"
"""Separates the verb from the provider in a ``x`` pick's value (no provider name holds it)."""


def is_drifting(f: Fidelity | None) -> bool:
    """True when ``f`` reads ``drifting`` and the user has not cleared it."""
    return f is not None and f.get("verdict") == "drifting" and not f.get("cleared")


def min_records(f: Fidelity) -> int | None:
    """The records a verdict needs: the object's ``min_records`` when it carries one, else the number its
    ``insufficient`` reason names (``... a verdict needs 20 records ...``, ``12 records, fewer than 20``);
    None when neither says."""
    if isinstance(f.get("min_records"), int):
        return int(f["min_records"])
    m = _MIN.search(str(f.get("reason") or ""))
    return int((m.group(1) or m.group(2)).replace(",", "")) if m else None


def fid_cell(f: Fidelity | None) -> Text:
    """The providers pane's ``fid`` cell: ``ok`` (green), ``drift`` (bold red), ``drift✓`` (dim: the user
    cleared it), ``12/20`` (dim: records of the minimum a verdict needs) or ``n/a`` (dim: too few records,
    minimum unknown), ``-`` (dim: not judged yet)."""
    if f is None:
        return Text("-", style="dim")
    verdict = f.get("verdict")
    if verdict == "ok":
        return Text("ok", style="green")
    if verdict == "drifting":
        return Text("drift✓", style="dim") if f.get("cleared") else Text("drift", style="bold red")
    need = min_records(f)
    records = int(f.get("records") or 0)
    return Text(f"{records}/{need}" if need is not None and records < need else "n/a", style="dim")


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _pair(figs: Mapping[str, Any], key: str) -> tuple[float, float] | None:
    v = figs.get(key)
    if isinstance(v, (list, tuple)) and len(v) == 2:
        a, b = _num(v[0]), _num(v[1])
        if a is not None and b is not None:
            return a, b
    return None


def target_figures(figs: Mapping[str, Any]) -> str:
    """The key phase-two figures in one line (those known): surprisal excess (nats/token) and its z, top-1
    agreement vs expected, the share of tokens outside the target's nucleus, the PIT chi-square and the
    log-likelihood (nats/token) against the other providers'."""
    out = []
    s, z = _num(figs.get("mean_surprisal_excess")), _num(figs.get("surprisal_z"))
    if s is not None:
        out.append(f"surprisal {s:+.3f} nats/token" + (f" (z={z:.1f})" if z is not None else ""))
    r, e = _num(figs.get("top1_rate")), _num(figs.get("top1_expected"))
    if r is not None and e is not None:
        out.append(f"top-1 {r:.3f} vs {e:.3f} expected")
    if (o := _num(figs.get("outside_share"))) is not None:
        out.append(f"{o:.2%} outside the nucleus")
    if (c := _num(figs.get("pit_chi2"))) is not None:
        out.append(f"PIT chi2 {c:.1f}")
    ll, oll = _num(figs.get("loglik_per_token")), _num(figs.get("others_loglik_per_token"))
    if ll is not None:
        out.append(f"log-lik {ll:.3f}" + (f" vs {oll:.3f} others" if oll is not None else "") + " nats/token")
    return "; ".join(out)


def cheap_figures(figs: Mapping[str, Any]) -> str:
    """The cheap signals' figures in one line, this provider's vs the other providers' (those known):
    median completion tokens, reasoning share, failing wire flags, invalid tool calls, billed prompt tokens
    differing from our count, reconstruction mismatches."""
    out = []
    if p := _pair(figs, "completion_tokens_median"):
        out.append(f"median completion {p[0]:,.0f} vs {p[1]:,.0f} tokens")
    for key, label in (("reasoning_share", "reasoning"), ("wire_flags", "wire flags"),
                       ("tool_call_validity", "invalid tool calls"), ("prompt_billed_share", "billed prompt differs"),
                       ("reconstruction", "reconstruction mismatches")):
        if p := _pair(figs, key):
            out.append(f"{label} {p[0]:.1%} vs {p[1]:.1%}")
    return "; ".join(out) + (" (this provider vs the others)" if out else "")


def _line(t: Text, label: str, text: str, style: str = "") -> None:
    t.append(f"\n    {label:<10}", style="dim")
    t.append(text, style=style)


def verdict_text(f: Fidelity) -> Text:
    """The verdict in full, styled as the pane's cell: ``ok``, ``drifting``, ``drifting (cleared)``,
    ``insufficient``."""
    verdict = str(f.get("verdict") or "insufficient")
    if verdict == "drifting" and f.get("cleared"):
        return Text("drifting (cleared)", style="dim")
    return Text(verdict, style={"ok": "green", "drifting": "bold red"}.get(verdict, "dim"))


def _records(records: Any, tokens: Any, looks: Any = None) -> str:
    out = f"{int(records or 0):,} records"
    if tokens:
        out += f", {int(tokens):,} tokens"
    if looks is not None:
        out += f", {int(looks)} look{'' if int(looks) == 1 else 's'}"
    return out


def provider_fidelity(name: str, f: Fidelity) -> Text:
    """One provider's part of the section: verdict, source, records, reason, key figures of each source,
    what was done and the evidence file."""
    t = Text("\n  ")
    t.append(f"{name:<14}", style="bold")
    t.append_text(verdict_text(f))
    src = f.get("source")
    t.append(f"  {SOURCE_TEXT.get(src, 'no verdict yet') if src else 'no verdict yet'}; "
             f"{_records(f.get('records'), f.get('tokens'))}")
    _line(t, "reason", str(f.get("reason") or "--"), "red" if is_drifting(f) else "")
    for key, what, figures in (("target", "phase two", target_figures), ("cheap", "cheap", cheap_figures)):
        part = f.get(key)
        if not part:
            continue
        line = f"{part.get('verdict')}, {_records(part.get('records'), part.get('tokens'), part.get('looks') or 0)}"
        if key != src:
            line += f": {part.get('reason') or '--'}"
        if figs := figures(part.get("figures") or {}):
            line += f"; {figs}"
        _line(t, what, line)
    acted = f.get("acted")
    if f.get("cleared"):
        _line(t, "action", f"cleared by the user (was: {acted or 'not acted on'}): its records count again, it is "
                           "never acted on again", "dim")
    elif acted:
        _line(t, "action", ACTED_TEXT.get(str(acted), str(acted)), "bold red" if acted != "report" else "yellow")
    if f.get("evidence"):
        _line(t, "evidence", str(f["evidence"]))
    return t


def fidelity_section(providers: Iterable[ProviderSnapshot]) -> Text | None:
    """The details view's ``provider fidelity`` section: every provider with a fidelity object, drifting
    ones first; None when no provider has one (the section is left out)."""
    judged = [p for p in providers if p.fidelity is not None]
    if not judged:
        return None
    order = {"drifting": 1, "ok": 2, "insufficient": 3}  # a cleared drift after the drifting ones

    def rank(p: ProviderSnapshot) -> tuple[int, str]:
        f = p.fidelity or {}
        return (0 if is_drifting(f) else order.get(str(f.get("verdict")), 4)), p.name

    judged.sort(key=rank)
    t = Text("\n\nprovider fidelity", style="bold underline")
    t.append("  (do its completions come from the target? docs/fidelity.md; x clears a drifting verdict)", style="dim")
    for p in judged:
        assert p.fidelity is not None
        t.append_text(provider_fidelity(p.name, p.fidelity))
    return t


def pick_options(providers: Iterable[ProviderSnapshot]) -> list[tuple[str, str]]:
    """What ``x`` offers, ``(value, label)``: each routed provider to exclude; each excluded one not
    drifting to include again; each drifting one (verdict not cleared) to clear its verdict (clearing
    routes to it again when the drift excluded it). Values: :func:`pick_value`."""
    ps = list(providers)
    out = [(pick_value("exclude", p.name), f"{p.name}  {p.requests:,} req  {p.error_rate:.0%} err")
           for p in ps if not p.excluded]
    out += [(pick_value("clear", p.name), f"{p.name}  (drifting: pick to clear its verdict)")
            for p in sorted(ps, key=lambda p: p.name) if is_drifting(p.fidelity)]
    out += [(pick_value("include", p.name), f"{p.name}  (excluded: pick to include it again)")
            for p in sorted(ps, key=lambda p: p.name) if p.excluded and not is_drifting(p.fidelity)]
    return out


def pick_value(verb: str, name: str) -> str:
    """A pick's value: ``verb`` (``exclude`` | ``include`` | ``clear``) and the provider."""
    return f"{verb}{PICK_SEP}{name}"


def parse_pick(value: str) -> tuple[str, str]:
    """``(verb, provider)`` of a :func:`pick_value`."""
    verb, _, name = value.partition(PICK_SEP)
    return verb, name


def clear_body(name: str, f: Fidelity | None) -> str:
    """The clear confirmation's text: the verdict, its reason, what it did and what clearing does."""
    f = f or {}
    src = SOURCE_TEXT.get(str(f.get("source")), "unknown source")
    acted = f.get("acted")
    did = {"exclude": "It was excluded from buying and its records flagged provider_drift.",
           "flag": "Its records were flagged provider_drift."}.get(str(acted), "Nothing was done (reported only).")
    back = " It is routed to again." if acted == "exclude" else ""
    return (f"{name} was judged drifting from {src}, over {int(f.get('records') or 0):,} records:\n"
            f"{f.get('reason') or '--'}\n{did}\n"
            f"Clearing: its records count again (training exports include them).{back} It is never acted on "
            f"again in this run.")


__all__ = ["cheap_figures", "clear_body", "fid_cell", "fidelity_section", "is_drifting", "min_records",
           "parse_pick", "pick_options", "pick_value", "provider_fidelity", "target_figures", "verdict_text"]
