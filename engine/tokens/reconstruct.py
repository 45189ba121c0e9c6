"""From API text back to token ids: prompt ids, completion ids two ways, native tool calls.

- Prompt ids: the chat template applied to the prompt messages (+ tools) with the generation
  prompt, encoded with special tokens parsed (:func:`prompt_ids`).
- Completion ids, method A (:func:`completion_ids`):
  ``encode(reasoning) + [think_end] + encode(content) + tool-call tokens + [end_of_turn]``, tool
  calls as ``[tool_calls_begin] ([tool_call_begin] encode(id) [tool_call_argument_begin]
  encode(arguments) [tool_call_end])* [tool_calls_end]`` (Kimi layout, docs/eagle3-data.md). Thinking
  off: no reasoning, no ``think_end``. Cut by ``max_tokens`` (``finish_reason == "length"``): no
  ``end_of_turn``, and ``think_end`` only when content followed the reasoning.
- Completion ids, method B: the whole conversation rendered with the generated assistant turn,
  minus the generation-prompt prefix. Method A's ids are the training ids; B is the independent
  cross-check (they must agree, and the prompt must be a prefix of the full rendering).
  A template that blanks the reasoning of the final plain assistant turn (Kimi-K2.5 renders the
  last assistant turn without tool calls as ``<think></think>``) is detected once per tokenizer
  (:func:`template_traits`), and B is then compared with A minus the reasoning ids.
- Tool calls in the model's native form: ids rebuilt as ``tool_id_format``
  (``functions.{name}:{index}``, index = tool calls before it in the conversation), arguments kept
  verbatim.

Everything here is CPU-bound and synchronous; :mod:`engine.tokens.service` runs it off the loop.
"""

from __future__ import annotations

import json
import re
import weakref
from dataclasses import dataclass, field
from typing import Any

from engine.tokens.template import TemplateError, assistant_turn, render
from engine.tokens.tokenizer import TOOL_MARKERS, Tokenizer


@dataclass
class Record:
    """One stored result with its prompt, as reconstruction needs it (plain data, picklable).

    Attributes:
        prompt_id / dataset / key: the prompt's identity in the store.
        messages / tools: OpenAI-shape prompt messages and tool declarations.
        reasoning / content: the returned texts; tool_calls: OpenAI-shape calls as returned.
        finish_reason / provider: as returned.
        prompt_tokens / completion_tokens / reasoning_tokens: billed usage (tokens; 0 = not reported).
        wire_flags: the response's wire-conformance flags (:mod:`engine.client.conformance`).
        token_ids: the generated ids the server returned (vLLM ``return_token_ids``), None when none.
    """

    prompt_id: int
    dataset: str
    key: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    reasoning: str
    content: str
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    provider: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    wire_flags: tuple[str, ...] = ()
    token_ids: list[int] | None = None


