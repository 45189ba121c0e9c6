"""Secrets never leak; the key never goes over plain http to a remote host; files are owner-only.

A canary key (``sk-or-v1-CANARY-`` + random hex) runs a full job (kind ``openai``) against the
simulator on loopback with faults on, through a crash (kill -9), a 401 from a server that QUOTES the
key it was sent in its error message, a key that cannot be a header value (a traceback path), and a
resume to the end. Then the run directory (every file, the SQLite database and its WAL included, and
a copy taken right after the kill), every process output, the export, ``datagen status`` (text and
JSON) and the logs are scanned: zero occurrences of the key or of its secret part.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import secrets
import signal
import socket
import stat
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from e2e import PY, SimProcess, integrity, live_status, run_cmd, status_json, write_prompts
from waiting import wait_for

from datagen import cli
from engine.client.chat import ChatClient
from engine.config import ConfigError, ProviderSection, parse_config
from engine.run.apikey import resolve_api_key
from engine.run.headless import is_datagen_handler, run_headless
from engine.sim import SimConfig, SimThread

FAULTS = "429:0.05,502:0.05,midstream:0.04,disconnect:0.04,stall:0.02"
CANARY = "sk-or-v1-CANARY-" + secrets.token_hex(16)
SECRET_PART = CANARY.rsplit("-", 1)[1]
NEEDLES = (CANARY.encode(), SECRET_PART.encode())


def hits(blob: bytes | str, where: str) -> list[str]:
    """Where the canary (or its secret part) occurs in ``blob``."""
    data = blob.encode("utf-8", "surrogateescape") if isinstance(blob, str) else blob
    return [f"{where}@{m.start()}" for n in NEEDLES for m in re.finditer(re.escape(n), data)]


def scan_dir(root: Path) -> tuple[list[str], int]:
    """Hits in every file under ``root`` (bytes), and how many files were read."""
    found, n = [], 0
    for p in sorted(root.rglob("*")):
        if p.is_file():
            n += 1
            found += hits(p.read_bytes(), str(p))
    return found, n


def test_scanner_finds_the_canary(tmp_path):
    """The scan can fail: a planted key is found in text, in bytes and inside a SQLite file."""
    import sqlite3

    db = sqlite3.connect(tmp_path / "x.sqlite")
    db.execute("CREATE TABLE t(v)")
    db.execute("INSERT INTO t VALUES (?)", (f"error: Bearer {CANARY}",))
    db.commit()
    db.close()
    found, n = scan_dir(tmp_path)
    assert n == 1 and len(found) == 2
    assert hits(f"x {CANARY} y", "s") and hits(SECRET_PART.encode(), "b")


class _Hostile401(BaseHTTPRequestHandler):
    """Answers everything with 401 and QUOTES the Authorization header it got (careless servers do)."""

    seen: list[str] = []

    def _answer(self) -> None:
        n = int(self.headers.get("content-length") or 0)
        if n:
            self.rfile.read(n)
        auth = self.headers.get("authorization", "")
        type(self).seen.append(auth)
        body = json.dumps({"error": {"code": 401, "message": f"User not found for the key presented ({auth})"}}).encode()
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:  # quiet
        pass


def _config(path: Path, run_dir: Path, base_url: str, data: Path, *, conc: int = 16, extra: str = "") -> Path:
    path.write_text(f"""
