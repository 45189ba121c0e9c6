"""Fidelity probes: a small probe set sent pinned to each provider, compared with a reference provider.

:func:`run_probes` (``datagen probe CONFIG``; ``datagen run`` once at start with ``[fidelity.probes] enabled``):

1. reads the probe set (``[fidelity.probes] path``, default the bundled :data:`BUNDLED`) and OpenRouter's
   endpoints listing of the model (who serves it and at what price; none: the configured providers);
2. prints and logs the cost projection, ``probes: 24 x 4 providers = 96 requests, est. $0.41 (max $0.93 at
   max_tokens)``, BEFORE the first request;
3. sends every probe ``repeats`` times to every provider through the run's client, each request pinned with
   ``provider: {"only": [slug], "allow_fallbacks": false}`` on top of the run's own body (model, sampling,
   ``reasoning``, ``extra_body``; of ``[provider.routing]`` only ``data_collection`` and
   ``require_parameters`` are kept), a probe's own ``temperature`` replacing the run's;
4. judges each provider against the reference (:func:`engine.fidelity.probes.judge_probes`), keeps the batch in
   the store (:mod:`engine.storage.probes`) and prints the table.

The probes' spend is the provider's bill like any other, but outside the datasets' budgets.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from engine.client.retry import RetryPolicy, call_with_retries
from engine.client.types import ChatRequest, Completion, RequestError
from engine.config import ConfigError
from engine.fidelity.endpoints import endpoints_path, parse_endpoints
from engine.fidelity.probes import (
    ProbeOutcome,
    ProbeThresholds,
    ProbeVerdict,
    judge_probes,
    response_called,
    response_schema_ok,
)
from engine.fidelity.probeset import (
    CostProjection,
    Probe,
    ProbeTarget,
    listing_prices,
    parse_probes,
    probe_targets,
    project_cost,
    same_provider,
)
from engine.money.prices import prices_from_models_endpoint
from engine.run.routing import thinking_plan

if TYPE_CHECKING:
    from engine.client.accumulate import StreamProgress
    from engine.config import Config
    from engine.run.seams import TextOut

log = logging.getLogger(__name__)

__all__ = ["BUNDLED", "ProbeClient", "ProbeReport", "load_probe_set", "probe_body", "run_probes"]

#: The bundled probe set: 12 prompts whose tools should be called, 4 offering tools a good answer does not
#: need, 8 plain; 5 of them greedy (temperature 0).
BUNDLED = Path(__file__).resolve().parents[1] / "samples" / "probes" / "fidelity_probes.jsonl"

#: Attempts per probe request (retryable errors only: 429, 5xx, cut streams), backoff up to 8 s.
RETRY = RetryPolicy(max_attempts=3, base_s=1.0, max_s=8.0)

#: ``[provider.routing]`` keys kept on a pinned probe (policies, not provider choices).
KEPT_ROUTING = ("data_collection", "require_parameters")


class ProbeClient(Protocol):
    """What the probes need of the run's client (:class:`~engine.client.chat.ChatClient`)."""

    async def complete(self, req: ChatRequest, progress: "StreamProgress | None" = None) -> Completion: ...
    async def get_json(self, path: str, params: dict[str, Any] | None = None) -> Any: ...


def load_probe_set(path: Path | None) -> list[Probe]:
    """The probes of ``path`` (None: :data:`BUNDLED`).

    Raises:
        ConfigError: the file cannot be read or a line is not a probe (``[fidelity.probes] path: FILE:LINE: why``).
    """
    p = Path(path) if path is not None else BUNDLED
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"[fidelity.probes] path: cannot read {p}: {e.strerror or e}") from None
    try:
        return parse_probes(text.splitlines(), str(p))
    except ValueError as e:
        raise ConfigError(f"[fidelity.probes] path: {e}") from None


def probe_body(cfg: "Config", target: ProbeTarget, probe: Probe) -> dict[str, Any]:
    """The request body (less messages, tools, max_tokens, stream) of ``probe`` pinned to ``target``."""
    g = cfg.generation
    body: dict[str, Any] = {"model": cfg.provider.model}
    for k in ("temperature", "top_p", "seed", "reasoning"):
        v = getattr(g, k)
        if v is not None:
            body[k] = v
    body.update(g.extra_body)
    body.update(thinking_plan(cfg).add)
    routing = cfg.provider.routing.to_provider_object()
    body["provider"] = {**{k: routing[k] for k in KEPT_ROUTING if k in routing},
                        "only": [target.slug], "allow_fallbacks": False}
    if probe.temperature is not None:
        body["temperature"] = probe.temperature
    return body


