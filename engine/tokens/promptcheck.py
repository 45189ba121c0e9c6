"""The ingest-time prompt check: render each prompt before anything is bought, and flag typed
special-token text.

When ``[tokenizer]`` is configured, ingest runs every prompt through :class:`PromptChecker`:

- **Render**: the prompt is rendered and encoded by :func:`engine.tokens.reconstruct.prompt_ids`,
  the very function validation uses to build a record's prompt ids (chat template with the
  generation prompt, then ``encode_chat``). A prompt the template cannot render (the template
  raised, e.g. ``raise_exception`` on an unknown role, a string where it iterates a list, a missing
  field it dereferences) or that cannot be encoded is rejected at ingest with the reason: it would
  otherwise be sent, paid for, and then fail validation with ``render_error``.
- **Special-token text** (``special_text_in_prompt``): a special token's TEXT typed inside a message's
  content (``<|im_end|>``, ``<think>``... any text of the tokenizer's special ids) becomes that
  special id when the rendered prompt is encoded, as serving stacks do (docs/prompt-checks.md).
  The same holds for tool-call arguments and tool schemas.
  ``[tokenizer] prompt_special_text = "keep"`` (default) keeps such prompts and flags them (stored
  per prompt, counted per dataset in ``datagen status`` and ``datagen validate``); ``"reject"``
  rejects them at ingest, naming the token text and the message.

Text searched: every text the template renders: ``content`` of every message (a string, or the
``text`` of ``{"type": "text"}`` parts), whatever the role; an assistant turn's ``reasoning_content``;
tool-call ids and ``arguments``; every string (keys included) of the tool declarations (a description
reaches the prompt through the TypeScript declaration).

Rendering costs about 0.15 ms per 1,000 prompt characters (demo Kimi-layout tokenizer, one core;
figures in docs/prompt-checks.md); it runs in ingest's worker thread, and an unchanged file is not
re-read. Facts and the rule in full: docs/prompt-checks.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from engine.tokens.reconstruct import prompt_ids
from engine.tokens.template import TemplateError
from engine.tokens.tokenizer import Tokenizer

#: ``[tokenizer] prompt_special_text`` values.
SpecialTextPolicy = Literal["keep", "reject"]


@dataclass(frozen=True)
class SpecialText:
    """One special-token text found in a prompt's rendered text fields.

    Attributes:
        token: the special token's text (e.g. ``"<|im_end|>"``).
        message: 1-based position of the message in the prompt; 0 for the tool declarations.
        role: that message's role (``"tools"`` for the tool declarations).
        part: where in the message: ``"content"``, ``"reasoning_content"``, ``"tool call arguments"``,
            ``"tool call id"`` (empty for the tool declarations).
    """

    token: str
    message: int
    role: str
    part: str = "content"

    def __str__(self) -> str:
        if self.message == 0:
            return f"{self.token!r} in the tool declarations"
        where = "" if self.part == "content" else f" {self.part}"
        return f"{self.token!r} in message {self.message} ({self.role}){where}"


@dataclass(frozen=True)
class PromptVerdict:
    """What the ingest check found on one prompt.

    Attributes:
        error: why the prompt cannot be rendered (``"chat template failed: ..."``, or
            ``"prompt cannot be rendered and encoded: ..."`` for any other error), or None.
        tokens: length of the rendered prompt (tokens, generation prompt included); None on error.
        special: special-token texts found in message contents (empty when none).
    """

    error: str | None
    tokens: int | None = None
    special: tuple[SpecialText, ...] = field(default=())

    def special_summary(self) -> str | None:
        """``"'<|im_end|>' in message 2 (user); ..."`` (stored per prompt), or None when none."""
        return "; ".join(str(s) for s in self.special) if self.special else None


def special_token_texts(tok: Tokenizer) -> list[str]:
    """Texts of ``tok``'s special ids that contain a non-space character, longest first."""
    texts: set[str] = set()
    for i in tok.backend.special_ids:
        t = tok.decode([i])
        if t.strip() and "\ufffd" not in t:
            texts.add(t)
    return sorted(texts, key=lambda t: (-len(t), t))


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return []


def _parts(m: dict[str, Any]) -> list[tuple[str, str]]:
    """``(part, text)`` of every text field of message ``m`` the chat template renders."""
    out = [("content", t) for t in _texts(m.get("content"))]
    if isinstance(m.get("reasoning_content"), str):
        out.append(("reasoning_content", m["reasoning_content"]))
    for c in m.get("tool_calls") or []:
        if not isinstance(c, dict):
            continue
        if isinstance(c.get("id"), str):
            out.append(("tool call id", c["id"]))
        fn = c.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            out.append(("tool call arguments", fn["arguments"]))
    return out


def _strings(value: Any) -> list[str]:
    """Every string inside a JSON value (keys included), depth first."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


class PromptChecker:
    """Renders prompts and finds special-token text in them (see the module docstring).

    Args:
        tok: the loaded tokenizer (the one the run validates with).
        special_policy: ``"keep"`` (flag only) or ``"reject"`` (:meth:`reject_reason` names it).

    Thread use: :meth:`check` only reads the tokenizer; ingest calls it from one worker thread.
    """

    def __init__(self, tok: Tokenizer, special_policy: SpecialTextPolicy = "keep") -> None:
        self.tok = tok
        self.special_policy = special_policy
        texts = special_token_texts(tok)
        self._pattern = re.compile("|".join(re.escape(t) for t in texts)) if texts else None

    def find_special(self, messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]] | None = None) -> tuple[SpecialText, ...]:
        """Special-token texts in every text the template renders: message contents, reasoning,
        tool-call ids and arguments, and every string of the tool declarations (each token once
        per message part, in order of appearance; the tool declarations first)."""
        if self._pattern is None:
            return ()
        out: list[SpecialText] = []
        seen: set[tuple[int, str, str]] = set()

        pattern = self._pattern

        def scan(n: int, role: str, part: str, text: str) -> None:
            for hit in pattern.findall(text):
                if (n, part, hit) not in seen:
                    seen.add((n, part, hit))
                    out.append(SpecialText(hit, n, role, part))

        for text in _strings(tools or []):
            scan(0, "tools", "", text)
        for n, m in enumerate(messages, 1):
            if isinstance(m, dict):
                for part, text in _parts(m):
                    scan(n, str(m.get("role", "?")), part, text)
        return tuple(out)

    def check(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> PromptVerdict:
        """Render and encode one prompt exactly as validation will, and look for special text.

        Returns:
            the :class:`PromptVerdict` (never raises on data: a template or encoder error is its
            ``error``).
        """
        special = self.find_special(messages, tools)
        try:
            _, ids = prompt_ids(self.tok, messages, tools)
        except TemplateError as e:
            msg = str(e)
            return PromptVerdict(error=msg if msg.startswith("chat template failed") else f"chat template failed: {msg}",
                                 special=special)
        except Exception as e:  # whatever else a row can make rendering or encoding raise
            return PromptVerdict(error=f"prompt cannot be rendered and encoded: {type(e).__name__}: {e}",
                                 special=special)
        return PromptVerdict(error=None, tokens=len(ids), special=special)

    def reject_reason(self, v: PromptVerdict) -> str | None:
        """Why ingest rejects a prompt with verdict ``v``, or None when it is kept."""
        if v.error is not None:
            return v.error
        if v.special and self.special_policy == "reject":
            return (f"special-token text {v.special_summary()} (it would be sent as special ids; "
                    f"[tokenizer] prompt_special_text = \"reject\")")
        return None
