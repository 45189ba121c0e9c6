"""How each simulated provider serves a model-backed completion (``datagen sim --behaviours``). Pure.

A behaviour is one of:

- ``honest``: samples the target's distribution at the request's temperature and top_p
  (:func:`engine.fidelity.dist.sampling_distribution`).
- ``quant:KL``: samples a fake-quantized copy of the target whose per-token KL(target || copy), at
  temperature 1 on the rehearsal's sample contexts, is about ``KL`` nats (``engine.sim.quant``).
- ``temp:X``: samples the target at ``X`` times the requested temperature (a provider that misapplies
  temperature; greedy stays greedy).
- ``mix:F`` or ``mix:F/INNER``: per request, with probability ``F`` (seeded by the request's sequence
  number) served as ``INNER`` (``quant:KL`` or ``temp:X``), otherwise honestly: a provider that mixes
  backends. ``INNER`` defaults to :data:`DEFAULT_MIX_INNER` (``quant:0.1``: over its requests the mix
  drifts as much on average as a ``quant:0.03`` provider does on each).

Spec: ``"SimA=honest,SimB=honest,SimQ=quant:0.03,SimT=temp:1.4,SimM=mix:0.3"``; a provider without a
behaviour is honest.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

#: The inner behaviour of ``mix:F`` when not given.
DEFAULT_MIX_INNER = "quant:0.1"
KINDS = ("honest", "quant", "temp", "mix")


@dataclass(frozen=True)
class Behaviour:
    """One provider's behaviour.

    Attributes:
        kind: ``honest`` | ``quant`` | ``temp`` | ``mix``.
        value: ``quant``: the KL target (nats/token); ``temp``: the temperature factor; ``mix``: the
            share of requests (0..1) served as ``inner``; ``honest``: 0.
        inner: the drifted behaviour of a ``mix`` (``quant`` or ``temp``), else None.
    """

    kind: str
    value: float = 0.0
    inner: "Behaviour | None" = None

    def __str__(self) -> str:
        if self.kind == "honest":
            return "honest"
        if self.kind == "mix":
            return f"mix:{self.value:g}/{self.inner}"
        return f"{self.kind}:{self.value:g}"


@dataclass(frozen=True)
class Served:
    """How one request is served.

    Attributes:
        quant_kl: None = the target's weights; else the KL target (nats) of the quantized copy used.
        temp_factor: multiplies the request's temperature (1.0 = as asked).
        label: ``honest`` | ``quant:KL`` | ``temp:X`` (what served it, for logs and tests).
    """

    quant_kl: float | None
    temp_factor: float
    label: str


HONEST = Behaviour("honest")


def parse_behaviour(text: str) -> Behaviour:
    """Parse one behaviour (``honest``, ``quant:KL``, ``temp:X``, ``mix:F[/INNER]``).

    Raises:
        ValueError: unknown kind, a missing or non-numeric value, ``KL <= 0``, ``X <= 0``, ``F`` outside
            [0, 1], or a mix whose inner behaviour is not ``quant`` or ``temp``.
    """
    t = text.strip()
    if t == "honest":
        return HONEST
    kind, sep, rest = t.partition(":")
    if kind not in KINDS or not sep:
        raise ValueError(f"behaviour {text!r}: expected honest, quant:KL, temp:X or mix:F[/quant:KL|/temp:X]")
    inner_text = None
    if kind == "mix":
        rest, _, inner_text = rest.partition("/")
        inner_text = inner_text or DEFAULT_MIX_INNER
    try:
        value = float(rest)
    except ValueError:
        raise ValueError(f"behaviour {text!r}: {rest!r} is not a number") from None
    if kind == "quant" and not value > 0:
        raise ValueError(f"behaviour {text!r}: the KL target must be > 0 nats")
    if kind == "temp" and not value > 0:
        raise ValueError(f"behaviour {text!r}: the temperature factor must be > 0")
    if kind == "mix":
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"behaviour {text!r}: the mixed share must be within [0, 1]")
        inner = parse_behaviour(inner_text or DEFAULT_MIX_INNER)
        if inner.kind not in ("quant", "temp"):
            raise ValueError(f"behaviour {text!r}: a mix serves its drifted share as quant:KL or temp:X")
        return Behaviour("mix", value, inner)
    return Behaviour(kind, value)


def parse_behaviours(spec: str) -> dict[str, Behaviour]:
    """``"A=honest,Q=quant:0.03"`` -> ``{provider: Behaviour}`` (empty spec -> ``{}``).

    Raises:
        ValueError: an entry without ``=``, an empty or repeated provider name, or a bad behaviour.
    """
    out: dict[str, Behaviour] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, text = part.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"behaviours: {part!r} is not PROVIDER=BEHAVIOUR")
        if name in out:
            raise ValueError(f"behaviours: provider {name!r} given twice")
        out[name] = parse_behaviour(text)
    return out


def quant_targets(behaviours: dict[str, Behaviour]) -> list[float]:
    """The distinct KL targets (nats) of the quantized copies the behaviours need, ascending."""
    kls = set()
    for b in behaviours.values():
        for x in (b, b.inner):
            if x is not None and x.kind == "quant":
                kls.add(x.value)
    return sorted(kls)


def serve(b: Behaviour, seed: int, seq: int) -> Served:
    """How request ``seq`` is served by a provider with behaviour ``b`` (a ``mix`` draws one seeded
    uniform per ``(seed, seq)``)."""
    if b.kind == "mix":
        assert b.inner is not None
        u = random.Random(f"sim-mix:{seed}:{seq}").random()
        return serve(b.inner, seed, seq) if u < b.value else serve(HONEST, seed, seq)
    if b.kind == "quant":
        return Served(b.value, 1.0, str(b))
    if b.kind == "temp":
        return Served(None, b.value, str(b))
    return Served(None, 1.0, "honest")
