"""The settings ``datagen report`` computes reservations with, stored with the run.

``datagen run`` writes :func:`run_settings` of its config to the store's ``meta`` table under
:data:`SETTINGS_KEY` at every start (the latest start's settings win); the report reads them back
with :func:`resolve_settings`. Only what the report needs is kept (no provider section: nothing
there can be a secret's value, and nothing of it is needed).
"""

from __future__ import annotations

import json
from typing import Any

from engine.config import Config, SpendSection
from engine.storage.handle import Handle, get_meta
from engine.storage.validations import SETTINGS_KEY  # ``meta`` key of run_settings (``validate`` reads it too)


def _spend(s: SpendSection) -> dict[str, Any]:
    return {"reserve_percentile": s.reserve_percentile, "calibrate_after": s.calibrate_after,
            "hard_cap": s.hard_cap, "reservation": s.reservation}


def run_settings(cfg: Config) -> dict[str, Any]:
    """The settings of ``cfg`` the report needs, as JSON (stored by ``datagen run`` under
    :data:`SETTINGS_KEY`): ``{"spend": {reserve_percentile, calibrate_after, hard_cap, reservation},
    "classes": {name: {max_tokens, concurrency}}, "extract_out_dir": str | None}``."""
    return {
        "spend": _spend(cfg.spend),
        "classes": {n: {"max_tokens": c.max_tokens, "concurrency": c.concurrency} for n, c in cfg.classes.items()},
        "extract_out_dir": str(cfg.extract.out_dir) if cfg.extract.out_dir is not None else None,
    }


def resolve_settings(conn: Handle, config: Config | None, status: dict[str, Any]) -> dict[str, Any]:
    """:func:`run_settings` of ``config``, else of the settings stored with the run, else the
    schema's defaults (classes then from the live row's ``max_tokens`` when it has them), with
    ``source`` saying which."""
    if config is not None:
        return {**run_settings(config), "source": "--config"}
    stored = get_meta(conn, SETTINGS_KEY)
    if stored is not None:
        try:
            return {**json.loads(stored), "source": "stored with the run"}
        except ValueError:
            pass
    classes = {c["name"]: {"max_tokens": c["max_tokens"], "concurrency": c.get("configured") or c.get("concurrency")}
               for c in status.get("classes", []) if c.get("max_tokens")}
    if not classes:
        default = Config.model_fields["classes"].get_default(call_default_factory=True)
        classes = {n: {"max_tokens": c.max_tokens, "concurrency": c.concurrency} for n, c in default.items()}
    return {"spend": _spend(SpendSection()), "classes": classes, "extract_out_dir": None,
            "source": "defaults (no settings stored with this run; pass --config CONFIG for its own)"}
