"""One live process per directory (issue 11 §5): ``flock`` on ``RUN_DIR/run.lock`` / ``OUT_DIR/extract.lock``.

Real processes throughout: a live ``datagen run`` against a scripted server whose replies wait on a gate,
a second ``datagen run`` on the same directory (another config, its own server: it must send nothing),
``status`` showing the holder, ``kill -9`` of the holder and a new run that completes.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from casesrv import DONE, CaseServer, Reply, case_config, chunk, sse, usage

from engine.proc import runlock

PY = sys.executable
REPO = Path(__file__).resolve().parents[3]
ENV = dict(os.environ, CASE_KEY="case-key-123")

HOLD = """
import sys, time
from pathlib import Path
from engine.proc import runlock
runlock.acquire(Path(sys.argv[1]), sys.argv[2], "test")
print("held", flush=True)
time.sleep(120)
"""


def holder_process(directory: Path, name: str = runlock.RUN_LOCK) -> subprocess.Popen:
    """A real process holding ``directory/name`` (it prints ``held`` once it does)."""
    p = subprocess.Popen([PY, "-c", HOLD, str(directory), name], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_lock_refused_while_held_and_free_after_kill_9(tmp_path):
    p = holder_process(tmp_path)
    try:
        with pytest.raises(runlock.DirectoryInUse) as e:
            runlock.acquire(tmp_path)
        assert e.value.holder.pid == p.pid and e.value.holder.command.startswith("python -c ")
        assert f"run directory in use by pid {p.pid} since " in str(e.value)
        h = runlock.holder(tmp_path)
        assert h is not None and h.pid == p.pid and abs(h.since - time.time()) < 60
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert json.loads((tmp_path / "run.lock").read_text())["pid"] == p.pid  # a stale file...
    assert runlock.holder(tmp_path) is None                                 # ...is no holder
    with runlock.acquire(tmp_path) as lock:                                 # and blocks nothing
        assert runlock.holder(tmp_path).pid == os.getpid()
        again = runlock.acquire(tmp_path)  # the same process shares its hold
        again.release()
        assert runlock.holder(tmp_path).pid == os.getpid()
    assert runlock.holder(tmp_path) is None and lock.path.read_text() == ""


def _gated(gate: threading.Event):
    def respond(req: dict, n: int) -> Reply:
        gate.wait(60)
        return Reply(pieces=[sse(chunk({"role": "assistant", "content": "an answer"})),
                             sse(chunk({}, finish="stop", usage=usage(10, 3, cost=0.00001))), DONE])
    return respond


def _run(cfg: Path) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "datagen", "run", str(cfg), "--headless"], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "datagen", *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow  # issue 27: long e2e test (>9 s on 2 cores), run by `make slow`
def test_second_run_on_a_live_directory_exits_1_at_once_and_sends_nothing(tmp_path):
    gate_a, gate_b = threading.Event(), threading.Event()
    prompts = [{"messages": [{"role": "user", "content": f"question {i}"}]} for i in range(8)]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with CaseServer(_gated(gate_a)) as a, CaseServer(_gated(gate_b)) as b:
        cfg_a = case_config(tmp_path / "a", a.base_url, prompts, concurrency=4)
        run_dir = tmp_path / "a" / "run"
        # Another config (its own server, another dataset name and other prompts) pointing at the same directory
        other = [{"messages": [{"role": "user", "content": f"other {i}"}]} for i in range(5)]
        cfg_b = case_config(tmp_path / "b", b.base_url, other, concurrency=4)
        cfg_b.write_text(cfg_b.read_text().replace(str(tmp_path / "b" / "run"), str(run_dir))
                         .replace('name = "d"', 'name = "other"'))
        first = _run(cfg_a)
        try:
            deadline = time.monotonic() + 60
            while len(a.requests) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(a.requests) == 4  # live: four requests in flight, held at the gate
            for cfg in (cfg_b, cfg_a):  # another config on the same dir, then the same config again
                t0 = time.monotonic()
                second = _cli("run", str(cfg), "--headless")
                assert second.returncode == 1, second.stdout + second.stderr
                assert time.monotonic() - t0 < 30  # at once (generous: a loaded machine)
                assert f"error: run directory in use by pid {first.pid} since " in second.stderr
                assert "datagen run" in second.stderr and str(run_dir) in second.stderr
                # the hint ends the run (SIGTERM drains and exits), not `ctl abort` (prompts go back to pending)
                assert f"kill -TERM {first.pid}" in second.stderr and "ctl" not in second.stderr
            assert len(b.requests) == 0 and len(a.requests) == 4  # the second runs sent nothing
            db = sqlite3.connect(run_dir / "store.sqlite")
            assert [n for (n,) in db.execute("SELECT name FROM datasets")] == ["d"]  # the store untouched
            assert db.execute("SELECT COUNT(*) FROM prompts").fetchone()[0] == 8
            db.close()
            st = _cli("status", str(run_dir))
            assert st.returncode == 0 and f"run directory held by pid {first.pid} on " in st.stdout
            doc = json.loads(_cli("status", str(run_dir), "--json").stdout)
            assert doc["lock"]["pid"] == first.pid and "datagen run" in doc["lock"]["command"]
            # validate would rewrite verdicts beside the live run: refused, exit 2
            v = _cli("validate", str(run_dir))
            assert v.returncode == 2 and f"in use by pid {first.pid}" in v.stderr
            # ctl keeps working during the live run (the commands table)
            c = _cli("ctl", str(run_dir), "pause", "d")
            assert c.returncode == 0, c.stdout + c.stderr
            assert _cli("ctl", str(run_dir), "resume", "d").returncode == 0
            first.send_signal(signal.SIGKILL)  # kill -9 of the holder, four streams in flight
            first.wait(30)
        finally:
            if first.poll() is None:
                first.kill()
            gate_a.set()
            gate_b.set()
        assert runlock.holder(run_dir) is None
        assert json.loads(_cli("status", str(run_dir), "--json").stdout)["lock"] is None
        again = _cli("run", str(cfg_a), "--headless", timeout=120)  # the kernel released the lock: a new run goes
        assert again.returncode == 0, again.stdout + again.stderr
        doc = json.loads(_cli("status", str(run_dir), "--json").stdout)
        assert doc["datasets"][0]["done"] == 8 and doc["lock"] is None, (again.stdout, again.stderr, doc["datasets"])
        assert len(b.requests) == 0


def test_dashboard_path_takes_the_lock_before_opening_the_ui(tmp_path):
    """`datagen run` on a terminal (a real pty): refused before the dashboard starts (no alternate screen)."""
    cfg = case_config(tmp_path, "http://127.0.0.1:9/api/v1", [{"messages": [{"role": "user", "content": "q"}]}])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    hold = holder_process(run_dir)
    try:
        master, slave = pty.openpty()
        p = subprocess.Popen([PY, "-m", "datagen", "run", str(cfg)], cwd=REPO, env=ENV, stdin=slave,
                             stdout=slave, stderr=slave, close_fds=True)
        os.close(slave)
        out = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 0.5)
            if r:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    break
                if not data:
                    break
                out += data
            elif p.poll() is not None:
                break
        code = p.wait(30)
        os.close(master)
    finally:
        hold.kill()
        hold.wait()
    text = out.decode(errors="replace")
    assert code == 1, text
    assert f"error: run directory in use by pid {hold.pid} since " in text
    assert "\x1b[?1049h" not in text  # the dashboard (alternate screen) never opened
    assert not (run_dir / "store.sqlite").exists() and not (run_dir / "datagen.log").exists()


def test_extract_refused_on_an_output_directory_in_use(tmp_path):
    out = tmp_path / "run" / "extract"
    out.mkdir(parents=True)
    (tmp_path / "data").mkdir()
    (tmp_path / "no-model").mkdir()  # a model config is enough to get past the settings (no weights loaded)
    (tmp_path / "no-model" / "config.json").write_text(json.dumps({"hidden_size": 8, "num_hidden_layers": 6}))
    (tmp_path / "config.toml").write_text(
        f'[run]\ndir = "run"\n[[datasets]]\nname = "a"\npath = "a.jsonl"\n'
        f'[extract]\nmodel = "{tmp_path / "no-model"}"\nout_dir = "{out}"\n')
    hold = holder_process(out, runlock.EXTRACT_LOCK)
    try:
        from engine.extract.status import collect

        assert collect(out)["lock"]["pid"] == hold.pid
        r = _cli("extract", str(tmp_path / "config.toml"), "--data", str(tmp_path / "data"))
    finally:
        hold.kill()
        hold.wait()
    if "extract output directory in use" not in r.stderr:  # settings are checked first; then the lock
        pytest.fail(r.stderr)
    assert r.returncode == 1 and f"pid {hold.pid}" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["extract.lock"]  # nothing written


async def test_status_after_the_end_with_the_dashboard_open_shows_the_live_holder(tmp_path):
    """`datagen run` whose run completed while its dashboard stays at "run ended: press q": it holds
    the lock and no longer commits. Status (read 20 s later, the heartbeat stale) names it as the
    engine, consistently with `lock`, and its spend rate is the dashboard's figure at that moment
    (this engine's spend over 5 min), not 0; `ctl` applies commands offline (nothing reads them)."""
    import io

    from helpers import SAMPLES, make_config

    from engine.report.status import collect_status, format_status
    from engine.run.ctl import send
    from engine.run.headless import run_headless
    from engine.storage.store import make_run_dir

    cfg = make_config(tmp_path, provider={"sim": {"seed": 2, "mean_completion_tokens": 40}},
                      datasets=[{"name": "b1", "path": str(SAMPLES / "b1_glaive.jsonl"), "format": "glaive",
                                 "max_prompts": 12}])
    make_run_dir(cfg.run.dir)
    hold = runlock.acquire(cfg.run.dir)  # as `datagen run` holds it around the dashboard
    jobs = []
    try:
        assert await run_headless(cfg, io.StringIO(), install_signals=False, on_ready=jobs.append, metrics=False) == 0
        tel, clock = jobs[0].scheduler.telemetry, jobs[0].scheduler.clock
        wall, mono = time.time(), clock()
        doc = collect_status(cfg.run.dir, now=wall + 20)
        dashboard = tel.spend_rate_usd_per_h(mono + 20, 0)
        later = collect_status(cfg.run.dir, now=wall + 200)
        dashboard_later = tel.spend_rate_usd_per_h(mono + 200, 0)
        text = format_status(doc)
        retry = send(cfg.run.dir, "retry-failed", wait_s=2)
    finally:
        hold.release()
    assert doc["run"]["state"] == "completed"
    assert (doc["run"]["pid"], doc["run"]["alive"]) == (os.getpid(), True)
    assert doc["lock"]["pid"] == os.getpid()
    assert f"held by pid {os.getpid()}" in text and "engine not running" not in text
    assert dashboard > 0 and doc["spend_rate_usd_per_h"] == pytest.approx(dashboard, rel=1e-6)
    assert later["spend_rate_usd_per_h"] == pytest.approx(dashboard_later, rel=1e-6) and dashboard_later < dashboard
    assert retry.ok and "not confirmed" not in retry.text, retry.text
    gone = collect_status(cfg.run.dir, now=time.time() + 20)  # lock released: the engine is gone
    assert (gone["run"]["pid"], gone["run"]["alive"], gone["spend_rate_usd_per_h"], gone["lock"]) == (None, False, 0.0, None)
