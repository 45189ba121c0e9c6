"""The start-up check: refuse to generate when tokenizer, template and configured mode disagree.

Run before any request is sent (and by ``datagen validate``). It:

1. resolves every configured marker text to exactly one id (``end_of_turn`` always; ``think_start``
   and ``think_end`` in thinking mode; the five tool-call markers all or none), distinct ids;
2. renders a sample prompt with the generation prompt and checks its end against the mode: thinking
   -> the last id is ``think_start``; thinking off -> it is not (e.g. Kimi's ``<think></think>``);
3. rebuilds a sample completion (and one with a tool call when tool markers are set) both ways
   (:mod:`engine.tokens.reconstruct`) and refuses on any structural reason.

The returned description (kind, path, resolved ids, mode, fingerprint, template traits, the tail of
the generation prompt) is printed and stored with the run.
"""

from __future__ import annotations

from typing import Any

from engine.tokens.reconstruct import Record, reconstruct, template_traits
from engine.tokens.template import TemplateError, render
from engine.tokens.tokenizer import TOOL_MARKERS, Tokenizer, TokenizerError
from engine.tokens.validate import check, structural

_SAMPLE = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "What is 2 + 2? Answer briefly. 二加二等于几？"},
]
_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def _need(tok: Tokenizer) -> list[str]:
    need = ["end_of_turn"]
    if tok.thinking:
        need += ["think_start", "think_end"]
    return need


def startup_check(tok: Tokenizer) -> dict[str, Any]:
    """Check ``tok`` against its configuration (see the module docstring).

    Returns:
        :meth:`Tokenizer.describe` plus ``traits`` and ``generation_prompt_tail`` (text).

    Raises:
        TokenizerError: a marker does not resolve to exactly one id, two markers share an id, the
            template is missing or fails, the generation prompt does not match the mode, or the
            sample completion is not rebuilt consistently; the message says which and how to fix it.
    """
    problems = [f"{name} = {tok.section.model_dump()[name]!r}: {why}" for name, why in tok.unresolved.items()]
    for name in _need(tok):
        if name not in tok.markers:
            problems.append(f"{name} is not configured (it is required{' in thinking mode' if name != 'end_of_turn' else ''})")
    tool_set = [m for m in TOOL_MARKERS if m in tok.markers]
    if tool_set and len(tool_set) != len(TOOL_MARKERS):
        problems.append(f"tool-call markers: set all of {', '.join(TOOL_MARKERS)} or none (set: {', '.join(tool_set)})")
    seen: dict[int, str] = {}
    for name, i in tok.ids.items():
        if not tok.is_special(i):
            problems.append(f"{name} = {tok.markers[name]!r} is an ordinary token (id {i}), not a special token")
        if i in seen:
            problems.append(f"{name} and {seen[i]} resolve to the same id {i}")
        seen[i] = name
    if problems:
        raise TokenizerError("tokenizer special tokens do not match the configuration:\n  " + "\n  ".join(problems)
                             + "\n  (name the tokens by their exact text in [tokenizer]; \"\" when the family has none)")
    try:
        text = render(tok, _SAMPLE, None, add_generation_prompt=True)
        traits = template_traits(tok)
    except TemplateError as e:
        raise TokenizerError(f"start-up check: {e}") from None
    ids = tok.encode_chat(text)
    tail = tok.decode(ids[-4:]) if ids else ""
    ts = tok.ids.get("think_start")
    if tok.thinking and (not ids or ids[-1] != ts):
        raise TokenizerError(
            f"start-up check: thinking = true but the generation prompt ends with {tail!r}, not "
            f"{tok.markers['think_start']!r}: the template is not in thinking mode (check [tokenizer] "
            f"template_vars / chat_template), or the model does not think")
    if not tok.thinking and ts is not None and ids and ids[-1] == ts:
        raise TokenizerError(
            f"start-up check: thinking = false but the generation prompt ends with {tok.markers['think_start']!r}: "
            f"the template renders thinking mode (pass the template's switch in [tokenizer] template_vars)")
    samples = [Record(prompt_id=0, dataset="", key="", messages=list(_SAMPLE), tools=[],
                      reasoning="The user asks 2 + 2, which is 4." if tok.thinking else "",
                      content="2 + 2 = 4. 二加二等于四。", tool_calls=[], finish_reason="stop")]
    if tool_set:
        samples.append(Record(prompt_id=0, dataset="", key="", messages=[{"role": "user", "content": "Weather in Rome?"}],
                              tools=[_TOOL], reasoning="I should call the tool." if tok.thinking else "",
                              content="", finish_reason="tool_calls",
                              tool_calls=[{"id": "call_1", "type": "function",
                                           "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}]))
    for s in samples:
        rec = reconstruct(tok, s)
        v = check(rec, s, thinking=tok.thinking, ids=tok.ids)
        bad = structural(v.reasons)
        if bad:
            detail = ""
            if rec.rendered_ids is not None and rec.agree is False:
                detail = (f"\n  method A (texts + markers): {tok.decode(rec.completion_ids)!r}"
                          f"\n  method B (template):        {tok.decode(rec.rendered_ids)!r}")
            raise TokenizerError(f"start-up check: a sample {'tool-call ' if s.tool_calls else ''}completion is not "
                                 f"rebuilt consistently: {', '.join(bad)}{detail} {'; '.join(rec.errors)}")
    out = tok.describe()
    out["traits"] = traits
    out["generation_prompt_tail"] = tail
    return out


def format_startup(info: dict[str, Any]) -> str:
    """One line per fact, for the console: kind, path, mode, each marker with its id."""
    lines = [f"tokenizer: {info['kind']} {info['path']} (vocab {info['vocab_size']:,}, fingerprint {info['fingerprint']}, "
             f"thinking {'on' if info['thinking'] else 'off'})"]
    lines += [f"  {text} = {i}" for text, i in info["special_ids"].items()]
    t = info.get("traits") or {}
    if t and not t.get("keeps_reasoning_plain", True):
        lines.append("  (the template blanks the reasoning of a final plain assistant turn; method B compares without it)")
    return "\n".join(lines)
