"""``datagen run``: wire config, store, ingest, provider, scheduler, writer and reporter together.

Exit codes: 0 completed (or drained on request), 1 configuration/data error, 2 the key was rejected
(401: the run pauses; headless, or with ``--exit-on-pause``, it then ends), 3 whole run paused by a
guard with ``--exit-on-pause``, 4 the run directory (or its store) was deleted, moved or replaced
while running (:func:`engine.run.guards.run_dir_lost`), 130 interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from engine.client.aiochoice import stream_backend
from engine.client.chat import ChatClient
from engine.client.endpoints import HealthPolicy
from engine.client.fleet import EndpointFleet
from engine.client.retry import RetryPolicy
from engine.client.types import RequestError
from engine.config import Config, ConfigError
from engine.datasets import DatasetError
from engine.fidelity.endpoints import endpoints_path
from engine.money.credits import read_credits, read_credits_each
from engine.money.prices import prices_from_models_endpoint
from engine.proc import runlock
from engine.report.settings import SETTINGS_KEY, run_settings
from engine.run import guards
from engine.run.apikey import probe_keyless_server, resolve_api_key
from engine.run.controller import Controller
from engine.run.fidelity import FidelityWatch
from engine.run.ingest import ingest_all
from engine.run.routing import thinking_plan
from engine.run.scheduler import Scheduler
from engine.run.seams import AccountClient, TextOut
from engine.run.supervisor import USAGE_BASELINE_KEY, Supervisor
from engine.storage.health import damaged_message
from engine.storage.rundir import RunDirWatch, store_where
from engine.storage.store import Store, make_run_dir
from engine.storage.writer import StoreWriter
from engine.stream.pool import StreamWorkerPool, default_stream_workers
from engine.stream.procs import WorkersNotStarted
from engine.stream.recover import prune, recover_cut_streams, recover_results

if TYPE_CHECKING:
    from engine.sim import SimThread
    from engine.tokens.service import ReconstructionService

log = logging.getLogger("engine")

#: ``extra={FILE_ONLY: True}`` on a log record: ``datagen.log`` only, not the console (the message
#: reaches the user another way, e.g. as the command's ``error:`` line).
FILE_ONLY = "datagen_file_only"

#: Seconds between prunings of the stream workers' journals while a run is running.
JOURNAL_PRUNE_S = 60.0

#: Longest wait (s) at the end of a run for the bills of cut streams to land (their ``/generation``
#: true-ups, the provider's usage) before spend is reconciled with the provider's usage.
RECONCILE_WAIT_S = 30.0
#: Seconds between credits readings while waiting for the bills to land.
RECONCILE_POLL_S = 2.0


def sim_config_from_section(cfg: Config):
    """Build the simulator's :class:`~engine.sim.SimConfig` from ``[provider.sim]``."""
    from engine.sim import SimConfig, parse_faults

    s = cfg.provider.sim
    return SimConfig(
        seed=s.seed, latency_ms=s.latency_ms, tokens_per_s=s.tokens_per_s,
        mean_completion_tokens=s.mean_completion_tokens, credits_usd=s.credits_usd, price_in=s.price_in,
        price_out=s.price_out, tokenizer=str(s.tokenizer) if s.tokenizer else None,
        faults=parse_faults(s.faults) if s.faults else {}, providers=tuple(s.providers),
        cancellable_providers=tuple(s.cancellable), model=cfg.provider.model,
        log_path=str(s.log) if s.log else None,
    )


