"""Whether this test process may mount a tmpfs (root with ``mount``): the disk-full tests need one and skip otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid


def can_mount() -> bool:
    """True when a 64 KiB tmpfs could be mounted (and was unmounted again) on a probe directory under /tmp."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    probe = f"/tmp/datagen-mount-probe-{uuid.uuid4().hex[:8]}"
    os.mkdir(probe)
    try:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", probe], capture_output=True).returncode == 0
        if ok:
            subprocess.run(["umount", probe], capture_output=True)
        return ok
    finally:
        os.rmdir(probe)
