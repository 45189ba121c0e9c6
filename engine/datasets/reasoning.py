"""Reasoning in earlier assistant turns: moved out of ``content`` into the turn's ``reasoning_content``.

Datasets distilled from reasoning models keep the model's reasoning inside the visible text of their
assistant turns: Mixture-of-Thoughts / OpenR1 style ``<think>...</think>answer``, OpenThoughts style
``<|begin_of_thought|>...<|end_of_thought|>`` then ``<|begin_of_solution|>answer<|end_of_solution|>``.
Left in ``content``, an earlier turn would put another model's reasoning into Kimi's prompt, its
markers as special tokens. Kimi's chat template reads a turn's reasoning from ``reasoning_content``
(it renders earlier plain turns as ``<think></think>{content}``, dropping it, and renders it inside a
trailing tool-call chain), so ingest moves it there: the prompt then holds each earlier turn as Kimi
renders its own history. Turns that already carry the reasoning as a field (``reasoning_content``, or
OpenRouter's ``reasoning``) keep it as ``reasoning_content``.

The rule and its edge cases are documented in ``docs/prompt-construction.md`` ("Reasoning in earlier
assistant turns"). Only assistant turns are touched (markers typed in user or system text are a
separate matter: the special-text flag). Everything here is pure (no I/O).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.datasets.kinds import kind_of
from engine.errors import DatagenError

#: Mixture-of-Thoughts / OpenR1 / DeepSeek-R1 style reasoning block.
THINK = ("<think>", "</think>")
#: OpenThoughts style reasoning block.
THOUGHT = ("<|begin_of_thought|>", "<|end_of_thought|>")
#: OpenThoughts style answer block: when present, its text is the visible answer.
SOLUTION = ("<|begin_of_solution|>", "<|end_of_solution|>")
#: Every marker string this module recognises.
MARKERS = (*THINK, *THOUGHT, *SOLUTION)
#: Field names read as a turn's reasoning, in order of preference (the first non-empty string wins).
REASONING_FIELDS = ("reasoning_content", "reasoning")
#: What joins separate reasoning pieces (several blocks, or a field and inline blocks).
SEPARATOR = "\n\n"


class ReasoningError(DatagenError, ValueError):
    """An assistant turn whose reasoning cannot be moved: ``str(err)`` is the reason (without the
    message number, which the caller adds)."""


@dataclass(frozen=True, slots=True)
class Split:
    """An assistant ``content`` string split into its visible answer and its inline reasoning.

    Attributes:
        content: the visible answer (no marker of :data:`MARKERS` left in it; outer whitespace and
            the blank lines around removed blocks stripped).
        reasoning: the text of the reasoning blocks, each stripped, joined with :data:`SEPARATOR`
            (``""`` when the blocks were empty).
        styles: which marker styles were found, in :data:`MARKERS` order: ``"<think>"``,
            ``"<|begin_of_thought|>"``, ``"<|begin_of_solution|>"``.
        unclosed: the opening marker of a reasoning block that was never closed (the rest of the text
            was reasoning), ``""`` when every block was closed.
    """

    content: str
    reasoning: str
    styles: tuple[str, ...]
    unclosed: str


def has_markers(text: str) -> bool:
    """True when ``text`` holds any marker of :data:`MARKERS`."""
    return any(m in text for m in MARKERS)


def _join(pieces: list[str]) -> str:
    """Concatenate text pieces, replacing the whitespace at each seam by one blank line."""
    out = ""
    for piece in pieces:
        if not piece.strip():
            continue
        out = f"{out.rstrip()}{SEPARATOR}{piece.lstrip()}" if out else piece
    return out.strip()


def _blocks(text: str, open_: str, close: str) -> tuple[list[str], list[str], bool]:
    """Cut the ``open_ ... close`` blocks out of ``text``.

    Returns ``(outside, inside, unclosed)``: the text pieces outside the blocks, the blocks' inner
    texts, and whether a block was still open at the end. A ``close`` with no ``open_`` before it
    (DeepSeek-R1 style, where the template wrote the opening marker) makes the text since the previous
    block (or the start) reasoning. An ``open_`` inside a block is part of that block's text.
    """
    outside: list[str] = []
    inside: list[str] = []
    pos = 0
    while True:
        o = text.find(open_, pos)
        c = text.find(close, pos)
        if o < 0 and c < 0:
            outside.append(text[pos:])
            return outside, inside, False
        if c >= 0 and (o < 0 or c < o):  # a close without its open: what came before it was reasoning
            inside.append(text[pos:c])
            pos = c + len(close)
            continue
        outside.append(text[pos:o])
        start = o + len(open_)
        c = text.find(close, start)
        if c < 0:
            inside.append(text[start:])
            return outside, inside, True
        inside.append(text[start:c])
        pos = c + len(close)


def split_inline(text: str) -> Split | None:
    """Split an assistant turn's ``content`` into visible answer and inline reasoning.

    Rules (``docs/prompt-construction.md``): OpenThoughts thought blocks, then ``<think>`` blocks, are
    reasoning, wherever they stand in the text; a closing marker without its opening one makes the
    text before it reasoning; an opening marker never closed makes the rest of the text reasoning
    (``unclosed``). What remains is the visible answer, except that when an
    ``<|begin_of_solution|>`` block is present the answer is the text of the solution block(s) only
    (its ``<|end_of_solution|>`` may be missing: then up to the end). Stray solution markers are removed.

    Args:
        text: the turn's content.

    Returns:
        the :class:`Split`, or None when ``text`` holds no marker (nothing to move).
    """
    if not has_markers(text):
        return None
    styles = tuple(s for s, pair in (("<think>", THINK), ("<|begin_of_thought|>", THOUGHT),
                                     ("<|begin_of_solution|>", SOLUTION)) if any(m in text for m in pair))
    reasoning: list[str] = []
    unclosed = ""
    rest = [text]
    for open_, close in (THOUGHT, THINK):
        outside: list[str] = []
        for piece in rest:
            out, inside, cut = _blocks(piece, open_, close)
            outside += out
            reasoning += inside
            unclosed = unclosed or (open_ if cut else "")
        rest = outside
    visible = _join(rest)
    if SOLUTION[0] in visible:
        _, answers, _ = _blocks(visible[visible.index(SOLUTION[0]):], *SOLUTION)
        visible = _join(answers)
    visible = _join([visible.replace(SOLUTION[0], "").replace(SOLUTION[1], "")])
    return Split(visible, SEPARATOR.join(r.strip() for r in reasoning if r.strip()), styles, unclosed)


def field_reasoning(message: dict[str, Any]) -> str:
    """The reasoning a message carries as a field: its ``reasoning_content``, else OpenRouter's
    ``reasoning`` (the first non-empty string of :data:`REASONING_FIELDS`); ``""`` when none.

    Raises:
        ReasoningError: a reasoning field holds something other than a string or null
            (``"'reasoning' is a dict, expected a string"``).
    """
    for key in REASONING_FIELDS:
        value = message.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ReasoningError(f"{key!r} is {kind_of(value)}, expected a string")
    for key in REASONING_FIELDS:
        value = message.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return ""


def move_reasoning(message: dict[str, Any]) -> tuple[dict[str, Any], Split | None]:
    """Move an assistant turn's reasoning out of ``content`` into ``reasoning_content``.

    The field reasoning (:func:`field_reasoning`) comes first, then the inline reasoning
    (:func:`split_inline`), joined with :data:`SEPARATOR`; ``content`` keeps the visible answer only;
    the ``reasoning`` key is removed (its text now in ``reasoning_content``, verbatim), and
    ``reasoning_content`` is absent when there is no reasoning at all. Messages of other roles are returned unchanged.

    Args:
        message: an OpenAI-shape message (not mutated).

    Returns:
        ``(message, split)``: the new message (the same object when nothing changed) and the
        :class:`Split` of its content (None when the content held no marker).

    Raises:
        ReasoningError: a reasoning field is not a string; or the content held reasoning and no visible
            answer is left while the turn has no ``tool_calls`` (``"holds only reasoning, no visible
            answer"``, ``"... (<think> never closed)"`` when a block was left open): a turn cut off while
            reasoning, which would stand in the prompt as an empty answer.
    """
    if message.get("role") != "assistant":
        return message, None
    kept = field_reasoning(message)
    content = message.get("content")
    split = split_inline(content) if isinstance(content, str) else None
    if split is None and not any(k in message for k in REASONING_FIELDS):
        return message, None
    if split is not None and not split.content and not message.get("tool_calls"):
        never = f" ({split.unclosed} never closed)" if split.unclosed else ""
        raise ReasoningError(f"holds only reasoning, no visible answer{never}")
    out = {k: v for k, v in message.items() if k not in REASONING_FIELDS}
    reasoning = SEPARATOR.join(r for r in (kept, split.reasoning) if r) if split is not None else kept
    if split is not None:
        out["content"] = split.content
    if reasoning:
        out["reasoning_content"] = reasoning
    return out, split
