"""Where the time goes: run one benchmark worker under py-spy and print a breakdown.

    python -m bench.profiling b1-ours          # the engine and its stream workers at 2,000 unthrottled streams (B1)
    python -m bench.profiling b1-httpx         # the bare httpx loop (ShardedTransport), same load
    python -m bench.profiling hold-headless    # 2,000 streams at 20 tok/s, headless (B2/B3)
    python -m bench.profiling hold-dashboard   # the same under the dashboard (B2/B7)
    python -m bench.profiling b4-resume        # pyinstrument of a resume with 80,000 stored results

Options: ``--delay S`` (start sampling after S seconds; default: once the load is steady),
``--seconds S`` (sampling duration), ``--out FILE`` (raw collapsed stacks, for flamegraph.pl).
Needs the ``bench`` extra (py-spy, pyinstrument); py-spy needs ptrace rights (root, or
``kernel.yama.ptrace_scope=0``).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import PY, REPO, SimProcess, placement, raise_fd_limit, sim_args, tempdir, write_prompts

CATEGORIES = (  # first match wins, tested against the whole stack (py-spy prints paths relative to sys.path)
    ("dashboard (textual/rich/tui)", ("(textual/", "(rich/", "(tui/")),
    ("SSE parse + JSON decode", ("(engine/client/sse.py", "(json/")),
    ("connection pool bookkeeping (httpcore)", ("_assign_requests_to_connections",)),
    ("stream accumulation", ("(engine/client/accumulate.py",)),
    ("store / writer (aiosqlite)", ("(engine/storage/writer.py", "(engine/storage/store.py", "(aiosqlite/")),
    ("HTTP stack (httpx/httpcore/h11/anyio)", ("(httpx/", "(httpcore/", "(h11/", "(anyio/")),
    ("scheduler / spend / telemetry / client glue", ("(engine/",  "(tenacity/")),
    ("event loop / selector", ("(asyncio/", "(selectors.py")),
)


def breakdown(raw: Path, top: int = 25) -> str:
    """Categories and the top self/inclusive frames of a py-spy ``raw`` file."""
    incl: collections.Counter = collections.Counter()
    selfc: collections.Counter = collections.Counter()
    cats: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        if not line.strip():
            continue
        stack, _, n = line.rpartition(" ")
        k = int(n)
        total += k
        names = []
        for fr in stack.split(";"):
            m = re.match(r"(.*?) \((.*?):\d+\)$", fr)
            names.append(f"{m.group(1)} ({m.group(2).split('site-packages/')[-1].replace(str(REPO) + '/', '')})"
                         if m else fr)
        for nm in set(names):
            incl[nm] += k
        selfc[names[-1]] += k
        cats[next((c for c, keys in CATEGORIES if any(x in stack for x in keys)), "other")] += k
    if not total:
        return "no samples"
    out = [f"{total} samples", "-- by category (a stack counts once, first match in this order)"]
    out += [f"{100 * v / total:5.1f}%  {k}" for k, v in cats.most_common()]
    out.append("-- inclusive")
    out += [f"{100 * v / total:5.1f}%  {k}" for k, v in incl.most_common(top + 10)
            if not re.search(r"runpy|runners\.py|base_events\.py|bench/", k)][:top]
    out.append("-- self")
    out += [f"{100 * v / total:5.1f}%  {k}" for k, v in selfc.most_common(top)]
    return "\n".join(out)


def pyspy(pid: int, seconds: float, out: Path) -> None:
    exe = shutil.which("py-spy") or str(Path(PY).with_name("py-spy"))
    # --subprocesses: the engine's HTTP streams run in its stream-worker processes (engine.stream)
    r = subprocess.run([exe, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "100", "-f", "raw", "-o", str(out),
                        "--nonblocking", "--subprocesses"], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"py-spy failed: {r.stderr[-800:]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="profile one benchmark worker")
    p.add_argument("target", choices=["b1-ours", "b1-httpx", "hold-headless", "hold-dashboard", "b4-resume"])
    p.add_argument("--delay", type=float, default=None)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    raise_fd_limit()
    client_cpu, sim_cpu = placement()
    pin = (lambda: os.sched_setaffinity(0, {client_cpu})) if client_cpu is not None else None
    if a.target == "b4-resume":
        return profile_resume(pin)
    out = Path(a.out or f"/tmp/datagen-profile-{a.target}.txt")
    with tempdir("profile") as tmp:
        if a.target.startswith("b1"):
            sim = SimProcess(*sim_args(mean_tokens=2000), cpu=sim_cpu)
            prompts = write_prompts(tmp / "p.jsonl", 12000)
            args = ["--base-url", sim.base_url, "--prompts", str(prompts), "--seconds", "600", "--start-after",
                    str(10**9)]
            cmd = ([PY, "-m", "bench.b1_throughput", "--worker", "--tmp", str(tmp), *args] if a.target == "b1-ours"
                   else [PY, "-m", "bench.baseline_httpx", "--worker", "--transport", "sharded", *args])
            delay = 20 if a.delay is None else a.delay
        else:
            sim = SimProcess(*sim_args(tokens_per_s=20, mean_tokens=2000), cpu=sim_cpu)
            cmd = [PY, "-m", "bench.hold", "--worker", "--base-url", sim.base_url, "--tmp", str(tmp), "--mode",
                   a.target.split("-")[1]]
            delay = 22 if a.delay is None else a.delay
        try:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=pin)
            time.sleep(delay)
            c0 = _cpu(proc.pid)
            pyspy(proc.pid, a.seconds, out)
            share = (_cpu(proc.pid) - c0) / a.seconds
            proc.kill()
            proc.wait()
        finally:
            sim.stop()
    print(f"{a.target}: process CPU {100 * share:.0f}% of a core while sampled; raw stacks in {out}")
    print(breakdown(out))
    return 0


def _cpu(pid: int) -> float:
    from bench.common import proc_cpu_s

    return proc_cpu_s(pid)


def profile_resume(pin) -> int:
    """pyinstrument over ``datagen run`` resuming 80,000 results, up to the first dispatch."""
    from bench import b4_resume

    with tempdir("profile-b4") as tmp, SimProcess(*sim_args(mean_tokens=50)) as sim:
        prompts = write_prompts(tmp / "prompts.jsonl", b4_resume.N_PROMPTS, tag="b4 ")
        cfg = b4_resume.write_config(tmp, sim.base_url, prompts)
        env = {**os.environ, "DATAGEN_BENCH_KEY": "sk-bench-local"}
        run = [PY, "-m", "bench.b4_resume", "--worker", "--config", str(cfg), "--run-dir", str(tmp / "r")]
        subprocess.run([*run, "--t0", repr(time.time())], cwd=REPO, env=env, capture_output=True, preexec_fn=pin)
        print(b4_resume.build_resume_store(tmp / "r" / "store.sqlite", b4_resume.N_DONE))
        code = ("import sys, time, pyinstrument; p = pyinstrument.Profiler(interval=0.001); p.start()\n"
                "import atexit\n"
                "def done():\n    p.stop(); print(p.output_text(unicode=False, color=False, show_all=False))\n"
                "import bench.common as c; emit = c.emit\n"
                "def emit2(r):\n    emit(r); done()\n"
                "c.emit = emit2\n"
                "import bench.b4_resume as b; b.emit = emit2\n"
                f"sys.argv = {[*run[2:], '--t0', repr(time.time())]!r}\n"
                "b.main(sys.argv[1:])\n")
        r = subprocess.run([PY, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, preexec_fn=pin)
        print(r.stdout[-12000:] or r.stderr[-3000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
