"""The ``datagen`` command line: run, sim, status, ctl, export, extract, validate, report, make-tokenizer.

The layer above the engine and the dashboard (``tui``). Every error the project defines derives from
:class:`engine.errors.DatagenError`; :func:`main` catches it once and prints ``error: <message>`` with the
command's error exit status (1, or 2 for ``export``, ``validate`` and ``report``: docs/commands.md). The commands
catch only what they turn into something else: ``export``'s "nothing to export" (exit 1), an unwritable
``--out`` or run directory (an ``OSError``, reworded), a refused start's clean-up (``run``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from datagen.parser import build_parser, version
from engine.errors import DatagenError

__all__ = ["build_parser", "main", "version"]


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


#: Commands that open a run directory's store.
RUN_DIR_COMMANDS = ("status", "ctl", "validate", "export", "report", "salvage")


def run_dir_access_problem(args) -> str | None:
    """The one line for a command this user may not run on its run directory (permission denied, a
    read-only filesystem), :func:`engine.storage.rundir.access_problem`; else None."""
    run_dir = getattr(args, "run_dir", None)
    if args.cmd not in RUN_DIR_COMMANDS or not run_dir or str(getattr(args, "verb", "")).startswith("extract-"):
        return None
    from pathlib import Path

    from engine.storage.rundir import access_problem

    return access_problem(Path(run_dir), f"datagen {args.cmd}")


def operator_error_line(e: OSError) -> str | None:
    """``PATH: Permission denied`` (or No space left on device, Read-only file system, Disk quota
    exceeded, File too large) for an error the operator can fix; None for any other error."""
    from engine.storage.rundir import OPERATOR_ERRNOS

    if e.errno not in OPERATOR_ERRNOS:
        return None
    return f"{e.filename}: {e.strerror}" if e.filename else (e.strerror or str(e))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``datagen`` console script.

    Returns the command's exit code. A :class:`~engine.errors.DatagenError` raised by any command is
    printed as ``error: <message>`` on stderr (no traceback) and exits with the command's error status:
    2 for ``export``, ``validate`` and ``report`` (``EXIT_ERROR``), 1 for the others. Besides each command's own
    codes, 130 when interrupted by Ctrl-C outside a run's own signal handling (``validate``, ``export``, ``status --watch``) and
    141 (128 + SIGPIPE, as a shell tool) when stdout is a pipe closed early (``datagen status | head``),
    both without a traceback; a closed stdout/stderr descriptor (``>&-``) is written to ``/dev/null``.
    A run directory this user may not read (``status``, ``ctl``, ``validate``, ``export``, ``report``)
    is refused first with one line naming the path and the access needed (:func:`run_dir_access_problem`),
    and an ``OSError`` the operator causes (permission denied, disk full or over quota, read-only
    filesystem) ends any command with one ``error: PATH: REASON`` line and its error status, never a traceback.
    """
    _reopen_closed_streams()
    args = build_parser().parse_args(argv)
    try:
        problem = run_dir_access_problem(args)
        if problem is not None:
            print(f"error: {problem}", file=sys.stderr)
            return getattr(args, "error_exit", 1)
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
    except OSError as e:  # permissions, a full disk, a read-only filesystem: one line, no traceback
        line = operator_error_line(e)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return getattr(args, "error_exit", 1)
    except Exception as e:  # a store damaged after the command's check: one line, as a refused start
        from engine.storage.health import damaged_message, is_damage

        if not is_damage(e):
            raise
        from engine.storage.schema import db_path

        run_dir = getattr(args, "run_dir", None)
        where = db_path(Path(run_dir)) if run_dir else Path("RUN_DIR/store.sqlite")
        print(f"error: {damaged_message(where, str(e))}", file=sys.stderr)
        return getattr(args, "error_exit", 1)

