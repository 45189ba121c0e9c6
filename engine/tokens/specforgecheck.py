"""Would SpecForge's own parser train on a ``specforge`` export row as it was bought?

SpecForge turns a ``conversations`` row into ``(input_ids, loss_mask)`` with its chat-template parser
(``sgl-project/SpecForge`` ``specforge/data/parse.py`` ``GeneralParser.parse`` / ``ThinkingParser``, with
the templates of ``specforge/data/template.py``; read at commit ``a6b6b02``, the fetched HEAD of
2026-12). A Kimi user picks ``kimi-k2-thinking``. For our rows that parser differs from what was bought
in three ways:

- **reasoning**: it renders the tokenizer's chat template over the whole conversation, and Kimi's
  template blanks the reasoning of the last plain assistant turn (``<think></think>``): the generated
  turn of a thinking run trains as ``<think></think>answer`` with its reasoning gone;
- **system prompt**: a conversation whose first turn is not ``system`` gets the template's
  ``system_prompt`` (``"You are a helpful assistant."``) inserted, a prompt the model never saw
  (Kimi's template serves its own default system turn instead);
- **tool arguments**: ``_sanitize_message`` ``json.loads`` every call's ``arguments`` text and the
  template re-dumps the object (``tojson``: ``", "`` and ``": "`` separators), so
  ``{"city":"Lima"}`` trains as ``{"city": "Lima"}``.

:func:`parser_messages` transcribes the message list ``parse`` builds (role aliases, the system turn,
leading non-user turns dropped, the role-order truncation, ``_sanitize_message``);
:func:`supervised_mask` transcribes its loss mask (the ``assistant_header ... end_of_turn`` regex
spans, mapped to tokens by encoding each prefix). :func:`check` renders and encodes that list with the
run's tokenizer (callables, so this module stays pure) and compares with the stored record: the row
trains as bought when SpecForge's ids equal the served prompt + bought completion ids and every
completion id is supervised (the criterion of case 30's replay). Otherwise :func:`check` returns a
:class:`Verdict` naming the kinds above that apply. ``max_length`` truncation is not modelled (the
caller's ``max_length`` is assumed to hold the record).

The pre-tokenized path trains on exactly the bought ids instead: ``datagen export RUN --format
tokens-jsonl`` (``{"input_ids", "loss_mask"}`` per line) read by SpecForge's online producer through
``data.prompts_path`` (``specforge/data/prompt_builder.py`` ``prepare_prompt_tasks``: a file whose
first record has both keys is read as pre-tokenized, no template applied). :data:`TOKENS_PATH` says so.

Functions here are pure (no I/O).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

#: The SpecForge commit whose parser this module transcribes.
SPECFORGE_COMMIT = "a6b6b02"

#: The message keys ``GeneralParser`` keeps (``self.standard_keys``) and those ``ThinkingParser`` keeps.
GENERAL_KEYS = frozenset({"role", "content", "tool_calls"})
THINKING_KEYS = frozenset({"role", "content", "tool_calls", "reasoning_content", "name", "tool_call_id"})


@dataclass(frozen=True, slots=True)
class SpecForgeTemplate:
    """One of SpecForge's registered chat templates (``specforge/data/template.py``), the fields its parser reads.

    Attributes:
        name: its registry name (``--chat-template`` / ``data.chat_template``).
        assistant_header / end_of_turn: the regex delimiters of the supervised spans.
        system_prompt: inserted when a conversation has no leading system turn (None: nothing).
        keys: the message keys the parser keeps (:data:`GENERAL_KEYS` or :data:`THINKING_KEYS`).
        enable_thinking: ``ThinkingParser`` passes ``enable_thinking=True`` to the template.
    """

    name: str
    assistant_header: str
    end_of_turn: str
    system_prompt: str | None
    keys: frozenset[str]
    enable_thinking: bool


KIMI_K2_THINKING = SpecForgeTemplate("kimi-k2-thinking", "<|im_assistant|>assistant<|im_middle|>", "<|im_end|>",
                                     "You are a helpful assistant.", THINKING_KEYS, True)
KIMI_K2_INSTRUCT = SpecForgeTemplate("kimi-k2-instruct", "<|im_assistant|>assistant<|im_middle|>", "<|im_end|>",
                                     "You are a helpful assistant.", GENERAL_KEYS, False)

#: The kinds of mis-training a :class:`Verdict` names, in this order, with their words.
KINDS = {"reasoning": "reasoning dropped", "system": "system prompt inserted",
         "arguments": "tool arguments re-serialised", "other": "other token differences"}

#: The exact path to train from instead (``{run}``: the run directory).
TOKENS_PATH = ("`datagen export {run} --format tokens-jsonl --out DIR` and SpecForge's pre-tokenized online input "
               "`data.prompts_path=DIR/<dataset>.jsonl` (input_ids + loss_mask, no template), or hidden states "
               "with `datagen extract` ([extract] layout = \"specforge\")")


@dataclass(frozen=True, slots=True)
class Verdict:
    """Why SpecForge's parser would not train a row as bought.

    Attributes:
        kinds: keys of :data:`KINDS` that apply (at least one).
        detail: one line: the kinds in words with their evidence.
    """

    kinds: tuple[str, ...]
    detail: str


def template_for(chat_template: str) -> SpecForgeTemplate | None:
    """The SpecForge template a user of this tokenizer chat template would pick: :data:`KIMI_K2_THINKING`
    for Kimi's layout (its assistant header in the template text), else None (not checked)."""
    return KIMI_K2_THINKING if "<|im_assistant|>" in chat_template and "<|im_middle|>" in chat_template else None


