"""Provider fidelity on the dashboard (issue 35): the providers pane's ``fid`` column in each verdict
state, the ``provider fidelity`` section of ``i``, and ``x`` clearing a drifting provider's verdict
(confirmed) through the engine's command path.

The fidelity objects are made by the engine's own :func:`engine.fidelity.looks.combined` from verdict
rows shaped as :func:`engine.storage.verdicts.load` gives them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Console
from rich.text import Text
from waiting import until

from engine.fidelity.looks import combined
from tui.app import DashboardApp
from tui.detail import detail_text
from tui.fidelity import fid_cell, fidelity_section, parse_pick, pick_options
from tui.modals import ConfirmScreen, PickScreen
from tui.panes.providers import PANE_WIDTH, providers_table
from tui.testing import FIXED_GPUS, FakeController, fixed_snapshot, screen_text

TARGET_FIGS = {"mean_surprisal_excess": 0.0412, "surprisal_z": 5.3, "top1_rate": 0.701, "top1_expected": 0.752,
               "outside_share": 0.0031, "pit_chi2": 88.4, "loglik_per_token": -1.234,
               "others_loglik_per_token": -1.101}
DRIFT_REASON = "surprisal +0.041 nats/token over the target's expectation (z=5.3, p=6e-08 < 1e-05)"


def row(verdict: str, records: int, *, tokens: int = 0, reason: str = "", acted: str | None = None,
        cleared: bool = False, evidence: str | None = None, figures: dict[str, Any] | None = None,
        looks: int = 1) -> dict[str, Any]:
    """A verdict row as engine.storage.verdicts.load gives it."""
    return {"verdict": verdict, "records": records, "tokens": tokens, "reason": reason, "looks": looks,
            "doc": {"figures": figures or {}}, "acted": acted, "cleared_at": 1.0 if cleared else None,
            "evidence": evidence}


OK = combined({"target": row("ok", 412, tokens=180_345, reason="no test rejects at p < 1e-05",
                             figures={**TARGET_FIGS, "mean_surprisal_excess": 0.0011, "surprisal_z": 0.4})})
DRIFT = combined({
    "target": row("drifting", 120, tokens=40_000, reason=DRIFT_REASON, acted="exclude", figures=TARGET_FIGS,
                  evidence="/runs/r/fidelity/SimB-target.json"),
    "cheap": row("ok", 300, reason="no cheap signal differs from the other providers' (300 records, 8 tests)",
                 figures={"completion_tokens_median": [410, 402], "reasoning_share": [0.31, 0.30]}),
})
CLEARED = combined({"cheap": row("drifting", 90, reason="completions 41% shorter than the other providers'",
                                 acted="flag", cleared=True, evidence="/runs/r/fidelity/X-cheap.json")})
SHORT = combined({"target": row("insufficient", 12, tokens=300, reason="12 records / 300 tokens scored; a verdict "
                                "needs 20 records and 2000 tokens", looks=0)})
UNKNOWN_MIN = combined({}, records_fallback=0)  # judged by nobody yet: "not judged yet"


def with_fidelity(*fids: dict[str, Any] | None, **over: Any):
    """The fixed snapshot, its providers (SimA, SimB, SimC excluded) given ``fids`` in order."""
    snap = fixed_snapshot()
    ps = tuple(dataclasses.replace(p, fidelity=f, **over.get(p.name, {})) for p, f in zip(snap.providers, fids, strict=False))
    return dataclasses.replace(snap, providers=ps + snap.providers[len(ps):])


def pane_lines(providers, width: int = PANE_WIDTH) -> list[str]:
    c = Console(width=width, record=True, color_system=None)
    c.print(providers_table(providers, width))
    return [line.rstrip() for line in c.export_text().splitlines()]


def test_fid_cell_in_each_verdict_state():
    cells = {name: fid_cell(f) for name, f in (("ok", OK), ("drift", DRIFT), ("cleared", CLEARED),
                                                ("short", SHORT), ("unknown", UNKNOWN_MIN), ("none", None))}
    assert {k: (c.plain, str(c.style)) for k, c in cells.items()} == {
        "ok": ("ok", "green"), "drift": ("drift", "bold red"), "cleared": ("drift✓", "dim"),
        "short": ("12/20", "dim"), "unknown": ("n/a", "dim"), "none": ("-", "dim")}
    # the cheap signals' reason names the minimum its own way
    cheap_short = combined({"cheap": row("insufficient", 7, reason="7 records, fewer than 20")})
    assert fid_cell(cheap_short).plain == "7/20"
    assert fid_cell(dict(SHORT, min_records=50)).plain == "12/50"  # a min_records the object carries wins


def test_pane_shows_fid_once_any_provider_is_judged_and_keeps_its_width():
    plain = fixed_snapshot().providers
    before = pane_lines(plain)
    assert "fid" not in before[0] and "TTFT" in before[0]  # nobody judged: the column is not there
    judged = with_fidelity(OK, DRIFT, SHORT).providers
    lines = pane_lines(judged)
    assert lines[0].split() == ["provider", "req", "err", "lat", "p50/95", "tok/s", "cost", "fid"]  # TTFT gave way
    assert [line.split()[-1] for line in lines[1:]] == ["ok", "drift", "12/20"]
    assert lines[1].startswith("SimA ") and lines[3].startswith("✗ SimC ")  # names whole
    assert all(len(line) <= PANE_WIDTH for line in lines)
    # wire flags too: latency gives way as well, the names keep their cells
    flagged = tuple(dataclasses.replace(p, flags={"replacement_char": 2}) if p.name == "SimA" else p for p in judged)
    lines = pane_lines(flagged)
    assert lines[0].split() == ["provider", "req", "err", "tok/s", "cost", "flags", "fid"]
    assert lines[1].split()[-2:] == ["2!", "ok"]
    # a cleared drift and a provider nobody judged yet
    lines = pane_lines(with_fidelity(CLEARED, None, UNKNOWN_MIN).providers)
    assert [line.split()[-1] for line in lines[1:]] == ["drift✓", "-", "n/a"]


def test_pane_cell_styles():
    table = providers_table(with_fidelity(OK, DRIFT, CLEARED).providers, PANE_WIDTH)
    fid = next(c for c in table.columns if c.header == "fid")
    assert [(c.plain, str(c.style)) for c in fid.cells] == [("ok", "green"), ("drift", "bold red"),
                                                            ("drift✓", "dim")]


def test_details_section_gives_each_providers_evidence():
    snap = with_fidelity(OK, DRIFT, CLEARED)
    text = detail_text(snap.datasets[0], snap).plain
    section = text[text.index("provider fidelity"):]
    # drifting first, then a cleared drift, then ok
    assert section.index("SimB") < section.index("SimC") < section.index("SimA")
    simb = section[section.index("SimB"):section.index("SimC")]
    assert "SimB          drifting  phase two (scored under the target model); 120 records, 40,000 tokens" in simb
    assert f"reason    {DRIFT_REASON}" in simb
    assert ("phase two drifting, 120 records, 40,000 tokens, 1 look; surprisal +0.041 nats/token (z=5.3); top-1 0.701 vs 0.752 "
            "expected; 0.31% outside the nucleus; PIT chi2 88.4; log-lik -1.234 vs -1.101 others nats/token") in simb
    assert ("cheap     ok, 300 records, 1 look: no cheap signal differs from the other providers' (300 records, 8 "
            "tests); median completion 410 vs 402 tokens; reasoning 31.0% vs 30.0% (this provider vs the others)"
            ) in simb
    assert "action    excluded from further buying; its records are flagged provider_drift" in simb
    assert "evidence  /runs/r/fidelity/SimB-target.json" in simb
    simc = section[section.index("SimC"):section.index("SimA")]
    assert "drifting (cleared)  cheap signals (against the other providers; no target); 90 records\n" in simc
    assert "cleared by the user (was: flag): its records count again" in simc
    assert "evidence  /runs/r/fidelity/X-cheap.json" in simc
    assert "ok  phase two (scored under the target model); 412 records, 180,345 tokens" in section
    # no provider judged: no section, the dataset's details unchanged
    assert fidelity_section(fixed_snapshot().providers) is None
    plain = fixed_snapshot()
    assert "provider fidelity" not in detail_text(plain.datasets[0], plain).plain
    assert isinstance(fidelity_section(snap.providers), Text)


def test_pick_offers_clear_for_a_drifting_provider_only():
    snap = with_fidelity(OK, DRIFT, CLEARED, SimB={"excluded": True})  # SimB: drift excluded it
    opts = pick_options(snap.providers)
    assert [(parse_pick(v), label) for v, label in opts] == [
        (("exclude", "SimA"), "SimA  2,500 req  1% err"),
        (("clear", "SimB"), "SimB  (drifting: pick to clear its verdict)"),
        (("include", "SimC"), "SimC  (excluded: pick to include it again)"),  # cleared: no longer drifting
    ]
    flagged = with_fidelity(None, dict(DRIFT, acted="flag"))  # drifting, still routed: exclude or clear
    assert [parse_pick(v) for v, _ in pick_options(flagged.providers)] == [
        ("exclude", "SimA"), ("exclude", "SimB"), ("clear", "SimB"), ("include", "SimC")]


class VerdictController(FakeController):
    """FakeController plus the clear-verdict verb."""

    async def clear_verdict(self, name: str) -> str:
        self.calls.append(("clear_verdict", (name,)))
        return f"provider {name}: drifting verdict cleared"


async def test_x_clears_a_drifting_providers_verdict_after_a_confirm():
    ctl = VerdictController()
    snap = with_fidelity(OK, DRIFT, None, SimB={"excluded": True})
    app = DashboardApp(snapshot_source=lambda: snap, controller=ctl, gpu_source=lambda: FIXED_GPUS)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.snapshot is not None, 3, what="a snapshot")
        await until(pilot, lambda: "drift" in screen_text(app), 3, what="the fid column")
        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, PickScreen), 2, what="pick modal")
        offered = screen_text(app).split("Exclude which provider?")[1]
        assert "SimB  (drifting: pick to clear its verdict)" in offered
        assert "SimC  (excluded: pick to include it again)" in offered
        await pilot.press("down", "enter")  # SimB's clear
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 2, what="confirm modal")
        shown = " ".join(screen_text(app).split())
        assert "Clear SimB's drifting verdict?" in shown and "It is routed to again." in shown
        await pilot.press("n")  # cancelled: nothing sent
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), 2, what="confirm closed")
        await pilot.pause(0.1)
        assert ctl.calls == []
        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, PickScreen), 2, what="pick modal")
        await pilot.press("down", "enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 2, what="confirm modal")
        await pilot.press("y")
        await until(pilot, lambda: ("clear_verdict", ("SimB",)) in ctl.calls, 2, what="clear_verdict call")
        assert ctl.calls == [("clear_verdict", ("SimB",))]
        await pilot.press("x")  # an excluded, non-drifting provider is still included again at once
        await until(pilot, lambda: isinstance(app.screen, PickScreen), 2, what="pick modal")
        await pilot.press("down", "down", "enter")
        await until(pilot, lambda: ("include_provider", ("SimC",)) in ctl.calls, 2, what="include call")