def _text(c: Completion) -> str:
    calls = " ".join(f"{t.name}({t.arguments})" for t in c.tool_calls)
    return "\n".join(s for s in (c.reasoning, c.content, calls) if s)


def outcome_of(probe: Probe, target: ProbeTarget, repeat: int, c: Completion) -> ProbeOutcome:
    """A completed probe request as a :class:`ProbeOutcome`."""
    calls = [t.to_openai() for t in c.tool_calls]
    called = response_called(c.finish_reason, calls)
    return ProbeOutcome(
        probe_id=probe.id, provider=target.name, repeat=repeat, greedy=probe.greedy, finish_reason=c.finish_reason,
        called=called, schema_ok=response_schema_ok(calls, probe.tools, called), text=_text(c),
        token_ids=c.token_ids, served=c.provider, pinned_ok=same_provider(c.provider, target),
        prompt_tokens=c.usage.prompt_tokens, completion_tokens=c.usage.completion_tokens, cost_usd=c.usage.cost_usd,
        generation_id=c.generation_id)


@dataclass
class ProbeReport:
    """What :func:`run_probes` did.

    Attributes:
        reference: the reference provider's name; targets: every provider probed (the reference first).
        projection: the cost shown before the first request.
        outcomes: one per request; verdicts: per provider (:class:`~engine.fidelity.probes.ProbeVerdict`).
        spent_usd: what the providers reported billing for the probes (USD; failed attempts' partial cost included).
        batch: the store's ``probe_batches`` id (None when not stored).
    """

    reference: str
    targets: list[ProbeTarget]
    projection: CostProjection
    outcomes: list[ProbeOutcome]
    verdicts: dict[str, ProbeVerdict]
    spent_usd: float
    batch: int | None = None

    @property
    def ok(self) -> bool:
        """False when a provider reads ``below`` or ``failed``, or the reference answered no probe
        (``datagen probe`` then exits 1)."""
        ref = self.verdicts.get(self.reference)
        return (ref is not None and not ref.reasons
                and not any(v.verdict in ("below", "failed") for v in self.verdicts.values()))

    def table(self) -> str:
        """The verdicts as an aligned text table, one provider a line, then the reasons."""
        def pct(x: float | None) -> str:
            return "-" if x is None else f"{x:.1%}"

        head = ("provider", "verdict", "pairs", "trigger F1", "schema", "calls", "greedy same", "errors")
        rows = []
        for v in self.verdicts.values():
            ref = v.verdict == "reference"
            rows.append((v.provider, v.verdict, "-" if ref else str(v.pairs), "-" if ref else pct(v.f1),
                         pct(v.schema_accuracy), str(v.tool_calls),
                         "-" if ref or not v.greedy_pairs else f"{v.greedy_identical}/{v.greedy_pairs}",
                         f"{v.errors}/{v.sent}"))
        w = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip() for r in (head, *rows)]
        for v in self.verdicts.values():
            extra = list(v.reasons)
            if v.first_divergence:
                d = sorted(v.first_divergence)
                extra.append(f"greedy outputs first differ at {v.divergence_unit} {', '.join(map(str, d))}")
            if v.truncated:
                extra.append(f"{v.truncated} pairs cut by max_tokens, left out of the F1")
            if extra:
                lines.append(f"  {v.provider}: " + "; ".join(extra))
        lines.append(f"probes: ${self.spent_usd:.4f} billed (projected ${self.projection.est_usd:.2f}, "
                     f"max ${self.projection.max_usd:.2f})")
        return "\n".join(lines)


async def _listing(client: ProbeClient, model: str) -> Any:
    try:
        return await client.get_json(endpoints_path(model))
    except (ValueError, RequestError) as e:
        log.info("probes: no endpoints listing of %s (%s)", model, getattr(e, "error_class", e))
        return None


