"""Rendering conversations with the target's chat template.

Rendering goes through transformers' own Jinja machinery (``render_jinja_template``: the sandboxed
environment, ``tojson(separators=...)``, ``raise_exception``, loop controls, reasoning-field
aliases), so a template renders here exactly as ``apply_chat_template(tokenize=False)`` would, for
both tokenizer kinds. The template receives ``messages``, ``tools``, ``add_generation_prompt``,
the tokenizer's ``bos_token``/``eos_token``... and :meth:`Tokenizer.template_vars`.

When the tokenizer's :attr:`~engine.tokens.tokenizer.Tokenizer.chat_preprocess` is ``kimi``, the
steps Kimi-K2.5's ``apply_chat_template`` applies before its template are applied first
(docs/kimi-tokenizer.md section 1): ``tools`` deep-sorted, ``tools_ts_str`` (the TypeScript
declaration, :mod:`engine.tokens.kimi_tools`) passed when the encoder succeeds, and the template
variables ``thinking`` / ``preserve_thinking`` defaulting to its keyword defaults unless configured.
The request sent to the provider keeps the dataset's key order; the provider's tokenizer sorts.

Messages are passed as given (after dropping ``None`` values, as transformers does): the prompt is
rendered as the provider received it, tool-call ids included. Only the GENERATED turn is normalised
(native tool-call ids, see :mod:`engine.tokens.reconstruct`).

The Kimi layout (docs/eagle3-data.md), for reference: ``<|im_system|>system<|im_middle|>{system}<|im_end|>``,
``<|im_user|>user<|im_middle|>{user}<|im_end|>``, generation prompt
``<|im_assistant|>assistant<|im_middle|><think>``; earlier assistant turns ``<think></think>{content}``;
tools in a ``tool_declare`` system turn; tool results ``## Return of {id}``.
"""

from __future__ import annotations

import logging
from typing import Any

from engine.tokens.kimi_tools import kimi_tool_vars
from engine.tokens.tokenizer import Tokenizer, TokenizerError

log = logging.getLogger(__name__)
_reported: set[str] = set()  # encoder fallbacks already logged (one line per distinct reason)


class TemplateError(TokenizerError):
    """The chat template failed to render these messages (message has the template's reason)."""


def clean_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Shallow copies of ``messages`` without ``None`` values (``content: null`` -> no key)."""
    return [{k: v for k, v in m.items() if v is not None} if isinstance(m, dict) else m for m in messages]


def render(tok: Tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
           add_generation_prompt: bool) -> str:
    """Render ``messages`` (+ ``tools``) with ``tok``'s chat template.

    Args:
        tok: the loaded tokenizer (its template, special-token texts and template variables).
        messages: OpenAI-shape messages.
        tools: OpenAI-shape tool declarations, or None/[] for none.
        add_generation_prompt: append the assistant generation prompt.

    With ``tok.chat_preprocess == "kimi"``, ``tools`` are deep-sorted and ``tools_ts_str`` is
    computed first (see the module docstring); an encoder failure falls back to no
    ``tools_ts_str`` (logged once per reason), as Kimi's tokenizer does.

    Returns:
        the rendered text (special tokens as text; encode it with ``tok.encode_chat``).

    Raises:
        TemplateError: no chat template, or the template raised (e.g. ``raise_exception``).
    """
    if not tok.chat_template:
        raise TemplateError("the tokenizer has no chat template (set [tokenizer] chat_template)")
    from engine.tokens.hfimport import transformers_module

    render_jinja_template = transformers_module("transformers.utils.chat_template_utils").render_jinja_template

    kwargs: dict[str, Any] = dict(tok.template_tokens)
    if getattr(tok, "chat_preprocess", "none") == "kimi":
        kwargs["preserve_thinking"] = False  # apply_chat_template's keyword default
        tools, ts, err = kimi_tool_vars(tools)
        if ts is not None:
            kwargs["tools_ts_str"] = ts
        elif err is not None and err not in _reported and len(_reported) < 100:
            _reported.add(err)
            log.warning("tool declarations rendered as JSON: Kimi's TypeScript encoder rejects the schema (%s)",
                        err[:300])
    kwargs.update(tok.template_vars())
    try:
        out = render_jinja_template(conversations=[clean_messages(messages)], tools=tools or None,
                                    chat_template=tok.chat_template, add_generation_prompt=add_generation_prompt,
                                    **kwargs)
    except Exception as e:  # jinja raises TemplateError, TypeError, UndefinedError...
        raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
    rendered = out[0] if isinstance(out, tuple) else out
    return rendered[0] if isinstance(rendered, list) else rendered


def assistant_turn(reasoning: str, content: str, tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The generated turn as a message for the template: ``content``, ``reasoning_content`` and,
    when there are any, OpenAI-shape ``tool_calls``."""
    m: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    if tool_calls:
        m["tool_calls"] = tool_calls
    return m
