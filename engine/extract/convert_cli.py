"""``datagen extract --convert OUT --to LAYOUT``: progress lines and exit codes around :func:`engine.extract.convert.convert`."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from engine.extract.convert import convert
from engine.extract.disk import fmt_bytes
from engine.extract.job import ExtractError, require_extract_packages
from engine.proc.runlock import DirectoryInUse


def run_convert(src: str, to: str | None, *, out: str | None = None, model: str | None = None,
                delete_source: bool = False, draft_config: str | None = None) -> int:
    """Convert, printing progress to stdout. Returns 0 complete, 1 error, refused (a live process holds
    the source's or the destination's ``extract.lock``), stopped (SIGINT/SIGTERM stop after the
    current shard; rerun to resume) or not complete because the source extraction is not."""
    if not to:
        print("error: --convert needs --to speculators|specforge|modelopt", file=sys.stderr)
        return 1
    try:
        require_extract_packages("datagen extract --convert", layout=to)
    except ExtractError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    s = Path(src)
    dst = Path(out) if out else s.with_name(f"{s.resolve().name}-{to}")
    stop = threading.Event()
    last = [0.0]

    def on_signal(_signum: int, _frame: Any) -> None:
        stop.set()

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 2.0 or done == total:
            last[0] = now
            print(f"convert: {done}/{total} samples in {dst}", flush=True)

    old = [signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)]
    try:
        rep = convert(s, dst, to, model=model, delete_source=delete_source, stop=stop, progress=progress,
                      draft_config=draft_config)
    except (ExtractError, DirectoryInUse) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, old[0])
        signal.signal(signal.SIGTERM, old[1])
    print(f"convert: {rep.converted} converted, {rep.already} already there, {fmt_bytes(rep.bytes_written)} written"
          + (f", {rep.shards_deleted} source shard(s) deleted" if delete_source else "")
          + ("; complete" if rep.complete else
             f"; NOT complete: {rep.source_reason}; convert again once it is" if not rep.source_complete else
             "; NOT complete: rerun to resume"), flush=True)
    if rep.layer_ids is not None:
        print(f"convert: aux layers as {to} numbers them: eagle_aux_hidden_state_layer_ids = {rep.layer_ids}"
              + (" (the draft config's)" if draft_config else " (the draft config must say the same; "
                 "--draft-config FILE checks it)"), flush=True)
    return 0 if rep.complete else 1