@dataclass
class Job:
    """A prepared run: everything opened, nothing dispatched yet. Close with :meth:`close`."""

    cfg: Config
    store: Store
    writer: StoreWriter
    scheduler: Scheduler
    client: "ChatClient | EndpointFleet"
    sim: SimThread | None
    writer_stop: asyncio.Event
    controller: Controller
    supervisor: Supervisor
    recon: ReconstructionService | None = None
    pool: StreamWorkerPool | None = None
    writer_task: asyncio.Task | None = None
    supervisor_task: asyncio.Task | None = None
    lock: runlock.DirLock | None = None  # on the run directory, released by close()
    watch: RunDirWatch | None = None  # the run directory held open; closed after the store

    def store_where(self) -> str:
        """The store as the run's last line names it: its path, where it was moved, or ``(deleted)``."""
        return store_where(self.supervisor.dir_lost, self.store.path)

    async def close(self) -> None:
        """Stop supervision and the ``/generation`` true-ups left (cancelled: estimates for the next
        start), flush, close the client, the store and the simulator."""
        if self.supervisor_task is not None:
            self.supervisor_task.cancel()
            await asyncio.gather(self.supervisor_task, return_exceptions=True)
        # no /generation read outlives the client (the run's end already waited for them, bounded)
        await self.scheduler.accounting.settle(0.0)
        if self.recon is not None:  # finish queued reconstructions before the store closes
            # A stopped run waits 10 s at most: what is left stays stored, unvalidated, for `datagen validate`.
            stopped = self.scheduler.state in ("stopping", "stopped")
            await self.recon.close(timeout_s=10.0 if stopped else None)
        if self.pool is not None:  # the scheduler is done: cancel whatever is left, let the workers exit
            await self.pool.aclose()
        self.writer_stop.set()
        if self.writer_task is not None:
            await self.writer_task
        else:
            await self.writer.flush()
        await self.client.aclose()
        if self.pool is not None and not self.writer.queued and self.writer.damaged is None:  # every journaled
            # result committed: drop them (a damaged store's are kept for after `datagen salvage`)
            try:
                await prune(self.cfg.run.dir, self.store, keep=self.pool.is_open_segment)
            except Exception:  # kept journals are ingested (once) at the next start
                log.warning("stream journals not pruned", exc_info=True)
        try:
            await self.store.close()
        except Exception as e:  # e.g. a full disk refuses the last checkpoint: what was committed stays in the WAL
            log.error("store %s not closed cleanly (%s): what was committed is kept and read at the next start",
                      self.store.path, e)
        if self.watch is not None:  # after the store: closing a descriptor of it drops SQLite's locks
            self.watch.close()
        if self.sim is not None:
            self.sim.stop()
        if self.lock is not None:
            self.lock.release()


