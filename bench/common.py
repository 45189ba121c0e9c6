"""Shared machinery of the benchmarks: the simulator subprocess, worker subprocesses, CPU pinning,
statistics, machine description, prompt files and engine configs.

Every measurement runs in a fresh worker process (``python -m bench.<module> --worker ...``) pinned
to its own core, and prints one machine-readable last line ``RESULT {json}``; the simulator runs in
another process (``datagen sim``) pinned to another core. The orchestrating process only starts
processes and collects numbers.
"""

from __future__ import annotations

import asyncio
import collections.abc
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
PY = sys.executable

#: Benchmark sizes: "full" (``make bench``) and "quick" (development; same shapes, shorter windows).
PROFILE = os.environ.get("BENCH_PROFILE", "full")


def log(msg: str) -> None:
    """Progress line on stderr (``make bench`` shows it)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- CPUs -----------------------------------------------------------------------------------------
def cpus() -> list[int]:
    """CPUs this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def placement() -> tuple[int | None, int | None]:
    """``(client_cpu, sim_cpu)``: the measured process on the first allowed CPU, the simulator on
    the last; ``(None, None)`` on a one-CPU machine (nothing pinned)."""
    c = cpus()
    if len(c) < 2:
        return None, None
    return c[0], c[-1]


def _pin(cpu: int | None):
    if cpu is None:
        return None

    def pre() -> None:
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError:
            pass

    return pre


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) from /proc, or NaN."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of a process (bytes) from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def raise_fd_limit(n: int = 16384) -> None:
    """Raise the soft open-files limit (2,000 sockets per side need it)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n if hard == resource.RLIM_INFINITY else min(n, hard)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


# ---- the engine's stream workers (engine.stream.pool) -------------------------------------------
#: Environment of a measured engine process: how many stream workers (``[run] stream_workers``) and
#: the CPUs to pin them to (comma-separated; every CPU the orchestrator may use when they run unpinned).
ENV_STREAM_WORKERS = "BENCH_STREAM_WORKERS"
ENV_STREAM_CPUS = "BENCH_STREAM_CPUS"


def stream_cpus() -> tuple[list[int], bool]:
    """``(cpus, pinned)``: the CPUs for the measured engine's stream workers: every allowed CPU but
    the measured process's (the first) and the simulator's (the last). When none is left (a 1- or
    2-core machine) they run unpinned: ``(every allowed CPU, False)``."""
    c = cpus()
    client, sim = placement()
    rest = [x for x in c if x not in (client, sim)]
    return (rest, True) if rest else (c, False)


def default_stream_workers() -> int:
    """The stream workers of the measured engine by default: one per CPU left to them (the engine's
    own default, ``max(1, cores - 1)``, would count the simulator's core and, in the pinned engine
    process, sees one core); 1 when they run unpinned."""
    c, pinned = stream_cpus()
    return len(c) if pinned else 1


def stream_env(workers: int | None = None) -> dict[str, str]:
    """Environment for a measured engine worker process: ``workers`` stream workers (default
    :func:`default_stream_workers`) on :func:`stream_cpus`."""
    c, _ = stream_cpus()
    return {ENV_STREAM_WORKERS: str(workers or default_stream_workers()), ENV_STREAM_CPUS: ",".join(map(str, c))}


def stream_settings() -> tuple[int | None, set[int] | None]:
    """In the measured engine process: ``(stream_workers, cpus)`` from :func:`stream_env`'s
    variables; ``(None, None)`` when unset (the engine's default count, the engine's CPU inherited)."""
    n = os.environ.get(ENV_STREAM_WORKERS)
    if not n:
        return None, None
    c = os.environ.get(ENV_STREAM_CPUS, "")
    return int(n), ({int(x) for x in c.split(",")} if c else None)


def stream_note(workers: int | None = None) -> str:
    """One phrase on where the stream workers ran, for a result row's note."""
    c, pinned = stream_cpus()
    n = workers or default_stream_workers()
    where = (f"pinned to CPU{'s' if len(c) > 1 else ''} {_cpu_list(c)}" if pinned else
             f"unpinned (affinity reset to all {len(c)} CPUs: none is left beside the engine's and the simulator's, "
             f"so the workers share those)")
    return f"{n} stream worker{'s' if n != 1 else ''} {where}"


