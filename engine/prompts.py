"""Prompts: the unit of work, and the stable key that makes resume independent of row order.

A prompt is a list of OpenAI-shape chat messages (``{"role", "content", ...}``) that ends with a
``user`` or ``tool`` turn, plus an optional list of OpenAI-shape tool definitions. Its key is the
SHA-256 of its canonical JSON (sorted keys, no whitespace, UTF-8), so the same conversation gets the
same key whichever file row, order or run it comes from (pitfall 4 of ``docs/eagle3-data.md``: resume by
a stable key, never by counting output lines).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

#: Roles a prompt message may carry (OpenAI chat-completions roles).
ROLES = frozenset({"system", "user", "assistant", "tool"})


def canonical_json(obj: Any) -> str:
    """Serialise ``obj`` deterministically: sorted keys, no spaces, non-ASCII kept as UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def prompt_key(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    """Return the stable key of a prompt: 32 hex chars (128 bits) of SHA-256 over canonical JSON.

    ``tools`` of ``None`` and ``[]`` give the same key.
    """
    payload = canonical_json({"messages": messages, "tools": tools or []})
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Became:
    """What the prompt rule made of one row (``docs/prompt-construction.md``).

    Attributes:
        ended_on: role of the conversation's final turn after role normalisation: ``"user"`` or
            ``"tool"`` (the whole conversation is the prompt) or ``"assistant"`` (cut before it).
        cut_at: when ``ended_on`` is ``"assistant"``, how reasons name the cut turn (``"message 4"``);
            ``""`` otherwise.
        reasoning: one text per assistant turn kept in the prompt whose inline reasoning was moved into
            ``reasoning_content``, e.g. ``"message 2 (<think>)"``; empty when none.
    """

    ended_on: str
    cut_at: str = ""
    reasoning: tuple[str, ...] = ()

    @property
    def cut(self) -> bool:
        """True when the row's final assistant turn was cut (its answer replaced by the generated one)."""
        return self.ended_on == "assistant"

    def describe(self) -> str:
        """One line for logs, e.g. ``"cut before the final assistant turn (message 4); inline reasoning
        moved to reasoning_content: message 2 (<think>)"``."""
        text = (f"cut before the final assistant turn ({self.cut_at})" if self.cut
                else f"whole conversation (ends on a {self.ended_on} turn)")
        if self.reasoning:
            text += "; inline reasoning moved to reasoning_content: " + ", ".join(self.reasoning)
        return text


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt ready to send.

    Attributes:
        messages: OpenAI-shape chat messages; the last one has role ``user`` or ``tool``.
        tools: OpenAI-shape tool definitions (``{"type": "function", "function": {...}}``), or empty.
        key: :func:`prompt_key` of ``messages`` and ``tools``.
        source: where it came from, ``"path:line"`` (line is 1-based; for a JSON array, the element
            index + 1; for Parquet, the row index + 1).
        notes: what ingest changed to bring the row's turns into SpecForge's role order (one text per
            change, e.g. ``"merged messages 2-3 (assistant)"``; see ``engine.datasets.roles``); empty
            when nothing changed. Not part of the key or of equality.
        became: what the prompt rule made of the row (whole conversation or cut, reasoning moved), or
            None when not built from a dataset row. Not part of the key or of equality.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    key: str = ""
    source: str = ""
    notes: tuple[str, ...] = field(default=(), compare=False)
    became: Became | None = field(default=None, compare=False)

    @staticmethod
    def make(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, source: str,
             notes: tuple[str, ...] | list[str] = (), became: Became | None = None) -> "Prompt":
        """Build a prompt and compute its key."""
        tools = list(tools or [])
        return Prompt(messages=messages, tools=tools, key=prompt_key(messages, tools), source=source,
                      notes=tuple(notes), became=became)

    def char_count(self) -> int:
        """Characters of text in the prompt (message contents + tool JSON), for token estimates."""
        n = 0
        for m in self.messages:
            c = m.get("content")
            if isinstance(c, str):
                n += len(c)
            elif c is not None:
                n += len(canonical_json(c))
        if self.tools:
            n += len(canonical_json(self.tools))
        return n


@dataclass(frozen=True, slots=True)
class Reject:
    """A dataset row that could not become a prompt.

    Attributes:
        source: ``"path:line"`` as in :class:`Prompt`.
        reason: short human-readable reason, e.g. ``"invalid JSON: Expecting ',' delimiter"``.
    """

    source: str
    reason: str

    def __str__(self) -> str:
        return f"{self.source}: {self.reason}"
