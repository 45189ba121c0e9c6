"""Commands that report failure as failure (issue 16, part 6).

- ``datagen validate`` / ``datagen export``: exit 0 all valid / exported, 1 invalid records or
  nothing exported (nothing written), 2 error; ``billing_diff`` is not a structural error.
- A missing API key is refused at start, naming the variable, with zero requests reaching a real
  loopback simulator.
- The rehearsal recipe (kind ``openai`` against a ``datagen sim --credits 5`` subprocess) reads credits.
- ``make demo`` ends with a validated ``tokens`` export: the demo tokenizer builds offline, the real
  ``config.toml`` runs, validates and exports with exit 0.
- documentation facts (README.md and docs/*.md: key length, sample files, ``file:N`` sources, optional
  ``--format``) and
  ``stacks.txt`` written 0600.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from e2e import PY, SimProcess, run_cmd, status_json, write_prompts
from fixtures_tokens import kimi_dir
from helpers import REPO, SAMPLES

from datagen.cli import main
from engine.config import ProviderSection
from engine.prompts import prompt_key
from engine.run.apikey import resolve_api_key
from engine.sim import SimConfig, SimThread

#: README.md and every docs/*.md page, where the facts below are documented.
DOCS = "\n".join(p.read_text(encoding="utf-8") for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])


def _env(**set_: str) -> dict[str, str]:
    """The test's environment without any API key variable, plus ``set_``."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENROUTER_API_KEY", "OPENAI_API_KEY", "REH_KEY")}
    env.update(set_)
    return env


def _tok_config(tmp: Path, *, sim_counts_with_tokenizer: bool, tolerance_pct: float = 0.0) -> Path:
    """A simulated run over the five-prompt glaive sample with the Kimi-layout [tokenizer]."""
    sim_tok = f'tokenizer = "{kimi_dir()}"\n' if sim_counts_with_tokenizer else ""
    cfg = tmp / f"config-{tolerance_pct:g}.toml"
    cfg.write_text(f"""
[run]
name = "exit"
dir = "{tmp / 'run'}"
commit_interval_s = 0.2
progress_interval_s = 30
[provider]
kind = "simulated"
[provider.sim]
seed = 3
latency_ms = 0
tokens_per_s = 0
mean_completion_tokens = 120
{sim_tok}
[classes.short]
max_tokens = 4000
concurrency = 8
[tokenizer]
path = "{kimi_dir()}"
executor = "thread"
billing_tolerance_tokens = 0
billing_tolerance_pct = {tolerance_pct}
[[datasets]]
name = "b1_glaive"
path = "{SAMPLES / 'b1_glaive.jsonl'}"
format = "glaive"
""")
    return cfg


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def _run(cfg: Path) -> None:
    p = subprocess.run(run_cmd(cfg), capture_output=True, text=True, timeout=120, cwd=REPO, env=_env())
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]


# ---------------------------------------------------------------------------------- exit codes

def test_validate_and_export_exit_1_when_every_record_is_invalid_and_write_nothing(tmp_path, capsys):
    # The simulator counts usage with its own tokenizer, not the [tokenizer]: every record fails billing_diff.
    cfg = _tok_config(tmp_path, sim_counts_with_tokenizer=False)
    _run(cfg)
    run_dir = tmp_path / "run"
    code, out, err = _cli(capsys, "validate", str(run_dir), "--json")
    doc = json.loads(out)
    assert code == 1, (doc["invalid"], doc["records"])
    assert doc["records"] == 5 and doc["invalid"] == 5 and doc["checks"]["billing_diff"] == 5
    assert doc["structural_errors"] == 0  # a billing mismatch is not a structural error
    assert "5 of 5 record(s) invalid" in err
    code, out, _ = _cli(capsys, "validate", str(run_dir))
    assert code == 1 and "records 5: ok 0, invalid 5 (structural errors 0)" in out
    for fmt in ("specforge", "openai", "tokens"):
        out_dir = tmp_path / fmt
        code, out, err = _cli(capsys, "export", str(run_dir), "--format", fmt, "--out", str(out_dir))
        assert code == 1, (fmt, out, err)
        assert "nothing to export: none of the 5 stored result(s)" in err and "billing_diff 5" in err
        assert not out_dir.exists() or not list(out_dir.iterdir()), fmt  # no empty files
    # --include-invalid exports them (exit 0)
    code, out, _ = _cli(capsys, "export", str(run_dir), "--format", "tokens", "--out", str(tmp_path / "all"),
                        "--include-invalid")
    assert code == 0 and pq.read_metadata(tmp_path / "all" / "b1_glaive.parquet").num_rows == 5

    # Re-validated with a tolerance that admits the difference: all valid -> 0, export -> 0 with rows.
    loose = _tok_config(tmp_path, sim_counts_with_tokenizer=False, tolerance_pct=1000.0)
    code, out, _ = _cli(capsys, "validate", str(run_dir), "--config", str(loose), "--json")
    assert code == 0 and json.loads(out)["ok"] == 5
    code, out, _ = _cli(capsys, "export", str(run_dir), "--format", "openai", "--out", str(tmp_path / "ok"))
    assert code == 0 and f"{tmp_path / 'ok' / 'b1_glaive.jsonl'}: 5 lines" in out
    assert "left out" not in out


