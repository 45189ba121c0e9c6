"""A Python environment like the GPU machine of issue 37, for the tests of ``bench/gpu_check.sh``.

That machine's ``python3`` has torch, transformers, safetensors, accelerate, tokenizers, tiktoken, httpx,
rich and pyarrow (and what they require) but not pydantic, textual, aiosqlite or vLLM. :func:`make_venv`
builds such a venv without the network and in a second: a bare ``venv`` (no pip, no system site-packages)
whose site-packages holds symlinks to exactly those distributions of this venv (:data:`ROOTS` and the
closure of their ``Requires-Dist``, extras left out, :data:`ABSENT` never), so everything else, pytest
and this project's other dependencies included, is as absent there as on the GPU machine.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOTS = ("torch", "transformers", "safetensors", "accelerate", "tokenizers", "tiktoken", "httpx", "rich", "pyarrow")
ABSENT = frozenset({"pydantic", "pydantic-core", "textual", "aiosqlite", "vllm"})


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: tuple[str, ...] = ROOTS, absent: frozenset[str] = ABSENT) -> dict[str, md.Distribution]:
    """The installed distributions ``roots`` require, transitively (normalised name -> distribution);
    ``absent`` ones and what only they require are left out."""
    seen: dict[str, md.Distribution] = {}
    todo = list(roots)
    while todo:
        n = _norm(todo.pop())
        if n in seen or n in absent:
            continue
        try:
            d = md.distribution(n)
        except md.PackageNotFoundError:
            continue
        seen[n] = d
        todo += [re.split(r"[ ;<>=!~\[(]", r.strip(), maxsplit=1)[0] for r in d.requires or [] if "extra ==" not in r]
    return seen


def make_venv(dest: Path) -> Path:
    """Build the emulated GPU machine's environment at ``dest``; returns its ``bin/python``.

    Raises:
        subprocess.CalledProcessError: ``venv`` failed; KeyError: a root distribution is not installed here.
    """
    dists = closure()
    missing = [r for r in ROOTS if _norm(r) not in dists]
    if missing:
        raise KeyError(f"not installed here: {missing}")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    site = Path(sysconfig.get_paths()["purelib"])
    ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    target = dest / "lib" / ver / "site-packages"
    for d in dists.values():
        tops = {Path(str(f)).parts[0] for f in d.files or [] if not str(f).startswith("..")}
        for top in tops:
            src, link = site / top, target / top
            if src.exists() and not link.exists():
                link.symlink_to(src)
    return dest / "bin" / "python"
