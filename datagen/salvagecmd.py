"""``datagen salvage RUN_DIR``: copy what is readable of a damaged store into a new one
(:mod:`engine.storage.salvage`), under the run directory's lock."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

#: Exit codes of ``datagen salvage`` (docs/commands.md).
EXIT_SALVAGED, EXIT_NOTHING, EXIT_ERROR = 0, 1, 2


def cmd_salvage(args: argparse.Namespace) -> int:
    """0 salvaged (a new store in place, the damaged one kept); 1 nothing to salvage (no store, or one
    that passes SQLite's ``integrity_check``); 2 error (a live run holds the directory, SQLite reads no
    row in the store, the new store cannot be written): nothing changed."""
    from engine.proc import runlock
    from engine.storage.salvage import NothingToSalvage, salvage
    from engine.storage.schema import db_path

    run_dir = Path(args.run_dir)
    if not db_path(run_dir).is_file():
        print(f"{run_dir}: no run store here (expected {db_path(run_dir)}): nothing to salvage", file=sys.stderr)
        return EXIT_NOTHING
    lock = runlock.acquire(run_dir)  # DirectoryInUse (exit 2 through main): not beside a live run
    try:
        done = salvage(run_dir)
    except NothingToSalvage as e:
        print(f"{e}", file=sys.stderr)
        return EXIT_NOTHING
    except OSError as e:
        print(f"error: cannot write the new store beside {run_dir / 'store.sqlite'}: {e.strerror or e} "
              f"(nothing changed)", file=sys.stderr)
        return EXIT_ERROR
    finally:
        lock.release()
    print("\n".join(done.lines()))
    return EXIT_SALVAGED
