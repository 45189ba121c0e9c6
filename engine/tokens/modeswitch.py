"""Thinking mode vs the request: refuse a config that can only buy rejected records, or send the switch.

Kimi-K2.5 thinks unless the request turns thinking off, and each server reads its own switch
(docs/eagle3-data.md, "Thinking and instant mode: the switch each server reads"; vLLM #43728: ``enable_thinking`` is the wrong name for
Kimi's template, which reads ``thinking``):

| switch in the request body | read by |
|---|---|
| ``reasoning: {enabled: false}`` / ``{effort: "none"}`` | OpenRouter (and the built-in simulator) |
| ``chat_template_kwargs: {thinking: false}`` | vLLM / SGLang serving Kimi's chat template |
| ``thinking: {type: "disabled"}`` | Moonshot's own API |

Validation rejects a record generated in the other mode (``reasoning_unexpected``, ``instant_reply``:
:mod:`engine.tokens.validate`) and one whose reasoning text was withheld (``reasoning_missing``), so a run
whose settings contradict ``[tokenizer] thinking`` pays for records it can never use. :func:`plan` decides
before the first request: a contradiction is refused (:class:`ModeConflict`, one line naming the keys);
``thinking = false`` with no switch gets OpenRouter's switch added for kinds ``openrouter`` and
``simulated``, and is refused for kind ``openai`` (the server's switch is not knowable from here).

Pure: values in, a plan out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.errors import DatagenError

#: reasoning efforts that turn thinking on (OpenRouter's ``reasoning.effort`` values but "none").
_ON_EFFORTS = ("minimal", "low", "medium", "high", "xhigh")


class ModeConflict(DatagenError, ValueError):
    """The request settings contradict ``[tokenizer] thinking``: every record bought would be rejected.
    The message names the keys and what to change."""


@dataclass(frozen=True)
class ModePlan:
    """What :func:`plan` decided.

    Attributes:
        add: keys merged into the request body (empty: nothing to add).
        note: one line for the run's output when something is added (None otherwise).
    """

    add: dict[str, Any] = field(default_factory=dict)
    note: str | None = None


def _switches(reasoning: dict[str, Any] | None, extra_body: dict[str, Any]) -> list[tuple[str, bool]]:
    """Every thinking switch the body carries: ``(config key, True = thinking on)``."""
    out: list[tuple[str, bool]] = []
    for where, r in (("[generation] reasoning", reasoning), ("[generation] extra_body.reasoning",
                                                            extra_body.get("reasoning"))):
        if not isinstance(r, dict):
            continue
        if r.get("enabled") is False:
            out.append((f"{where}.enabled = false", False))
        elif r.get("enabled") is True:
            out.append((f"{where}.enabled = true", True))
        effort = r.get("effort")
        if effort == "none":
            out.append((f'{where}.effort = "none"', False))
        elif effort in _ON_EFFORTS:
            out.append((f'{where}.effort = "{effort}"', True))
        mt = r.get("max_tokens")
        if isinstance(mt, int) and not isinstance(mt, bool):
            out.append((f"{where}.max_tokens = {mt}", mt > 0))
    ctk = extra_body.get("chat_template_kwargs")
    if isinstance(ctk, dict):
        for k in ("thinking", "enable_thinking"):
            if isinstance(ctk.get(k), bool):
                out.append((f"[generation] extra_body.chat_template_kwargs.{k} = {str(ctk[k]).lower()}", ctk[k]))
    th = extra_body.get("thinking")
    if isinstance(th, dict) and th.get("type") in ("enabled", "disabled"):
        out.append((f'[generation] extra_body.thinking.type = "{th["type"]}"', th["type"] == "enabled"))
    return out


def _withheld(reasoning: dict[str, Any] | None, extra_body: dict[str, Any]) -> str | None:
    """The key that asks the provider to leave the reasoning text out of the response, if any."""
    for where, r in (("[generation] reasoning", reasoning), ("[generation] extra_body.reasoning",
                                                            extra_body.get("reasoning"))):
        if isinstance(r, dict) and r.get("exclude") is True:
            return f"{where}.exclude = true"
    if extra_body.get("include_reasoning") is False:
        return "[generation] extra_body.include_reasoning = false"
    return None


SWITCHES_HELP = ('set [generation] reasoning = { enabled = false } (OpenRouter), extra_body = '
                 '{ chat_template_kwargs = { thinking = false } } (vLLM/SGLang serving Kimi\'s template) or '
                 'extra_body = { thinking = { type = "disabled" } } (Moonshot\'s API)')


def plan(thinking: bool, kind: str, reasoning: dict[str, Any] | None, extra_body: dict[str, Any]) -> ModePlan:
    """Decide, before the first request, how the request body matches ``[tokenizer] thinking``.

    Args:
        thinking: ``[tokenizer] thinking`` (True: the run buys thinking-mode records).
        kind: ``[provider] kind`` (``openrouter``, ``openai``, ``simulated``).
        reasoning: ``[generation] reasoning`` (None: not sent).
        extra_body: ``[generation] extra_body`` (merged into the body last).

    Returns:
        the :class:`ModePlan` (keys to add to the body, the line saying so).

    Raises:
        ModeConflict: the settings can only buy records validation rejects (a switch contradicting
            ``thinking``, two switches contradicting each other, reasoning withheld in a thinking run,
            or ``thinking = false`` on kind ``openai`` with no switch).
    """
    found = _switches(reasoning, extra_body)
    on = [k for k, v in found if v]
    off = [k for k, v in found if not v]
    if on and off:
        raise ModeConflict(f"{on[0]} and {off[0]} contradict each other: the server's mode is unknown and "
                           f"validation would reject the records of the other one; keep the one that matches "
                           f"[tokenizer] thinking = {str(thinking).lower()}")
    if thinking:
        if off:
            raise ModeConflict(f"[tokenizer] thinking = true but {off[0]} turns the target's thinking off: every "
                               f"record would be rejected (instant_reply); remove it, or set [tokenizer] thinking "
                               f"= false to buy instant-mode records")
        w = _withheld(reasoning, extra_body)
        if w is not None:
            raise ModeConflict(f"[tokenizer] thinking = true but {w} withholds the reasoning text: every record "
                               f"would be rejected (reasoning_missing, its tokens billed but not received); "
                               f"remove it")
        return ModePlan()
    if on:
        raise ModeConflict(f"[tokenizer] thinking = false but {on[0]} turns the target's thinking on: every record "
                           f"would be rejected (reasoning_unexpected); remove it, or set [tokenizer] thinking = true")
    if off:
        return ModePlan()
    if kind in ("openrouter", "simulated"):
        return ModePlan(add={"reasoning": {**(reasoning or {}), "enabled": False}},
                        note="[tokenizer] thinking = false: sending reasoning = { enabled = false } "
                             "(OpenRouter's switch; Kimi-K2.5 thinks unless told not to)")
    raise ModeConflict("[tokenizer] thinking = false but no request setting turns the server's thinking off "
                       "(Kimi-K2.5 thinks by default, and every thinking reply would be rejected as "
                       "reasoning_unexpected): " + SWITCHES_HELP)
