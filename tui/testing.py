"""Helpers for testing and screenshotting the dashboard (used by ``tests/tui/``).

- :func:`sim_config`: a config on the built-in simulator with the bundled sample datasets.
- :func:`fixed_snapshot` / :data:`FIXED_GPUS`: a literal engine state for snapshot tests.
- :class:`FakeController`: records the commands it receives.
- :func:`screen_text`: the visible text of the app's screen; :func:`normalise_svg`: an SVG
  screenshot with Textual's per-render ids made stable.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from engine.api import (
    ClassSnapshot,
    CommandResult,
    Config,
    DatasetSnapshot,
    GpuReading,
    GpuSnapshot,
    ProviderSnapshot,
    RunCommand,
    RunSnapshot,
    SampleSnapshot,
    apply_command,
    parse_config,
)

SAMPLES = Path(__file__).resolve().parents[1] / "engine" / "samples"
"""The bundled sample dataset files."""


def sim_config(
    tmp: Path,
    *,
    tokens_per_s: float = 40,
    mean_completion_tokens: int = 120,
    concurrency: int = 4,
    datasets: list[dict[str, Any]] | None = None,
    faults: str = "",
    drain_timeout_s: float = 10,
    spend: dict[str, Any] | None = None,
    **run: Any,
) -> Config:
    """A config in ``tmp`` on the simulator (requests last ~``mean/tokens_per_s`` seconds).

    Default datasets: ``sharegpt`` (b7, 98 prompts) then ``glaive`` (b1, 5 prompts); one class
    ``short`` with ``concurrency``; commits every 0.1 s. ``spend``: the ``[spend]`` section
    (e.g. ``{"anomaly_window": 10}``); ``run``: more ``[run]`` keys.
    """
    data: dict[str, Any] = {
        "run": {"name": "tui-test", "dir": str(tmp / "run"), "commit_interval_s": 0.1, "progress_interval_s": 1,
                "drain_timeout_s": drain_timeout_s, **run},
        "provider": {"kind": "simulated", "sim": {
            "seed": 1, "tokens_per_s": tokens_per_s, "mean_completion_tokens": mean_completion_tokens,
            "latency_ms": 20, "faults": faults}},
        "classes": {"short": {"max_tokens": 2000, "concurrency": concurrency}},
        **({"spend": spend} if spend else {}),
        "datasets": datasets or [
            {"name": "sharegpt", "path": str(SAMPLES / "b7_sharegpt.json"), "format": "sharegpt"},
            {"name": "glaive", "path": str(SAMPLES / "b1_glaive.jsonl"), "format": "glaive"},
        ],
    }
    return parse_config(data, tmp / "config.toml")


class FakeController:
    """Stands in for :class:`engine.run.controller.Controller` (a :class:`tui.host.InjectedCommands`):
    :meth:`apply` takes the engine's command path (:func:`engine.run.commands.apply`) to its own
    per-verb methods; ``calls`` lists ``(method, args)``; ``failed`` are the counts :meth:`failed_counts` returns."""

    def __init__(self, failed: dict[str, int] | None = None) -> None:
        self.calls: list[tuple[str, tuple]] = []
        self.failed = dict(failed or {})

    async def apply(self, cmd: RunCommand) -> CommandResult:
        return await apply_command(cmd, self)

    async def pause(self, dataset: str | None = None) -> str:
        self.calls.append(("pause", (dataset,)))
        return f"{dataset or 'run'} paused"

    async def resume(self, dataset: str | None = None) -> str:
        self.calls.append(("resume", (dataset,)))
        return f"{dataset or 'run'} resumed"

    async def skip(self, dataset: str, abort: bool = False) -> str:
        self.calls.append(("skip", (dataset, True) if abort else (dataset,)))
        return f"{dataset} skipped"

    def abort(self, dataset: str | None = None) -> str:
        self.calls.append(("abort", (dataset,)))
        return "aborted"

    async def set_concurrency(self, cls: str, n: int) -> str:
        self.calls.append(("set_concurrency", (cls, n)))
        return f"class {cls} concurrency {n}"

    async def exclude_provider(self, name: str) -> str:
        self.calls.append(("exclude_provider", (name,)))
        return f"provider {name} excluded"

    async def include_provider(self, name: str) -> str:
        self.calls.append(("include_provider", (name,)))
        return f"provider {name} included again"

    async def clear_verdict(self, name: str) -> str:
        self.calls.append(("clear_verdict", (name,)))
        return f"provider {name}: drifting verdict cleared"

    async def failed_counts(self, dataset: str | None = None) -> dict[str, int]:
        self.calls.append(("failed_counts", (dataset,)))
        return dict(self.failed)

    async def retry_failed(self, dataset: str | None = None, reason: str | None = None) -> str:
        self.calls.append(("retry_failed", (dataset, reason)))
        return f"failed prompts of {dataset} returned to pending"

    def dataset_class(self, dataset: str) -> str | None:
        """None: the dashboard takes the snapshot's first class (tests assign a function to change it)."""
        return None

    def stop(self, reason: str = "", abort: bool = False) -> str:
        self.calls.append(("stop", (abort,)))
        return "stopping"


