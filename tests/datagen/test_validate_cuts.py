"""``datagen validate`` tells the cuts the config asked for from faults (issue 33).

A completion cut at the class's ``max_tokens`` (finish ``length``) is what the config asked for:
before, ``validate`` exited 1 when those were the only invalid records, as if the run had a fault.
Now it counts both (``cut_at_max_tokens``, ``faults``), exits 0 when every invalid record is such a
cut, and 1 when any fault remains. A real run on the simulator (real HTTP on 127.0.0.1, a real
SQLite store), validated with the Kimi-layout tokenizer.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

from e2e import run_cmd, write_prompts
from fixtures_tokens import kimi_dir
from helpers import REPO

from datagen.cli import main

MAX_TOKENS = 80


def _config(tmp: Path, *, sim_counts_with_tokenizer: bool = True) -> Path:
    sim_tok = f'tokenizer = "{kimi_dir()}"\n' if sim_counts_with_tokenizer else ""
    data = write_prompts(tmp / "prompts.jsonl", 30)
    cfg = tmp / "config.toml"
    cfg.write_text(f"""
[run]
name = "cuts"
dir = "{tmp / 'run'}"
commit_interval_s = 0.2
progress_interval_s = 30
[provider]
kind = "simulated"
[provider.sim]
seed = 5
latency_ms = 0
tokens_per_s = 0
mean_completion_tokens = 120
{sim_tok}
[classes.short]
max_tokens = {MAX_TOKENS}
concurrency = 8
[tokenizer]
path = "{kimi_dir()}"
executor = "thread"
[[datasets]]
name = "d"
path = "{data}"
format = "text"
""")
    return cfg


def _run(cfg: Path) -> Path:
    p = subprocess.run(run_cmd(cfg), capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return cfg.parent / "run"


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def _cut_rows(run_dir: Path) -> list[tuple[int, int]]:
    with sqlite3.connect(run_dir / "store.sqlite") as c:
        return c.execute("SELECT prompt_id, completion_tokens FROM results WHERE finish_reason='length'").fetchall()


def test_validate_exits_0_when_the_only_invalid_records_are_cuts_at_max_tokens(tmp_path, capsys):
    run_dir = _run(_config(tmp_path))
    cuts = _cut_rows(run_dir)
    assert 3 <= len(cuts) < 30, cuts  # mean 120 tokens over max_tokens 80: most, not all, are cut
    assert all(MAX_TOKENS - 16 <= n <= MAX_TOKENS for _pid, n in cuts), cuts  # cut at max_tokens
    code, out, err = _cli(capsys, "validate", str(run_dir), "--json")
    doc = json.loads(out)
    assert (doc["records"], doc["invalid"], doc["cut_at_max_tokens"], doc["faults"]) == (30, len(cuts), len(cuts), 0)
    assert doc["max_tokens"] == {"short": MAX_TOKENS} and doc["datasets"]["d"]["cut_at_max_tokens"] == len(cuts)
    assert code == 0, err  # before: 1, as if the run had a fault
    code, out, err = _cli(capsys, "validate", str(run_dir))
    assert code == 0
    assert f"invalid: {len(cuts)} cut at max_tokens as the config asks (finish length; max_tokens short 80), 0 fault(s)" in out
    assert f"{len(cuts)} of 30 record(s) cut at max_tokens as the config asks (finish length)" in err


def test_validate_exits_1_on_a_fault_beside_the_cuts_and_counts_both(tmp_path, capsys):
    # The simulator counts usage with its own words, not the [tokenizer]: every uncut record fails
    # billing_diff (a fault); a cut is not checked for it (its usage is capped by max_tokens).
    run_dir = _run(_config(tmp_path, sim_counts_with_tokenizer=False))
    cuts = len(_cut_rows(run_dir))
    code, out, err = _cli(capsys, "validate", str(run_dir), "--json")
    doc = json.loads(out)
    assert code == 1
    assert (doc["invalid"], doc["cut_at_max_tokens"], doc["faults"]) == (30, cuts, 30 - cuts)
    assert doc["checks"]["billing_diff"] == 30 - cuts > 0
    assert f"{30 - cuts} of 30 record(s) invalid by a fault" in err
    assert f"{cuts} of 30 record(s) cut at max_tokens as the config asks" in err


def test_a_length_finish_well_below_max_tokens_is_a_fault(tmp_path, capsys):
    """A provider's own cut (finish ``length`` far below ``max_tokens``: a context limit, a moderation
    stop) is no cut the config asked for: it stays a fault."""
    run_dir = _run(_config(tmp_path))
    pid, _n = _cut_rows(run_dir)[0]
    with sqlite3.connect(run_dir / "store.sqlite") as c:  # as if the provider had stopped at 20 tokens
        c.execute("UPDATE results SET completion_tokens=20 WHERE prompt_id=?", (pid,))
    code, out, _err = _cli(capsys, "validate", str(run_dir), "--json")
    doc = json.loads(out)
    assert code == 1 and doc["faults"] == 1 and doc["cut_at_max_tokens"] == doc["invalid"] - 1


def test_without_stored_settings_every_cut_is_a_fault(tmp_path, capsys):
    run_dir = _run(_config(tmp_path))
    with sqlite3.connect(run_dir / "store.sqlite") as c:  # a run directory from before the settings were stored
        c.execute("DELETE FROM meta WHERE key='run_settings'")
    code, out, _ = _cli(capsys, "validate", str(run_dir))
    assert code == 1 and "max_tokens unknown: no settings stored with the run, every cut counts as a fault" in out
