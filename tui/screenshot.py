"""``python -m tui.screenshot [OUT.svg] [--config config.toml] [--seconds 20]``: run the job of a
config (default: the repository's demo ``config.toml`` on the simulator) under the dashboard,
headless at 160x48, in a temporary run directory, and save a mid-run SVG screenshot with
``App.save_screenshot`` (default ``docs/dashboard.svg``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
from pathlib import Path

from engine.api import load_config
from tui.app import DashboardApp

REPO = Path(__file__).resolve().parents[1]


async def take(config: Path, out: Path, seconds: float, size: tuple[int, int] = (160, 48),
               tokens_per_s: float | None = None) -> Path:
    """Run ``config`` for ``seconds`` seconds of dashboard time, save ``out``, quit with abort.

    ``tokens_per_s`` overrides ``[provider.sim] tokens_per_s`` (slower streams: a longer run)."""
    cfg = load_config(config)
    logging.getLogger().setLevel(logging.INFO)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"dir": Path(tmp) / "run"})})
        if tokens_per_s is not None:
            sim = cfg.provider.sim.model_copy(update={"tokens_per_s": tokens_per_s})
            cfg = cfg.model_copy(update={"provider": cfg.provider.model_copy(update={"sim": sim})})
        app = DashboardApp(cfg, install_signals=False)
        async with app.run_test(size=size) as pilot:
            await pilot.pause(seconds)
            out.parent.mkdir(parents=True, exist_ok=True)
            app.save_screenshot(out.name, str(out.parent))
            app.begin_quit("abort")
            for _ in range(300):
                if not app.is_running:
                    break
                await pilot.pause(0.1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tui.screenshot")
    p.add_argument("out", nargs="?", default=str(REPO / "docs" / "dashboard.svg"))
    p.add_argument("--config", default=str(REPO / "config.toml"))
    p.add_argument("--seconds", type=float, default=15.0, help="run time before the screenshot (s)")
    p.add_argument("--tokens-per-s", type=float, default=40.0, help="simulator stream speed (tokens/s)")
    args = p.parse_args(argv)
    print(asyncio.run(take(Path(args.config), Path(args.out), args.seconds, tokens_per_s=args.tokens_per_s)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
