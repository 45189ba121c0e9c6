"""The finish reasons of a chat completion and their accepted aliases (pure; no engine import).

Shared by the ``[provider] finish_reasons`` config check and the client
(:mod:`engine.client.conformance`); the contract is docs/wire-conformance.md ("What a finish means").
"""

from __future__ import annotations

from collections.abc import Mapping

#: Finish reasons accepted by default as another spelling of a standard one (compared lower-case):
#: Together ``eos``, gateways ``end``, Anthropic-style ``end_turn``/``stop_sequence``/``tool_use``/
#: ``max_tokens``, Gemini ``STOP``/``MAX_TOKENS``. ``[provider] finish_reasons`` adds more.
DEFAULT_FINISH_ALIASES: dict[str, str] = {
    "eos": "stop", "eos_token": "stop", "end": "stop", "end_turn": "stop", "stop_sequence": "stop",
    "max_tokens": "length", "max_output_tokens": "length", "tool_use": "tool_calls",
}
#: The standard finish reasons (OpenAI / OpenRouter's normalised set) an alias may map to.
STANDARD_FINISHES: frozenset[str] = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call"})


def finish_aliases(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The alias table in force: :data:`DEFAULT_FINISH_ALIASES` updated with ``extra`` (keys lower-cased).

    Raises:
        ValueError: an alias maps to something that is not a standard finish reason, or the alias is a
            standard finish reason itself (``stop = "length"`` would change what every reply means).
    """
    table = dict(DEFAULT_FINISH_ALIASES)
    for k, v in (extra or {}).items():
        if v not in STANDARD_FINISHES:
            raise ValueError(f"finish_reasons.{k}: expected one of {sorted(STANDARD_FINISHES)}, got {v!r}")
        if str(k).lower() in STANDARD_FINISHES:
            raise ValueError(f"finish_reasons.{k}: {k!r} is a standard finish reason itself; only other "
                             f"spellings can be aliases")
        table[str(k).lower()] = v
    return table