@dataclass
class Reconstruction:
    """The rebuilt ids of one record and what was noticed while rebuilding them.

    Attributes:
        prompt_ids: rendered prompt ids ``[P]``.
        completion_ids: method A ids ``[C]`` (the training ids).
        rendered_ids: method B ids (full rendering after the prompt prefix), None when not built.
        agree: A and B agree (None: B not applicable, e.g. truncated, or the prefix was unstable).
        prefix_stable: the prompt rendering is a prefix of the full rendering (None: not checked).
        tool_calls: the calls in native form (OpenAI shape).
        ids_rebuilt: how many call ids differed from the native form and were rebuilt.
        bad_args: indexes of calls whose ``arguments`` are not valid JSON.
        roundtrip_bad: labels of pieces where ``decode(encode(piece)) != piece``.
        special_text: ``(piece label, marker name)`` for special-token texts found inside pieces.
        errors: structural problems (``render_error: ...``, ``tool_layout: ...``).
        truncated: ``finish_reason == "length"``.
        history_rerendered: the prompt is a prefix of the full rendering only once the earlier
            assistant turns' ``reasoning_content`` is left out of both: the template renders the
            prompt's trailing tool-call chain with its reasoning, and drops it once the generated
            plain answer closes the chain (Kimi-K2.5, docs/kimi-tokenizer.md section 5). The training
            ids are still the prompt AS SERVED plus method A; B is checked on the re-rendered pair.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    rendered_ids: list[int] | None = None
    agree: bool | None = None
    prefix_stable: bool | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    ids_rebuilt: int = 0
    bad_args: list[int] = field(default_factory=list)
    roundtrip_bad: list[str] = field(default_factory=list)
    special_text: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    truncated: bool = False
    history_rerendered: bool = False


def count_tool_calls(messages: list[dict[str, Any]]) -> int:
    """Tool calls already in the conversation (assistant ``tool_calls`` entries)."""
    n = 0
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list):
            n += len(m["tool_calls"])
    return n


def _native_id(call_id: str, name: str, id_format: str) -> bool:
    """Whether ``call_id`` has the native form ``id_format`` for the function ``name`` (any index)."""
    head, sep, tail = id_format.partition("{index}")
    if not sep or "{index}" in tail:
        return False
    pre, post = head.format(name=name), tail.format(name=name)
    mid = call_id[len(pre):len(call_id) - len(post)] if len(call_id) > len(pre) + len(post) else ""
    return call_id.startswith(pre) and call_id.endswith(post) and mid.isdigit() and mid.isascii()


#: Call ids in shapes Kimi itself writes besides its native ``functions.NAME:IDX`` (sglang PRs #21377 and #25362,
#: exo PR #2282 show them in raw model output): ``functions`` + anything (``functionsread3``,
#: ``functions_read_3``, ``functions.other:7``) or ``call`` + digits (``call00003``).
_MODEL_WRITTEN = re.compile(r"functions.*|call\d+", re.S)


def model_written(call_id: str) -> bool:
    """Whether ``call_id`` has a shape the model itself writes (:data:`_MODEL_WRITTEN`): a provider passing it
    through keeps the model's text, which the training record must keep verbatim. Ids providers mint
    (``call_*``, ``chatcmpl-tool-*``, ``toolu_*``, a random token) are not."""
    return bool(_MODEL_WRITTEN.fullmatch(call_id))


def native_tool_calls(tool_calls: list[dict[str, Any]], prior: int, id_format: str) -> tuple[list[dict[str, Any]], int]:
    """Rebuild the model's native call ids; keep names and ``arguments`` verbatim.

    An id the provider passed through in the native form with the call's own name (Kimi's
    ``functions.NAME:IDX``) is the model's own text and is kept verbatim, whatever its index (a model
    may repeat or skip one), and so is an id in another shape the model itself writes (:func:`model_written`:
    ``functionsread3``, ``call00003``); any other id (a provider's ``call_*``, ``chatcmpl-tool-*``...) or none
    is rebuilt as ``id_format`` with the call's position (docs/wire-conformance.md, "Tool calls").

    Args:
        tool_calls: OpenAI-shape calls as the provider returned them.
        prior: tool calls earlier in the conversation (the first call's index).
        id_format: e.g. ``"functions.{name}:{index}"``; ``""`` keeps the provider's ids.

    Returns:
        ``(calls, rebuilt)``: OpenAI-shape calls with native ids, and how many ids changed.
    """
    out: list[dict[str, Any]] = []
    rebuilt = 0
    for i, tc in enumerate(tool_calls):
        fn = _obj if isinstance(_obj := tc.get("function"), dict) else {}
        name = str(fn.get("name") or "")
        args = fn.get("arguments", "")
        if not isinstance(args, str):  # an object instead of the JSON string: serialise it compactly
            args = json.dumps(args, ensure_ascii=False)
        old = str(tc.get("id") or "")
        keep = not id_format or _native_id(old, name, id_format) or model_written(old)
        new = old if keep else id_format.format(name=name, index=prior + i)
        rebuilt += new != old
        out.append({"id": new, "type": "function", "function": {"name": name, "arguments": args}})
    return out, rebuilt


#: :func:`template_traits` per tokenizer, computed once (weak keys: a closed tokenizer's entry goes with it).
_TRAITS: weakref.WeakKeyDictionary[Tokenizer, dict[str, bool]] = weakref.WeakKeyDictionary()


def template_traits(tok: Tokenizer) -> dict[str, bool]:
    """How the template treats a generated final assistant turn (computed once per tokenizer).

    Returns:
        ``{"keeps_reasoning_plain": bool, "keeps_reasoning_tools": bool}``: whether the reasoning of
        a final assistant turn without / with tool calls appears in the rendering.

    Raises:
        TemplateError: the probe conversation does not render.
    """
    cached = _TRAITS.get(tok)
    if cached is not None:
        return cached
    user = [{"role": "user", "content": "Hi"}]
    probe = "Zq9 probe reasoning"
    plain = render(tok, user + [assistant_turn(probe, "Hello", [])], None, add_generation_prompt=False)
    tools = [{"type": "function", "function": {"name": "probe", "description": "p", "parameters": {"type": "object", "properties": {}}}}]
    calls, _ = native_tool_calls([{"id": "x", "function": {"name": "probe", "arguments": "{}"}}], 0,
                                 tok.section.tool_id_format or "call_{index}")
    with_tools = render(tok, user + [assistant_turn(probe, "", calls)], tools, add_generation_prompt=False)
    traits = {"keeps_reasoning_plain": probe in plain, "keeps_reasoning_tools": probe in with_tools}
    _TRAITS[tok] = traits
    return traits


def prompt_ids(tok: Tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> tuple[str, list[int]]:
    """``(rendered text, ids)`` of the prompt with the generation prompt.

    Raises:
        TemplateError: the template failed on these messages.
    """
    text = render(tok, messages, tools, add_generation_prompt=True)
    return text, tok.encode_chat(text)


def completion_ids(tok: Tokenizer, reasoning: str, content: str, calls: list[dict[str, Any]], *,
                   finished: bool, pieces: dict[str, list[int]] | None = None) -> list[int]:
    """Method A: the completion's ids from its texts (see the module docstring for the layout).

    Args:
        tok: tokenizer with resolved markers (``think_end``/``end_of_turn`` and, for calls, the
            five tool markers; a missing one is left out, which method B then reports).
        reasoning / content: returned texts; calls: native OpenAI-shape calls.
        finished: False when cut by ``max_tokens`` (no ``end_of_turn``).
        pieces: when given, filled with ``label -> ids`` of every plain-text piece encoded.

    Returns:
        the ids ``[C]``.
    """
    ids = tok.ids
    enc = tok.encode
    out: list[int] = []

    def piece(label: str, text: str) -> list[int]:
        p = enc(text)
        if pieces is not None:
            pieces[label] = p
        return p

    if tok.thinking:
        out += piece("reasoning", reasoning)
        if (finished or content or calls) and "think_end" in ids:
            out.append(ids["think_end"])
    out += piece("content", content)
    if calls:
        if "tool_calls_begin" in ids:
            out.append(ids["tool_calls_begin"])
        for i, c in enumerate(calls):
            if "tool_call_begin" in ids:
                out.append(ids["tool_call_begin"])
            out += piece(f"tool_calls[{i}].id", c["id"])
            if "tool_call_argument_begin" in ids:
                out.append(ids["tool_call_argument_begin"])
            out += piece(f"tool_calls[{i}].arguments", c["function"]["arguments"])
            if "tool_call_end" in ids:
                out.append(ids["tool_call_end"])
        if "tool_calls_end" in ids:
            out.append(ids["tool_calls_end"])
    if finished and "end_of_turn" in ids:
        out.append(ids["end_of_turn"])
    return out


def reconstruct(tok: Tokenizer, rec: Record) -> Reconstruction:
    """Rebuild prompt and completion ids of ``rec`` and cross-check them (never raises on data:
    problems land in the result's fields)."""
    truncated = rec.finish_reason == "length"
    calls, rebuilt = native_tool_calls(rec.tool_calls, count_tool_calls(rec.messages), tok.section.tool_id_format)
    errors: list[str] = []
    try:
        p_text, p_ids = prompt_ids(tok, rec.messages, rec.tools)
    except TemplateError as e:
        p_text, p_ids = "", []
        errors.append(f"render_error: {e}")
    if calls and any(m not in tok.ids for m in TOOL_MARKERS):
        errors.append("tool_layout: tool calls but the tool-call markers are not all configured/resolved")
    pieces: dict[str, list[int]] = {}
    c_ids = completion_ids(tok, rec.reasoning, rec.content, calls, finished=not truncated, pieces=pieces)
    out = Reconstruction(prompt_ids=p_ids, completion_ids=c_ids, tool_calls=calls, ids_rebuilt=rebuilt,
                         errors=errors, truncated=truncated)
    # per-piece checks: round trip and special-token texts inside generated text
    texts = {"reasoning": rec.reasoning, "content": rec.content}
    for i, c in enumerate(calls):
        texts[f"tool_calls[{i}].id"] = c["id"]
        texts[f"tool_calls[{i}].arguments"] = c["function"]["arguments"]
        try:
            json.loads(c["function"]["arguments"])
        except ValueError:
            out.bad_args.append(i)
    specials = dict(tok.markers)
    specials.update({k: v for k, v in tok.template_tokens.items() if v})
    for label, text in texts.items():
        if not text:
            continue
        ids = pieces.get(label)
        if ids is None:
            ids = tok.encode(text)
        if tok.decode(ids) != text:
            out.roundtrip_bad.append(label)
        for name, marker in specials.items():
            if marker in text:
                out.special_text.append((label, name))
    if not errors and not truncated:
        _method_b(tok, rec, calls, p_text, p_ids, pieces.get("reasoning", []), out)
    return out


def _tail(tok: Tokenizer, p_text: str, p_ids: list[int], full: str) -> tuple[bool, list[int]]:
    """``(prefix_stable, ids of the full rendering after the prompt)``."""
    if p_ids and full.startswith(p_text) and tok.is_special(p_ids[-1]):
        # the prompt ends on a special token: no merge crosses it, encode only the tail text
        return True, tok.encode_chat(full[len(p_text):])
    f_ids = tok.encode_chat(full)
    return f_ids[: len(p_ids)] == p_ids, f_ids[len(p_ids):]


def _method_b(tok: Tokenizer, rec: Record, calls: list[dict[str, Any]], p_text: str, p_ids: list[int],
              r_ids: list[int], out: Reconstruction) -> None:
    """Render the full conversation and compare its tail with method A (fills ``out``)."""
    reasoning = rec.reasoning if tok.thinking else ""
    try:
        full = render(tok, rec.messages + [assistant_turn(reasoning, rec.content, calls)], rec.tools,
                      add_generation_prompt=False)
        traits = template_traits(tok)
    except TemplateError as e:
        out.errors.append(f"render_error: {e}")
        return
    out.prefix_stable, tail = _tail(tok, p_text, p_ids, full)
    if not out.prefix_stable and any(m.get("reasoning_content") for m in rec.messages
                                     if isinstance(m, dict) and m.get("role") == "assistant"):
        plain = [{k: v for k, v in m.items() if k != "reasoning_content"} if isinstance(m, dict) and
                 m.get("role") == "assistant" else m for m in rec.messages]
        try:
            p2_text, p2_ids = prompt_ids(tok, plain, rec.tools)
            full2 = render(tok, plain + [assistant_turn(reasoning, rec.content, calls)], rec.tools,
                           add_generation_prompt=False)
        except TemplateError as e:
            out.errors.append(f"render_error: {e}")
            return
        stable2, tail2 = _tail(tok, p2_text, p2_ids, full2)
        if stable2:
            out.prefix_stable, out.history_rerendered, tail = True, True, tail2
    out.rendered_ids = tail
    if not out.prefix_stable:
        return
    expected = out.completion_ids
    keeps = traits["keeps_reasoning_tools" if calls else "keeps_reasoning_plain"]
    if tok.thinking and not keeps and r_ids:
        expected = expected[len(r_ids):]
    out.agree = tail == expected
