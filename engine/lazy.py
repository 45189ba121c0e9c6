"""Lazy package exports (PEP 562): a package names its public objects and the submodule of each; a
submodule is imported on first use, so importing the package costs nothing (``engine.sim`` loads no
simulator for ``config``, ``engine.extract`` no torch, ``engine.client`` no httpx)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``exports`` maps a public name to the submodule that
    defines it (relative, e.g. ``"config"``, or absolute, ``"engine.extract.job"``).

    Raises (from the returned function):
        AttributeError: the name is not exported (``module 'P' has no attribute 'N'``).
    """

    def __getattr__(name: str) -> Any:
        mod = exports.get(name)
        if mod is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(mod if "." in mod else f"{package}.{mod}"), name)

    return __getattr__
