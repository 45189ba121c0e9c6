"""At a glance, at 120x40 and 80x24 (a new user's first terminals): tokens vs budget, dollars vs
cap, credits and the ETA stay on screen, shorter when narrow, and no number is ever cut by an
ellipsis; the header says ``capped at $X`` when a cap bounds the projection and ``ETA -- (why)``
when there is no ETA. Textual's pilot on the fixed snapshot of :mod:`tui.testing`."""

from __future__ import annotations

import dataclasses
import re

import pytest
from rich.text import Text

from tui.app import DashboardApp
from tui.panes.datasets import DatasetsTable
from tui.panes.header import fit, header_lines
from tui.testing import FIXED_GPUS, FakeController, fixed_snapshot, screen_text

CUT_NUMBER = re.compile(r"[\d$.,/–-]…|…[\d$]")
"""An ellipsis right after or before a figure: a number cut in the middle."""

LONG_REASON = "anomaly guard: error rate 34% > 20% over the last 50 attempts of class short (429 and 502)"


def calibrating(snap=None):
    """Mid-calibration with a long state reason and a rich account: the widest header the trial saw
    (the built-in simulator then read $1,000,000,000.00)."""
    snap = snap or fixed_snapshot()
    return dataclasses.replace(
        snap, state="paused", state_reason=LONG_REASON, calibration=(3, 50), projected_cost_low_usd=10.1234,
        projected_cost_high_usd=1234.56, eta_s_low=52.0, eta_s_high=20644.0, credits_usd=1e9)


async def screen_of(snap, size) -> tuple[str, DashboardApp]:
    app = DashboardApp(snapshot_source=lambda: snap, controller=FakeController(), gpu_source=lambda: FIXED_GPUS,
                       refresh_hz=20)
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.25)
        text = screen_text(app)
        keys = app.query_one(DatasetsTable).column_keys
    return text, keys


def no_cut_numbers(lines: list[str]) -> None:
    for line in lines:
        assert not CUT_NUMBER.search(line), f"a number cut by an ellipsis: {line!r}"


async def test_120x40_shows_tokens_budget_cap_credits_and_eta():
    text, keys = await screen_of(fixed_snapshot(), (120, 40))
    lines = text.split("\n")
    header = "\n".join(lines[:3])
    assert "spent $4.34 / cap $25.00" in header and "credits $95.66" in header and "ETA 13m40s" in header
    assert "6.9 req/s" in header
    assert "tokens" in keys, keys  # the datasets table's tokens-vs-budget column (was only from 160)
    table = "\n".join(lines[3:10])
    assert "tok/budget" in table and "1.71M/4M" in table and "$4.12 / $10.00" in table
    no_cut_numbers(lines)


async def test_120x40_calibrating_with_a_long_reason_keeps_credits_and_eta():
    text, _ = await screen_of(calibrating(), (120, 40))
    header = text.split("\n")[:3]
    assert "credits $1,000,000,000.00" in header[1] and "ETA" in header[1], header
    assert "projected $10.12–$1,234.56" in header[1] and "cap $25.00" in header[1], header
    no_cut_numbers(header)


@pytest.mark.parametrize("snap", [fixed_snapshot(), calibrating()], ids=["calibrated", "calibrating"])
async def test_80x24_keeps_the_essentials_in_a_shorter_form(snap):
    text, _ = await screen_of(snap, (80, 24))
    lines = text.split("\n")
    header = lines[:3]
    assert all(len(line) <= 80 for line in header)
    assert "credits $" in header[1] and "ETA " in header[1] and "/$25.00" in "".join(header[1].split(" cap "))
    assert "req/s" in header[0] and "tok 1.71M/4M" in header[2], header
    if snap.calibration:
        assert "proj ≤$1,234.56" in header[1] and "ETA" in header[1] and "anomaly guard" in header[0], header
    no_cut_numbers(lines)


def test_capped_projection_and_eta_reason():
    s = dataclasses.replace(fixed_snapshot(), projection_capped=True, projected_total_cost_usd=25.0, eta_s=None,
                            eta_reason="run cost cap met")
    line2 = header_lines(s, width=118)[1].plain
    assert "capped at $25.00" in line2 and "> cap!" not in line2 and "projected" not in line2
    assert "ETA -- (run cost cap met)" in line2
    assert "ETA --" in header_lines(s, width=60)[1].plain  # the reason goes before any figure
    over = dataclasses.replace(fixed_snapshot(), projected_total_cost_usd=30.1)
    assert "projected $30.10 > cap!" in header_lines(over, width=118)[1].plain
    # issue 33's trial: spent + streams in flight already past the cap read "capped at $21.23" under a $20 cap
    past = dataclasses.replace(s, projected_total_cost_usd=25.4)
    line = header_lines(past, width=118)[1].plain
    assert "$25.40 > cap $25.00 (in flight)" in line and "capped at" not in line


def test_a_frozen_stream_worker_shows_in_the_header():
    """Issue 34: a stream worker stopped (SIGSTOP) read as up; now ``· 1 frozen`` while it is silent."""
    s = dataclasses.replace(fixed_snapshot(), stream_workers=2, stream_workers_alive=2, stream_workers_frozen=1)
    line1 = header_lines(s, width=140)[0].plain
    assert "workers 2 · 1 frozen" in line1
    ok = dataclasses.replace(s, stream_workers_frozen=0)
    assert "frozen" not in header_lines(ok, width=140)[0].plain

def test_fit_shortens_before_it_drops_and_never_cuts_a_number():
    segs = [(0, Text("spent $1.00 / cap $2.00"), (1, Text("spent $1.00/$2.00"))), (3, Text("rate $2/h")),
            (0, Text("ETA 12m05s"))]
    assert fit(segs, 40).plain == "spent $1.00 / cap $2.00  ETA 12m05s"
    assert fit(segs, 30).plain == "spent $1.00/$2.00  ETA 12m05s"
    cut = fit([(0, Text("credits $1,234.56  and more words"))], 16).plain
    assert cut == "credits…" and not CUT_NUMBER.search(cut)
