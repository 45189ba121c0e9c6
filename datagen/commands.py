"""The other ``datagen`` commands: sim, status, export, validate, report, make-tokenizer, ctl, extract."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.config import Config, load_config
from engine.proc import runlock


def cmd_sim(args: argparse.Namespace) -> int:
    """``datagen sim``: serve the simulator until interrupted. Returns 0, or 1 for bad options."""
    from engine.sim import serve_forever, sim_config_from_args

    try:
        cfg = sim_config_from_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    serve_forever(cfg)
    return 0


def check_store(run_dir: Path, *, thorough: bool = False) -> None:
    """Refuse a damaged store before a command reads or writes it: SQLite's ``quick_check``
    (``thorough``: ``integrity_check``, for commands that write), :func:`engine.storage.health.check`;
    nothing to check when there is no store yet (the command says so itself).

    Raises:
        engine.storage.health.DamagedStoreError: the store is damaged (:func:`datagen.cli.main` prints its one line).
    """
    from engine.storage.health import check
    from engine.storage.schema import db_path

    check(db_path(run_dir), thorough=thorough)


def cmd_status(args: argparse.Namespace) -> int:
    """``datagen status``: print (or ``--watch``) a run's progress from its store. Returns 0, 1 for bad options."""
    from engine.report.status import collect_status, format_status, watch_status

    check_store(Path(args.run_dir))  # once, --watch included
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


#: Exit codes of ``datagen export`` and ``datagen validate`` (docs/commands.md).
EXIT_OK, EXIT_INVALID, EXIT_ERROR = 0, 1, 2


def cmd_export(args: argparse.Namespace) -> int:
    """0 something exported; 1 nothing exported (no record qualifies, nothing written); 2 error."""
    from engine.errors import NothingToExport
    from engine.report.export import export

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"error: --out {out}: exists and is not a directory (expected a directory to write into)",
              file=sys.stderr)
        return EXIT_ERROR
    check_store(Path(args.run_dir))
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
                         on_empty=lambda ds, why: empty.append((ds, why)), include_drifting=args.include_drifting,
                         check_specforge=not args.force)
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
    if args.format != "raw" and not args.include_drifting:
        _say_drift_left_out(Path(args.run_dir), args.include_invalid)
    from engine.tokens.specforgeguard import REASON_PREFIX, left_out_line

    parser_line = left_out_line(role_left_out, args.run_dir)
    role_left_out = [(rid, why) for rid, why in role_left_out if not why.startswith(REASON_PREFIX)]
    if parser_line:
        print(parser_line)
    if role_left_out:
        rid, why = role_left_out[0]
        print(f"left out: {len(role_left_out)} row(s) whose turns SpecForge's parser would drop or cut (prompts "
              f"stored before ingest normalised role order; docs/specforge-roles.md), e.g. {rid}: {why}")
    return EXIT_OK


def _say_drift_left_out(run_dir: Path, include_invalid: bool) -> None:
    """The line that counts the records left out as ``provider_drift`` (docs/fidelity.md), if any."""
    from engine.tokens import vstore
    from engine.tokens.exports import drift_left_out

    conn = vstore.connect(run_dir)
    try:
        left = drift_left_out(conn, include_invalid)
    finally:
        conn.close()
    if left:
        n = sum(c for c, _ in left.values())
        print(f"left out: {n} record(s) of providers judged drifting (provider_drift): "
              + "; ".join(f"{p} {c} ({why})" for p, (c, why) in left.items()) + "; --include-drifting exports them")


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
    from engine.tokens.exports import left_out, served_instead

    conn = vstore.connect(run_dir)
    try:
        invalid, unvalidated, reasons = left_out(conn)
        instead = served_instead(conn) if reasons.get("model_mismatch") else {}
    finally:
        conn.close()
    if invalid:
        why = ", ".join(f"{k} {v}" for k, v in reasons.most_common())
        print(f"left out: {invalid} invalid record(s) ({why}); --include-invalid exports them")
    if instead:
        print("  model_mismatch: served " + ", ".join(f"{m or '(unnamed)'} {n}" for m, n in instead.items())
              + " instead of the model asked for")
    if unvalidated:
        why = f" (the live run, pid {live.pid}, validates them as they arrive)" if live is not None else ""
        print(f"left out: {unvalidated} result(s) not validated{why}")