async def prepare(cfg: Config, out: TextOut = sys.stdout) -> Job:
    """Open the store, ingest, start the simulator if configured and build the scheduler.

    Raises:
        ConfigError: key missing, plain-http key, etc.
        engine.datasets.DatasetError / engine.storage.store.StoreError: unusable input or store (a
            failed ingest is recorded first: the run stopped with the reason, in the store and in
            ``datagen.log``).
        engine.proc.runlock.DirectoryInUse: another process runs on this run directory (nothing opened).
        engine.tokens.modeswitch.ModeConflict: the request settings contradict ``[tokenizer] thinking``
            (nothing opened, no request sent).
        engine.stream.procs.WorkersNotStarted: ``DATAGEN_STREAM_HTTP`` names no usable library (nothing
            opened), or a stream worker did not start.
    """
    mode = thinking_plan(cfg)  # ModeConflict: settings that can only buy rejected records, refused before anything
    try:  # the stream workers' HTTP library (DATAGEN_STREAM_HTTP), named before anything is opened
        stream_backend()
    except ValueError as e:
        raise WorkersNotStarted(f"stream workers not started: {e}") from None
    if mode.note:
        print(mode.note, file=out)
    api_key = resolve_api_key(cfg.provider)
    if api_key is None and cfg.provider.kind == "openai":
        await probe_keyless_server(cfg.provider)
    checked = await load_checked_tokenizer(cfg)  # before the store: a refused tokenizer leaves nothing behind
    make_run_dir(cfg.run.dir)
    async with contextlib.AsyncExitStack() as opened:  # on any failure: closed in reverse order, re-raised
        lock = runlock.acquire(cfg.run.dir)  # shared with `datagen run`'s own hold; refused if another process has it
        opened.callback(lock.release)
        store = await Store.open(cfg.run.dir)
        watch = RunDirWatch(cfg.run.dir, store.path)

        async def close_store() -> None:
            try:
                await store.close()
            finally:
                watch.close()  # after the store (see engine.storage.rundir)

        opened.push_async_callback(close_store)
        prev = await store.get_meta("run_name")
        if prev is None:
            await store.set_meta("run_name", cfg.run.name)
        await store.set_meta(SETTINGS_KEY, json.dumps(run_settings(cfg)))  # for `datagen report`
        checker = None
        if checked is not None:
            from engine.tokens.promptcheck import PromptChecker

            assert cfg.tokenizer is not None  # a checked tokenizer comes from [tokenizer]
            checker = PromptChecker(checked[0], cfg.tokenizer.prompt_special_text)
        try:
            reports = await ingest_all(cfg, store, checker)
        except DatasetError as e:  # the run is recorded as stopped by it, before any request
            await store.record_stopped(f"ingest failed: {e}")
            log.error("ingest failed; the run stops before any request: %s", e, extra={FILE_ONLY: True})
            raise
        for rep in reports:
            ref = cfg.dataset(rep.dataset).hub()
            if ref is not None:
                print(f"[{rep.dataset}] {rep.revision_summary(ref.url, ref.revision)}", file=out)
            for note in rep.file_notes:  # whole-file problems first: they say what the counts below mean
                print(f"[{rep.dataset}] warning: {note}", file=out)
            if rep.skipped_unchanged:
                print(f"[{rep.dataset}] {rep.prompts} prompts (already ingested), {rep.rejected} rejected rows", file=out)
            else:
                dups = f" + {rep.duplicates} bought under another dataset" if rep.duplicates else ""
                print(f"[{rep.dataset}] ingested {rep.prompts} prompts{dups} ({rep.inserted} new), {rep.rejected} rejected rows",
                      file=out)
                for ex in rep.examples:
                    print(f"    rejected {ex}", file=out)
                if rep.normalised:
                    print(f"[{rep.dataset}] {rep.normalised} prompt(s) brought into SpecForge's role order "
                          f"(turns merged or dropped; docs/specforge-roles.md), e.g. {rep.normalised_examples[0]}", file=out)
                print(f"[{rep.dataset}] {rep.became_summary()}", file=out)
                if rep.stale_summary():
                    print(f"[{rep.dataset}] {rep.stale_summary()}", file=out)
            for line in rep.overlap:  # its prompts also in another dataset ([run] cross_dataset_duplicates)
                print(line, file=out)
        sim = None
        if cfg.provider.kind == "simulated":
            from engine.sim import SimThread

            sim = SimThread(sim_config_from_section(cfg))
            opened.callback(sim.stop)
            base_url = sim.start()
            api_key = "sim-local"
            print(f"simulator listening on {base_url}", file=out)
        else:
            base_url = cfg.provider.resolved_base_url()
        t = cfg.provider.timeouts
        total_conc = sum(c.concurrency for c in cfg.classes.values())

        client_kw: dict[str, Any] = dict(stream=cfg.provider.stream, stream_usage=cfg.provider.stream_usage,
                         finish_reasons=dict(cfg.provider.finish_reasons),
                         return_token_ids=cfg.provider.return_token_ids,
                         connect_timeout_s=t.connect_s, stall_timeout_s=t.stall_s, total_timeout_s=t.total_s)

        def make_client(url: str, spare: int = 0) -> ChatClient:
            # the run's own client: account endpoints (/key, /credits, /generation, /models) and health
            # probes; the streams themselves go through the stream workers
            return ChatClient(url, api_key, max_connections=16 + spare, **client_kw)

        # The writer, the reconstruction service, the controller and the endpoint fleet call back into
        # the scheduler built just after them: their callbacks look `sched` up when called, never before.
        sched: Scheduler
        client: AccountClient
        fleet: EndpointFleet | None = None
        pool: StreamWorkerPool
        check_fd_limit(total_conc, out)  # before the stream workers start: they inherit the limit
        if cfg.provider.base_urls:
            fleet = client = endpoint_fleet(cfg, make_client, lambda level, msg: sched.event(level, "endpoint", None, msg),
                                            send=lambda i, req, progress: pool.send(i, req, progress))
        else:
            client = make_client(base_url)  # refuses a bad URL or key use before any worker starts
        opened.push_async_callback(client.aclose)
        urls = [u for u, _ in cfg.provider.endpoints()] if cfg.provider.base_urls else [base_url]
        pool = StreamWorkerPool(cfg.run.stream_workers or default_stream_workers(), urls, api_key,
                                {**client_kw, "max_connections": max(total_conc, 16)}, run_dir=cfg.run.dir,
                                on_event=lambda level, msg: sched.event(level, "stream_worker", None, msg))
        opened.push_async_callback(pool.aclose)
        await pool.start()

        def store_failed(e: BaseException) -> None:
            if writer.damaged is not None:  # never written again: the run stops, the streams in flight
                # finish into the workers' journals (stored from them after `datagen salvage`)
                sched.ending.stop(damaged_message(store.path, str(writer.damaged)), exit_code=1, abort=False)
                return
            guards.apply(sched, guards.store_failing(e, sched.runstate))

        def store_recovered() -> None:
            if guards.store_recovered(sched.runstate):
                sched.resume_all()

        writer = StoreWriter(store, cfg.run.commit_interval_s, live=lambda: sched.live(),
                             on_error=store_failed, on_recover=store_recovered)
        recon: ReconstructionService | None
        recon = reconstruction_service(cfg, checked, lambda ds, ok, reasons: on_validation_verdict(sched, recon, ds, ok, reasons))
        account_api = cfg.provider.kind in ("openrouter", "simulated")
        sched = Scheduler(cfg, store, writer, fleet.complete if fleet is not None else pool.complete,
                          get_json=client.get_json if account_api else None,
                          recon=recon, policy=fleet_retry_policy(cfg, fleet),
                          endpoints=fleet.snapshot if fleet is not None else None, workers=pool.figures,
                          hold=pool.hold)
        if fleet is not None:
            for url, probe in await fleet.start():  # unreachable endpoints start down, probed again later
                print(f"endpoint {url}: " + (f"healthy (GET /models answered in {probe.seconds * 1000:.0f} ms)"
                                             if probe.ok else f"down ({probe.reason}); probed again later"), file=out)
        # the journals of earlier processes only: this run's workers (started above) have theirs open
        recovered = await recover_results(cfg.run.dir, store, sched.accounting.price,  # before the counters load
                                          live=pool.owns)
        await sched.load()
        await discover_prices(cfg, sched, client, out)
        if cfg.fidelity.probes.enabled:
            await probe_once(cfg, client, out)
        cut, streams = await recover_cut_streams(cfg.run.dir, store, sched.accounting.price,  # priced now
                                                 sched.ending.cut_costs if account_api else None, live=pool.owns)
        for dataset, tokens, usd, cls in streams:
            sched.spend.count_lost(dataset, tokens, usd, cls)
        for rec in (recovered, cut):
            if rec.line():
                print(rec.line(), file=out)
        stored = 0
        if account_api:  # estimated bills (cut streams, of earlier processes too) trued up from /generation
            stored = sched.accounting.trueup_stored(await store.estimated_attempts(), sched.ending.cut_costs)
            if stored:
                log.info("truing up %d estimated bill(s) of cut streams from /generation", stored)
        sup: Supervisor
        ctl = Controller(sched, credits_check=lambda: sup.poll_credits())
        # Credits from /key (fallback /credits) wherever the server offers them, kind openai included
        # (e.g. a rehearsal against `datagen sim`); a server with neither is probed once and left unknown.
        # With several endpoints each is its own account: every replica's /key is read and summed.
        reader = (functools.partial(read_credits_each, fleet.getters()) if fleet is not None
                  else functools.partial(read_credits, client.get_json))
        # the drift spans every process of the run (what a kill lost shows), except on the built-in
        # simulator, whose account is new at every start
        base = await store.get_meta(USAGE_BASELINE_KEY) if cfg.provider.kind != "simulated" else None
        if base is not None:
            sched.spend.seed_baseline(float(base))
        sup = Supervisor(sched, ctl, reader, watch=watch)
        await sup.poll_credits()  # credits known before the first dispatch: the floor is checked at each one
        if stored and base is not None:  # the last process's reconciliation, corrected once its bills are known
            sched.accounting.track(asyncio.get_running_loop().create_task(
                reconcile_spend(sched, sup, wait_s=RECONCILE_WAIT_S, after=f"{stored} estimated bill(s) of "
                                "earlier processes' cut streams were trued up")))
        await sup.gate_before_dispatch()  # a restarted run: the calibration gate decided on the stored results
        if recon is not None:
            print(format_startup_line(await recon.start()), file=out)
            left = await recon.start_backlog()  # stored by an earlier process (or recovered) without a verdict
            if left:
                print(f"validating {left:,} result(s) stored without a verdict by an earlier process "
                      "(stopped or killed before it validated them)", file=out)
        # Long-lived start-up objects (config, tokenizer, imports) leave the GC's young generations,
        # and collections run less often: full collections stalled the loop 170-230 ms under load.
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)
        opened.pop_all()  # everything opened now belongs to the job (Job.close)
        return Job(cfg, store, writer, sched, client, sim, asyncio.Event(), ctl, sup, recon, pool=pool, lock=lock,
                   watch=watch)
    raise AssertionError("unreachable")  # pragma: no cover - the block returns or raises