[run]
name = "canary"
dir = "{run_dir}"
progress_interval_s = 1
commit_interval_s = 0.2
max_attempts = 8
[provider]
kind = "openai"
base_url = "{base_url}"
api_key_env = "CANARY_KEY"
{extra}
[provider.timeouts]
connect_s = 5
stall_s = 1
total_s = 60
[spend]
anomaly_error_rate = 0
[classes.short]
max_tokens = 2048
concurrency = {conc}
[[datasets]]
name = "canary"
path = "{data}"
format = "text"
""")
    return path


def _env(key: str | None = CANARY) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CANARY_KEY"}
    if key is not None:
        env["CANARY_KEY"] = key
    return env


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
def test_canary_key_never_leaks(tmp_path):
    data = write_prompts(tmp_path / "p.jsonl", 100, tag="canary ")
    run_dir = tmp_path / "run"
    log = tmp_path / "sim.jsonl"
    outputs: dict[str, str] = {}
    sim = SimProcess("--faults", FAULTS, "--seed", "9", "--mean-completion-tokens", "200", "--tokens-per-s", "400",
                     "--latency-ms", "50", log=log)
    hostile = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile401)
    _Hostile401.seen = []
    threading.Thread(target=hostile.serve_forever, daemon=True).start()
    try:
        cfg = _config(tmp_path / "config.toml", run_dir, sim.base_url, data)
        # 1. a crash: kill -9 in the middle of the run; copy the run directory (WAL included) at once.
        with open(tmp_path / "crash.out", "w") as out:
            p = subprocess.Popen(run_cmd(cfg), env=_env(), stdout=out, stderr=subprocess.STDOUT)
            wait_for(lambda: (live_status(run_dir) or {"totals": {"done": 0}})["totals"]["done"] >= 20, 60)
            p.kill()
            p.wait()
        after_kill = {str(f): f.read_bytes() for f in run_dir.iterdir() if f.is_file()}
        assert any(name.endswith("-wal") for name in after_kill)
        assert integrity(run_dir / "store.sqlite") == "ok"
        # 2. a 401 from a server that echoes the key it was sent: the run stops with exit 2.
        cfg401 = _config(tmp_path / "config401.toml", run_dir, f"http://127.0.0.1:{hostile.server_port}/api/v1", data)
        r = subprocess.run(run_cmd(cfg401), env=_env(), capture_output=True, text=True, timeout=120)
        outputs["401 run"] = r.stdout + r.stderr
        assert r.returncode == 2, outputs["401 run"]
        assert "API key rejected (HTTP 401): User not found for the key presented (Bearer [REDACTED])" in r.stdout
        assert _Hostile401.seen and all(a == f"Bearer {CANARY}" for a in _Hostile401.seen)  # the key WAS sent
        # 3. a key that cannot be an HTTP header (a second line in it): refused without quoting it.
        r = subprocess.run(run_cmd(cfg), env=_env(CANARY + "\nsecond line"), capture_output=True, text=True, timeout=120)
        outputs["bad key run"] = r.stdout + r.stderr
        assert r.returncode != 0
        assert f"the API key contains whitespace at position {len(CANARY) + 1} of {len(CANARY) + 12}" in r.stderr
        # 4. resume to the end.
        r = subprocess.run(run_cmd(cfg), env=_env(), capture_output=True, text=True, timeout=240)
        outputs["resume"] = r.stdout + r.stderr
        assert r.returncode == 0, outputs["resume"]
    finally:
        if p.poll() is None:
            p.kill()
        hostile.shutdown()
        sim.stop()
    outputs["crash run"] = (tmp_path / "crash.out").read_text()
    outputs["simulator"] = "".join(sim.output)
    for args in (["status", str(run_dir)], ["status", str(run_dir), "--json"],
                 ["export", str(run_dir), "--format", "raw", "--out", str(tmp_path / "export")]):
        r = subprocess.run([PY, "-m", "datagen", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        outputs[" ".join(args[:1] + args[2:])] = r.stdout + r.stderr
    doc = status_json(run_dir)
    assert doc["run"]["state"] == "completed" and doc["totals"]["done"] == 100
    errors = doc["totals"]["errors"]
    assert errors.get("auth", 0) >= 1 and errors.get("rate_limit", 0) >= 1 and errors.get("disconnect", 0) >= 1

    found = [h for name, text in outputs.items() for h in hits(text, name)]
    found += [h for name, blob in after_kill.items() for h in hits(blob, "after kill -9: " + name)]
    for root in (run_dir, tmp_path / "export"):
        f, n = scan_dir(root)
        assert n >= 1
        found += f
    found += hits(log.read_bytes(), "simulator log")
    assert (run_dir / "datagen.log").stat().st_size > 0
    assert found == []
    print(f"\ncanary: 0 hits in {len(after_kill)} files after kill -9, the run directory, export, status, "
          f"{len(outputs)} process outputs; the 401 server saw the key {len(_Hostile401.seen)} times and its echo was "
          f"redacted")


async def test_no_key_and_no_request_body_in_debug_logs(tmp_path, caplog):
    """Every logger at DEBUG (httpx and httpcore included) over a job with faults: no key, no
    Authorization value and no request body (bodies are never logged)."""
    marker = "BODYMARKER" + secrets.token_hex(6)
    data = write_prompts(tmp_path / "p.jsonl", 40, tag=marker + " ")
    # aiosqlite too: an earlier test in this worker may have run setup_file_logging, which leaves the
    # library loggers at WARNING for the rest of the process.
    for name in ("", "httpx", "httpcore", "aiosqlite", "engine"):
        caplog.set_level(logging.DEBUG, logger=name)
    with SimThread(SimConfig(seed=4, faults={"429": 0.1, "502": 0.1, "disconnect": 0.05, "midstream": 0.05},
                             mean_completion_tokens=50)) as base_url:
        cfg = parse_config({
            "run": {"name": "dbg", "dir": str(tmp_path / "run"), "commit_interval_s": 0.1, "progress_interval_s": 1},
            "provider": {"kind": "openai", "base_url": base_url, "api_key_env": "CANARY_KEY",
                         "timeouts": {"stall_s": 2}},
            "spend": {"anomaly_error_rate": 0},
            "classes": {"short": {"max_tokens": 512, "concurrency": 8}},
            "datasets": [{"name": "d", "path": str(data), "format": "text"}],
        }, tmp_path / "config.toml")
        os.environ["CANARY_KEY"] = CANARY
        try:
            out = io.StringIO()
            code = await run_headless(cfg, out, install_signals=False)
        finally:
            del os.environ["CANARY_KEY"]
    assert code == 0, out.getvalue()
    records = caplog.records
    assert any(r.name.startswith("httpcore") for r in records) and any(r.name.startswith("httpx") for r in records)
    text = "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in records) + out.getvalue()
    assert hits(text, "logs") == []
    # aiosqlite's own DEBUG lines quote every SQL parameter (prompts included): a library trace the user
    # must switch on (datagen sets aiosqlite, httpx and httpcore to WARNING). Everything else: no body.
    http_and_engine = "\n".join(r.getMessage() for r in records if not r.name.startswith("aiosqlite"))
    assert any(marker in r.getMessage() for r in records if r.name.startswith("aiosqlite"))
    assert marker not in http_and_engine + out.getvalue()
    assert not re.search(r"(?i)bearer\s+(?!\[REDACTED\])\S{8,}", text)


# ---------------------------------------------------------------------------------- plain http

REFUSED = ["http://10.1.2.3/v1", "http://openrouter.ai/api/v1", "http://127.0.0.1.nip.io/v1",
           "http://localhost.example.com/v1", "http://192.168.1.20:8000/v1"]
ALLOWED = ["https://openrouter.ai/api/v1", "http://127.0.0.1:8000/v1", "http://localhost:8000/v1",
           "http://[::1]:8000/v1", "http://127.0.0.2:9/v1", "https://10.1.2.3/v1"]


@pytest.mark.parametrize("url", REFUSED)
def test_key_refused_over_plain_http_to_remote(url):
    p = ProviderSection(kind="openai", base_url=url)
    with pytest.raises(ConfigError) as e:
        resolve_api_key(p, {"OPENAI_API_KEY": CANARY})
    assert str(e.value) == f"provider.base_url: refusing to send the API key over plain http to {url}; use https"
    with pytest.raises(ValueError) as e2:
        ChatClient(url, CANARY)
    host = httpx.URL(url).host
    assert str(e2.value) == f"refusing to send an API key over plain http:// to non-loopback host {host!r}; use https://"
    assert not hits(str(e.value) + str(e2.value), "messages")
    # Without a key nothing secret is sent, so plain http is fine (a local server needing no key).
    assert resolve_api_key(p, {}) is None


@pytest.mark.parametrize("url", ALLOWED)
async def test_key_allowed_over_https_or_loopback(url):
    p = ProviderSection(kind="openai", base_url=url)
    assert resolve_api_key(p, {"OPENAI_API_KEY": CANARY}) == CANARY
    c = ChatClient(url, CANARY)
    assert CANARY not in repr(c)
    await c.aclose()


@pytest.fixture
def no_datagen_log_handlers():
    yield
    root = logging.getLogger()
    for h in list(root.handlers):
        if is_datagen_handler(h):
            root.removeHandler(h)
            h.close()


def test_cli_refuses_plain_http_before_any_request(tmp_path, capsys, monkeypatch, no_datagen_log_handlers):
    data = write_prompts(tmp_path / "p.jsonl", 3)
    url = "http://10.255.255.1/api/v1"
    cfg = _config(tmp_path / "config.toml", tmp_path / "run", url, data)
    monkeypatch.setenv("CANARY_KEY", CANARY)
    t0 = time.monotonic()
    rc = cli.main(["run", str(cfg), "--headless"])
    err = capsys.readouterr().err
    assert rc == 1 and time.monotonic() - t0 < 10
    assert err.endswith(f"error: provider.base_url: refusing to send the API key over plain http to {url}; use https\n")
    assert not hits(err, "stderr")


CRED_MSG = ("credentials in the URL are not supported (they would be sent as Basic auth instead of the API key); "
            "put the key in ${}")


@pytest.mark.parametrize("provider, key, env", [
    ({"base_url": "http://bob:pw-{s}@127.0.0.1:18102/api/v1"}, "provider.base_url", "OPENAI_API_KEY"),
    ({"base_urls": ["http://127.0.0.1:18101/v1", "http://bob:pw-{s}@127.0.0.1:18102/api/v1"]},
     "provider.base_urls[1]", "OPENAI_API_KEY"),
    ({"base_urls": [{"url": "https://bob:pw-{s}@10.0.0.3/v1", "concurrency": 4}], "api_key_env": "VLLM_KEY"},
     "provider.base_urls[0]", "VLLM_KEY"),
    ({"base_urls": ["http://127.0.0.1:1/v1", "https://only-a-user-{s}@10.0.0.3/v1"]}, "provider.base_urls[1]",
     "OPENAI_API_KEY"),
])
def test_credentials_in_a_provider_url_are_refused_at_config_check(provider, key, env):
    """httpx turns ``user:password@`` into Basic auth in place of the Bearer key: the server's 401
    would then blame a key that was never sent. Refused where the config is checked, naming the key
    and its variable, never echoing the URL's secret."""
    secret = secrets.token_hex(8)
    prov = {k: (v.format(s=secret) if isinstance(v, str) else
                [e.format(s=secret) if isinstance(e, str) else {**e, "url": e["url"].format(s=secret)} for e in v])
            for k, v in provider.items()}
    with pytest.raises(ConfigError) as e:
        parse_config({"run": {"name": "x"}, "provider": {"kind": "openai", **prov},
                      "datasets": [{"name": "a", "path": "a.jsonl"}]}, Path("c.toml"), check_files=False)
    assert str(e.value).splitlines()[1:] == [f"  {key}: {CRED_MSG.format(env)}"]
    assert secret not in str(e.value) and "bob" not in str(e.value)
    # the client refuses them too whenever it would send a key (and sends nothing without one)
    url = "http://bob:pw@127.0.0.1:9/v1"
    with pytest.raises(ValueError) as e2:
        ChatClient(url, CANARY)
    assert "credentials in the URL are not supported" in str(e2.value) and "pw" not in str(e2.value)