def test_export_and_validate_errors_exit_2_and_an_empty_run_exits_1(tmp_path, capsys):
    code, _, err = _cli(capsys, "export", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert code == 2 and "error:" in err
    code, _, err = _cli(capsys, "export", str(tmp_path / "nope"), "--format", "tokens", "--out", str(tmp_path / "o"))
    assert code == 2 and "error:" in err
    code, _, err = _cli(capsys, "validate", str(tmp_path / "nope"), "--config", str(_tok_config(tmp_path, sim_counts_with_tokenizer=True)))
    assert code == 2 and "error:" in err

    # A run whose every request fails: the store exists but holds no result.
    cfg = tmp_path / "empty.toml"
    cfg.write_text(f"""
[run]
dir = "{tmp_path / 'empty'}"
max_attempts = 1
progress_interval_s = 30
[provider]
kind = "simulated"
[provider.sim]
faults = "500:1.0"
latency_ms = 0
[classes.short]
max_tokens = 100
concurrency = 4
[[datasets]]
name = "a"
path = "{write_prompts(tmp_path / 'a.jsonl', 3)}"
format = "text"
""")
    subprocess.run(run_cmd(cfg), capture_output=True, timeout=120, cwd=REPO, env=_env())
    code, out, err = _cli(capsys, "export", str(tmp_path / "empty"), "--out", str(tmp_path / "raw"))
    assert code == 1 and "stores no completed result yet" in err and not (tmp_path / "raw").exists()
    code, _, err = _cli(capsys, "validate", str(tmp_path / "empty"), "--config", str(_tok_config(tmp_path, sim_counts_with_tokenizer=True)))
    assert code == 1 and "stores no completed result yet" in err


# --------------------------------------------------------------------------------- missing key

def _provider_config(tmp: Path, body: str) -> Path:
    cfg = tmp / "key.toml"
    cfg.write_text(f"""
[run]
dir = "{tmp / 'run'}"
progress_interval_s = 30
[provider]
{body}
[classes.short]
max_tokens = 100
concurrency = 4
[[datasets]]
name = "a"
path = "{write_prompts(tmp / 'a.jsonl', 3)}"
format = "text"
""")
    return cfg


def _sim_hits(case: str, tmp_path: Path) -> tuple[int, int, str]:
    """Run the refused config against a real loopback simulator; (connections, chat requests, stderr)."""
    sim = SimThread(SimConfig(seed=1, latency_ms=0))
    base_url = sim.start()
    try:
        body = {"openrouter": f'kind = "openrouter"\nbase_url = "{base_url}"',
                "openai_named_env": f'kind = "openai"\nbase_url = "{base_url}"\napi_key_env = "REH_KEY"',
                "openai_probe_401": f'kind = "openai"\nbase_url = "{base_url}"'}[case]
        cfg = _provider_config(tmp_path, body)
        p = subprocess.run(run_cmd(cfg), capture_output=True, text=True, timeout=60, cwd=REPO, env=_env())
        assert p.returncode == 1, p.stdout[-1500:] + p.stderr[-1500:]
        return sim.server.connections, sim.ledger.requests, p.stderr
    finally:
        sim.stop()


@pytest.mark.parametrize("case", ["openrouter", "openai_named_env", "openai_probe_401"])
def test_missing_key_is_refused_at_start_naming_the_variable_zero_requests_reach_the_simulator(tmp_path, case):
    conns, chats, err = _sim_hits(case, tmp_path)
    var = {"openrouter": "OPENROUTER_API_KEY", "openai_named_env": "REH_KEY", "openai_probe_401": "OPENAI_API_KEY"}[case]
    assert f"error: provider.api_key_env: environment variable {var} is not set" in err, err
    assert "Check the key" not in err
    if case == "openai_probe_401":
        # No key source in the config: one credential-less GET /key (401 here), no completion.
        assert (conns, chats) == (1, 0), err
        assert "wants one (HTTP 401 on GET /key without a key)" in err and "No completion was requested" in err
    else:
        assert (conns, chats) == (0, 0), err
        assert "Nothing was sent" in err


def test_key_policy_per_kind():
    # openrouter: always; openai: when the config names api_key_env; otherwise None (probed at start).
    with pytest.raises(Exception, match="environment variable OPENROUTER_API_KEY is not set"):
        resolve_api_key(ProviderSection(kind="openrouter"), {})
    named = ProviderSection.model_validate({"kind": "openai", "base_url": "https://llm.example.com/v1", "api_key_env": "REH_KEY"})
    with pytest.raises(Exception, match="environment variable REH_KEY is not set"):
        resolve_api_key(named, {})
    assert resolve_api_key(ProviderSection(kind="openai", base_url="http://10.0.0.5:8000/v1"), {}) is None
    assert resolve_api_key(named, {"REH_KEY": "k-1"}) == "k-1"
    # kind openai reads OPENAI_API_KEY unless the config names another variable (openrouter's is not read)
    keyless = ProviderSection(kind="openai", base_url="https://llm.example.com/v1")
    assert keyless.api_key_env == "OPENAI_API_KEY" and "api_key_env" not in keyless.model_fields_set
    assert resolve_api_key(keyless, {"OPENAI_API_KEY": "k-2", "OPENROUTER_API_KEY": "k-3"}) == "k-2"
    assert resolve_api_key(keyless, {"OPENROUTER_API_KEY": "k-3"}) is None  # not required: probed at start
    assert ProviderSection(kind="openrouter").api_key_env == "OPENROUTER_API_KEY"
    assert ProviderSection(kind="openai", base_url="https://x.example/v1",
                           api_key_env="OPENROUTER_API_KEY").api_key_env == "OPENROUTER_API_KEY"


# ---------------------------------------------------------------------- rehearsal reads credits

def test_rehearsal_against_datagen_sim_subprocess_reads_credits(tmp_path):
    sim = SimProcess("--credits", "5", "--latency-ms", "0", "--tokens-per-s", "0")
    try:
        cfg = tmp_path / "rehearsal.toml"
        cfg.write_text(f"""
[run]
dir = "{tmp_path / 'run'}"
progress_interval_s = 30
[provider]
kind = "openai"
base_url = "{sim.base_url}"
model = "moonshotai/kimi-k2.5"
[classes.short]
max_tokens = 2000
concurrency = 8
[[datasets]]
name = "a"
path = "{write_prompts(tmp_path / 'a.jsonl', 6)}"
format = "text"
""")
        p = subprocess.run(run_cmd(cfg), capture_output=True, text=True, timeout=120, cwd=REPO,
                           env=_env(OPENAI_API_KEY="rehearsal"))
        assert p.returncode == 0, p.stdout[-1500:] + p.stderr[-1500:]
        req = urllib.request.Request(sim.base_url + "/key", headers={"Authorization": "Bearer x"})
        with urllib.request.urlopen(req, timeout=10) as r:
            remaining = json.loads(r.read())["data"]["limit_remaining"]
    finally:
        sim.stop()
    st = status_json(tmp_path / "run")
    assert 0 < remaining < 5
    assert st["credits_usd"] == pytest.approx(remaining, abs=1e-9), st["credits_usd"]
    assert "credits read failed" not in p.stderr


# -------------------------------------------------------------------------------------- make demo

def test_make_tokenizer_builds_offline_and_is_idempotent(tmp_path, capsys):
    d = tmp_path / "tok"
    code, out, _ = _cli(capsys, "make-tokenizer", str(d))
    assert code == 0 and "built" in out
    assert (d / "tiktoken.model").read_bytes() == (kimi_dir() / "tiktoken.model").read_bytes()
    code, out, _ = _cli(capsys, "make-tokenizer", str(d))
    assert code == 0 and "already there" in out
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("x")
    code, _, err = _cli(capsys, "make-tokenizer", str(tmp_path / "other"))
    assert code == 1 and "not a tokenizer directory" in err


def test_demo_config_ends_with_a_validated_tokens_export(tmp_path):
    """The real config.toml and the Makefile's demo steps, in a copy of the repository layout."""
    make = (REPO / "Makefile").read_text()
    tok_dir = re.search(r"^DEMO_TOKENIZER := (\S+)$", make, re.M).group(1)
    demo = make[make.index("\ndemo:") + 1:].split("\n\n")[0].splitlines()
    assert "$(DEMO_TOKENIZER)/tokenizer_config.json" in demo[0]  # built before the run
    assert "$(BIN)/datagen make-tokenizer $(DEMO_TOKENIZER)" in make
    steps = [line.strip().replace("$(BIN)/datagen", "datagen") for line in demo[1:]]
    assert steps == ["datagen run config.toml --headless", "datagen validate runs/demo",
                     "datagen export runs/demo --format tokens --out out/demo-tokens"], steps
    text = (REPO / "config.toml").read_text()
    assert re.search(rf'^\[tokenizer\][^\[]*^path = "{tok_dir}"', text, re.M | re.S)
    assert f'tokenizer = "{tok_dir}"' in text  # the simulator counts with the same tokenizer
    (tmp_path / "config.toml").write_text(text)
    (tmp_path / "engine").symlink_to(REPO / "engine")
    env = _env(PYTHONPATH=str(REPO))
    dg = [PY, "-m", "datagen"]
    # Before the tokenizer is built: refused at load, naming both keys and how to build it.
    p = subprocess.run(dg + ["run", "config.toml", "--headless"], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path, env=env)
    assert p.returncode == 1 and "provider.sim.tokenizer: not found" in p.stderr and "tokenizer.path: not a directory" in p.stderr
    assert "`datagen make-tokenizer DIR` builds the small demo tokenizer" in p.stderr
    for argv in (["make-tokenizer", tok_dir], ["run", "config.toml", "--headless"], ["validate", "runs/demo"],
                 ["export", "runs/demo", "--format", "tokens", "--out", "out/demo-tokens"]):
        p = subprocess.run(dg + argv, capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
        assert p.returncode == 0, (argv, p.stdout[-2000:], p.stderr[-2000:])
        if argv[0] == "validate":
            assert "records 110: ok 110, invalid 0" in p.stdout, p.stdout
    rows = sum(pq.read_metadata(f).num_rows for f in (tmp_path / "out" / "demo-tokens").glob("*.parquet"))
    assert rows == 110


# ---------------------------------------------------------------------- documented facts, modes

def test_documented_facts_match_the_code():
    key = prompt_key([{"role": "user", "content": "hi"}])
    assert len(key) == 32 and re.fullmatch(r"[0-9a-f]{32}", key)
    assert "32 hex characters" in DOCS and "SHA-256 of its canonical JSON (messages" not in DOCS
    n = len([p for p in SAMPLES.iterdir() if p.suffix in (".json", ".jsonl")])
    assert n == 5 and "five prompt sample files" in DOCS and "eight sample datasets" not in DOCS
    assert "the 1-based element number of a JSON array" in DOCS
    assert "`datagen export RUN_DIR [--format raw] --out DIR`" in DOCS
    assert "`datagen export RUN_DIR --format raw --out DIR`" not in DOCS


def test_export_without_format_is_raw_bad_out_is_an_error_and_a_closed_pipe_is_quiet(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"""
[run]
dir = "{tmp_path / 'run'}"
progress_interval_s = 30
[provider]
kind = "simulated"
[provider.sim]
latency_ms = 0
tokens_per_s = 0
mean_completion_tokens = 30
[classes.short]
max_tokens = 200
concurrency = 4
[[datasets]]
name = "a"
path = "{write_prompts(tmp_path / 'a.jsonl', 2)}"
format = "text"
""")
    _run(cfg)
    code, out, _ = _cli(capsys, "export", str(tmp_path / "run"), "--out", str(tmp_path / "raw"))
    assert code == 0 and f"{tmp_path / 'raw' / 'a.jsonl'}: 2 lines" in out

    # `datagen status RUN --json | true`: the reader is gone before the output is written. A shell
    # tool's answer (128 + SIGPIPE) and no traceback; before, a BrokenPipeError traceback and rc 1.
    r = subprocess.run(f"{PY} -m datagen status {tmp_path / 'run'} --json | true; exit ${{PIPESTATUS[0]}}",
                       shell=True, executable="/bin/bash", cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (141, "")

    # An --out that cannot be a directory is an error (2) with one line naming it, not a traceback (was 1).
    (tmp_path / "afile").write_text("x")
    for bad, says in ((tmp_path / "afile", "exists and is not a directory"),
                      (tmp_path / "afile" / "sub", "Not a directory")):
        code, _, err = _cli(capsys, "export", str(tmp_path / "run"), "--format", "raw", "--out", str(bad))
        assert code == 2 and f"--out {bad}" in err and says in err and "Traceback" not in err


def test_stacks_txt_is_owner_only(tmp_path):
    from datagen.runcmd import _install_stack_dump

    old = signal.getsignal(signal.SIGUSR1)
    old_umask = os.umask(0o022)
    try:
        _install_stack_dump(tmp_path)
        os.kill(os.getpid(), signal.SIGUSR1)
        path = tmp_path / "stacks.txt"
        assert "File" in path.read_text()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        path.chmod(0o644)  # an older file is tightened on the next dump
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        os.umask(old_umask)
        signal.signal(signal.SIGUSR1, old)


def test_keyless_local_server_without_key_endpoints_runs_and_credits_stay_unknown_quietly(tmp_path):
    """A local OpenAI-compatible server with no key and no /key or /credits (like a bare vLLM): the
    start-up probe lets the run start keyless, credits are asked once, stay unknown, and nothing is
    logged above INFO about them."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    hits: list[tuple[str, str, str | None]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # quiet
            pass

        def _send(self, code: int, doc: dict) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            hits.append(("GET", self.path, self.headers.get("authorization")))
            self._send(404, {"error": {"message": "not found", "code": 404}})

        def do_POST(self):
            self.rfile.read(int(self.headers.get("content-length", 0)))
            hits.append(("POST", self.path, self.headers.get("authorization")))
            self._send(200, {"id": "c-1", "object": "chat.completion", "model": "m", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "An answer."}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}})

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        cfg = tmp_path / "local.toml"
        cfg.write_text(f"""
[run]
dir = "{tmp_path / 'run'}"
progress_interval_s = 30
[provider]
kind = "openai"
base_url = "http://127.0.0.1:{srv.server_address[1]}/v1"
model = "m"
stream = false
[classes.short]
max_tokens = 100
concurrency = 2
[[datasets]]
name = "a"
path = "{write_prompts(tmp_path / 'a.jsonl', 3)}"
format = "text"
""")
        p = subprocess.run(run_cmd(cfg), capture_output=True, text=True, timeout=120, cwd=REPO, env=_env())
    finally:
        srv.shutdown()
        srv.server_close()
    assert p.returncode == 0, p.stdout[-1500:] + p.stderr[-1500:]
    gets = [path for m, path, _ in hits if m == "GET"]
    assert gets.count("/v1/key") == 2 and gets.count("/v1/credits") == 1, gets  # probe + one credits read
    assert [a for m, _, a in hits if m == "POST"] == [None] * 3  # no Authorization header sent
    assert "credits" not in p.stderr.lower(), p.stderr
    assert status_json(tmp_path / "run")["credits_usd"] is None
    log = (tmp_path / "run" / "datagen.log").read_text()
    assert log.count("credits: provider exposes neither /key nor /credits") == 1


def test_version_prints_the_installed_distributions_version():
    from importlib.metadata import version

    p = subprocess.run([PY, "-m", "datagen", "--version"], capture_output=True, text=True, timeout=60,
                       cwd=REPO)
    assert p.returncode == 0 and p.stdout == f"datagen {version('eagle-datagen')}\n", p.stdout + p.stderr
    assert re.fullmatch(r"datagen \d+\.\d+\.\d+\S*\n", p.stdout)