def endpoint_fleet(cfg: Config, make_client, on_change, send=None) -> EndpointFleet:
    """The :class:`~engine.client.fleet.EndpointFleet` over ``[provider] base_urls`` (not started):
    each endpoint's client from ``make_client(url, spare)`` (``spare`` connections beyond the streams,
    so a health probe never waits for a pooled one), health from the ``endpoint_*`` keys, probes
    within ``timeouts.connect_s``; ``on_change(level, message)`` hears every state change; ``send``
    sends one attempt to an endpoint by index (the stream workers' ``send``; None: the fleet's clients)."""
    p = cfg.provider
    return EndpointFleet(p.endpoints(), lambda url: make_client(url, spare=4), send=send,
                         policy=HealthPolicy(error_streak=p.endpoint_error_streak, probe_s=p.endpoint_probe_s,
                                             probe_max_s=max(60.0, p.endpoint_probe_s)),
                         probe_timeout_s=p.timeouts.connect_s, on_change=on_change)


def fleet_retry_policy(cfg: Config, fleet: EndpointFleet | None) -> RetryPolicy | None:
    """The retry policy of a run over several endpoints: ``run.max_attempts``, plus two retries per
    endpoint of errors that are an endpoint's fault (not counted against the prompt). None with one
    endpoint (the scheduler's default policy)."""
    if fleet is None:
        return None
    return RetryPolicy(max_attempts=cfg.run.max_attempts, endpoint_retries=2 * len(fleet))