def test_cli_refuses_credentials_in_a_url_before_anything(tmp_path, capsys, monkeypatch, no_datagen_log_handlers):
    data = write_prompts(tmp_path / "p.jsonl", 3)
    cfg = _config(tmp_path / "config.toml", tmp_path / "run", "http://127.0.0.1:9/v1", data)
    cfg.write_text(cfg.read_text().replace('base_url = "http://127.0.0.1:9/v1"', 'base_urls = ["http://127.0.0.1:9/v1", '
                                           '"http://bob:hunter2@127.0.0.1:10/api/v1"]'))
    monkeypatch.setenv("CANARY_KEY", CANARY)
    rc = cli.main(["run", str(cfg), "--headless"])
    err = capsys.readouterr().err
    assert rc == 1 and "hunter2" not in err and not (tmp_path / "run").exists(), err
    assert f"  provider.base_urls[1]: {CRED_MSG.format('CANARY_KEY')}" in err.splitlines()


# ------------------------------------------------------------------------------------ key file

@pytest.mark.parametrize("mode,warns", [(0o600, False), (0o400, False), (0o640, True), (0o644, True), (0o604, True)])
def test_key_file_permissions_warning(tmp_path, caplog, mode, warns):
    kf = tmp_path / "key"
    kf.write_text(CANARY + "\n")
    kf.chmod(mode)
    p = ProviderSection(kind="openrouter", api_key_file=kf)
    with caplog.at_level(logging.WARNING, logger="engine"):
        assert resolve_api_key(p, {}) == CANARY
    msgs = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert msgs == ([f"key file {kf} is readable by group/others; chmod 600 it"] if warns else [])
    assert not hits("".join(msgs), "warning")


