"""``datagen run``: the run lock, a refused start undone, the stack dump on SIGQUIT, then the dashboard or the headless run."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from engine.config import load_config
from engine.errors import DatagenError
from engine.proc import runlock


def cmd_run(args: argparse.Namespace) -> int:
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
            from tui.launch import run_dashboard

            return run_dashboard(cfg, exit_on_pause=args.exit_on_pause)
        if cfg.extract.after_run != "never":  # generation, then extraction (docs/extraction.md, "Chaining")
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
    from engine.run.headless import is_datagen_handler

    root = logging.getLogger()
    for h in list(root.handlers):
        if is_datagen_handler(h) and isinstance(h, logging.FileHandler):
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

    def dump(signum, frame):  # signal handler signature
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
