"""The prompt rule: one adapter's whole conversation -> the prompt, the same for every format.

``docs/prompt-construction.md`` states the rule per format; :func:`normalise_conversation` first brings
the conversation into SpecForge's role order (:mod:`engine.datasets.roles`, ``docs/specforge-roles.md``),
then :func:`cut_prompt` decides what becomes the prompt (a conversation ending on a user or tool turn is
the prompt whole; one ending on an assistant turn is cut just before it; anything else is rejected),
validates it, and moves the reasoning of the assistant turns it keeps out of their content
(:mod:`engine.datasets.reasoning`). Pure (no I/O).
"""

from __future__ import annotations

from typing import Any

from engine.datasets.adapters import AdapterError, Conversation
from engine.datasets.kinds import kind_of
from engine.datasets.reasoning import ReasoningError, move_reasoning
from engine.datasets.roles import normalise, specforge_parse
from engine.prompts import Became

_MISSING = object()



def normalise_conversation(conv: Conversation) -> tuple[Conversation, list[str]]:
    """Normalise a conversation's role order with the one rule of :mod:`engine.datasets.roles`
    (leading non-user turns: system ones merged into one system turn, others dropped; consecutive
    same-role user/assistant/system turns merged). Returns the new conversation and one note per change."""
    numbers = conv.numbers if conv.numbers is not None else [
        i - conv.offset + 1 if i >= conv.offset else None for i in range(len(conv.messages))]
    messages, numbers, notes = normalise(conv.messages, numbers)
    return Conversation(messages, conv.tools, conv.offset, numbers), notes


def cut_prompt(conv: Conversation) -> tuple[list[dict[str, Any]], Became]:
    """Apply the prompt rule, validate, and move earlier turns' reasoning; return the prompt messages.

    The ONE rule for every format (``docs/prompt-construction.md``), applied after
    :func:`normalise_conversation`: a conversation ending on a ``user`` or ``tool`` turn IS the prompt
    (whole); one ending on an ``assistant`` turn is cut just before that final turn (its answer is what
    the generated turn replaces); one ending on a ``system`` turn fits no rule and is rejected. Then
    every assistant turn kept in the prompt has its reasoning moved out of ``content`` into
    ``reasoning_content`` (:func:`engine.datasets.reasoning.move_reasoning`).

    The prompt followed by the generated assistant turn must keep every turn under SpecForge's role
    rules (:func:`engine.datasets.roles.specforge_parse`), else the row is rejected: SpecForge would
    cut the conversation before the generated turn.

    Returns:
        ``(messages, became)``: the prompt (new dicts where reasoning moved; ``conv`` is not mutated)
        and what the rule made of the row (:class:`engine.prompts.Became`).

    Raises:
        AdapterError: ``"empty conversation"``; ``"conversation ends on a system turn (message N): no
            prompt rule fits ..."``; ``"message N: null content"`` / ``"missing field 'content'"`` /
            ``"content is a T, expected a string"`` (null or missing content is fine on an assistant
            message with ``tool_calls``); ``"no user turn"``; ``"roles out of order: prompt ends with a
            R turn"``; ``"message N: final user turn is empty"``; ``"message N: roles out of SpecForge's
            order: ..."``; ``"message N: holds only reasoning, no visible answer"`` /
            ``"message N: 'reasoning' is a T, expected a string"`` (an assistant turn kept in the prompt).
    """
    messages = conv.messages
    if not messages:
        raise AdapterError("empty conversation")
    ended_on = messages[-1]["role"]
    if ended_on == "assistant":
        prompt, cut_at = messages[:-1], conv.label(len(messages) - 1)
    elif ended_on in ("user", "tool"):
        prompt, cut_at = list(messages), ""
    else:
        raise AdapterError(f"conversation ends on a {ended_on} turn ({conv.label(len(messages) - 1)}): no prompt "
                           f"rule fits (a prompt is a conversation ending on a user or tool turn, or one ending on an "
                           f"assistant turn cut before it)")

    for i, m in enumerate(prompt):
        content = m.get("content", _MISSING)
        if isinstance(content, str):
            continue
        if m["role"] == "assistant" and m.get("tool_calls") and (content is None or content is _MISSING):
            continue
        if content is None:
            raise AdapterError(f"{conv.label(i)}: null content")
        if content is _MISSING:
            raise AdapterError(f"{conv.label(i)}: missing field 'content'")
        raise AdapterError(f"{conv.label(i)}: content is {kind_of(content)}, expected a string")
    if not any(m["role"] == "user" for m in prompt):
        raise AdapterError("no user turn" + (" before the last assistant turn" if cut_at else ""))
    end = prompt[-1]
    if end["role"] not in ("user", "tool"):
        raise AdapterError(f"roles out of order: prompt ends with a {end['role']} turn ({conv.label(len(prompt) - 1)})")
    if end["role"] == "user" and not end["content"].strip():
        raise AdapterError(f"{conv.label(len(prompt) - 1)}: final user turn is empty")
    cut = specforge_parse([*prompt, {"role": "assistant", "content": ""}])
    if cut.dropped:
        raise AdapterError(f"{conv.label(cut.dropped[0])}: roles out of SpecForge's order: a {prompt[cut.dropped[0]]['role']} "
                           f"turn before the first user turn (SpecForge's parser drops it)")
    if cut.truncated_at is not None:
        raise AdapterError(f"{conv.label(cut.truncated_at)}: roles out of SpecForge's order: {cut.reason} "
                           f"(SpecForge's parser would cut the conversation there, before the generated turn)")
    out: list[dict[str, Any]] = []
    moved: list[str] = []
    for i, m in enumerate(prompt):
        try:
            m, split = move_reasoning(m)
        except ReasoningError as e:
            raise AdapterError(f"{conv.label(i)}: {e}") from None
        if split is not None:
            moved.append(f"{conv.label(i)} ({', '.join(split.styles)})")
        out.append(m)
    return out, Became(ended_on, cut_at, tuple(moved))