def test_key_file_missing_and_env_wins(tmp_path):
    kf = tmp_path / "nope"
    with pytest.raises(ConfigError) as e:
        resolve_api_key(ProviderSection(kind="openrouter", api_key_file=kf), {})
    assert str(e.value) == f"provider.api_key_file: cannot read {kf}: No such file or directory"
    with pytest.raises(ConfigError) as e:
        resolve_api_key(ProviderSection(kind="openrouter"), {})
    assert "environment variable OPENROUTER_API_KEY is not set" in str(e.value)
    assert resolve_api_key(ProviderSection(kind="openrouter", api_key_file=kf), {"OPENROUTER_API_KEY": CANARY}) == CANARY


def test_key_file_warning_reaches_the_user(tmp_path):
    """``datagen run`` with a group-readable key file: the warning is on stderr, the job runs."""
    data = write_prompts(tmp_path / "p.jsonl", 3)
    kf = tmp_path / "key"
    kf.write_text(CANARY + "\n")
    kf.chmod(0o644)
    sim = SimProcess("--seed", "1", "--mean-completion-tokens", "20")
    try:
        cfg = _config(tmp_path / "config.toml", tmp_path / "run", sim.base_url, data, extra=f'api_key_file = "{kf}"')
        r = subprocess.run(run_cmd(cfg), env=_env(None), capture_output=True, text=True, timeout=120)
    finally:
        sim.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"WARNING key file {kf} is readable by group/others; chmod 600 it" in r.stderr
    assert not hits(r.stdout + r.stderr, "output")


