"""The simulator's fault specification: :data:`FAULT_KINDS`, :func:`parse_faults`, :func:`validate_faults`.

Beside the simulator package (``engine/sim/``), not in it: ``engine.config`` checks ``[provider.sim]
faults`` with it, and the simulator imports the tokenizer, which imports the config, so a parser inside
``engine/sim/`` would close an import cycle between the packages. Pure: no imports at all.
"""

from __future__ import annotations

#: Fault kinds the simulator can inject, in the order their probabilities are stacked when one
#: uniform draw per request picks the fault (so a given seed gives the same fault sequence).
#:
#: - ``429``: HTTP 429 (``Retry-After: 1`` on every other one, ``X-RateLimit-Reset`` epoch-ms on the rest)
#: - ``500`` / ``502`` / ``503``: HTTP 5xx with an OpenRouter-shaped error body
#: - ``402``: HTTP 402, ``metadata.error_type == "payment_required"``
#: - ``midstream``: part of the completion, then an error chunk (HTTP 200), no ``[DONE]``
#: - ``disconnect``: part of the stream, then the TCP connection is aborted
#: - ``stall``: part of the stream, then silence for ``stall_s`` seconds (socket kept open)
#: - ``padding``: whitespace before a non-stream JSON body / extra keep-alive comments in a stream
#: - ``200error``: HTTP 200 whose body (or first stream chunk) is an error
#:
#: Data faults (the request completes; the RESPONSE carries a defect a real provider can introduce,
#: for testing token reconstruction, see ``engine.sim.generator.inject_data_fault``):
#:
#: - ``toolid``: tool-call ids rewritten to ``call_...`` (billing unchanged: the model generated its
#:   native ``functions.NAME:IDX`` id)
#: - ``leak``: reasoning leaked into content (``reasoning`` empty, ``content`` = reasoning +
#:   ``</think>`` + content; usage unchanged)
#: - ``split``: the provider's tokens were a non-canonical split of the text: usage reports
#:   ``max(3, 1%)`` more completion tokens than the canonical encoding
#: - ``badargs``: tool-call ``arguments`` is not valid JSON (closing brace missing)
FAULT_KINDS: tuple[str, ...] = (
    "429",
    "500",
    "502",
    "503",
    "402",
    "midstream",
    "disconnect",
    "stall",
    "padding",
    "200error",
    "toolid",
    "leak",
    "split",
    "badargs",
)


def validate_faults(faults: dict[str, float]) -> None:
    """Raise ValueError for an unknown kind, a probability outside [0, 1] or a sum above 1."""
    total = 0.0
    for kind, p in faults.items():
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r} (known: {', '.join(FAULT_KINDS)})")
        if not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"fault {kind!r}: probability {p!r} is outside [0, 1]")
        total += float(p)
    if total > 1.0 + 1e-9:
        raise ValueError(f"fault probabilities sum to {total:g}, more than 1")


def parse_faults(spec: str) -> dict[str, float]:
    """Parse ``"429:0.05,502:0.03"`` into ``{"429": 0.05, "502": 0.03}``.

    Empty items are skipped; an empty spec gives ``{}``. Raises ValueError naming the bad item,
    an unknown kind, a probability outside [0, 1], or probabilities summing above 1.
    """
    out: dict[str, float] = {}
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        kind, sep, prob = item.partition(":")
        kind = kind.strip()
        if not sep or not kind:
            raise ValueError(f"bad fault item {item!r}: expected KIND:PROBABILITY")
        try:
            p = float(prob)
        except ValueError:
            raise ValueError(f"bad fault item {item!r}: {prob.strip()!r} is not a number") from None
        if kind not in FAULT_KINDS:
            raise ValueError(f"bad fault item {item!r}: unknown kind {kind!r} (known: {', '.join(FAULT_KINDS)})")
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"bad fault item {item!r}: probability {p:g} is outside [0, 1]")
        out[kind] = out.get(kind, 0.0) + p
    validate_faults(out)
    return out