def _normalise(m: dict[str, Any]) -> dict[str, Any]:
    # Parser._normalize_message: role from role/from, content from content/value (None -> "")
    role = m.get("role", m.get("from", ""))
    content = m.get("content") or m.get("value") or ""
    role = "user" if role in ("human", "user") else "assistant" if role in ("gpt", "assistant") else role
    out = {**m, "role": role, "content": content}
    out.pop("from", None)
    out.pop("value", None)
    return out


def _sanitise(m: dict[str, Any], keys: frozenset[str]) -> dict[str, Any]:
    # Parser._sanitize_message: standard keys only; tool_calls text and arguments text parsed as JSON
    out = {k: v for k, v in m.items() if k in keys}
    if "tool_calls" not in out:
        return out
    calls = out["tool_calls"]
    if isinstance(calls, str):
        try:
            calls = json.loads(calls)
        except json.JSONDecodeError:
            out.pop("tool_calls")
            return out
    if isinstance(calls, list):
        clean = []
        for tc in calls:
            if not isinstance(tc, dict):
                continue
            c: dict[str, Any] = {"id": tc.get("id", ""), "type": tc.get("type", "function")}
            fn = tc.get("function", {})
            if isinstance(fn, dict):
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except json.JSONDecodeError:
                        args = {}
                c["function"] = {"name": fn.get("name", ""), "arguments": args}
            clean.append(c)
        out["tool_calls"] = clean
    return out


def parser_messages(conversation: list[dict[str, Any]], template: SpecForgeTemplate) -> list[dict[str, Any]]:
    """The message list SpecForge's ``GeneralParser.parse`` (``preformatted=False``) hands the chat template.

    Args:
        conversation: a row's ``conversations`` (OpenAI or ShareGPT keys; ``tool_calls`` list or JSON text).
        template: the SpecForge template (its ``system_prompt`` and kept keys).

    Returns:
        the messages, in order: the row's system turn or the template's ``system_prompt``, then the turns
        from the first user turn up to the first out of role order, each reduced to ``template.keys``
        with tool calls parsed (arguments as objects). ``[]`` for an empty conversation.
    """
    conv = [_normalise(m) for m in conversation]
    if not conv:
        return []
    msgs: list[dict[str, Any]] = []
    if conv[0]["role"] == "system":
        msgs.append({"role": "system", "content": conv[0]["content"]})
        conv = conv[1:]
    elif template.system_prompt:
        msgs.append({"role": "system", "content": template.system_prompt})
    while conv and conv[0]["role"] != "user":
        conv = conv[1:]
    for j, m in enumerate(conv):
        if j > 0:
            prev = conv[j - 1]["role"]
            if (m["role"] == "tool" and prev not in ("assistant", "tool")) or (
                    m["role"] == "assistant" and prev not in ("user", "tool")):
                break
        msgs.append(_sanitise(m, template.keys))
    return msgs


def supervised_mask(text: str, n_ids: int, prefix_len: Callable[[str], int], template: SpecForgeTemplate, *,
                    last_only: bool = False) -> list[int]:
    """SpecForge's loss mask over the rendered ``text`` (``GeneralParser.parse``, general assistant pattern).

    Args:
        text: the rendered conversation.
        n_ids: its token count (len of its ids).
        prefix_len: token count of a prefix of ``text`` (the parser encodes each span's prefix).
        template: the assistant header and end-of-turn token of the spans.
        last_only: the last span only (SpecForge's ``train_only_last_turn``).

    Returns:
        ``[n_ids]`` of 0/1: 1 on each ``assistant_header``-to-``end_of_turn`` span (end token included,
        header excluded), as the parser sets it.
    """
    pattern = re.escape(template.assistant_header) + r"([\s\S]*?(?:" + re.escape(template.end_of_turn) + "|$))"
    mask = [0] * n_ids
    matches = list(re.finditer(pattern, text, re.DOTALL))
    for m in matches[-1:] if last_only else matches:
        start, end = min(prefix_len(text[:m.start(1)]), n_ids), min(prefix_len(text[:m.end(1)]), n_ids)
        for i in range(start, end):
            mask[i] = 1
    return mask


