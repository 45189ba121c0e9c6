"""`datagen run --headless` over three `datagen sim` processes (`[provider] base_urls`), one of them
killed with SIGKILL mid-run: nothing lost, its share moves to the others, status shows it down."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess

import pytest
from e2e import PY, SimProcess, read_log, run_env, status_json, write_prompts
from waiting import wait_for

PROMPTS = 90


def _completed(log) -> int:
    return sum(1 for e in read_log(log) if e["outcome"] == "completed") if log.exists() else 0


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
def test_three_endpoints_one_killed_mid_run(tmp_path):
    logs = [tmp_path / f"sim{i}.jsonl" for i in range(3)]
    # ~60-token completions at 150 tok/s: each stream lasts ~0.4 s, so the kill cuts streams in flight
    sims = [SimProcess("--seed", str(i), "--providers", f"S{i}", "--mean-completion-tokens", "60",
                       "--tokens-per-s", "150", "--latency-ms", "20", log=logs[i]) for i in range(3)]
    data = write_prompts(tmp_path / "p.jsonl", PROMPTS)
    cfg = tmp_path / "config.toml"
    urls = [s.base_url for s in sims]
    cfg.write_text(f"""
[run]
name = "fleet"
dir = "{tmp_path / 'run'}"
progress_interval_s = 1
commit_interval_s = 0.2
max_attempts = 1            # any error counted against a prompt would fail it
[provider]
kind = "openai"
base_urls = ["{urls[0]}", {{ url = "{urls[1]}", concurrency = 4 }}, "{urls[2]}"]
endpoint_concurrency = 5
endpoint_probe_s = 0.2
api_key_env = "E2E_KEY"
[provider.timeouts]
connect_s = 2
stall_s = 10
total_s = 60
[classes.short]
max_tokens = 400
concurrency = 12
[[datasets]]
name = "a"
path = "{data}"
format = "text"
""")
    run_dir = tmp_path / "run"
    killed = sims[1]
    try:
        p = subprocess.Popen([PY, "-m", "datagen", "run", str(cfg), "--headless"], env=run_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_for(lambda: p.poll() is not None or _completed(logs[1]) >= 8, 60, interval=0.05)
        assert p.poll() is None, p.stdout.read()
        killed.proc.send_signal(signal.SIGKILL)
        killed.proc.wait(10)
        at_kill = [_completed(log) for log in logs]
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
    finally:
        for s in sims:
            if s.proc.poll() is None:
                s.stop()
    assert f"endpoint {urls[1]}: healthy" in out and "run completed" in out

    # nothing lost: every prompt done exactly once, none failed
    doc = status_json(run_dir)
    t = doc["totals"]
    assert (t["prompts"], t["done"], t["failed"], t["pending"], t["in_flight"]) == (PROMPTS, PROMPTS, 0, 0, 0)
    exp = subprocess.run([PY, "-m", "datagen", "export", str(run_dir), "--out", str(tmp_path / "raw")],
                         capture_output=True, text=True)
    assert exp.returncode == 0, exp.stdout + exp.stderr
    rows = [json.loads(line) for line in (tmp_path / "raw" / "a.jsonl").read_text().split("\n") if line]
    assert len(rows) == PROMPTS and len({r["key"] for r in rows}) == PROMPTS

    # the killed endpoint's log stopped at the kill; the others served the rest
    after = [_completed(log) for log in logs]
    assert after[1] == at_kill[1]
    assert after[0] > at_kill[0] and after[2] > at_kill[2]
    by_provider = {}
    for r in rows:
        by_provider[r["provider"]] = by_provider.get(r["provider"], 0) + 1
    assert by_provider.get("S1", 0) <= at_kill[1]
    assert by_provider["S0"] + by_provider["S2"] >= PROMPTS - at_kill[1]
    assert by_provider["S0"] > 0 and by_provider["S2"] > 0

    # status --json: the killed endpoint down with its errors, the others healthy with none
    eps = {e["url"]: e for e in doc["endpoints"]}
    assert list(eps) == urls
    dead = eps[urls[1]]
    assert dead["state"] == "down" and dead["errors"] and set(dead["errors"]) <= {"connect", "disconnect"}
    assert dead["concurrency"] == 4 and dead["in_flight"] == 0
    for u in (urls[0], urls[2]):
        assert eps[u]["state"] == "healthy" and eps[u]["errors"] == {} and eps[u]["concurrency"] == 5
        assert eps[u]["requests"] >= by_provider["S0" if u == urls[0] else "S2"]
    text = subprocess.run([PY, "-m", "datagen", "status", str(run_dir)], capture_output=True, text=True).stdout
    assert f"endpoint {urls[1]}: down" in text

    # each failed attempt names the killed endpoint and was retried elsewhere, never counted against its prompt
    db = sqlite3.connect(run_dir / "store.sqlite")
    errs = db.execute("SELECT error_class, message FROM attempts WHERE outcome='error'").fetchall()
    assert errs and all(m.startswith(urls[1] + ": ") for _, m in errs)
    assert sum(dead["errors"].values()) == len(errs)
    log = (run_dir / "datagen.log").read_text()
    assert f"endpoint {urls[1]} down" in log
    db.close()


def test_the_same_400_from_every_replica_is_one_config_mistake(tmp_path):
    """A rejection names its replica in the message, yet the same 400 from two replicas is still
    "the same rejection": the run pauses (config mistake) and no prompt is failed."""
    from casesrv import CaseServer, case_config, error_reply, run_case

    refused = "Reasoning is mandatory for this endpoint and cannot be disabled."
    with CaseServer(lambda req, n: error_reply(400, refused)) as a, \
            CaseServer(lambda req, n: error_reply(400, refused)) as b:
        prompts = [{"messages": [{"role": "user", "content": f"Fact {i}?"}]} for i in range(20)]
        cfg = case_config(tmp_path, a.base_url, prompts, concurrency=4)
        cfg.write_text(cfg.read_text().replace(f'base_url = "{a.base_url}"',
                                               f'base_urls = ["{a.base_url}", "{b.base_url}"]'))
        r = run_case(cfg, "--exit-on-pause")
        out = r.stdout + r.stderr
        assert r.returncode == 3, out
        assert "the provider refuses every request the same way" in out and refused in out
        assert a.requests and b.requests  # both replicas were asked and both refused
    with sqlite3.connect(tmp_path / "run" / "store.sqlite") as db:
        assert dict(db.execute("SELECT state, COUNT(*) FROM prompts GROUP BY state").fetchall()) == {"pending": 20}
