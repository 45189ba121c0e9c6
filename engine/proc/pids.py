"""Whether a process id names a live process on this host (``kill(pid, 0)``, which sends nothing).

Used by ``datagen status`` (is the run's engine still there), ``datagen extract``'s status (is a worker
gone) and its shard directory (is a temporary file's writer gone).
"""

from __future__ import annotations

import os


def pid_alive(pid: int | None) -> bool:
    """True when ``pid`` is a live process on this host, including one owned by another user
    (``PermissionError``: it exists). False for None, 0 or a negative number (``kill`` would address a
    process group or every process, not one process), for a pid too large for the platform, and for a
    process that is gone. A zombie (exited, not yet reaped) counts as alive."""
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    return True
