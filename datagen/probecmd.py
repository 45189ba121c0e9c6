"""``datagen probe CONFIG``: the fidelity probes alone (docs/fidelity.md, "Probes"), then a table; exit 0 every
provider within the thresholds, 1 one below them, failed, or no answer from the reference."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from engine.config import Config, ConfigError, load_config


async def _probe(cfg: Config) -> int:
    from engine.client.chat import ChatClient
    from engine.run.apikey import resolve_api_key
    from engine.run.probes import run_probes

    sim = None
    api_key: str | None
    if cfg.provider.kind == "simulated":
        from engine.run.runner import sim_config_from_section
        from engine.sim import SimThread

        sim = SimThread(sim_config_from_section(cfg))
        base_url, api_key = await asyncio.to_thread(sim.start), "sim-local"
    elif cfg.provider.base_urls:
        raise ConfigError("[fidelity.probes]: probes pin providers of one API (OpenRouter); [provider] base_urls "
                          "names several replicas instead")
    else:
        base_url, api_key = cfg.provider.resolved_base_url() or "", resolve_api_key(cfg.provider)
    t = cfg.provider.timeouts
    try:
        async with ChatClient(base_url, api_key, stream=cfg.provider.stream, stream_usage=cfg.provider.stream_usage,
                              finish_reasons=dict(cfg.provider.finish_reasons),
                              return_token_ids=cfg.provider.return_token_ids, connect_timeout_s=t.connect_s,
                              stall_timeout_s=t.stall_s, total_timeout_s=t.total_s, max_connections=64) as client:
            report = await run_probes(cfg, client, cfg.run.dir, sys.stdout)
    finally:
        if sim is not None:
            await asyncio.to_thread(sim.stop)
    return 0 if report.ok else 1


def cmd_probe(args: argparse.Namespace) -> int:
    """``datagen probe``: 0 every provider ok (or insufficient), 1 one below the thresholds or failed, or the
    reference answered nothing; a bad config raises :class:`~engine.errors.DatagenError` (exit 1)."""
    cfg = load_config(args.config)
    if args.run_dir:
        cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"dir": Path(args.run_dir).resolve()})})
    if args.reference:
        pr = cfg.fidelity.probes.model_copy(update={"reference": args.reference})
        cfg = cfg.model_copy(update={"fidelity": cfg.fidelity.model_copy(update={"probes": pr})})
    try:
        return asyncio.run(_probe(cfg))
    except KeyboardInterrupt:
        return 130