async def load_checked_tokenizer(cfg: Config):
    """Load ``[tokenizer]`` and run its start-up check, off the loop; None without a ``[tokenizer]``.

    Returns:
        ``(engine.tokens.tokenizer.Tokenizer, start-up description)``: ingest renders every prompt
        with it, and the reconstruction service validates with the same object.

    Raises:
        engine.tokens.tokenizer.TokenizerError: the tokenizer cannot be loaded, or the start-up check
            refused it (generation is refused).
    """
    if cfg.tokenizer is None:
        return None
    from engine.tokens.startup import startup_check
    from engine.tokens.tokenizer import load_tokenizer

    tok = await asyncio.to_thread(load_tokenizer, cfg.tokenizer)
    return tok, await asyncio.to_thread(startup_check, tok)


def reconstruction_service(cfg: Config, checked, on_verdict) -> ReconstructionService | None:
    """The token reconstruction service of results as they arrive (not started), when
    ``[tokenizer]`` is configured; else None. Start it with ``await recon.start()``.

    ``checked``: the ``(tokenizer, start-up description)`` of :func:`load_checked_tokenizer` (None:
    the service loads and checks the tokenizer itself at start). ``on_verdict(dataset, ok,
    reasons)``: called with each validation verdict (see :func:`on_validation_verdict`).

    Raises (at ``start``):
        engine.tokens.tokenizer.TokenizerError: the tokenizer, its special tokens or the chat
            template disagree with the configured mode (generation is refused).
    """
    if cfg.tokenizer is None:
        return None
    from engine.tokens.service import ReconstructionService

    return ReconstructionService(cfg.tokenizer, cfg.run.dir, on_verdict=on_verdict, checked=checked)