def cmd_validate(args: argparse.Namespace) -> int:
    """0 every stored result valid, or invalid only by a cut at ``max_tokens`` the config asked for;
    1 some invalid by a fault, some not validated, or none stored; 2 error."""
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
        check_store(run_dir, thorough=True)  # it writes verdicts
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
    cuts = (f"{doc['cut_at_max_tokens']} of {doc['records']} record(s) cut at max_tokens as the config asks "
            f"(finish length): left out of exports unless --include-invalid") if doc["cut_at_max_tokens"] else ""
    if doc["faults"] or doc["unvalidated"]:
        extra = f", {doc['unvalidated']} not validated" if doc["unvalidated"] else ""
        print(f"{doc['faults']} of {doc['records']} record(s) invalid by a fault{extra}: "
              f"left out of exports unless --include-invalid", file=sys.stderr)
        if cuts:
            print(cuts, file=sys.stderr)
        return EXIT_INVALID
    if cuts:
        print(cuts, file=sys.stderr)
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    """0 written; 2 error (no run directory or store, matplotlib missing, ``--out`` not writable)."""
    from engine.report.page import write_report

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"error: --out {out}: exists and is not a directory (expected a directory to write into)", file=sys.stderr)
        return EXIT_ERROR
    cfg = load_config(args.config, check_files=False) if args.config else None
    check_store(Path(args.run_dir))
    try:
        path = write_report(Path(args.run_dir), out, cfg)
    except OSError as e:
        print(f"error: cannot write the report to --out {out}: {e.filename or out}: {e.strerror or e}", file=sys.stderr)
        return EXIT_ERROR
    print(f"{path}: {path.stat().st_size:,} bytes")
    return EXIT_OK


def cmd_make_tokenizer(args: argparse.Namespace) -> int:
    """``datagen make-tokenizer``: build the offline Kimi-layout demo tokenizer. Returns 0."""
    from engine.tokens.demo_tokenizer import build_demo_tokenizer

    built = build_demo_tokenizer(Path(args.dir), force=args.force)
    print(f"{args.dir}: {'built' if built else 'already there'} (Kimi-K2.5 layout over mistral-common's tekken "
          f"vocabulary: for the simulator, not for real Kimi completions)")
    return 0


def cmd_ctl_extract(args: argparse.Namespace) -> int:
    """``datagen ctl DIR extract-*``: send an extraction command (pause, resume, skip). Returns 0 applied, 1 not."""
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


def cmd_ctl(args: argparse.Namespace) -> int:
    """``datagen ctl``: send a command to a live run, or save it for the next start. Returns 0 applied or saved,
    1 refused or not applied."""
    from engine.report.status import collect_status
    from engine.run.commands import RunCommand
    from engine.run.ctl import send

    if args.verb.startswith("extract-"):
        return cmd_ctl_extract(args)
    check_store(Path(args.run_dir))

    dataset, arg = args.dataset, None
    if args.verb == "concurrency":
        if args.dataset is None or args.value is None:
            print("error: usage: datagen ctl RUN_DIR concurrency CLASS N", file=sys.stderr)
            return 1
        arg = args.value
    elif args.verb in ("exclude-provider", "include-provider", "clear-verdict"):
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
        result = send(Path(args.run_dir), RunCommand.from_row(args.verb, dataset, arg), force=args.force)
    except ValueError as e:  # an unknown verb, dataset, class or provider (StatusError: main)
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(result.text, file=sys.stdout if result.ok else sys.stderr)
    return 0 if result.ok else 1


def _judged(cfg: Config, code: int) -> int:
    """After ``datagen extract``: judge the providers from the scores it stored (docs/fidelity.md); ``code`` as is."""
    if cfg.extract.fidelity:
        from engine.run.fidelity import judge_offline

        try:
            judge_offline(Path(cfg.run.dir), cfg.fidelity, print)
        except Exception as e:  # the extraction's result stands
            print(f"warning: providers not judged: {type(e).__name__}: {e}", file=sys.stderr)
    return code


def cmd_extract(args: argparse.Namespace) -> int:
    """``datagen extract``: run (or ``--convert``) the hidden-state extraction. Returns 0 done or drained, 1 failed, 130 interrupted."""
    if args.convert:
        from engine.extract.convert_cli import run_convert

        return run_convert(args.convert, args.to, out=args.convert_out, model=args.model,
                           delete_source=args.delete_source, draft_config=args.draft_config)
    if not args.config:
        print("error: datagen extract needs CONFIG (or --convert OUT --to LAYOUT)", file=sys.stderr)
        return 1
    if args.to or args.convert_out or args.delete_source or args.draft_config:
        print("error: --to, --convert-out, --delete-source and --draft-config go with --convert OUT (rewrite existing shards); "
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
                return _judged(cfg, run_extract_dashboard(run))
        from engine.report.metricsserver import open_metrics

        return _judged(cfg, run_extract(cfg, data=data, gpus=gpus, workers=args.workers,
                                        free_bytes=args.free_bytes, progress_s=args.progress_s,
                                        metrics=lambda run: open_metrics(cfg.run, extract=run.snapshot)))
    except OSError as e:  # ExtractError and DirectoryInUse: main
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