def _sample(key: str, provider: str, tokens: int) -> SampleSnapshot:
    return SampleSnapshot(
        key=key, prompt_tail="Summarise the main ideas of the text in bullet points.",
        reasoning="The user wants bullet points. I should list the five stages of the launch [not markup].",
        content="- Pre-pre-launch: build anticipation\n- Pre-launch: three videos\n- Launch: open the cart",
        tool_calls=(), finish_reason="stop", provider=provider, completion_tokens=tokens, validation="ok: 412 tokens",
    )


def fixed_snapshot() -> RunSnapshot:
    """A literal mid-run state: one dataset running, one paused by the anomaly guard, one done,
    one skipped; errors, providers (one excluded), 10 minutes of history and a few events."""
    ds = (
        DatasetSnapshot(
            name="b7_sharegpt", state="running", state_reason="", prompts=9800, rejected=2, done=4120, failed=12,
            skipped=0, pending=5468, in_flight=200, prompt_tokens=2_100_000, completion_tokens=1_712_000,
            reasoning_tokens=600_000, cost_usd=4.1234, token_budget=4_000_000,
            errors={"rate_limit": 31, "server": 4}, req_per_s=6.9, req_per_s_since_start=6.1, tok_per_s=2850.0,
            avg_completion_tokens=415.5, eta_s=820.0, avg_completion_tokens_recent=402.0, eta_s_since_start=930.0,
            reserved_tokens=81_000, max_cost_usd=10.0, projected_cost_usd=9.81,
            latest_sample=_sample("b7-000412", "SimA", 412),
        ),
        DatasetSnapshot(
            name="b1_glaive", state="paused", state_reason="anomaly guard: error rate 34% > 20%", prompts=500,
            rejected=0, done=120, failed=41, skipped=0, pending=339, in_flight=0, prompt_tokens=90_000,
            completion_tokens=52_000, reasoning_tokens=9_000, cost_usd=0.1502, token_budget=None,
            errors={"midstream": 40, "timeout": 1}, req_per_s=0.0, req_per_s_since_start=0.4,
            avg_completion_tokens=433.3, avg_completion_tokens_recent=398.0, eta_s=None,
        ),
        DatasetSnapshot(
            name="b3_oss_instruct", state="done", state_reason="", prompts=75, rejected=0, done=75, failed=0,
            skipped=0, pending=0, in_flight=0, prompt_tokens=30_000, completion_tokens=31_000,
            reasoning_tokens=8_000, cost_usd=0.0712, token_budget=None, avg_completion_tokens=413.3,
            avg_completion_tokens_recent=413.3, eta_s=0.0,
        ),
        DatasetSnapshot(
            name="b8_swe_agent", state="skipped", state_reason="skipped by user", prompts=60, rejected=3, done=0,
            failed=0, skipped=60, pending=0, in_flight=0, prompt_tokens=0, completion_tokens=0,
            reasoning_tokens=0, cost_usd=0.0, token_budget=None,
        ),
    )
    history = tuple((float(t), 5.0 + 2.0 * ((t // 10) % 5) / 4, 2000.0 + 900.0 * ((t // 20) % 4) / 3)
                    for t in range(600, 1210, 10))
    providers = (
        ProviderSnapshot("SimA", 2500, {"rate_limit": 20}, 0.008, 1.42, 4.05, 0.131, 0.402, 105.0, 410.0, 2.61, False),
        ProviderSnapshot("SimB", 1600, {"server": 4, "rate_limit": 11}, 0.0094, 1.38, 3.71, 0.124, 0.388, 107.0,
                         405.0, 1.55, False),
        ProviderSnapshot("SimC", 240, {"midstream": 40, "timeout": 1}, 0.171, 2.9, 9.8, 0.6, 2.1, 40.0, 380.0, 0.19,
                         True),
    )
    return RunSnapshot(
        name="demo", state="running", state_reason="", elapsed_s=1210.0, datasets=ds,
        classes=(ClassSnapshot("short", 200, 200, 10240), ClassSnapshot("long", 50, 0, 16384)),
        in_flight=200, req_per_s=6.9, cost_usd=4.3448,
        errors={"rate_limit": 31, "server": 4, "midstream": 40, "timeout": 1}, writer_queue=12,
        credits_usd=95.6552, credits_age_s=14.0, spend_rate_usd_per_h=12.93, projected_total_cost_usd=10.05,
        max_cost_usd=25.0, cost_in_flight_usd=0.1984, eta_s=820.0, tok_per_s=2850.0, loop_lag_ms=3.2,
        providers=providers,
        latest_errors={"rate_limit": "SimA is temporarily rate-limited upstream; retry after 2s",
                       "server": "HTTP 502 Bad Gateway from SimB", "midstream": "stream ended with error: overloaded",
                       "timeout": "no bytes for 30s (stalled stream)"},
        history=history,
        events=(
            "12:00:01 INFO    run started",
            "12:14:09 WARNING [b1_glaive] dataset paused: anomaly guard: error rate 34% > 20%",
            "12:15:40 WARNING provider SimC excluded (routing ignore)",
            "12:17:02 INFO    [b8_swe_agent] dataset skipped: skipped by user",
        ),
    )


FIXED_GPUS = GpuReading(True, "", (
    GpuSnapshot(0, "NVIDIA H200", 87.0, 120 * 1024**3, 141 * 1024**3, 71.0, 612.0, 700.0),
    GpuSnapshot(1, "NVIDIA H200", 4.0, 2 * 1024**3, 141 * 1024**3, 38.0, 118.0, 700.0),
), 1.0)
"""Two GPUs, one busy and one idle."""


_ID = re.compile(r"terminal-\d+")


def normalise_svg(svg: str) -> str:
    """``svg`` with Textual/Rich's render-specific ``terminal-<number>`` ids replaced."""
    return _ID.sub("terminal-X", svg)


def svg_text(svg: str) -> str:
    """The visible text of an SVG screenshot, one line per terminal row, each glyph in its column."""
    rows: dict[float, dict[int, str]] = {}
    pattern = r'<text[^>]*\bx="([\d.]+)" y="([\d.]+)" textLength="([\d.]+)" clip-path[^>]*>(.*?)</text>'
    for m in re.finditer(pattern, svg, re.S):
        body = html.unescape(m.group(4)).replace("\xa0", " ")
        if not body or body == "\n":
            continue
        x, y, length = float(m.group(1)), float(m.group(2)), float(m.group(3))
        cell = length / len(body)  # Rich exports 0.61 * font size per cell (12.2 px)
        col = round(x / cell)
        row = rows.setdefault(y, {})
        for i, ch in enumerate(body):
            row[col + i] = ch
    lines = []
    for _, cells in sorted(rows.items()):
        width = max(cells) + 1
        lines.append("".join(cells.get(i, " ") for i in range(width)).rstrip())
    return "\n".join(lines)


def screen_text(app: Any) -> str:
    """The visible text of ``app``'s current screen."""
    return svg_text(app.export_screenshot())
