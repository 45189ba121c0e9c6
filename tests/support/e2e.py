"""Helpers for end-to-end tests: a `datagen sim` subprocess and configs covering all eight datasets."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path

from helpers import SAMPLES
from waiting import wait_for  # noqa: F401 - re-exported

PY = sys.executable

#: Rows in the published schemas of the four datasets without a sample file (docs/datasets.md).
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
                           {"from": "assistant", "value": "<|begin_of_thought|>...<|end_of_thought|>"
                                                          "<|begin_of_solution|>4<|end_of_solution|>"}]}
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
    """`datagen sim` in its own process on an ephemeral loopback port.

    After the first line its output is drained by a thread into :attr:`output` (the last 200
    lines), so a chatty simulator never blocks on a full pipe.
    """

    def __init__(self, *args: str, log: Path | None = None, env: dict[str, str] | None = None) -> None:
        cmd = [PY, "-m", "datagen", "sim", "--port", "0", *args]
        if log is not None:
            cmd += ["--log", str(log)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        line = self.proc.stdout.readline()
        m = re.search(r"(http://(?:127\.0\.0\.1|0\.0\.0\.0|\[::1?\]):\d+/api/v1)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"simulator did not start: {line!r}")
        self.base_url = m.group(1)
        self.first_line = line
        self.output: deque[str] = deque(maxlen=200)
        self._drain = threading.Thread(target=self._read_rest, daemon=True)
        self._drain.start()

    def _read_rest(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)

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
[spend]
anomaly_error_rate = 0.5   # the fault mix here is deliberately heavy
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
    out = subprocess.run([PY, "-m", "datagen", "status", str(run_dir), "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


# ---- helpers for the chaos / soak / signal / security suites ------------------------------------

def write_prompts(path: Path, n: int, tag: str = "", bad_rows: bool = False) -> Path:
    """A ``text`` dataset of ``n`` distinct prompts (plus, with ``bad_rows``, an invalid JSON row
    after the first and a duplicate of the first as the last row: ``n`` valid prompts either way)."""
    rows = [json.dumps({"prompt": f"{tag}Question number {i}: explain topic {i * 7919 % 1000} in depth."}) for i in range(n)]
    if bad_rows and rows:
        rows.insert(1, '{"prompt": "broken row",')
        rows.append(rows[0])
    path.write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    return path


def integrity(db: Path) -> str:
    """``PRAGMA integrity_check`` of a store (read through a fresh connection; WAL is recovered)."""
    conn = sqlite3.connect(db, timeout=30)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def rss_kb(pid: int) -> int | None:
    """Resident set size (kB) of a live process from ``/proc/PID/status``, or None when gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def socket_count(pid: int | str = "self") -> int | None:
    """Open sockets of a process: entries of ``/proc/PID/fd`` that link to ``socket:[...]``."""
    n = 0
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                n += 1
        except OSError:
            pass
    return n


def run_cmd(cfg: Path, *extra: str) -> list[str]:
    """``datagen run CONFIG --headless`` as an argv list."""
    return [PY, "-m", "datagen", "run", str(cfg), "--headless", *extra]


def live_status(run_dir: Path) -> dict | None:
    """``collect_status`` in-process, or None while the store does not exist yet or is being created
    (``datagen status`` fails with ``no such table`` in the instant between file and schema)."""
    from engine.report.status import StatusError, collect_status

    if not (Path(run_dir) / "store.sqlite").exists():
        return None
    try:
        return collect_status(Path(run_dir))
    except (StatusError, sqlite3.Error):
        return None


# ---- the eight datasets (+ tool rows) through the simulator counting with a fixture tokenizer ----------
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Web search",
                                      "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]


def write_run_config(tmp: Path, tok: Path, markers: dict[str, str], *, faults: str = "", max_tokens: int = 6000,
                     tools_rows: int = 0) -> Path:
    """config.toml over the eight datasets (+ an optional tool-calling set), simulator counting with ``tok``."""
    entries = [(n, SAMPLES / f, fmt) for n, f, fmt in SAMPLE_DATASETS]
    for name, rows in SCHEMA_ROWS.items():
        p = tmp / f"{name}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        entries.append((name, p, "auto"))
    if tools_rows:
        p = tmp / "tools.jsonl"
        p.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Weather in city number {i}?"}],
                                         "tools": TOOLS}) + "\n" for i in range(tools_rows)))
        entries.append(("tools", p, "openai"))
    ds = "".join(f'\n[[datasets]]\nname = "{n}"\npath = "{p}"\nformat = "{f}"\n' for n, p, f in entries)
    mk = "".join(f'{k} = "{v}"\n' for k, v in markers.items())
    # injected data faults fail records on purpose: the anomaly guard would pause the datasets, and a pause holds
    # what was dispatched but not sent, so the run would wait for a resume that never comes
    guard = "max_failure_rate = 0\n" if faults else ""
    cfg = tmp / "config.toml"
    cfg.write_text(f"""
[run]
name = "tokens"
dir = "{tmp / 'run'}"
commit_interval_s = 0.2
progress_interval_s = 30
[provider]
kind = "simulated"
[provider.sim]
seed = 7
mean_completion_tokens = 250
tokenizer = "{tok}"
faults = "{faults}"
log = "{tmp / 'sim.jsonl'}"
[classes.short]
max_tokens = {max_tokens}
concurrency = 64
[tokenizer]
path = "{tok}"
billing_tolerance_tokens = 0
billing_tolerance_pct = 0
executor = "thread"
{guard}{mk}{ds}""")
    return cfg
