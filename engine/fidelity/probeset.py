"""The probe set, who is probed, and what probing costs (pure; :mod:`engine.fidelity.probes` judges the answers).

A probe set is JSONL, one ``{"id", "messages", "tools"?, "temperature"?, "expect"?}`` per line (the bundled
one: ``engine/samples/probes/fidelity_probes.jsonl``). Each probe is sent, pinned with ``provider.only`` and
``allow_fallbacks: false``, to every :class:`ProbeTarget`; :func:`project_cost` is shown before the first one.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EXPECTED_SHARE", "CostProjection", "Probe", "ProbeTarget", "listing_prices", "parse_probes",
           "probe_targets", "project_cost", "prompt_tokens_estimate", "same_provider"]

#: The share of ``max_tokens`` a probe's completion is expected to use in the "est." figure (reasoning models
#: often think up to the cap; "max" assumes every completion uses all of it).
EXPECTED_SHARE = 0.5


@dataclass(frozen=True)
class Probe:
    """One probe prompt.

    Attributes:
        id: unique name (shown, stored).
        messages / tools: OpenAI-shape messages and tools (tools empty for a plain prompt).
        temperature: sent instead of ``[generation] temperature`` when not None; 0 makes the probe greedy.
        expect: ``"tool"`` | ``"none"`` | None: what the probe set's author expects (informational; the
            verdict compares with the reference provider, not with this).
    """

    id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    temperature: float | None = None
    expect: str | None = None

    @property
    def greedy(self) -> bool:
        """Whether the probe is sent at temperature 0."""
        return self.temperature == 0


def parse_probes(lines: Iterable[str], source: str = "probes") -> list[Probe]:
    """Probes from JSONL lines: ``{"id", "messages", "tools"?, "temperature"?, "expect"?}`` per line (blank lines
    skipped).

    Raises:
        ValueError: ``"{source}:{line}: ..."`` for a line that is not such an object, a duplicate id, or no probe.
    """
    out: list[Probe] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}:{n}"
        try:
            d = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{where}: not JSON ({e})") from None
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected a JSON object")
        pid, msgs, tools, temp, expect = d.get("id"), d.get("messages"), d.get("tools", []), d.get("temperature"), d.get("expect")
        if not isinstance(pid, str) or not pid:
            raise ValueError(f"{where}: id must be a non-empty string")
        if pid in seen:
            raise ValueError(f"{where}: duplicate id {pid!r}")
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and "role" in m for m in msgs):
            raise ValueError(f"{where}: messages must be a non-empty list of objects with a role")
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise ValueError(f"{where}: tools must be a list of objects")
        if temp is not None and (isinstance(temp, bool) or not isinstance(temp, (int, float)) or not 0 <= temp <= 2):
            raise ValueError(f"{where}: temperature must be a number in [0, 2]")
        if expect not in (None, "tool", "none"):
            raise ValueError(f"{where}: expect must be \"tool\" or \"none\"")
        seen.add(pid)
        out.append(Probe(pid, msgs, tools, None if temp is None else float(temp), expect))
    if not out:
        raise ValueError(f"{source}: no probe")
    return out


# -- who is probed ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProbeTarget:
    """A provider to probe: ``name`` shown and compared with the response's ``provider`` field, ``slug`` sent
    in ``provider.only`` (OpenRouter's provider slug, e.g. ``deepinfra``)."""

    name: str
    slug: str


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def same_provider(served: str, target: ProbeTarget) -> bool:
    """Whether a response's ``provider`` field names ``target`` (case, spaces and punctuation ignored; the
    slug's base before ``/`` counts). An empty ``served`` (no provider field) counts as the same."""
    if not served:
        return True
    s = _norm(served)
    return s in (_norm(target.name), _norm(target.slug), _norm(target.slug.split("/")[0]))


def probe_targets(reference: str, *, configured: Sequence[str] | None = None,
                  endpoints: Sequence[Mapping[str, Any]] = (), only: Sequence[str] | None = None,
                  order: Sequence[str] | None = None, ignore: Sequence[str] | None = None) -> list[ProbeTarget]:
    """The providers to probe, the reference first.

    ``configured`` (``[fidelity.probes] providers``) wins; else one per provider of the endpoints listing
    (``provider_name``; slug: the base of its ``tag``, else the name lower-cased), kept to ``only`` and
    without ``ignore`` (``[provider.routing]``); else ``only``, else ``order``. The reference is added when
    missing.

    Raises:
        ValueError: nothing to compare the reference with (no provider besides it).
    """
    targets: list[ProbeTarget] = []
    if configured:
        targets = [ProbeTarget(n, n) for n in configured]
    elif endpoints:
        for e in endpoints:
            name = str(e.get("provider_name") or "")
            if not name or any(t.name == name for t in targets):
                continue
            tag = str(e.get("tag") or "")
            targets.append(ProbeTarget(name, tag.split("/")[0] if tag else name.lower().replace(" ", "-")))
        if only:
            targets = [t for t in targets if any(same_provider(s, t) for s in only)]
        if ignore:
            targets = [t for t in targets if not any(same_provider(s, t) for s in ignore)]
    elif only or order:
        targets = [ProbeTarget(n, n) for n in (only or order or [])]
    ref = next((t for t in targets if same_provider(reference, t)), ProbeTarget(reference, reference))
    targets = [ref] + [t for t in targets if t != ref]
    if len(targets) < 2:
        raise ValueError(f"no provider to compare with the reference {reference!r}: set [fidelity.probes] providers")
    return targets


# -- what it costs ------------------------------------------------------------------------------------------

def listing_prices(doc: Any) -> dict[str, tuple[float, float]]:
    """``{provider_name: (USD per prompt token, USD per completion token)}`` from OpenRouter's endpoints
    listing (``data.endpoints[].pricing``, USD-per-token strings); providers without a usable price left out
    (the first endpoint of a provider wins)."""
    data = doc.get("data") if isinstance(doc, dict) else None
    eps = data.get("endpoints") if isinstance(data, dict) else None
    out: dict[str, tuple[float, float]] = {}
    for e in eps if isinstance(eps, list) else []:
        pr = e.get("pricing") if isinstance(e, dict) else None
        name = e.get("provider_name") if isinstance(e, dict) else None
        if not isinstance(pr, dict) or not isinstance(name, str) or name in out:
            continue
        try:
            pin, pout = float(pr.get("prompt")), float(pr.get("completion"))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if math.isfinite(pin) and math.isfinite(pout) and pin >= 0 and pout >= 0:
            out[name] = (pin, pout)
    return out


def prompt_tokens_estimate(p: Probe) -> int:
    """A probe's prompt tokens, estimated: characters of the messages' text and of the tools' JSON / 4, plus
    4 per message (the ingest heuristic, :func:`engine.run.ingest.estimate_prompt_tokens`)."""
    chars = sum(len(json.dumps(m.get("content"), ensure_ascii=False)) for m in p.messages)
    chars += len(json.dumps(p.tools, ensure_ascii=False)) if p.tools else 0
    return chars // 4 + 4 * len(p.messages)


@dataclass(frozen=True)
class CostProjection:
    """What the probes will cost, before one is sent.

    Attributes:
        probes / providers / repeats: the counts; requests = probes x providers x repeats.
        est_usd: USD with each completion using :data:`EXPECTED_SHARE` of ``max_tokens``; max_usd: every
            completion at ``max_tokens``. Providers without a known price count $0 and are named in ``unpriced``.
    """

    probes: int
    providers: int
    repeats: int
    est_usd: float
    max_usd: float
    unpriced: tuple[str, ...] = ()

    @property
    def requests(self) -> int:
        """Requests the probes send (one attempt each; retries of failed attempts come on top)."""
        return self.probes * self.providers * self.repeats

    def line(self) -> str:
        """``probes: 24 x 4 providers = 96 requests, est. $0.41 (max $0.93 at max_tokens)`` (plus the repeats and
        the providers whose price is unknown)."""
        rep = f" x {self.repeats} repeats" if self.repeats > 1 else ""
        s = (f"probes: {self.probes} x {self.providers} providers{rep} = {self.requests} requests, "
             f"est. ${self.est_usd:.2f} (max ${self.max_usd:.2f} at max_tokens)")
        if self.unpriced:
            s += f"; price unknown for {', '.join(self.unpriced)} (counted $0)"
        return s


def project_cost(probes: Sequence[Probe], targets: Sequence[ProbeTarget], repeats: int, max_tokens: int,
                 prices: Mapping[str, tuple[float, float] | None]) -> CostProjection:
    """The :class:`CostProjection` of sending every probe ``repeats`` times to every target; ``prices`` maps a
    target's ``name`` to (USD per prompt token, USD per completion token), None or missing: unknown."""
    prompt = sum(prompt_tokens_estimate(p) for p in probes)
    est = mx = 0.0
    unpriced: list[str] = []
    for t in targets:
        pr = prices.get(t.name)
        if pr is None:
            unpriced.append(t.name)
            continue
        n = len(probes) * repeats
        est += repeats * prompt * pr[0] + n * EXPECTED_SHARE * max_tokens * pr[1]
        mx += repeats * prompt * pr[0] + n * max_tokens * pr[1]
    return CostProjection(len(probes), len(targets), repeats, est, mx, tuple(unpriced))


