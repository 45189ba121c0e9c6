"""Helpers for end-to-end tests: a `datagen sim` subprocess and configs covering all eight datasets."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import SAMPLES

PY = sys.executable

#: Rows in the published schemas of the four datasets without a sample file (SOURCES.md).
SCHEMA_ROWS = {
    "b2_opencodeinstruct": [
        {"id": f"oci-{i}", "input": f"Write a Python function that returns the {i}th Fibonacci number.", "output": "def f(n): ...",
         "domain": "algorithmic", "generation_algorithm": "self-instruct", "llm_judgement": "{}",
         "unit_tests": "['assert f(1) == 1']", "tests_execution_status": "[]", "average_test_score": "1.0"}
        for i in range(6)
    ],
    "b4_mixture_of_thoughts": [
        {"messages": [{"role": "user", "content": f"Prove that {i} + {i} is even."},
                      {"role": "assistant", "content": "<think>2k</think>It is 2x."}], "num_tokens": 100, "source": "math"}
        for i in range(6)
    ],
    "b5_openthoughts": [
        {"system": "Your role as an assistant involves thoroughly exploring questions.",
         "conversations": [{"from": "user", "value": f"How many primes are below {10 * (i + 2)}?"},
                           {"from": "assistant", "value": "<|begin_of_thought|>...<|end_of_thought|><|begin_of_solution|>4<|end_of_solution|>"}]}
        for i in range(6)
    ],
    "b6_ultrachat": [
        {"prompt": f"Tell me about topic {i}.", "prompt_id": f"{i:064x}",
         "messages": [{"role": "user", "content": f"Tell me about topic {i}."}, {"role": "assistant", "content": "Sure."},
                      {"role": "user", "content": "More detail please."}, {"role": "assistant", "content": "Here."}]}
        for i in range(6)
    ],
}

SAMPLE_DATASETS = [
    ("b1_glaive", "b1_glaive.jsonl", "glaive"),
    ("b3_oss_instruct", "b3_magicoder_oss_instruct.jsonl", "oss_instruct"),
    ("b3_evol_instruct", "b3_magicoder_evol_instruct.jsonl", "instruction"),
    ("b7_sharegpt", "b7_sharegpt.json", "sharegpt"),
    ("b8_swe_agent", "b8_swe_agent_trajectories.jsonl", "swe_agent"),
]


class SimProcess:
    """`datagen sim` in its own process on an ephemeral loopback port."""

    def __init__(self, *args: str, log: Path | None = None) -> None:
        cmd = [PY, "-m", "engine.cli", "sim", "--port", "0", *args]
        if log is not None:
            cmd += ["--log", str(log)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"(http://127\.0\.0\.1:\d+/api/v1)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"simulator did not start: {line!r}")
        self.base_url = m.group(1)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def eight_dataset_config(tmp_path: Path, base_url: str, *, stall_s: float = 2.0, extra_run: str = "",
                         tokens_env: str = "E2E_KEY") -> Path:
    """Write a config over the five sample files and four schema-row files, against ``base_url``."""
    entries = []
    for name, fname, fmt in SAMPLE_DATASETS:
        entries.append((name, str(SAMPLES / fname), fmt))
    for name, rows in SCHEMA_ROWS.items():
        p = tmp_path / f"{name}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        entries.append((name, str(p), "auto"))
    ds = "".join(f'\n[[datasets]]\nname = "{n}"\npath = "{p}"\nformat = "{f}"\n' for n, p, f in entries)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"""
[run]
name = "e2e"
dir = "{tmp_path / 'run'}"
progress_interval_s = 1
commit_interval_s = 0.5
max_attempts = 6
{extra_run}
[provider]
kind = "openai"
base_url = "{base_url}"
api_key_env = "{tokens_env}"
[provider.timeouts]
connect_s = 5
stall_s = {stall_s}
total_s = 120
[classes.short]
max_tokens = 4096
concurrency = 64
[classes.long]
max_tokens = 8192
concurrency = 16
min_prompt_tokens = 8000
{ds}""")
    return cfg


def run_env(key: str = "sk-test-e2e") -> dict[str, str]:
    env = dict(os.environ)
    env["E2E_KEY"] = key
    return env


def status_json(run_dir: Path) -> dict:
    out = subprocess.run([PY, "-m", "engine.cli", "status", str(run_dir), "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def wait_for(pred, timeout: float, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise TimeoutError("condition not met")