def format_startup_line(info) -> str:
    """The reconstruction service's start-up line (:func:`engine.tokens.startup.format_startup`)."""
    from engine.tokens.startup import format_startup

    return format_startup(info)


def on_validation_verdict(sched: Scheduler, recon, dataset: str, ok: bool, reasons: list[str]) -> None:
    """Record a validation verdict of ``dataset`` and feed the anomaly guard: a dataset whose
    failure rate passes ``tokenizer.max_failure_rate`` is paused with the reason."""
    sched.telemetry.validation[dataset] = "valid" if ok else "INVALID: " + ", ".join(reasons)
    guards.apply(sched, guards.validation(sched.datasets.get(dataset), recon.guard(dataset)))


def check_fd_limit(concurrency: int, out: TextOut) -> int:
    """Raise the soft open-files limit toward ``concurrency + 256`` (one socket per in-flight
    request plus the store, logs and the simulator); warn when the hard limit is too low.
    Returns the soft limit in force."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return -1
    need = concurrency + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft < need:
        print(f"warning: open-files limit {soft} is below {need} needed for {concurrency} concurrent requests; "
              f"run `ulimit -n {need}` first or lower classes.*.concurrency", file=out)
    return soft


def endpoints_reader(job: Job) -> Callable[[], Awaitable[Any]] | None:
    """The GET of the model's endpoints listing (declared precisions, docs/fidelity.md), or None where no
    account API is asked (the built-in simulator in-process, several self-hosted replicas) or the model id
    is not ``author/slug``."""
    if job.client is None or job.cfg.provider.kind == "simulated" or job.cfg.provider.base_urls:
        return None
    try:
        path = endpoints_path(job.cfg.provider.model)
    except ValueError:
        return None
    client = job.client
    return lambda: client.get_json(path)


async def probe_once(cfg: Config, client: Any, out: TextOut) -> None:
    """``[fidelity.probes] enabled``: send the probes pinned to each provider once per run directory, before
    the first dispatch (a restart finds the batch stored and says so; ``datagen probe`` sends them again).
    Failed probes never stop the run: the line says why.

    Raises:
        ConfigError: no reference or an unreadable probe set (:func:`engine.run.probes.run_probes`).
    """
    from engine.run.probes import run_probes
    from engine.storage.handle import connect_ro
    from engine.storage.probes import latest_batch

    with connect_ro(cfg.run.dir) as h:
        done = latest_batch(h)
    if done is not None:
        print(f"probes: sent already in this run directory (batch {done.get('id')}); `datagen probe` sends them again",
              file=out)
        return
    try:
        report = await run_probes(cfg, client, cfg.run.dir, out)
    except RequestError as e:
        print(f"probes: not sent ({e.error_class.value}: {e}); the run goes on", file=out)
        return
    if not report.ok:
        log.warning("probes: a provider is below the thresholds or failed (see the table above); docs/fidelity.md#probes")


async def discover_prices(cfg: Config, sched: Scheduler, client: AccountClient, out: TextOut) -> None:
    """Learn the model's prices from ``/models`` when ``[pricing]`` does not give them.

    Raises:
        ConfigError: a dollar cap is configured and no price is known (never price at $0).
    """
    spend = sched.spend
    unreachable: RequestError | None = None
    if spend.config_prices is None:
        try:
            spend.endpoint_prices = prices_from_models_endpoint(await client.get_json("/models"), cfg.provider.model)
        except RequestError as e:
            log.info("/models unavailable (%s); prices from [pricing] or observed usage only", e.error_class.value)
            unreachable = e if e.error_class.value in ("connect", "timeout") else None
    p = spend.prices()
    if p is not None:
        print(f"prices ({p.source}): ${p.prompt_usd_per_token * 1e6:.3f} / ${p.completion_usd_per_token * 1e6:.3f} "
              f"per million prompt / completion tokens", file=out)
    elif spend.has_cost_cap and unreachable is not None:  # the server, not the price list, is the problem
        raise ConfigError(
            f"cannot reach {cfg.provider.base_url} ({unreachable.error_class.value}): its /models did not answer, "
            f"so the price of model {cfg.provider.model!r} is unknown and max_cost_usd cannot be enforced; "
            f"check [provider] base_url and that the server is up, or set [pricing] prompt_usd_per_m and "
            f"completion_usd_per_m"
        )
    elif spend.has_cost_cap:
        raise ConfigError(
            f"a max_cost_usd cap is set but no price is known for model {cfg.provider.model!r} "
            f"(not in the provider's /models): set [pricing] prompt_usd_per_m and completion_usd_per_m"
        )


def guard_pause_reason(sched: Scheduler) -> str | None:
    """The reason when the whole run is paused by a guard (credits, 402, price, or every unfinished
    dataset paused by the anomaly guard / calibration gate) with nothing in flight; else None."""
    return guards.guard_paused(sched.snapshot(), sched.runstate)


async def reconcile_spend(sched: Scheduler, sup: Supervisor, *, wait_s: float = RECONCILE_WAIT_S,
                          poll_s: float = RECONCILE_POLL_S, after: str = "") -> float | None:
    """Reconcile the run's accounted spend with the provider's usage, once the bills of the streams
    cut in this process have landed, and log it: ``spend reconciliation: provider usage minus
    accounted spend = $D`` (USD; positive: the provider billed more than was accounted), then a line
    saying which way it goes and how many estimated bills were trued up.

    The bill of a cut stream lands after the cut (``/generation`` true-ups, the provider's usage), so
    when this process made estimated bills (:attr:`engine.run.accounting.Accounting.estimated`), or
    ``after`` is given (a start truing up earlier processes' estimates: waits for them first), the
    credits are read again every ``poll_s`` seconds until the usage stops moving and no true-up is
    pending, at most ``wait_s`` seconds. Returns the drift (USD; None when it cannot be computed)."""
    acc = sched.accounting
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    if after:
        while acc.trueups - {asyncio.current_task()} and loop.time() < deadline:
            await asyncio.sleep(min(poll_s, max(0.0, deadline - loop.time())))
    await sup.poll_credits()
    cr = sched.spend.credits
    if acc.estimated and cr is not None and cr.usage_usd is not None:
        prev = cr.usage_usd
        while loop.time() < deadline:
            await asyncio.sleep(min(poll_s, max(0.0, deadline - loop.time())))
            await sup.poll_credits()
            cr = sched.spend.credits
            now = cr.usage_usd if cr is not None else None
            if now is None or (now == prev and not acc.trueups - {asyncio.current_task()}):
                break
            prev = now
    d = sched.spend.drift_usd()
    if d is not None:
        left = acc.estimated - acc.settled
        log.info("spend reconciliation: provider usage minus accounted spend = $%.6f", d)
        log.info("spend reconciliation %s: %s%s", f"(after {after})" if after else "at the end",
                 "the provider billed more than was accounted" if d > 0 else "accounted at or above what was billed",
                 f"; {acc.settled} estimated bill(s) of cut streams trued up from /generation "
                 f"({acc.settled_usd:+.6f} USD)" + (f", {left} still estimated" if left > 0 else "")
                 if acc.estimated else "")
    elif cr is not None and cr.partial:
        log.info("spend reconciliation: not done, credits partial (%d of %d endpoints gave none: %s)",
                 len(cr.missing), cr.endpoints, ", ".join(cr.missing))
    return d


async def run_job(job: Job, *, exit_on_pause: bool = False, stop_on_auth: bool = False,
                  out: TextOut = sys.stdout) -> int:
    """Run a prepared job to its end: writer, supervisor and scheduler; closes the job. Returns the exit code.

    Args:
        exit_on_pause: end the run (drained) when a guard pauses it: exit 2 when the pause is a
            rejected key (401), else 3.
        stop_on_auth: end the run with exit 2 when a 401 pauses it (headless: the key comes from
            this process's environment, so nothing can fix it while the run waits).
    """
    sched = job.scheduler
    job.writer_task = asyncio.create_task(job.writer.run(job.writer_stop))
    job.supervisor_task = asyncio.create_task(job.supervisor.run())

    async def pause_watch() -> None:
        while True:
            await asyncio.sleep(0.5)
            end = guards.exit_on_pause(sched.snapshot(), sched.runstate,
                                       exit_on_pause=exit_on_pause, stop_on_auth=stop_on_auth)
            if end is None:
                continue
            try:
                print(f"run paused by a guard: {end.paused_for}; exiting ({end.why})", file=out, flush=True)
            except (OSError, ValueError):
                log.warning("run paused by a guard: %s; exiting (%s)", end.paused_for, end.why)
            sched.ending.stop(end.reason, exit_code=end.exit_code, abort=False)
            return

    async def prune_journals() -> None:  # a journal segment whose results are all committed is deleted
        while job.pool is not None:
            await asyncio.sleep(JOURNAL_PRUNE_S)
            if job.writer.damaged is not None:  # kept for after `datagen salvage`
                continue
            try:
                await prune(job.cfg.run.dir, job.store, keep=job.pool.is_open_segment)
            except Exception:  # kept segments are pruned later or ingested (once) at the next start
                log.warning("stream journals not pruned", exc_info=True)

    watch = asyncio.create_task(pause_watch()) if exit_on_pause or stop_on_auth else None
    pruner = asyncio.create_task(prune_journals())
    fidelity = FidelityWatch(job.cfg.run.dir, job.cfg.fidelity, job.controller.exclude_provider, sched.event,
                             publish=lambda current: setattr(sched.telemetry, "fidelity", current),
                             read_endpoints=endpoints_reader(job))
    judge = asyncio.create_task(fidelity.run())
    try:
        code = await sched.run()
        await reconcile_spend(sched, job.supervisor)  # final readings, once the bills of cut streams landed
        judge.cancel()
        await asyncio.gather(judge, return_exceptions=True)
        await fidelity.look(final=True)  # the run's last look: every record stored is judged
        return code
    finally:
        judge.cancel()
        pruner.cancel()
        await asyncio.gather(pruner, judge, return_exceptions=True)
        if watch is not None:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        await job.close()