def _arguments(conversation: list[dict[str, Any]]) -> list[str]:
    out = []
    for m in conversation:
        calls = m.get("tool_calls") or []
        if isinstance(calls, str):
            try:
                calls = json.loads(calls)
            except json.JSONDecodeError:
                continue
        for tc in calls if isinstance(calls, list) else []:
            args = (tc.get("function") or {}).get("arguments") if isinstance(tc, dict) else None
            if isinstance(args, str) and args:
                out.append(args)
    return out


def _explain(conversation: list[dict[str, Any]], template: SpecForgeTemplate, text: str | None) -> Verdict:
    kinds: dict[str, str] = {}
    gen = conversation[-1] if conversation else {}
    reasoning = gen.get("reasoning_content") or ""
    if reasoning and (text is None or reasoning not in text):
        kinds["reasoning"] = f"reasoning dropped ({len(reasoning)} chars of the generated turn's reasoning not rendered)"
    first = _normalise(conversation[0])["role"] if conversation else ""
    if first != "system" and template.system_prompt:
        kinds["system"] = f"system prompt inserted ({template.system_prompt!r}, never served)"
    changed = [a for a in _arguments(conversation) if text is None or a not in text]
    if changed:
        kinds["arguments"] = f"tool arguments re-serialised ({changed[0][:60]!r} not rendered as sent)"
    if not kinds:
        kinds["other"] = "other token differences"
    order = [k for k in KINDS if k in kinds]
    return Verdict(tuple(order), f"SpecForge {template.name} ({SPECFORGE_COMMIT}): " + "; ".join(kinds[k] for k in order))


def check(conversation: list[dict[str, Any]], tools: list[dict[str, Any]], ids: list[int], prompt_len: int,
          render: Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str],
          encode: Callable[[str], list[int]], template: SpecForgeTemplate = KIMI_K2_THINKING) -> Verdict | None:
    """Whether SpecForge's parser trains ``conversation`` as bought; None when it does.

    Args:
        conversation: the exported row's ``conversations`` (prompt turns + the generated turn).
        tools: the row's tool declarations (``[]`` for none).
        ids: the record's served prompt ids + bought completion ids (tokens); ``prompt_len`` of them prompt.
        render: ``(messages, tools or None) -> text``: the run's chat template (``add_generation_prompt``
            False), as the tokenizer SpecForge loads renders it.
        encode: rendered text -> ids (special-token text -> special ids).
        template: the SpecForge template the user picks.

    Returns:
        None when SpecForge's ids equal ``ids`` and every completion id (``ids[prompt_len:]``) is
        supervised; else the :class:`Verdict`. A render that raises counts as ``other``.
    """
    try:
        text = render(parser_messages(conversation, template), tools or None)
    except Exception as e:  # the template refused SpecForge's message list
        v = _explain(conversation, template, None)
        return Verdict(v.kinds, f"{v.detail}; the template raised {type(e).__name__}")
    got = encode(text)
    if got == list(ids):
        # the completion lies in the last span (earlier ones are the prompt's turns): only it is encoded
        mask = supervised_mask(text, len(got), lambda s: len(encode(s)), template, last_only=True)
        if all(mask[prompt_len:]):
            return None
    return _explain(conversation, template, text)


def likely(conversation: list[dict[str, Any]], template: SpecForgeTemplate = KIMI_K2_THINKING) -> Verdict | None:
    """Without a tokenizer: the kinds that mis-train under ``template`` whatever the chat template renders
    (reasoning on a final turn without tool calls, which Kimi's template blanks; no leading system turn
    while ``template`` inserts one), else None."""
    if not conversation:
        return None
    gen = conversation[-1]
    plain = gen.get("tool_calls") in (None, "", "[]", [])
    kinds: dict[str, str] = {}
    if plain and gen.get("reasoning_content"):
        kinds["reasoning"] = "reasoning dropped (the generated turn is the last plain assistant turn)"
    if _normalise(conversation[0])["role"] != "system" and template.system_prompt:
        kinds["system"] = f"system prompt inserted ({template.system_prompt!r}, never served)"
    if not kinds:
        return None
    return Verdict(tuple(kinds), f"SpecForge {template.name} ({SPECFORGE_COMMIT}): " + "; ".join(kinds.values()))
