"""``[extract] after_run = "follow"`` after ``kill -9``: a ``datagen run`` subprocess is killed while its
follow extraction writes (workers die with it) and a3 is still to buy (held by ``datagen ctl pause``),
then the run is started again: generation buys the rest, its follow picks up where the output
directory stands, and the final manifest lists every validated record exactly once.
Real simulator, tokenizer and extraction workers on the tiny model (CPU)."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import pytest
from extract_jobs import lines, manifest_ids
from follow_jobs import follow_data, stored, write_toml

from engine.config import parse_config
from engine.run.chain import ExtractChain, run_headless_chained
from engine.run.ctl import send
from engine.tokens.exports import iter_token_records

pytestmark = pytest.mark.usefixtures("one_thread")  # the workers: the machine is shared

TINY_VOCAB = 4200  # the shared `tiny` fixture's vocabulary
REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow  # a subprocess, a kill -9 and a second run: ~25 s alone, more on a shared machine (`make slow`)
def test_a_restart_after_kill_9_resumes_following_exactly_once(tmp_path: Path, tiny: Path) -> None:
    # small batches: the extraction commits a few samples at a time, so the kill lands inside one
    data = follow_data(tmp_path, tiny, prompts=24, latency_ms=150, max_tokens_per_batch=256)
    cfg_path = write_toml(tmp_path / "config.toml", data)
    manifest = tmp_path / "run" / "extract" / "manifest.jsonl"
    log = (tmp_path / "first.log").open("wb")
    p = subprocess.Popen([sys.executable, "-m", "datagen", "run", str(cfg_path), "--headless"], cwd=REPO,
                         stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    run_dir = tmp_path / "run"

    def wait(until: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 120
        while not until():
            assert p.poll() is None and time.monotonic() < deadline, (tmp_path / "first.log").read_text()[-3000:]
            time.sleep(0.02)

    try:
        wait(lambda: stored(run_dir, "a3") > 0)
        assert send(run_dir, "pause", "a3").ok  # a3 is still to buy when the process dies
        wait(lambda: lines(manifest) >= 6)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
        log.close()
    first = Counter(manifest_ids(tmp_path / "run" / "extract"))
    assert first and max(first.values()) == 1
    a3_at_kill = stored(run_dir, "a3")
    assert a3_at_kill < 24
    time.sleep(1)  # the workers die with their launcher (PR_SET_PDEATHSIG)
    assert send(run_dir, "resume", "a3").ok  # no engine: saved for the next start

    cfg = parse_config(data, cfg_path)
    out = io.StringIO()
    chains: list[ExtractChain] = []
    code = asyncio.run(run_headless_chained(cfg, out, install_signals=False, on_chain=chains.append))
    text = out.getvalue()
    assert code == 0, text[-4000:]
    done_before = ", ".join(f"{n} {c}" for n, c in sorted(Counter(i.split(":")[0] for i in first).items()))
    assert f"extract: following generation; already extracted: {done_before}" in text, text[-4000:]
    validated = sorted(r.id for r in iter_token_records(cfg.run.dir))
    assert len(validated) == 3 * 24 and stored(run_dir, "a3") == 24  # the rerun bought a3's rest
    ids = manifest_ids(tmp_path / "run" / "extract")
    assert Counter(ids).most_common(1)[0][1] == 1 and sorted(ids) == validated
    assert ids[:len(first)] == list(first)  # appended after what the killed run had written
    assert not list((tmp_path / "run" / "extract" / "status" / "follow-input").glob("*"))