# ----------------------------------------------------------------------------------- simulator

def _listening_addresses(pid: int) -> list[tuple[str, int]]:
    """(address, port) of the TCP sockets ``pid`` listens on (from /proc/net/tcp and tcp6)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out = []
    for table, width in (("tcp", 4), ("tcp6", 16)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                hexaddr, hexport = f[1].split(":")
                raw = bytes.fromhex(hexaddr)
                if width == 4:
                    addr = socket.inet_ntop(socket.AF_INET, raw[::-1])
                else:
                    addr = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
                out.append((addr, int(hexport, 16)))
    return out


def test_simulator_binds_loopback_unless_told():
    assert SimConfig().host == "127.0.0.1"
    sim = SimProcess()
    try:
        port = int(sim.base_url.split(":")[2].split("/")[0])
        assert _listening_addresses(sim.proc.pid) == [("127.0.0.1", port)]
    finally:
        sim.stop()
    sim = SimProcess("--host", "0.0.0.0")  # told otherwise
    try:
        port = int(sim.base_url.split(":")[2].split("/")[0])
        assert _listening_addresses(sim.proc.pid) == [("0.0.0.0", port)]
    finally:
        sim.stop()


async def test_builtin_simulator_binds_loopback(tmp_path):
    data = write_prompts(tmp_path / "p.jsonl", 2)
    cfg = parse_config({"run": {"dir": str(tmp_path / "run"), "commit_interval_s": 0.1},
                        "classes": {"short": {"max_tokens": 100, "concurrency": 2}},
                        "datasets": [{"name": "d", "path": str(data), "format": "text"}]}, tmp_path / "c.toml")
    seen = {}

    def ready(job):
        seen["addr"] = job.sim.server._server.sockets[0].getsockname()[:2]

    assert await run_headless(cfg, io.StringIO(), install_signals=False, on_ready=ready) == 0
    assert seen["addr"][0] == "127.0.0.1"


# ------------------------------------------------------------------------------ owner-only files

def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_run_directory_and_database_owner_only_even_with_umask_0(tmp_path):
    data = write_prompts(tmp_path / "p.jsonl", 400)
    run_dir = tmp_path / "deep" / "run"
    sim = SimProcess("--seed", "2", "--mean-completion-tokens", "200", "--tokens-per-s", "200")
    cfg = _config(tmp_path / "config.toml", run_dir, sim.base_url, data, conc=8)
    files = ("store.sqlite", "store.sqlite-wal", "store.sqlite-shm", "datagen.log")
    try:
        p = subprocess.Popen(run_cmd(cfg), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             preexec_fn=lambda: os.umask(0))
        wait_for(lambda: (live_status(run_dir) or {"totals": {"done": 0}})["totals"]["done"] >= 5, 60)
        live = {f: _mode(run_dir / f) for f in files}
        p.kill()
        p.wait()
        killed = {f: _mode(run_dir / f) for f in files}
        # A directory loosened by hand is tightened at the next start.
        run_dir.chmod(0o755)
        (run_dir / "store.sqlite").chmod(0o644)
        p = subprocess.Popen(run_cmd(cfg), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             preexec_fn=lambda: os.umask(0))
        wait_for(lambda: (live_status(run_dir) or {"run": {"alive": False}})["run"]["alive"], 60)
        restarted = {f: _mode(run_dir / f) for f in files}
        restarted_dir = _mode(run_dir)
        p.send_signal(signal.SIGTERM)
        p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
        sim.stop()
    assert _mode(run_dir) == restarted_dir == 0o700
    assert live == killed == restarted == {f: 0o600 for f in files}


def test_key_with_a_second_line_is_a_clean_error(tmp_path, capsys, monkeypatch, no_datagen_log_handlers):
    data = write_prompts(tmp_path / "p.jsonl", 2)
    cfg = _config(tmp_path / "config.toml", tmp_path / "run", "http://127.0.0.1:9/api/v1", data)
    monkeypatch.setenv("CANARY_KEY", CANARY + "\n# rotated 2026-01-01")
    rc = cli.main(["run", str(cfg), "--headless"])
    err = capsys.readouterr().err
    assert rc == 1 and "error: " in err and "contains whitespace at position" in err
    assert not hits(err, "stderr")
