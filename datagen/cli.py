"""The ``datagen`` command line: run, sim, status, ctl, export, extract, validate, report, make-tokenizer.

The layer above the engine and the dashboard (``tui``). Every error the project defines derives from
:class:`engine.errors.DatagenError`; :func:`main` catches it once and prints ``error: <message>`` with the
command's error exit status (1, or 2 for ``export``, ``validate`` and ``report``: README "Commands"). The commands
catch only what they turn into something else: ``export``'s "nothing to export" (exit 1), an unwritable
``--out`` or run directory (an ``OSError``, reworded), a refused start's clean-up (``run``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path

from engine.proc import runlock
from engine.config import load_config
from engine.errors import DatagenError


def _cmd_run(args: argparse.Namespace) -> int:
    """``datagen run``: 0 completed, 2 stopped by a fatal provider error, 3 paused with --exit-on-pause,
    130 interrupted; a bad config, a missing key or a directory in use raise :class:`DatagenError` (exit 1)."""
    from engine.run.apikey import resolve_api_key
    from engine.storage.store import make_run_dir

    cfg = load_config(args.config)
    if args.run_dir:
        cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"dir": Path(args.run_dir).resolve()})})
    resolve_api_key(cfg.provider)  # a missing or unusable API key refuses the start before anything is created
    fresh = (not Path(cfg.run.dir).exists(), not (Path(cfg.run.dir) / "datagen.log").exists())
    try:
        make_run_dir(cfg.run.dir)
        fresh_lock = not (Path(cfg.run.dir) / runlock.RUN_LOCK).exists()
        # One live run per directory, taken before anything is written, sent, or the dashboard opens.
        lock = runlock.acquire(cfg.run.dir)  # DirectoryInUse: another live run holds it
    except OSError as e:
        print(f"error: run.dir: cannot create or write {cfg.run.dir}: {e.strerror or e}", file=sys.stderr)
        return 1
    try:
        return _run_locked(cfg, args, lock, (*fresh, fresh_lock))
    finally:
        lock.release()


def _run_locked(cfg, args: argparse.Namespace, lock: runlock.DirLock, fresh: tuple[bool, bool, bool]) -> int:
    """The rest of ``datagen run`` once this process holds the run directory's lock; ``fresh``:
    (run dir, datagen.log, lock file) did not exist before this start. A start refused by a
    :class:`DatagenError` (bad dataset, store, tokenizer...) removes what it created, then re-raises."""
    from engine.run.headless import run_headless, setup_file_logging

    try:
        setup_file_logging(cfg.run.dir)
    except OSError as e:
        print(f"error: run.dir: cannot create or write {cfg.run.dir}: {e.strerror or e}", file=sys.stderr)
        _undo_refused_start(Path(cfg.run.dir), *fresh, lock=lock)
        return 1
    _install_stack_dump(cfg.run.dir)
    headless = args.headless or not sys.stdout.isatty()
    if not headless:
        try:
            import tui.app  # noqa: F401 - the dashboard needs textual; fall back to headless without it
        except ImportError:
            print("(dashboard not available in this build; running headless)", file=sys.stderr)
            headless = True
    try:
        if cfg.extract.after_run != "never":  # the target model must load before any money is spent on generation
            from engine.extract.job import read_model_shape, require_extract_packages

            require_extract_packages(f'[extract] after_run = "{cfg.extract.after_run}"', cfg.extract.layout)
            read_model_shape(cfg.extract.model or "", cfg.extract.trust_remote_code)
        if not headless:
            from tui.app import run_dashboard

            return run_dashboard(cfg, exit_on_pause=args.exit_on_pause)
        if cfg.extract.after_run != "never":  # generation, then extraction (README "Chaining")
            from engine.run.chain import run_headless_chained

            return asyncio.run(run_headless_chained(cfg, exit_on_pause=args.exit_on_pause))
        return asyncio.run(run_headless(cfg, exit_on_pause=args.exit_on_pause))
    except DatagenError:
        _undo_refused_start(Path(cfg.run.dir), *fresh, lock=lock)
        raise
    except KeyboardInterrupt:
        return 130


def _undo_refused_start(run_dir: Path, fresh_dir: bool, fresh_log: bool, fresh_lock: bool = False,
                        lock: "runlock.DirLock | None" = None) -> None:
    """After a start refused before the store was created (e.g. a keyless server that wants a key):
    remove the ``datagen.log``, the lock file and the run directory this start created, so a refused
    start leaves nothing behind. Anything that existed before, or a store, is kept."""
    from engine.storage.store import db_path

    if db_path(run_dir).exists():
        return
    if fresh_lock and lock is not None:
        lock.release_and_remove()
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_datagen", False) and isinstance(h, logging.FileHandler):
            root.removeHandler(h)
            h.close()
    try:
        if fresh_log:
            (run_dir / "datagen.log").unlink(missing_ok=True)
        if fresh_dir:
            run_dir.rmdir()  # only when empty
    except OSError:
        pass


def _install_stack_dump(run_dir: Path) -> None:
    """``kill -USR1 PID`` appends every thread's stack and every asyncio task's stack to
    ``RUN_DIR/stacks.txt`` (for diagnosing a run that seems stuck)."""
    import faulthandler
    import signal

    if not hasattr(signal, "SIGUSR1"):
        return
    path = Path(run_dir) / "stacks.txt"

    def dump(signum, frame):  # noqa: ARG001 - signal handler signature
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)  # owner-only like every run file
        os.fchmod(fd, 0o600)
        with open(fd, "a", encoding="utf-8") as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            for t in asyncio.all_tasks(loop):
                f.write(f"--- {t!r}\n")
                t.print_stack(limit=8, file=f)

    signal.signal(signal.SIGUSR1, dump)


def _cmd_sim(args: argparse.Namespace) -> int:
    from engine.sim import serve_forever, sim_config_from_args

    try:
        cfg = sim_config_from_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    serve_forever(cfg)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from engine.report.status import collect_status, format_status, watch_status

    if args.interval is not None and not args.watch:
        print("error: --interval goes with --watch", file=sys.stderr)
        return 1
    if args.watch:
        interval = 2.0 if args.interval is None else args.interval
        if not interval > 0:
            print(f"error: --interval must be > 0 seconds, got {interval}", file=sys.stderr)
            return 1
        try:
            return watch_status(Path(args.run_dir), interval, as_json=args.json)
        except KeyboardInterrupt:
            return 0
    doc = collect_status(Path(args.run_dir))
    print(json.dumps(doc, indent=2) if args.json else format_status(doc))
    return 0


#: Exit codes of ``datagen export`` and ``datagen validate`` (README "Commands").
EXIT_OK, EXIT_INVALID, EXIT_ERROR = 0, 1, 2


def _cmd_export(args: argparse.Namespace) -> int:
    """0 something exported; 1 nothing exported (no record qualifies, nothing written); 2 error."""
    from engine.errors import NothingToExport
    from engine.report.export import export

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"error: --out {out}: exists and is not a directory (expected a directory to write into)",
              file=sys.stderr)
        return EXIT_ERROR
    lock, live = None, None
    if args.format != "raw":  # validating what is not validated yet writes the store: not beside a live run
        try:
            lock = _store_lock(Path(args.run_dir))
        except runlock.DirectoryInUse as e:
            live = e.holder
    try:
        section = None
        if args.config and args.format != "raw":
            from engine.tokens.service import section_for_run

            section = section_for_run(Path(args.run_dir), args.config)
        role_left_out: list[tuple[str, str]] = []
        empty: list[tuple[str, str]] = []
        written = export(Path(args.run_dir), out, args.format, tokenizer=section,
                         include_invalid=args.include_invalid, validate=lock is not None or live is None,
                         on_left_out=lambda rid, why: role_left_out.append((rid, why)),
                         on_empty=lambda ds, why: empty.append((ds, why)))
    except NothingToExport as e:  # a DatagenError with its own exit status
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    except OSError as e:  # the output directory cannot be made or written (a file in the path, permissions, disk)
        where = e.filename or out
        print(f"error: cannot write the export to --out {out}: {where}: {e.strerror or e}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if lock is not None:
            lock.release()
    unit = "rows" if args.format == "tokens" else "lines"
    for path, n in written.items():
        print(f"{path}: {n} {unit}")
    for ds, why in empty:  # no 0-row file: it would break loaders reading the whole directory
        print(f"dataset {ds}: no file written ({why})")
    if args.format != "raw" and not args.include_invalid:
        _say_left_out(Path(args.run_dir), live)
    if role_left_out:
        rid, why = role_left_out[0]
        print(f"left out: {len(role_left_out)} row(s) whose turns SpecForge's parser would drop or cut (prompts "
              f"stored before ingest normalised role order; docs/specforge-roles.md), e.g. {rid}: {why}")
    return EXIT_OK


def _store_lock(run_dir: Path) -> runlock.DirLock | None:
    """The run directory's lock for a command that writes its store outside a run (``validate``, and
    ``export`` when it validates); None when ``run_dir`` has no store (the command reports that).

    Raises:
        engine.proc.runlock.DirectoryInUse: a live ``datagen run`` (or another writer) holds it.
    """
    from engine.storage.store import db_path

    if not db_path(run_dir).exists():
        return None
    return runlock.acquire(run_dir)


def _say_left_out(run_dir: Path, live: "runlock.Holder | None" = None) -> None:
    from engine.tokens import vstore
    from engine.tokens.exports import left_out

    conn = vstore.connect(run_dir)
    try:
        invalid, unvalidated, reasons = left_out(conn)
    finally:
        conn.close()
    if invalid:
        why = ", ".join(f"{k} {v}" for k, v in reasons.most_common())
        print(f"left out: {invalid} invalid record(s) ({why}); --include-invalid exports them")
    if unvalidated:
        why = f" (the live run, pid {live.pid}, validates them as they arrive)" if live is not None else ""
        print(f"left out: {unvalidated} result(s) not validated{why}")


def _cmd_validate(args: argparse.Namespace) -> int:
    """0 every stored result valid; 1 some invalid (or none stored); 2 error."""
    from engine.tokens.report import format_report
    from engine.tokens.service import section_for_run, validate_run

    run_dir = Path(args.run_dir)
    try:
        lock = _store_lock(run_dir)  # it rewrites every verdict: not beside a live run (which validates itself)
    except runlock.DirectoryInUse as e:
        live_run = e.holder is not None and e.holder.command.startswith("datagen run ")
        print(f"error: {e}" + (". A live run validates its results as they arrive; run `datagen validate` after "
                               "it ends (`datagen export` meanwhile exports what is validated)" if live_run else ""),
              file=sys.stderr)
        return EXIT_ERROR
    try:
        section = section_for_run(run_dir, args.config)
        if section is None:
            print(f"error: {run_dir} stores no [tokenizer]: pass --config CONFIG with a [tokenizer] section", file=sys.stderr)
            return EXIT_ERROR
        doc = validate_run(run_dir, section, workers=args.workers)
    finally:
        if lock is not None:
            lock.release()
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(format_report(doc))
    if not doc["records"]:
        print(f"{run_dir} stores no completed result yet: nothing validated", file=sys.stderr)
        return EXIT_INVALID
    if doc["invalid"] or doc["unvalidated"]:
        extra = f", {doc['unvalidated']} not validated" if doc["unvalidated"] else ""
        print(f"{doc['invalid']} of {doc['records']} record(s) invalid{extra}: "
              f"left out of exports unless --include-invalid", file=sys.stderr)
        return EXIT_INVALID
    return EXIT_OK


def _cmd_report(args: argparse.Namespace) -> int:
    """0 written; 2 error (no run directory or store, matplotlib missing, ``--out`` not writable)."""
    from engine.report.page import write_report

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"error: --out {out}: exists and is not a directory (expected a directory to write into)", file=sys.stderr)
        return EXIT_ERROR
    cfg = load_config(args.config, check_files=False) if args.config else None
    try:
        path = write_report(Path(args.run_dir), out, cfg)
    except OSError as e:
        print(f"error: cannot write the report to --out {out}: {e.filename or out}: {e.strerror or e}", file=sys.stderr)
        return EXIT_ERROR
    print(f"{path}: {path.stat().st_size:,} bytes")
    return EXIT_OK


def _cmd_make_tokenizer(args: argparse.Namespace) -> int:
    from engine.tokens.demo_tokenizer import build_demo_tokenizer

    built = build_demo_tokenizer(Path(args.dir), force=args.force)
    print(f"{args.dir}: {'built' if built else 'already there'} (Kimi-K2.5 layout over mistral-common's tekken "
          f"vocabulary: for the simulator, not for real Kimi completions)")
    return 0


def _cmd_ctl_extract(args: argparse.Namespace) -> int:
    from engine.extract.control import send as send_extract

    if args.value is not None or (args.verb == "extract-skip") != (args.dataset is not None):
        print(f"error: usage: datagen ctl OUT_OR_RUN_DIR {args.verb}" + (" DATASET" if args.verb == "extract-skip" else ""),
              file=sys.stderr)
        return 1
    try:
        result = send_extract(Path(args.run_dir), args.verb, args.dataset)
    except ValueError as e:  # a missing or unknown dataset (ControlError: main)
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(result.text, file=sys.stdout if result.ok else sys.stderr)
    return 0 if result.ok else 1


def _cmd_ctl(args: argparse.Namespace) -> int:
    from engine.run.ctl import send
    from engine.report.status import collect_status

    if args.verb.startswith("extract-"):
        return _cmd_ctl_extract(args)

    dataset, arg = args.dataset, None
    if args.verb == "concurrency":
        if args.dataset is None or args.value is None:
            print("error: usage: datagen ctl RUN_DIR concurrency CLASS N", file=sys.stderr)
            return 1
        arg = args.value
    elif args.verb in ("exclude-provider", "include-provider"):
        if args.dataset is None:
            print(f"error: usage: datagen ctl RUN_DIR {args.verb} NAME", file=sys.stderr)
            return 1
        dataset, arg = None, args.dataset
    elif args.verb == "retry-failed":
        if args.value is not None:
            print("error: usage: datagen ctl RUN_DIR retry-failed [DATASET] [--reason CLASS]", file=sys.stderr)
            return 1
        arg = args.reason
    elif args.verb == "skip":
        if args.dataset is None:
            print("error: usage: datagen ctl RUN_DIR skip DATASET [--abort]", file=sys.stderr)
            return 1
        arg = "abort" if args.abort else None
    if args.reason is not None and args.verb != "retry-failed":
        print("error: --reason goes with retry-failed", file=sys.stderr)
        return 1
    try:
        if args.verb == "abort" or (args.verb == "skip" and args.abort):
            doc = collect_status(Path(args.run_dir))
            live = doc.get("live", {})
            n = sum(d["in_flight"] for d in doc["datasets"] if dataset in (None, d["name"]))
            usd = (live.get("cost_in_flight_usd") or 0.0) if dataset is None else sum(
                d.get("cost_in_flight_usd", 0.0) for d in doc["datasets"] if d["name"] == dataset)
            print(f"{n} request(s) in flight, about ${usd:.4f} in flight (streamed tokens are billed anyway)")
            if dataset is None and doc.get("abort_cost_basis"):
                print(f"est. bill of an abort now ${doc.get('abort_cost_usd') or 0.0:.4f} ({doc['abort_cost_basis']})")
            if not args.yes:
                if not sys.stdin.isatty():
                    print("error: abort cancels paid streams; confirm with --yes", file=sys.stderr)
                    return 1
                if input("abort them? [y/N] ").strip().lower() not in ("y", "yes"):
                    print("not aborted")
                    return 1
        result = send(Path(args.run_dir), args.verb, dataset, arg, force=args.force)
    except ValueError as e:  # an unknown verb, dataset, class or provider (StatusError: main)
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(result.text, file=sys.stdout if result.ok else sys.stderr)
    return 0 if result.ok else 1


def _cmd_extract(args: argparse.Namespace) -> int:
    if args.convert:
        from engine.extract.convert_cli import run_convert

        return run_convert(args.convert, args.to, out=args.convert_out, model=args.model,
                           delete_source=args.delete_source)
    if not args.config:
        print("error: datagen extract needs CONFIG (or --convert OUT --to LAYOUT)", file=sys.stderr)
        return 1
    if args.to or args.convert_out or args.delete_source:
        print("error: --to, --convert-out and --delete-source go with --convert OUT (rewrite existing shards); "
              "a run's layout is [extract] layout in CONFIG", file=sys.stderr)
        return 1
    from engine.extract.launch import ExtractRun, run_extract, torchrun_env

    cfg = load_config(args.config, check_files=False)
    gpus = None
    if args.gpus:
        try:
            gpus = [int(x) for x in args.gpus.split(",") if x.strip()]
        except ValueError:
            print(f"error: --gpus expects comma-separated GPU ids like 0,1,2, got {args.gpus!r}", file=sys.stderr)
            return 1
    data = Path(args.data) if args.data else None
    try:
        if not (args.headless or not sys.stdout.isatty() or torchrun_env() is not None):
            try:
                from tui.extract.run_app import run_extract_dashboard
            except ImportError:  # the dashboard needs textual
                print("(dashboard not available in this build; running headless)", file=sys.stderr)
            else:
                # workers log to OUT/status/worker-<rank>.log: nothing may write to the dashboard's terminal
                run = ExtractRun(cfg, data=data, gpus=gpus, workers=args.workers, free_bytes=args.free_bytes,
                                 say=lambda _line: None, progress_s=None, worker_output="file")
                return run_extract_dashboard(run)
        from engine.report.metricsserver import open_metrics

        return run_extract(cfg, data=data, gpus=gpus, workers=args.workers,
                           free_bytes=args.free_bytes, progress_s=args.progress_s,
                           metrics=lambda run: open_metrics(cfg.run, extract=run.snapshot))
    except OSError as e:  # ExtractError and DirectoryInUse: main
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def version() -> str:
    """The installed eagle-datagen's version (``importlib.metadata``), or ``unknown`` when the code
    runs from a source tree that was never installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("eagle-datagen")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of ``datagen``."""
    p = argparse.ArgumentParser(prog="datagen", description="Buy a target model's completions and turn them into EAGLE-3 training data.")
    p.add_argument("--version", action="version", version=f"datagen {version()}")
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="run the generation job of CONFIG (resumes if the run directory exists)")
    r.add_argument("config", help="path of config.toml")
    r.add_argument("--headless", action="store_true", help="log lines instead of the dashboard (default without a TTY)")
    r.add_argument("--run-dir", help="override [run] dir")
    r.add_argument("--exit-on-pause", action="store_true", help="exit with code 3 when the whole run is paused by a guard")
    r.set_defaults(func=_cmd_run)

    from engine.sim import add_sim_arguments

    s = sub.add_parser("sim", help="serve the OpenRouter-compatible simulator on 127.0.0.1")
    add_sim_arguments(s)
    s.set_defaults(func=_cmd_sim)

    st = sub.add_parser("status", help="show a run's progress (works while it runs, from another shell)")
    st.add_argument("run_dir")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument("--watch", action="store_true", help="refresh until the engine exits (or Ctrl-C)")
    st.add_argument("--interval", type=float, default=None, metavar="S", help="seconds between refreshes with --watch (default 2)")
    st.set_defaults(func=_cmd_status)

    c = sub.add_parser("ctl", help="control a run from another shell: pause|resume|skip|abort [DATASET], "
                       "concurrency CLASS N, exclude-provider|include-provider NAME, retry-failed [DATASET] "
                       "[--reason CLASS]; extraction: OUT_OR_RUN_DIR extract-pause|extract-resume|extract-skip DATASET; "
                       "exits 1 when not applied",
                       description="Exit status: 0 applied by the live engine, or saved for the next start "
                       "(pause/resume/skip DATASET, exclude/include-provider, retry-failed); 1 refused or not applied "
                       "(no engine running for abort, concurrency and a run-wide pause/resume; not confirmed within "
                       "10 s).")
    c.add_argument("run_dir", help="the run directory (extract-*: the extraction output directory, or a run directory)")
    c.add_argument("verb", choices=["pause", "resume", "skip", "abort", "concurrency", "exclude-provider",
                                    "include-provider", "retry-failed", "extract-pause", "extract-resume",
                                    "extract-skip"])
    c.add_argument("dataset", nargs="?", help="dataset (or CLASS for concurrency, NAME for the provider verbs)")
    c.add_argument("value", nargs="?", help="N for concurrency")
    c.add_argument("--yes", action="store_true", help="confirm abort without asking")
    c.add_argument("--abort", action="store_true", help="with skip: cancel the dataset's in-flight requests too")
    c.add_argument("--force", action="store_true", help="with exclude-provider: a name this run has not seen yet")
    c.add_argument("--reason", metavar="CLASS", help="with retry-failed: only prompts that failed with this error "
                   "class (bad_request, forbidden, server, timeout, ...; `datagen status` lists them)")
    c.set_defaults(func=_cmd_ctl)

    xt = sub.add_parser("extract", help="run the target model over the token records and save EAGLE-3 hidden states")
    xt.add_argument("config", nargs="?", help="path of config.toml (its [extract] section)")
    xt.add_argument("--headless", action="store_true", help="progress lines instead of the dashboard (default without a TTY)")
    xt.add_argument("--gpus", help="comma-separated GPU ids to use (default: all visible)")
    xt.add_argument("--workers", type=int, help="worker processes (default: GPUs // gpus_per_worker, 1 on CPU)")
    xt.add_argument("--data", help="a `tokens` Parquet export (dir or file) instead of the run directory")
    xt.add_argument("--free-bytes", type=int, help="assume this much free disk space (bytes) instead of asking the OS")
    xt.add_argument("--progress-s", type=float, default=5.0, help=argparse.SUPPRESS)
    xt.add_argument("--convert", metavar="OUT", help="rewrite the shards in OUT into another layout (no model run)")
    xt.add_argument("--to", choices=["speculators", "specforge"], help="with --convert: the layout to write")
    xt.add_argument("--convert-out", metavar="DIR", help="with --convert: destination (default OUT-<layout> beside OUT)")
    xt.add_argument("--model", help="with --convert --to speculators: model dir for the final norm (default: job.json's)")
    xt.add_argument("--delete-source", action="store_true", help="with --convert: delete each shard once converted")
    xt.set_defaults(func=_cmd_extract)

    ex = sub.add_parser("export", help="export stored results (exit 0 exported, 1 nothing exported, 2 error)")
    ex.add_argument("run_dir")
    ex.add_argument("--format", choices=["raw", "specforge", "openai", "tokens"], default="raw",
                    help="raw JSONL (everything stored; the default), or validated records as specforge/openai JSONL "
                    "or tokens Parquet")
    ex.add_argument("--out", required=True, help="output directory")
    ex.add_argument("--config", help="config whose [tokenizer] validates results not validated yet (default: the run's)")
    ex.add_argument("--include-invalid", action="store_true", help="also export records that failed validation")
    ex.set_defaults(func=_cmd_export, error_exit=EXIT_ERROR)

    v = sub.add_parser("validate", help="rebuild token ids of every stored result and check them (re-run after a "
                       "tokenizer fix; exit 0 all valid, 1 some invalid, 2 error)")
    v.add_argument("run_dir")
    v.add_argument("--config", help="config with the [tokenizer] section (default: the one stored with the run)")
    v.add_argument("--json", action="store_true", help="machine-readable report")
    v.add_argument("--workers", type=int, default=None, help="worker processes (default [tokenizer] workers)")
    v.set_defaults(func=_cmd_validate, error_exit=EXIT_ERROR)

    rp = sub.add_parser("report", help="write RUN_DIR's report, one self-contained HTML file with charts, to "
                        "DIR/report.html (exit 0 written, 2 error)")
    rp.add_argument("run_dir")
    rp.add_argument("--out", required=True, help="output directory")
    rp.add_argument("--config", help="config whose [spend] and classes the reservations are computed with "
                    "(default: the settings stored with the run)")
    rp.set_defaults(func=_cmd_report, error_exit=EXIT_ERROR)

    mt = sub.add_parser("make-tokenizer", help="build the small Kimi-layout demo tokenizer into DIR, offline "
                        "(for the simulator: Kimi-K2.5's layout, not its vocabulary)")
    mt.add_argument("dir")
    mt.add_argument("--force", action="store_true", help="replace DIR when it exists")
    mt.set_defaults(func=_cmd_make_tokenizer)
    return p


def _reopen_closed_streams() -> None:
    """Point a CLOSED stdout/stderr (``datagen status RUN >&-``: Python then has ``sys.stdout = None``,
    and every print or flush would raise) at ``/dev/null``, the descriptor included, so the command and
    the processes it starts write into nothing, quietly. A closed pipe is handled in :func:`main`."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if getattr(sys, name) is not None:
            continue
        try:
            os.fstat(fd)
        except OSError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
        setattr(sys, name, open(fd, "w", encoding="utf-8", errors="backslashreplace", closefd=False))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``datagen`` console script.

    Returns the command's exit code. A :class:`~engine.errors.DatagenError` raised by any command is
    printed as ``error: <message>`` on stderr (no traceback) and exits with the command's error status:
    2 for ``export``, ``validate`` and ``report`` (``EXIT_ERROR``), 1 for the others. Besides each command's own codes, 130 when interrupted by
    Ctrl-C outside a run's own signal handling (``validate``, ``export``, ``status --watch``) and
    141 (128 + SIGPIPE, as a shell tool) when stdout is a pipe closed early (``datagen status | head``),
    both without a traceback; a closed stdout/stderr descriptor (``>&-``) is written to ``/dev/null``.
    """
    _reopen_closed_streams()
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # surface a closed pipe here, not at interpreter exit
        return code
    except DatagenError as e:
        print(f"error: {e}", file=sys.stderr)
        return getattr(args, "error_exit", 1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader is gone: point stdout at /dev/null so the interpreter's final flush is quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141

