"""The ``datagen validate`` report: counts per check per dataset and per provider, billing
difference statistics, supervised-token fractions.

Billing statistics (``billing``) cover records that were billed and not truncated (a cut record's
usage is capped by ``max_tokens``, so its difference says nothing about the reconstruction):
``rows``, ``mean`` and ``mean_abs`` (tokens), ``pct_of_tokens`` (sum of abs differences / sum of
billed completion tokens x 100), ``p99_abs`` (tokens), ``worst`` (the largest abs differences, run
level only). Supervised fraction = completion tokens / (prompt + completion tokens) over valid
records; ``zero_supervised`` counts records with no completion token, ``low_supervised`` those under
1% (docs/eagle3-data.md pitfall 2: a wrong template silently supervises nothing).

Invalid records are of two kinds (``datagen validate``'s exit status tells them apart): ``cut_at_max_tokens``,
completions the config asked to cut (finish ``length`` at the class's ``max_tokens``, failing only the checks
such a cut explains, :data:`CUT_EXPLAINED`), and ``faults``, every other invalid record (a provider's cut well
below ``max_tokens`` included). A cut is "at ``max_tokens``" when its billed completion tokens (its rebuilt
length when none were billed) reach ``max_tokens`` minus :func:`cut_slack`; the classes' ``max_tokens`` are
those the run stored at its latest start (``meta['run_settings']``). Without them every cut is a fault.
"""

from __future__ import annotations

import json
import math
from typing import Any

from engine.storage import read, validations
from engine.storage.handle import Handle
from engine.tokens.validate import NON_STRUCTURAL, REASONS

LOW_SUPERVISED = 0.01

#: The checks a cut at ``max_tokens`` explains: the cut itself, and no answer yet when it came during reasoning.
CUT_EXPLAINED: frozenset[str] = frozenset({"truncated", "empty"})


def cut_slack(max_tokens: int) -> float:
    """Tokens below ``max_tokens`` at which a ``length`` finish still counts as the requested cut:
    ``max(16, 2% of max_tokens)`` (the last piece that did not fit, and counts that differ slightly)."""
    return max(16.0, 0.02 * max_tokens)


def requested_cut(reasons: list[str], billed: int, completion_len: int, max_tokens: int | None) -> bool:
    """Whether an invalid record is a cut the config asked for: ``truncated`` with nothing but
    :data:`CUT_EXPLAINED` failing, at ``max_tokens`` (tokens; None: unknown, then False)."""
    if max_tokens is None or "truncated" not in reasons or not set(reasons) <= CUT_EXPLAINED:
        return False
    return (billed or completion_len) >= max_tokens - cut_slack(max_tokens)


