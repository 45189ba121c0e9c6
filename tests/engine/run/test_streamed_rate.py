"""Issue 33: with streams of minutes, the figures the user reads must count what is streaming. The token rate
counts tokens as they stream (it counted finished completions: 194 tok/s shown for ~5,500 streaming), and
tokens streamed are counted at the run's own characters per token (characters / 4 read 1.4x the provider's
count on the simulator). The engine against the simulator as a real loopback server."""

from __future__ import annotations

import asyncio
import io
import json

import pytest

from engine.client.progress import DEFAULT_CHARS_PER_TOKEN, StreamProgress, TokenRatio
from engine.config import parse_config
from engine.run.headless import run_headless
from engine.run.runstate import DatasetRuntime


def test_token_ratio_learns_characters_per_token_and_progress_reads_through_it():
    ratio = TokenRatio(min_tokens=100)
    prog = StreamProgress(ratio)
    prog.chars_received = 560
    assert prog.tokens_received == 560 / DEFAULT_CHARS_PER_TOKEN  # 4 before anything finished
    ratio.observe(5_600, 1_000)  # 5.6 characters per billed token
    assert ratio.chars_per_token == pytest.approx(5.6)
    assert prog.tokens_received == 100  # the same stream, read at the learned ratio
    ratio.observe(10, 0)  # nothing billed: ignored
    assert ratio.chars_per_token == pytest.approx(5.6)
    assert StreamProgress().tokens_received == 0


def test_streamed_tokens_feed_the_rate_and_a_failed_stream_never_counts_down():
    rt = DatasetRuntime(name="a", position=0, prompts=10, rejected=0, token_budget=None)
    assert rt.note_streamed(0.0, 0.0) == 0.0  # the first reading sets the mark
    assert rt.note_streamed(1.0, 400.0) == 400.0  # streams in flight
    rt.completion_tokens += 300  # one finished at 300 billed tokens; its 280 streamed left the in-flight sum
    assert rt.note_streamed(2.0, 120.0 + 50.0) == pytest.approx(300 + 170 - 400)
    assert rt.note_streamed(3.0, 0.0) == 0.0  # a stream failed: its tokens leave the sum, nothing counted
    assert rt.tok_rate.since_start == pytest.approx(470)


def _cfg(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"Question {i}: explain topic {i} in detail."}) + "\n" for i in range(60)))
    return parse_config({
        "run": {"name": "rate", "dir": str(tmp_path / "run"), "commit_interval_s": 0.1, "progress_interval_s": 1},
        "provider": {"kind": "simulated", "timeouts": {"stall_s": 30},
                     "sim": {"seed": 1, "mean_completion_tokens": 4000, "tokens_per_s": 50, "latency_ms": 20,
                             "providers": ["SimA"], "cancellable": ["SimA"], "faults": ""}},
        "classes": {"short": {"max_tokens": 8000, "concurrency": 20}},
        "datasets": [{"name": "a", "path": str(p), "format": "text"}],
    }, tmp_path / "config.toml")


async def test_the_token_rate_counts_streams_in_flight_before_any_finishes(tmp_path):
    """20 streams of 50 tokens/s, mean 4,000 tokens (80 s): after 4 s almost none has finished, yet ~1,000
    tokens/s are streaming. Before the fix the run's and the dataset's tok/s read about 0 here."""
    got: dict = {}

    def ready(job):
        async def go():
            s = job.scheduler
            while not s.datasets or s.snapshot().in_flight < 20:
                await asyncio.sleep(0.05)
            await asyncio.sleep(4.0)
            snap = s.snapshot()
            got["snap"] = snap
            got["streaming"] = sum(p.tokens_received for _c, p, _e in s.datasets["a"].streams.values())
            s.ending.stop("test", abort=True)

        got["t"] = asyncio.get_running_loop().create_task(go())

    await run_headless(_cfg(tmp_path), io.StringIO(), install_signals=False, on_ready=ready)
    snap = got["snap"]
    d = snap.dataset("a")
    finished_rate = d.completion_tokens / 5.0  # what a rate of finished completions could show at most
    print(f"\nrun tok/s {snap.tok_per_s:.0f}, dataset {d.tok_per_s:.0f}, finished-only <= {finished_rate:.0f}, "
          f"in flight {d.in_flight}, streamed so far {got['streaming']:.0f}")
    assert d.done <= 3
    assert d.tok_per_s >= 0.4 * 20 * 50  # the streams' own 1,000 tokens/s, within rate-window ramp-up and load
    assert snap.tok_per_s >= 0.4 * 20 * 50
    assert d.tok_per_s > 3 * finished_rate
