"""A new user's first minutes: the built-in simulator has a plausible $100 account (not
$1,000,000,000.00), ``datagen sim --help`` shows every default, the report says how old its credits
reading is, and the tiny-extract config of docs/extraction.md names a dataset file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from helpers import make_config

from datagen.parser import build_parser
from engine.report.page import status_tables
from engine.run.runner import sim_config_from_section
from engine.sim import SimThread
from tui.testing import sim_config

REPO = Path(__file__).resolve().parents[3]


def test_the_built_in_simulator_has_100_dollars_of_credits(tmp_path: Path):
    cfg = sim_config(tmp_path)
    assert cfg.provider.sim.credits_usd == 100.0  # [provider.sim] credits_usd, unset
    with SimThread(sim_config_from_section(cfg)) as base_url:
        key = httpx.get(f"{base_url}/key", headers={"Authorization": "Bearer x"}, timeout=10).json()["data"]
    assert key["limit"] == 100.0 and key["limit_remaining"] == 100.0  # what the header shows: $100.00
    mine = make_config(tmp_path / "b", provider={"sim": {"credits_usd": 5}})  # settable as before
    assert sim_config_from_section(mine).credits_usd == 5.0


def test_sim_help_shows_the_defaults():
    sub = next(a for a in build_parser()._subparsers._group_actions if a.dest == "command" or a.choices)
    text = " ".join(sub.choices["sim"].format_help().split())
    for option, default in (("--seed SEED", "(default 0)"), ("--latency-ms LATENCY_MS", "(default 0.0)"),
                            ("--tokens-per-s TOKENS_PER_S", "(default 0.0)"),
                            ("--mean-completion-tokens MEAN_COMPLETION_TOKENS", "(default 400)"),
                            ("--credits CREDITS", "(default 100.0)"), ("--price-in PRICE_IN", "(default 0.4)"),
                            ("--price-out PRICE_OUT", "(default 1.9)"), ("--providers PROVIDERS", "(default SimA,SimB,SimC)")):
        assert re.search(re.escape(option) + r"(?:(?! --).)*?" + re.escape(default), text), (option, default)
    assert "default unlimited" not in text


def test_the_report_says_how_old_the_credits_reading_is():
    html = status_tables({"run": {"state": "running"}, "totals": {}, "datasets": [], "credits_usd": 95.6552,
                          "credits_age_s": 14.0})
    assert "$95.66 (read 14s before this report)" in html
    assert "read" not in status_tables({"run": {}, "totals": {}, "datasets": [], "credits_usd": None})


def test_docs_tiny_extract_config_names_an_existing_dataset_file():
    page = (REPO / "docs" / "extraction.md").read_text(encoding="utf-8")
    block = page[page.index("cat > runs/tiny-extract.toml"):]
    block = block[:block.index("\nTOML\n")]
    path = re.search(r'^path = "([^"]+)"', block, re.M).group(1)
    assert (REPO / "runs" / path).resolve().is_file(), path