class _Acc:
    def __init__(self) -> None:
        self.records = self.ok = self.structural = self.cuts = 0
        self.checks = {r: 0 for r in REASONS}
        self.notes: dict[str, int] = {}
        self.diffs: list[int] = []
        self.billed = 0
        self.prompt_diffs: list[int] = []
        self.prompt_tok = self.completion_tok = 0
        self.zero = self.low = 0

    def add(self, ok: bool, reasons: list[str], notes: list[str], pl: int, cl: int, billed: int,
            bdiff: int | None, pdiff: int | None, cut: bool = False) -> None:
        self.records += 1
        self.ok += ok
        self.cuts += cut and not ok
        for r in reasons:
            self.checks[r] = self.checks.get(r, 0) + 1
        if any(r not in NON_STRUCTURAL for r in reasons):
            self.structural += 1
        for n in notes:
            self.notes[n] = self.notes.get(n, 0) + 1
        if bdiff is not None and "truncated" not in reasons:
            self.diffs.append(bdiff)
            self.billed += billed
        if pdiff is not None:
            self.prompt_diffs.append(pdiff)
        if cl == 0:
            self.zero += 1
        elif pl + cl and cl / (pl + cl) < LOW_SUPERVISED:
            self.low += 1
        if ok:
            self.prompt_tok += pl
            self.completion_tok += cl

    def doc(self) -> dict[str, Any]:
        d = self.diffs
        absd = sorted(abs(x) for x in d)
        total = self.prompt_tok + self.completion_tok
        return {
            "records": self.records, "ok": self.ok, "invalid": self.records - self.ok,
            "cut_at_max_tokens": self.cuts, "faults": self.records - self.ok - self.cuts,
            "structural_errors": self.structural, "checks": dict(self.checks), "notes": dict(self.notes),
            "billing": {
                "rows": len(d), "mean": sum(d) / len(d) if d else None,
                "mean_abs": sum(absd) / len(d) if d else None,
                "pct_of_tokens": 100.0 * sum(absd) / self.billed if self.billed else None,
                "p99_abs": absd[min(len(absd) - 1, math.ceil(0.99 * len(absd)) - 1)] if absd else None,
                "exact": sum(1 for x in d if x == 0),
            },
            "prompt_diff": {"rows": len(self.prompt_diffs),
                            "mean": sum(self.prompt_diffs) / len(self.prompt_diffs) if self.prompt_diffs else None,
                            "mean_abs": (sum(abs(x) for x in self.prompt_diffs) / len(self.prompt_diffs)
                                         if self.prompt_diffs else None)},
            "tokens": {"prompt": self.prompt_tok, "completion": self.completion_tok},
            "supervised_fraction": self.completion_tok / total if total else None,
            "zero_supervised": self.zero, "low_supervised": self.low,
        }


