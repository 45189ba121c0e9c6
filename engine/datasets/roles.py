"""Role order: the one rule every adapter's conversation is normalised to, and SpecForge's own role rules.

A SpecForge export row is ``prompt + [generated assistant turn]``. SpecForge's ``GeneralParser.parse``
(``sgl-project/SpecForge``, ``specforge/data/parse.py``; see ``docs/specforge-roles.md``) walks the
turns and *truncates* the conversation at the first turn out of order, so a prompt whose roles
do not follow its rules would train the draft model on the dataset's old text instead of the
generated turn. Every prompt is therefore normalised at ingest (:func:`normalise`) and then checked
against a transcription of those rules (:func:`specforge_parse`); a prompt the rule cannot repair is
rejected with the reason.

The normalisation rule (applied to the whole conversation, before the prompt rule of
``docs/prompt-construction.md`` cuts a final assistant turn):

1. **Head**: the turns before the first ``user`` turn: its ``system`` turns become ONE leading system
   turn (contents joined with :data:`SEPARATOR`); its other turns (an assistant greeting, a tool
   output) are dropped. SpecForge keeps only the first message as system and drops every other
   turn before the first user turn: dropping them here keeps the prompt sent = the prompt trained.
2. **Runs**: consecutive turns of the same role ``user``, ``assistant`` or ``system`` merge into one
   (string contents joined with :data:`SEPARATOR`, empty parts skipped; an assistant's
   ``tool_calls`` concatenated in order, its reasoning fields (``reasoning_content`` or ``reasoning``)
   joined into one ``reasoning_content``). ``tool`` turns never merge (each answers its own call).
   A turn whose content is neither a string nor null (content parts) does not merge.

Functions here are pure (no I/O).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: What joins the contents of merged turns.
SEPARATOR = "\n\n"
_MERGEABLE = frozenset({"user", "assistant", "system"})


@dataclass(frozen=True, slots=True)
class SpecForgeCut:
    """What SpecForge's parser keeps of one conversation (its role rules only; no tokenizer).

    Attributes:
        kept: indices (into the input) of the messages it trains on, in order.
        dropped: indices of leading non-user turns it dropped (after the optional first system turn).
        truncated_at: index of the turn where it cut the conversation, or None when it kept the rest.
        reason: why it cut there (SpecForge's own wording), ``""`` when not cut.
    """

    kept: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    truncated_at: int | None = None
    reason: str = ""


def _role(m: dict[str, Any]) -> str:
    role = m.get("role", m.get("from", ""))
    return {"human": "user", "gpt": "assistant"}.get(role, role)


def specforge_parse(conversation: list[dict[str, Any]]) -> SpecForgeCut:
    """Apply the role rules of SpecForge's ``GeneralParser.parse`` to ``conversation``.

    Rules (``specforge/data/parse.py`` at sgl-project/SpecForge a6b6b02, 2026-08): roles ``human``/``gpt``
    read as ``user``/``assistant``; a first ``system`` message is kept as the system prompt; then
    leading turns that are not ``user`` are dropped; then, walking the rest, the first turn must be
    ``user``, a ``tool`` turn must follow an ``assistant`` or ``tool`` turn and an ``assistant`` turn
    must follow a ``user`` or ``tool`` turn, else the conversation is truncated before that turn
    (any other role, a later ``system`` included, is accepted anywhere).

    Args:
        conversation: messages with ``role`` (or ShareGPT ``from``); must not be empty.

    Returns:
        the :class:`SpecForgeCut`.
    """
    kept: list[int] = []
    rest = list(range(len(conversation)))
    if rest and _role(conversation[0]) == "system":
        kept.append(0)
        rest = rest[1:]
    dropped = []
    while rest and _role(conversation[rest[0]]) != "user":
        dropped.append(rest.pop(0))
    for j, i in enumerate(rest):
        role = _role(conversation[i])
        if j == 0:
            if role != "user":  # unreachable after the drop above; SpecForge checks it anyway
                return SpecForgeCut(kept, dropped, i, f"Conversation must start with a 'user' role, but found '{role}'")
        else:
            prev = _role(conversation[rest[j - 1]])
            if role == "tool" and prev not in ("assistant", "tool"):
                return SpecForgeCut(kept, dropped, i, f"A 'tool' message must follow an 'assistant' or 'tool' "
                                                      f"message, but was preceded by '{prev}'")
            if role == "assistant" and prev not in ("user", "tool"):
                return SpecForgeCut(kept, dropped, i, f"An 'assistant' message must follow a 'user' or 'tool' "
                                                      f"message, but was preceded by '{prev}'")
        kept.append(i)
    return SpecForgeCut(kept, dropped)


def specforge_problem(conversation: list[dict[str, Any]]) -> str | None:
    """Why SpecForge's parser would not train on all of ``conversation`` (a leading turn dropped, or
    the conversation truncated; index 0-based), or None when it keeps every turn."""
    cut = specforge_parse(conversation)
    if cut.truncated_at is not None:
        return f"truncated before turn {cut.truncated_at}: {cut.reason}"
    if cut.dropped:
        return f"leading turn(s) {cut.dropped} dropped (not user, before the first user turn)"
    return None


def _mergeable(m: dict[str, Any]) -> bool:
    content = m.get("content")
    return m["role"] in _MERGEABLE and (isinstance(content, str) or (content is None and m["role"] == "assistant"
                                                                       and bool(m.get("tool_calls"))))


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    parts = [c for c in (a.get("content"), b.get("content")) if isinstance(c, str) and c]
    out["content"] = SEPARATOR.join(parts)
    calls = list(a.get("tool_calls") or []) + list(b.get("tool_calls") or [])
    if calls:
        out["tool_calls"] = calls
    for key, value in b.items():
        out.setdefault(key, value)
    reasoning = [m.get("reasoning_content") or m.get("reasoning") for m in (a, b)]
    fields = [m.get(k) for m in (a, b) for k in ("reasoning_content", "reasoning")]
    if any(reasoning) and all(isinstance(v, str) or v is None for v in fields):
        # both turns' reasoning fields, joined (one would be lost); docs/prompt-construction.md
        out.pop("reasoning", None)
        out["reasoning_content"] = SEPARATOR.join(r for r in reasoning if r)
    return out


def normalise(messages: list[dict[str, Any]], numbers: list[int | None]) -> tuple[
        list[dict[str, Any]], list[int | None], list[str]]:
    """Apply the module's normalisation rule (head, then runs) to a whole conversation.

    Args:
        messages: OpenAI-shape messages (``role`` in ``engine.prompts.ROLES``).
        numbers: per message, its 1-based number in the row's own turn list (None for a message the
            adapter added, e.g. from a ``system`` field); same length as ``messages``.

    Returns:
        ``(messages, numbers, notes)``: the normalised messages (new dicts where changed; inputs are not
        mutated), each one's number (a merged turn takes its first turn's number) and one note per
        change, e.g. ``"dropped message 1 (assistant) before the first user turn"``,
        ``"merged messages 2-3 (assistant)"``. A conversation without a user turn is returned unchanged.
    """
    first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
    if first_user is None:
        return list(messages), list(numbers), []
    notes: list[str] = []
    out: list[dict[str, Any]] = []
    nums: list[int | None] = []
    for i in range(first_user):
        m = messages[i]
        if m["role"] != "system":
            notes.append(f"dropped {_name(numbers[i])} ({m['role']}) before the first user turn")
            continue
        out.append(m)
        nums.append(numbers[i])
    span: list[list[int | None]] = [[n] for n in nums]
    for i in range(first_user, len(messages)):
        out.append(messages[i])
        nums.append(numbers[i])
        span.append([numbers[i]])
    merged: list[dict[str, Any]] = []
    mnums: list[int | None] = []
    mspan: list[list[int | None]] = []
    for m, n, s in zip(out, nums, span, strict=True):
        if merged and m["role"] == merged[-1]["role"] and _mergeable(m) and _mergeable(merged[-1]):
            merged[-1] = _merge(merged[-1], m)
            mspan[-1] = mspan[-1] + s
            continue
        merged.append(m)
        mnums.append(n)
        mspan.append(list(s))
    for m, s in zip(merged, mspan, strict=True):
        if len(s) > 1:
            notes.append(f"merged {_names(s)} ({m['role']})")
    return merged, mnums, notes


def _name(number: int | None) -> str:
    return "the 'system' field" if number is None else f"message {number}"


def _names(numbers: list[int | None]) -> str:
    own = [n for n in numbers if n is not None]
    extra = "the 'system' field and " if len(own) < len(numbers) else ""
    if not own:
        return "the 'system' field"
    if own == list(range(own[0], own[-1] + 1)):
        return f"{extra}messages {own[0]}-{own[-1]}" if len(own) > 1 else f"{extra}message {own[0]}"
    return extra + "messages " + ", ".join(map(str, own))
