"""Extraction chained after generation in ``datagen run`` (``[extract] after_run``).

- ``run``: once the whole generation run ended with exit 0, one :class:`~engine.extract.run.ExtractRun`
  over the run directory (every validated sample).
- ``dataset``: as soon as a dataset is finished (``done``, ``budget_met`` or ``skipped``), its
  results are committed and every one of them has its validation verdict, extraction of the
  datasets finished so far starts while generation goes on. Extraction is exactly-once by sample id
  (the output manifest), so successive ExtractRuns over "every dataset finished so far" write each
  sample once; one run at a time (the output directory's lock). A dataset whose share of invalid
  records passes ``[tokenizer] max_failure_rate`` (the anomaly guard's rule) is not extracted.
- ``follow``: while datasets are still being bought, an extraction of their newly validated records
  starts once ``follow_records`` of one dataset are waiting (the rest once it ends):
  :mod:`engine.run.chainfollow`.

:class:`ExtractChain` is also what the extraction view shows (an ``ExtractHost``: :attr:`commands`
and :meth:`snapshot`). Generation and extraction are paused independently: a generation pause does
not pause extraction, nor the reverse. A quit drains both (the caller drains generation; the chain
drains the extraction in hand and starts no other). :func:`run_headless_chained` is ``datagen run
--headless`` with the chain (extraction lines prefixed ``extract:``). What the chain shows and
says: :class:`engine.run.chainview.ChainView`.

Exit code of the whole command: :func:`combined_exit_code` (generation's when it is not 0, else
extraction's). A chain that ended with samples left (a quit's drain exits 0, as ``datagen extract``
does) says so in its last line: :meth:`ExtractChain.incomplete_line`.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

from engine.config import Config
from engine.errors import DatagenError
from engine.extract.run import ExtractRun
from engine.report.metricsserver import open_metrics, printer, serving
from engine.report.snapshot import RunSnapshot
from engine.run.chainfollow import Follower
from engine.run.chainready import FINISHED_STATES, dataset_counts, readiness
from engine.run.chainview import ChainCommands, ChainView
from engine.run.seams import TextOut
from engine.storage.schema import StoreError


def combined_exit_code(generation: int, extraction: int | None) -> int:
    """``datagen run``'s exit code with chaining: generation's when it is not 0, else extraction's
    (0 when no extraction ran)."""
    return generation if generation != 0 else (extraction or 0)


class ExtractChain(ChainView):
    """Extraction chained after generation, by ``cfg.extract.after_run``.

    Args:
        cfg: the validated config (``after_run`` is ``run``, ``dataset`` or ``follow``).
        say: where the chain's and the extraction runs' lines go (headless: printed; dashboard: the log).
        progress_s: seconds between the extraction runs' progress lines (None: none, for the dashboard).
        worker_output: the workers' logs (``"file"``: ``out_dir/status/worker-<rank>.log``).
        on_quit: called with ``"drain"``/``"abort"`` when the extraction view quits, to stop
            generation too (None: nothing).
        poll_s: seconds between looks at the generation snapshot.
        make_run: builds the :class:`ExtractRun` for a dataset tuple (None: all); default one with
            the settings above (tests inject workers/free space).

    Attributes:
        runs: the extraction runs started, oldest first; current: the one running (None between).
        follow: the :class:`~engine.run.chainfollow.Follower` (``follow`` mode; None otherwise).
        source: the input of the next extraction run (a ``tokens`` Parquet folder: a follow
            increment's frozen records; None: the run directory).
        starts: ``(epoch s, datasets)`` of each started run; handed: datasets given to runs so far.
        left_out: ``{dataset: why}`` of datasets not extracted; exit_code: once :meth:`run` returned.
        paused / quit_mode: the extraction view's pause and quit (``"drain"``/``"abort"``).

    Raises:
        ValueError: ``after_run`` is ``never``.
    """

    def __init__(self, cfg: Config, *, say: Callable[[str], None] = print, progress_s: float | None = None,
                 worker_output: str = "file", on_quit: Callable[[str], None] | None = None, poll_s: float = 1.0,
                 make_run: Callable[[tuple[str, ...] | None], ExtractRun] | None = None) -> None:
        if cfg.extract.after_run not in ("run", "dataset", "follow"):
            raise ValueError(f"extract.after_run is {cfg.extract.after_run!r}: nothing to chain")
        self.cfg = cfg
        self.mode = cfg.extract.after_run
        self._say = say
        self.progress_s = progress_s
        self.worker_output = worker_output
        self._on_quit = on_quit
        self.poll_s = poll_s
        self._make_run = make_run or self._new_run
        self.runs: list[ExtractRun] = []
        self.current: ExtractRun | None = None
        self.starts: list[tuple[float, tuple[str, ...]]] = []
        self.handed: tuple[str, ...] = ()
        self.left_out: dict[str, str] = {}
        self.paused = False
        self.quit_mode: str | None = None
        self.exit_code: int | None = None
        self.events: collections.deque[str] = collections.deque(maxlen=200)
        self.commands = ChainCommands(self)
        self.follow = Follower(self) if self.mode == "follow" else None
        self.source: Path | None = None
        self._interrupts = 0

    # ------------------------------------------------------------------ messages, commands
    def say(self, line: str) -> None:
        """Keep ``line`` (with the time) for the view's log and pass it to ``say``."""
        self.events.append(f"{time.strftime('%H:%M:%S')} {line}")
        try:
            self._say(line)
        except (OSError, ValueError, RuntimeError):  # a closed terminal
            pass

    def _new_run(self, datasets: tuple[str, ...] | None) -> ExtractRun:
        return ExtractRun(self.cfg, data=self.source, datasets=list(datasets) if datasets is not None else None,
                          say=self.say, progress_s=self.progress_s, worker_output=self.worker_output)

    def quit(self) -> str:
        """The extraction view's quit: drain (then abort) the extraction in hand, start no other,
        and stop generation the same way (``on_quit``). Returns a line for a toast."""
        mode = "drain" if self.quit_mode is None else "abort"
        line = self.request_quit(mode)
        if self._on_quit is not None:
            self._on_quit(mode)
        return line

    def request_quit(self, mode: str) -> str:
        """Stop chaining: ``drain`` (the extraction in hand finishes its batches, none starts) or
        ``abort`` (its workers stop after the write in progress). Returns a line."""
        if mode not in ("drain", "abort"):
            raise ValueError(f"mode must be 'drain' or 'abort', got {mode!r}")
        if self.quit_mode == "abort" or self.quit_mode == mode:
            return f"extraction: quit ({self.quit_mode}) already asked"
        self.quit_mode = mode
        run = self.current
        if run is None:
            line = "extraction: no extraction running; none starts"
            self.say(line)
            return line
        try:
            line = run.commands.quit()
            if mode == "abort" and "abort" not in line:
                line = run.commands.quit()
        except (DatagenError, OSError) as e:
            line = f"extraction: cannot write the control file ({e})"
            self.say(line)
        return line

    def interrupt(self, signame: str, mode: str | None = None) -> None:
        """A signal (SIGINT/SIGTERM/SIGHUP) or the dashboard's Ctrl-C while chained. ``mode`` None
        (headless): the first drains, the second aborts (kills the workers, like ``datagen
        extract``). The dashboard passes ``"drain"``/``"abort"`` by its own rule (a quit already in
        progress counts as the first interrupt): the chain stops that way. Either way the extraction
        in hand counts it as an interrupt, so it exits 130 while samples are left (as ``datagen
        extract`` after SIGINT), not 0 as after a quit key's drain."""
        self._interrupts += 1
        if mode is None:
            self.quit_mode = "drain" if self._interrupts == 1 else "abort"
        else:
            self.request_quit(mode)
        if self.current is not None:
            self.current.interrupt(signame)

    # ------------------------------------------------------------------ the chain
    async def run(self, snapshot: Callable[[], RunSnapshot | None], ended: Callable[[], int | None]) -> int:
        """Chain extraction to the generation seen through ``snapshot`` (None before it is prepared)
        and ``ended`` (its exit code once it ended, else None); returns when nothing more will be
        extracted.

        Returns:
            Extraction's exit code: 0 (nothing to do, done, or drained after a quit), else the first
            failing :meth:`ExtractRun.run` code (1 failed, 130 interrupted).
        """
        try:
            if self.follow is not None:
                code = await self.follow.run(snapshot, ended)
            else:
                code = await (self._after_run(ended) if self.mode == "run" else self._per_dataset(snapshot, ended))
        finally:
            self.current = None
        self.exit_code = code
        return code

    async def _after_run(self, ended: Callable[[], int | None]) -> int:
        while (gen := ended()) is None or self.paused:
            if self.quit_mode:
                return 0
            await asyncio.sleep(self.poll_s)
        if self.quit_mode:
            return 0
        if gen != 0:
            self.say(f"generation ended with exit code {gen}: extraction not started")
            self.left_out = {d.name: f"generation ended with exit code {gen}" for d in self.cfg.datasets}
            return 0
        names = [d.name for d in self.cfg.datasets]
        verdicts = await asyncio.to_thread(self._check, {n: 0 for n in names})
        ok = tuple(n for n in names if verdicts[n][0] == "ready")
        self._leave_out({n: v for n, v in verdicts.items() if v[0] != "ready"})
        if not ok:
            return 0
        return await self._one(None if len(ok) == len(names) else ok)

    async def _per_dataset(self, snapshot: Callable[[], RunSnapshot | None], ended: Callable[[], int | None]) -> int:
        order = [d.name for d in self.cfg.datasets]
        while not self.quit_mode:
            gen = ended()
            ready = await self._ready(snapshot(), final=gen is not None)
            if ready and not self.paused:
                datasets = tuple(n for n in order if n in set(self.handed) | set(ready))
                code = await self._one(datasets)
                if code != 0:
                    return code
                continue
            if gen is not None and not ready:
                return 0
            await asyncio.sleep(self.poll_s)
        return 0

    async def _ready(self, snap: RunSnapshot | None, final: bool) -> list[str]:
        """Finished datasets not handed yet that can be extracted now; with ``final`` (generation
        ended) the others that are not ready are left out, with why."""
        if snap is None:
            return []
        cands = {d.name: d.done for d in snap.datasets
                 if d.state in FINISHED_STATES and d.name not in self.handed and d.name not in self.left_out}
        if not cands:
            return []
        verdicts = await asyncio.to_thread(self._check, cands)
        self._leave_out({n: v for n, v in verdicts.items() if v[0] == "refuse" or (final and v[0] == "wait")})
        return [n for n, v in verdicts.items() if v[0] == "ready"]

    def _check(self, done: dict[str, int]) -> dict[str, tuple[str, str]]:
        tok = self.cfg.tokenizer
        rate, window = (tok.max_failure_rate, tok.failure_window) if tok is not None else (0.0, 200)
        try:
            counts = dataset_counts(self.cfg.run.dir, list(done))
        except StoreError as e:
            return {n: ("wait", f"store not readable yet ({e})") for n in done}
        return {n: readiness(done[n], *counts[n], max_failure_rate=rate, failure_window=window) for n in done}

    def _leave_out(self, verdicts: dict[str, tuple[str, str]]) -> None:
        for n, (_, why) in verdicts.items():
            if n not in self.left_out:
                self.left_out[n] = why
                self.say(f"{n} not extracted: {why}")

    async def _one(self, datasets: tuple[str, ...] | None) -> int:
        """One extraction run over ``datasets`` (None: every dataset); returns its exit code."""
        try:  # resolving the job reads the model's config and starts NVML: off the loop, generation goes on
            run = await asyncio.to_thread(self._make_run, datasets)
        except DatagenError as e:
            self.say(f"extraction not started: {e}")
            return 1
        self.current = run
        self.runs.append(run)
        names = datasets if datasets is not None else tuple(d.name for d in self.cfg.datasets)
        self.handed = tuple(dict.fromkeys(self.handed + names))
        self.starts.append((time.time(), names))
        self.say(f"extraction of {', '.join(names)} starting (after_run = \"{self.mode}\")")
        try:
            await asyncio.to_thread(run.prepare)
        except DatagenError as e:  # ExtractError, DirectoryInUse: nothing started
            self.say(f"extraction not started: {e}")
            self.current = None
            return 1
        if self.paused:  # prepare reset the control file: the pause holds
            run.commands.pause()
        if self.quit_mode:
            run.commands.quit()
            if self.quit_mode == "abort":
                run.commands.quit()
        try:
            return await run.run()
        finally:
            self.current = None


async def run_headless_chained(cfg: Config, out: TextOut = sys.stdout, *, exit_on_pause: bool = False,
                               install_signals: bool = True, on_chain: Callable[[ExtractChain], None] | None = None,
                               make_run: Callable[[tuple[str, ...] | None], ExtractRun] | None = None) -> int:
    """``datagen run --headless`` with ``[extract] after_run``: generation's progress lines and the
    chained extraction's (prefixed ``extract:``) on ``out``.

    A signal drains both (the second aborts both); after generation ended, signals reach the
    extraction alone. ``on_chain`` gets the chain once it exists (tests); ``make_run`` as for
    :class:`ExtractChain`.

    Returns:
        :func:`combined_exit_code` of generation's and extraction's codes.

    With ``[run] metrics_port`` one Prometheus endpoint serves both (generation's snapshot, its
    last one once generation ended, and the chain's) until the command ends.

    Raises:
        Whatever generation's ``prepare`` raised (ConfigError, DatasetError, StoreError...);
        engine.report.metricsserver.MetricsError: the metrics port cannot be bound.
    """
    chain = ExtractChain(cfg, say=_prefixed(out), progress_s=cfg.run.progress_interval_s, worker_output="file",
                         make_run=make_run)
    if on_chain is not None:
        on_chain(chain)
    jobs: list[Any] = []
    # One metrics endpoint for both: generation's snapshot (its last one once it ended) and the chain's.
    server = open_metrics(cfg.run, run=lambda: jobs[0].controller.snapshot() if jobs else None, extract=chain.snapshot)
    async with serving(server, printer(out)):
        return await _chained(cfg, out, chain, jobs, exit_on_pause=exit_on_pause, install_signals=install_signals)


def _prefixed(out: TextOut) -> Callable[[str], None]:
    """Print a chained extraction's line to ``out`` prefixed ``extract:`` (a closed stream is ignored)."""

    def say(line: str) -> None:
        try:
            print(f"extract: {line}", file=out, flush=True)
        except (OSError, ValueError):
            pass

    return say


async def _chained(cfg: Config, out: TextOut, chain: ExtractChain, jobs: list[Any], *, exit_on_pause: bool,
                   install_signals: bool) -> int:
    from engine.run.headless import run_headless

    say = _prefixed(out)
    gen = asyncio.create_task(run_headless(cfg, out, exit_on_pause=exit_on_pause, install_signals=install_signals,
                                           on_ready=jobs.append, on_signal=chain.interrupt, metrics=False),
                              name="generation")

    def ended() -> int | None:
        if not gen.done():
            return None
        return 1 if gen.cancelled() or gen.exception() is not None else gen.result()

    task = asyncio.create_task(chain.run(lambda: jobs[0].controller.snapshot() if jobs else None, ended),
                               name="extract-chain")
    try:
        code = await gen
    except BaseException:
        chain.request_quit("abort")
        await asyncio.wait({task}, timeout=30)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    loop = asyncio.get_running_loop()
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if install_signals else ()
    for sig in sigs:
        try:
            loop.add_signal_handler(sig, chain.interrupt, sig.name)
        except (NotImplementedError, RuntimeError):
            pass
    try:
        xcode = await task
    finally:
        for sig in sigs:
            try:
                loop.remove_signal_handler(sig)
            except (NotImplementedError, RuntimeError):
                pass
    if chain.runs or chain.left_out:
        say(f"chained extraction ended: exit code {xcode}"
            + (f"; not extracted: {', '.join(chain.left_out)}" if chain.left_out else ""))
    incomplete = chain.incomplete_line()
    if incomplete:
        say(incomplete)
    return combined_exit_code(code, xcode)


__all__ = ["ChainCommands", "ExtractChain", "FINISHED_STATES", "combined_exit_code", "dataset_counts", "readiness",
           "run_headless_chained"]  # readiness / dataset_counts: engine.run.chainready