def _cpu_list(c: list[int]) -> str:
    return f"{c[0]}-{c[-1]}" if len(c) > 2 and c == list(range(c[0], c[-1] + 1)) else ",".join(map(str, c))


class StreamWorkers:
    """The measured engine's stream-worker processes (``job.pool``, a
    :class:`engine.stream.pool.StreamWorkerPool`): pins them to ``cpus`` (they would otherwise
    inherit the engine's single CPU; None: left so) and sums their CPU time and RSS. :meth:`start`
    re-pins every 0.5 s, so a worker that replaced a dead one is pinned too."""

    def __init__(self, pool: Any, cpus_: set[int] | None) -> None:
        self.pool = pool
        self.cpus = cpus_
        self._pinned: set[int] = set()
        self._dead_cpu = 0.0  # CPU of workers that were replaced (so sums never go backwards)
        self._last_cpu: dict[int, float] = {}
        self.task: asyncio.Task | None = None
        self.pin()

    def pids(self) -> list[int]:
        return [w.pid for w in self.pool.figures().workers if w.pid and w.alive]

    def pin(self) -> None:
        """Set the affinity of every thread of every live worker not pinned yet."""
        if self.cpus is None:
            return
        for pid in self.pids():
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                continue
            for tid in tids:
                if tid in self._pinned:
                    continue
                try:
                    os.sched_setaffinity(tid, self.cpus)
                    self._pinned.add(tid)
                except OSError:
                    pass

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.pin()

    def start(self) -> "StreamWorkers":
        self.task = asyncio.get_running_loop().create_task(self._keep())
        return self

    def cpu_s(self) -> float:
        """CPU seconds of the workers since they started (all their threads; replaced ones included)."""
        pids = set(self.pids())
        for pid in [p for p in self._last_cpu if p not in pids]:
            self._dead_cpu += self._last_cpu.pop(pid)
        for pid in pids:
            v = proc_cpu_s(pid)
            if v == v:
                self._last_cpu[pid] = v
        return self._dead_cpu + sum(self._last_cpu.values())

    def rss(self) -> int:
        """Summed RSS of the live workers (bytes)."""
        total = 0
        for pid in self.pids():
            try:
                total += rss_bytes(pid)
            except OSError:
                pass
        return total

    def figures(self) -> dict[str, Any]:
        f = self.pool.figures()
        return {"stream_workers": f.configured, "alive": f.alive, "restarts": f.restarts, "pids": self.pids(),
                "cpus": sorted(self.cpus) if self.cpus else None,
                "affinity": {pid: sorted(_affinity(pid)) for pid in self.pids()}}


def _affinity(pid: int) -> set[int]:
    try:
        return os.sched_getaffinity(pid)
    except OSError:
        return set()


