"""``python -m tui.extract --demo [--screenshot OUT.svg] [--size 160x48]``: the extraction view over a
scripted 8-GPU job (no engine, no GPU): ``p`` pauses/resumes, ``s`` skips the highlighted dataset,
``q`` drains then (again) aborts. With ``--screenshot``, the fixed snapshot of :mod:`tui.extract.demo`
is saved as an SVG (headless) instead."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from tui.extract.app import ExtractApp
from tui.extract.demo import DemoExtraction, fixed_extract_snapshot
from tui.extract.host import RecordingCommands, StaticExtractHost


def size_arg(text: str) -> tuple[int, int]:
    """``"160x48"`` -> ``(160, 48)``.

    Raises:
        argparse.ArgumentTypeError: not ``COLSxROWS`` with positive numbers.
    """
    cols, _, rows = text.lower().partition("x")
    if not (cols.isdigit() and rows.isdigit() and int(cols) > 0 and int(rows) > 0):
        raise argparse.ArgumentTypeError(f"--size must be COLSxROWS such as 160x48, got {text!r}")
    return int(cols), int(rows)


async def screenshot(out: Path, size: tuple[int, int]) -> Path:
    """Save the fixed snapshot's view at ``size`` to ``out`` (SVG); returns ``out``."""
    snap = fixed_extract_snapshot()
    app = ExtractApp(StaticExtractHost(lambda: snap, RecordingCommands()), refresh_hz=20)
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.3)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(app.export_screenshot(title="eagle-datagen extract"), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tui.extract", description=__doc__)
    p.add_argument("--demo", action="store_true", help="show a scripted 8-GPU extraction (no engine)")
    p.add_argument("--screenshot", metavar="OUT.svg", help="save the fixed snapshot's view as an SVG and exit")
    p.add_argument("--size", type=size_arg, default=(160, 48), help="screenshot size COLSxROWS (default 160x48)")
    args = p.parse_args(argv)
    if args.screenshot:
        print(asyncio.run(screenshot(Path(args.screenshot), args.size)))
        return 0
    if not args.demo:
        p.error("give --demo or --screenshot (the real view opens with `datagen extract CONFIG` on a terminal)")
    demo = DemoExtraction()
    return ExtractApp(demo).run() or 0


if __name__ == "__main__":
    raise SystemExit(main())