def summarize(conn: Handle, *, worst: int = 10, max_tokens: dict[str, int] | None = None) -> dict[str, Any]:
    """Build the report from the ``validations`` table of an open store.

    ``max_tokens``: each class's ``max_tokens``, used where the run stored none (see the module docstring).

    Returns:
        ``{"records", "ok", "invalid", "cut_at_max_tokens", "faults", "structural_errors", "checks", "notes", "billing",
        "prompt_diff", "tokens", "supervised_fraction", "zero_supervised", "low_supervised",
        "unvalidated", "special_text_in_prompt", "max_tokens", "datasets": {name: same + special_text_in_prompt},
        "providers": {name: same}}`` (``special_text_in_prompt``: validated records whose prompt was
        flagged at ingest, :mod:`engine.tokens.promptcheck`); ``billing`` of the
        run also has ``worst`` (list of ``{id, dataset, provider, billing_diff, completion_len,
        billed_completion, reasons}``).
    """
    run = _Acc()
    per_ds: dict[str, _Acc] = {}
    per_prov: dict[str, _Acc] = {}
    order = read.dataset_names(conn)
    limits = validations.class_max_tokens(conn) or dict(max_tokens or {})
    classes = validations.cut_classes(conn)
    rows = validations.verdict_rows(conn)
    worst_rows: list[tuple[int, dict[str, Any]]] = []
    for pid, ds, key, prov, ok, reasons, notes, pl, cl, billed, bdiff, pdiff in rows:
        reasons, notes = json.loads(reasons), json.loads(notes)
        cut = not ok and requested_cut(reasons, billed, cl, limits.get(classes.get(pid, "")))
        for acc in (run, per_ds.setdefault(ds, _Acc()), per_prov.setdefault(prov or "(unknown)", _Acc())):
            acc.add(bool(ok), reasons, notes, pl, cl, billed, bdiff, pdiff, cut)
        if bdiff and "truncated" not in reasons:
            worst_rows.append((abs(bdiff), {"id": f"{ds}:{key}", "dataset": ds, "provider": prov, "billing_diff": bdiff,
                                            "completion_len": cl, "billed_completion": billed, "reasons": reasons}))
    doc = run.doc()
    worst_rows.sort(key=lambda x: -x[0])
    doc["billing"]["worst"] = [w for _, w in worst_rows[:worst]]
    doc["unvalidated"] = validations.unvalidated_count(conn)
    doc["max_tokens"] = limits or None
    names = [n for n in order if n in per_ds] + sorted(n for n in per_ds if n not in order)
    doc["datasets"] = {n: per_ds[n].doc() for n in names}
    flagged = validations.flagged_special_text(conn)
    doc["special_text_in_prompt"] = sum(flagged.values())
    for n, d in doc["datasets"].items():
        d["special_text_in_prompt"] = flagged.get(n, 0)
    doc["providers"] = {n: per_prov[n].doc() for n in sorted(per_prov)}
    return doc


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def format_report(doc: dict[str, Any]) -> str:
    """Human-readable report: totals, failed checks, billing, then one line per dataset/provider."""
    b = doc["billing"]
    lines = []
    t = doc.get("tokenizer")
    if t:
        lines.append(f"tokenizer {t['kind']} {t['path']} fingerprint {t['fingerprint']} "
                     f"thinking {'on' if t['thinking'] else 'off'}; ids: "
                     + ", ".join(f"{k}={v}" for k, v in t["special_ids"].items()))
    lines.append(f"records {doc['records']}: ok {doc['ok']}, invalid {doc['invalid']} "
                 f"(structural errors {doc['structural_errors']}), unvalidated {doc['unvalidated']}")
    if doc.get("invalid"):
        limit = ("max_tokens " + ", ".join(f"{k} {v:,}" for k, v in doc["max_tokens"].items())
                 if doc.get("max_tokens") else "max_tokens unknown: no settings stored with the run, every cut counts as a fault")
        lines.append(f"invalid: {doc['cut_at_max_tokens']} cut at max_tokens as the config asks "
                     f"(finish length; {limit}), {doc['faults']} fault(s)")
    failed = {k: v for k, v in doc["checks"].items() if v}
    lines.append("failed checks: " + (", ".join(f"{k} {v}" for k, v in failed.items()) or "none")
                 + ("; notes: " + ", ".join(f"{k} {v}" for k, v in doc["notes"].items()) if doc["notes"] else ""))
    lines.append(f"billing difference over {b['rows']} billed, untruncated records: mean {_f(b['mean'])}, "
                 f"mean abs {_f(b['mean_abs'])}, {_f(b['pct_of_tokens'], '{:.3f}')}% of tokens, "
                 f"p99 abs {_f(b['p99_abs'], '{}')}, exact {b['exact']}")
    for w in b.get("worst", [])[:5]:
        lines.append(f"  worst: {w['id']} ({w['provider']}) diff {w['billing_diff']:+d} "
                     f"of {w['billed_completion']} billed {', '.join(w['reasons'])}")
    lines.append(f"supervised fraction {_f(doc['supervised_fraction'], '{:.3f}')}, zero-supervised rows "
                 f"{doc['zero_supervised']}, under 1% {doc['low_supervised']}")
    if doc.get("special_text_in_prompt"):
        lines.append(f"special_text_in_prompt {doc['special_text_in_prompt']}: records whose prompt has special-token "
                     f"text typed in its messages (sent as special ids; a flag, not a failure)")
    for title, group in (("dataset", doc["datasets"]), ("provider", doc["providers"])):
        for name, d in group.items():
            f = ", ".join(f"{k} {v}" for k, v in d["checks"].items() if v) or "-"
            flag = f"; special_text_in_prompt {d['special_text_in_prompt']}" if d.get("special_text_in_prompt") else ""
            cuts = f"; {d['cut_at_max_tokens']} cut at max_tokens" if d["cut_at_max_tokens"] else ""
            lines.append(f"  {title} {name}: {d['ok']}/{d['records']} ok{cuts}; billing mean abs "
                         f"{_f(d['billing']['mean_abs'])}; supervised {_f(d['supervised_fraction'], '{:.3f}')}; {f}{flag}")
    return "\n".join(lines)