# ---- the simulator --------------------------------------------------------------------------------
class SimProcess:
    """``datagen sim`` in its own process on an ephemeral loopback port, pinned to ``cpu``."""

    def __init__(self, *args: str, cpu: int | None = None) -> None:
        raise_fd_limit()
        cmd = [PY, "-m", "datagen", "sim", "--port", "0", *args]
        self.args = args
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     preexec_fn=_pin(cpu))
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        m = re.search(r"(http://127\.0\.0\.1:\d+/api/v1)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"simulator did not start: {line!r}")
        self.base_url = m.group(1)

    def cpu_s(self) -> float:
        return proc_cpu_s(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "SimProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def sim_args(*, tokens_per_s: float = 0, latency_ms: float = 0, mean_tokens: int = 2000, seed: int = 1,
             extra: Sequence[str] = ()) -> list[str]:
    return ["--seed", str(seed), "--tokens-per-s", str(tokens_per_s), "--latency-ms", str(latency_ms),
            "--mean-completion-tokens", str(mean_tokens), *extra]


# ---- workers --------------------------------------------------------------------------------------
class WorkerError(RuntimeError):
    pass


def run_worker(module: str, args: Sequence[str], *, cpu: int | None, timeout: float,
               env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``python -m bench.<module> --worker ARGS`` pinned to ``cpu``; return its ``RESULT`` JSON.

    Raises:
        WorkerError: no RESULT line (the worker's output tail is in the message) or a timeout.
    """
    cmd = [PY, "-m", f"bench.{module}", "--worker", *args]
    e = dict(os.environ)
    e.setdefault("PYTHONUNBUFFERED", "1")
    e.update(env or {})
    try:
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, preexec_fn=_pin(cpu),
                           env=e)
    except subprocess.TimeoutExpired as ex:
        out = (ex.stdout or b"")
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        err = ex.stderr.decode(errors="replace") if isinstance(ex.stderr, bytes) else (ex.stderr or "")
        raise WorkerError(f"{module} timed out after {timeout:.0f}s: {(out + err)[-1500:]}") from None
    res = parse_result(r.stdout)
    if res is None:
        raise WorkerError(f"{module} exited {r.returncode} without RESULT: {(r.stdout + r.stderr)[-2000:]}")
    return res


def parse_result(text: str) -> dict[str, Any] | None:
    """The JSON of the last ``RESULT {json}`` line of ``text`` (None if there is none)."""
    for line in reversed(text.splitlines()):
        if line.startswith("RESULT "):
            try:
                return json.loads(line[7:])
            except ValueError:
                return None
    return None


def emit(result: dict[str, Any]) -> None:
    """Print the worker's machine-readable last line and flush."""
    print("RESULT " + json.dumps(result), flush=True)


# ---- statistics -----------------------------------------------------------------------------------
def summary(values: Sequence[float]) -> dict[str, Any]:
    """Median and spread (min, max; IQR from 4 runs on) of repeated measurements."""
    v = sorted(x for x in values if x is not None and x == x)
    if not v:
        return {"median": None, "min": None, "max": None, "n": 0, "values": []}
    out: dict[str, Any] = {"median": statistics.median(v), "min": v[0], "max": v[-1], "n": len(v),
                           "values": [None if x is None else round(x, 6) for x in values]}  # a failed run: None
    if len(v) >= 4:
        q = statistics.quantiles(v, n=4)
        out["iqr"] = [q[0], q[2]]
    return out


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0-100) by linear interpolation."""
    v = sorted(values)
    if not v:
        return float("nan")
    k = (len(v) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


# ---- event-loop lag ----
class LagProbe:
    """Sleeps ``interval`` s in a loop and records how late each wake-up was (seconds)."""

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self.samples: list[float] = []
        self.task: Any = None

    def start(self) -> "LagProbe":
        self.task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.interval)
            self.samples.append(time.perf_counter() - t - self.interval)

    def take(self) -> list[float]:
        s, self.samples = self.samples, []
        return s


def lag_stats(samples: list[float]) -> dict[str, Any]:
    ms = [1000 * x for x in samples]
    return {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99), "max_ms": max(ms) if ms else None,
            "n": len(ms)}


class _TimedCoro(collections.abc.Coroutine):
    """Wraps a coroutine and adds the main thread's CPU time of each step to ``meter.cpu_s``."""

    __slots__ = ("_coro", "_meter")

    def __init__(self, coro, meter: "UICpuMeter") -> None:
        self._coro = coro
        self._meter = meter

    def send(self, value):
        m = self._meter
        t, g = time.thread_time(), m.gc_s
        try:
            return self._coro.send(value)
        finally:
            m.cpu_s += time.thread_time() - t - (m.gc_s - g)

    def throw(self, *exc):
        m = self._meter
        t, g = time.thread_time(), m.gc_s
        try:
            return self._coro.throw(*exc)
        finally:
            m.cpu_s += time.thread_time() - t - (m.gc_s - g)

    def close(self):
        return self._coro.close()

    def __await__(self):
        return self

    def __iter__(self):
        return self

    def __next__(self):
        return self.send(None)


class UICpuMeter:
    """CPU seconds spent in the dashboard's asyncio tasks (those whose coroutine is defined in
    textual, rich or tui: message pumps, timers, the compositor's refreshes, snapshot polls).

    Installed as the loop's task factory before the app starts; only those tasks are wrapped, so
    the engine's 2,000 stream tasks run untouched. The engine's own host task (a Textual worker)
    is excluded: what it awaits (``scheduler.run()``) is engine work. Garbage collections that
    happen to run inside a dashboard step are not charged to it (they collect everyone's objects;
    ``gc_s`` is their total)."""

    UI = ("/textual/", "/rich/", "/tui/")
    EXCLUDE = ("textual/worker.py",)

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.gc_s = 0.0
        self.tasks = 0
        self._gc_t0 = 0.0

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_t0 = time.thread_time()
        else:
            self.gc_s += time.thread_time() - self._gc_t0

    def install(self, loop: asyncio.AbstractEventLoop) -> "UICpuMeter":
        import gc

        gc.callbacks.append(self._on_gc)
        def factory(loop_, coro, **kw):
            code = getattr(coro, "cr_code", None)
            fn = code.co_filename if code is not None else ""
            if any(x in fn for x in self.UI) and not any(x in fn for x in self.EXCLUDE):
                self.tasks += 1
                coro = _TimedCoro(coro, self)
            return asyncio.Task(coro, loop=loop_, **kw)

        loop.set_task_factory(factory)
        return self


# ---- machine --------------------------------------------------------------------------------------
def machine_info() -> dict[str, Any]:
    """CPU model, cores, RAM, OS, Python, key package versions, date, load average."""
    from importlib import metadata

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    pkgs = {}
    for name in ("httpx", "httpcore", "h11", "aiosqlite", "textual", "tiktoken", "tokenizers", "openai", "torch",
                 "transformers", "pydantic"):
        try:
            pkgs[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pkgs[name] = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                timeout=5).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                    capture_output=True, text=True, timeout=5).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", False
    return {
        "cpu": cpu, "cores": os.cpu_count(), "cores_allowed": len(cpus()), "ram_gib": round(mem / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
        "packages": pkgs, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": commit + ("+dirty" if dirty else ""),
        "loadavg_at_start": list(os.getloadavg()), "profile": PROFILE,
    }


# ---- prompts and configs --------------------------------------------------------------------------
def write_prompts(path: Path, n: int, tag: str = "") -> Path:
    """A ``text``-format JSONL of ``n`` distinct short prompts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": f"{tag}Question number {i}: explain topic {i * 7919 % 1000} in depth."}))
            f.write("\n")
    return path


def read_prompt_messages(path: Path, n: int | None = None) -> list[list[dict[str, str]]]:
    """The messages the engine sends for the first ``n`` prompts of a ``text`` JSONL (same bodies)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            out.append([{"role": "user", "content": json.loads(line)["prompt"]}])
            if n is not None and len(out) >= n:
                break
    return out


def engine_config(tmp: Path, base_url: str, datasets: list[dict[str, Any]], *, concurrency: int,
                  max_tokens: int = 8000, run: dict[str, Any] | None = None, spend: dict[str, Any] | None = None,
                  stall_s: float = 120):
    """A validated engine Config against an external simulator (``[provider] kind = "openai"``)."""
    from engine.config import parse_config

    os.environ.setdefault("DATAGEN_BENCH_KEY", "sk-bench-local")  # the simulator wants a bearer token
    data = {
        "run": {"name": "bench", "dir": str(tmp / "run"), "commit_interval_s": 1.0, "progress_interval_s": 3600,
                **(run or {})},
        "provider": {"kind": "openai", "base_url": base_url, "api_key_env": "DATAGEN_BENCH_KEY",
                     "timeouts": {"stall_s": stall_s, "total_s": 1800}},
        "classes": {"short": {"max_tokens": max_tokens, "concurrency": concurrency}},
        "spend": spend or {},
        "datasets": datasets,
    }
    return parse_config(data, tmp / "config.toml")


@contextmanager
def tempdir(prefix: str) -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix=f"datagen-bench-{prefix}-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class Window:
    """Steady-state measurement window over a completion counter: opens once ``start_after``
    requests completed (connections are up, every slot busy) or, when ``open_at_s`` is given, that
    many seconds after :meth:`watch` started, whichever comes first; closes after ``seconds`` or
    once ``end_at`` completed (before the drain tail). Records wall time, process CPU and the
    optional ``events`` counter (SSE data events) at both ends. ``cpu`` (default: this process's
    ``time.process_time``) is the CPU clock read; the engine's adds its stream workers'."""

    def __init__(self, start_after: int, end_at: int, seconds: float, open_at_s: float | None = None,
                 cpu=None) -> None:
        self.start_after, self.end_at, self.seconds, self.open_at_s = start_after, end_at, seconds, open_at_s
        self.cpu = cpu or time.process_time
        self.t0 = self.c0 = self.n0 = self.e0 = None
        self.t1 = self.c1 = self.n1 = self.e1 = None

    async def watch(self, count, events=None, in_flight=None, interval: float = 0.02) -> None:
        """Poll ``count()`` (completions) until the window closed; ``in_flight()`` is sampled
        inside the window (its mean and minimum are reported)."""
        ev = events or (lambda: 0)
        t_watch = time.monotonic()
        self._inflight: list[int] = []
        while True:
            n = count()
            now = time.monotonic()
            if self.t0 is None:
                if n >= self.start_after or (self.open_at_s is not None and now - t_watch >= self.open_at_s):
                    self.t0, self.c0, self.n0, self.e0 = now, self.cpu(), n, ev()
            elif n >= self.end_at or now - self.t0 >= self.seconds:
                self.t1, self.c1, self.n1, self.e1 = now, self.cpu(), n, ev()
                return
            elif in_flight is not None:
                self._inflight.append(in_flight())
            await asyncio.sleep(interval)

    def result(self) -> dict[str, Any]:
        wall = self.t1 - self.t0
        done = self.n1 - self.n0
        cpu = self.c1 - self.c0
        events = self.e1 - self.e0
        out = {"req_per_s": done / wall if wall > 0 else 0.0, "cpu_s_per_1000": 1000 * cpu / done if done else None,
               "cpu_share": cpu / wall if wall > 0 else None, "window_s": wall, "window_requests": done}
        if getattr(self, "_inflight", None):
            out.update(in_flight_mean=sum(self._inflight) / len(self._inflight), in_flight_min=min(self._inflight))
        if events:
            out.update(events_per_s=events / wall, cpu_us_per_event=1e6 * cpu / events,
                       events_per_request=events / done if done else None)
        return out


# ---- result rows ----------------------------------------------------------------------------------
def ratio_summary(ours: Sequence[float], base: Sequence[float]) -> dict[str, Any]:
    """Summary of per-run ratios ours/baseline (runs paired by index: they ran side by side)."""
    rs = [o / b for o, b in zip(ours, base, strict=False) if o is not None and b not in (None, 0)]
    return summary(rs)


def make_row(id: str, what: str, *, ours: Any, baseline: Any, unit: str, goal: str, met: bool | None,
             ratio: dict[str, Any] | None = None, note: str = "", details: dict[str, Any] | None = None) -> dict:
    """One line of the results table. ``ours``/``baseline`` are summaries (see :func:`summary`),
    plain numbers or strings ("not available")."""
    return {"id": id, "what": what, "ours": ours, "baseline": baseline, "unit": unit, "ratio": ratio, "goal": goal,
            "met": met, "note": note, "details": details or {}}


def unavailable(id: str, what: str, goal: str, why: str) -> dict:
    return make_row(id, what, ours="not available", baseline="not available", unit="", goal=goal, met=None, note=why)