async def _prices(cfg: "Config", client: ProbeClient, doc: Any,
                  targets: list[ProbeTarget]) -> dict[str, tuple[float, float] | None]:
    """Per provider (name): the listing's price, else ``[pricing]``, else ``/models``; None: unknown."""
    listed = listing_prices(doc)
    p = cfg.pricing
    fallback: tuple[float, float] | None = None
    if p.prompt_usd_per_m is not None and p.completion_usd_per_m is not None:
        fallback = (p.prompt_usd_per_m / 1e6, p.completion_usd_per_m / 1e6)
    elif any(not any(same_provider(n, t) for n in listed) for t in targets):
        try:
            m = prices_from_models_endpoint(await client.get_json("/models"), cfg.provider.model)
        except RequestError:
            m = None
        fallback = None if m is None else (m.prompt_usd_per_token, m.completion_usd_per_token)
    return {t.name: next((pr for n, pr in listed.items() if same_provider(n, t)), fallback) for t in targets}


async def _save(store_dir: Path, report: ProbeReport, taken_at: float) -> int:
    from engine.storage.handle import connect_rw
    from engine.storage.probes import save_batch
    from engine.storage.schema import db_path
    from engine.storage.store import Store

    if not db_path(store_dir).exists():  # `datagen probe` before the first run: the run's store, created
        await (await Store.open(store_dir)).close()

    def write() -> int:
        with connect_rw(store_dir) as h:
            return save_batch(h, taken_at=taken_at, reference=report.reference, requests=report.projection.requests,
                              est_usd=report.projection.est_usd, max_usd=report.projection.max_usd,
                              spent_usd=report.spent_usd, verdicts=report.verdicts, outcomes=report.outcomes,
                              slugs={t.name: t.slug for t in report.targets})

    return await asyncio.to_thread(write)


async def run_probes(cfg: "Config", client: ProbeClient, store_dir: Path | None, out: "TextOut") -> ProbeReport:
    """Send the probes of ``[fidelity.probes]`` pinned to each provider and judge them against the reference.

    Args:
        cfg: the run's config (``[fidelity.probes]``; ``reference`` must be set).
        client: the run's client (its ``complete`` sends one attempt; ``get_json`` reads the listing and prices).
        store_dir: the run directory whose store keeps the batch (created when missing); None: not kept.
        out: where the cost line (before any request) and the table go.

    Raises:
        ConfigError: no reference, an unreadable probe set, or no provider to compare with.
    """
    pc = cfg.fidelity.probes
    if not pc.reference:
        raise ConfigError("[fidelity.probes] reference: set the provider the others are compared with")
    probes = load_probe_set(pc.path)
    doc = await _listing(client, cfg.provider.model)
    routing = cfg.provider.routing
    try:
        targets = probe_targets(pc.reference, configured=pc.providers, endpoints=parse_endpoints(doc),
                                only=routing.only, order=routing.order, ignore=routing.ignore)
    except ValueError as e:
        raise ConfigError(f"[fidelity.probes] {e}") from None
    projection = project_cost(probes, targets, pc.repeats, pc.max_tokens, await _prices(cfg, client, doc, targets))
    line = projection.line() + f"; reference {targets[0].name}, pinned with provider.only + allow_fallbacks false"
    print(line, file=out, flush=True)
    log.info("%s", line)

    sem = asyncio.Semaphore(pc.concurrency)
    spent = 0.0

    async def one(probe: Probe, target: ProbeTarget, repeat: int) -> ProbeOutcome:
        nonlocal spent
        req = ChatRequest(messages=probe.messages, tools=probe.tools, max_tokens=pc.max_tokens,
                          body=probe_body(cfg, target, probe))
        async with sem:
            try:
                c = await call_with_retries(lambda: client.complete(req), RETRY)
            except RequestError as e:
                spent += e.partial_cost_usd or 0.0
                return ProbeOutcome(probe_id=probe.id, provider=target.name, repeat=repeat, greedy=probe.greedy,
                                    finish_reason=None, served=e.provider, error=str(e)[:300],
                                    generation_id=e.generation_id)
        spent += c.usage.cost_usd or 0.0
        return outcome_of(probe, target, repeat, c)

    t0 = time.time()
    outcomes = list(await asyncio.gather(*(one(p, t, r) for r in range(pc.repeats) for p in probes for t in targets)))
    th = ProbeThresholds(min_f1=pc.min_f1, min_schema=pc.min_schema_accuracy, min_pairs=pc.min_pairs)
    verdicts = judge_probes(outcomes, targets[0].name, th)
    report = ProbeReport(targets[0].name, targets, projection, outcomes, verdicts, spent)
    if store_dir is not None:
        report.batch = await _save(Path(store_dir), report, t0)
    print(report.table(), file=out, flush=True)
    for v in verdicts.values():
        log.info("probes: %s", json.dumps(v.to_dict(), sort_keys=True))
    return report
